//! Compiled JSON Schemas (the `jsonschema` crate) and readable violation reports.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;

use serde_json::Value;

/// Most violations listed in one report; the model needs the first few, not hundreds.
const MAX_REPORTED_VIOLATIONS: usize = 5;

/// Longest violation line: jsonschema's messages quote the offending value whole, which may be
/// megabytes of a tool's output, and reports reach the model, events and the audit trail.
const MAX_VIOLATION_CHARS: usize = 300;

/// Distinct schemas kept compiled per thread. Compiling checks the schema against the draft
/// 2020-12 meta-schema, and on wasm jsonschema rebuilds that meta-validator for every compile
/// (milliseconds each); registries rebuild tools often, with the same few schemas.
const SCHEMA_CACHE_CAPACITY: usize = 1024;

/// Most schema text the cache holds (its keys). A compiled validator takes ~8-10 times its
/// schema's text, and the wasm memory it grew is never given back: bounded by count alone,
/// 1,024 distinct 30 KiB schemas (forged tools' schemas are the model's, or a user's) held
/// ~260 MB for the process's life. This keeps it to ~10 MB.
const SCHEMA_CACHE_BYTES: usize = 1 << 20;

/// Schemas with more text than this are compiled each time, not cached: one would take a
/// large part of the cache's bytes.
const MAX_CACHED_SCHEMA_BYTES: usize = 64 << 10;

#[derive(Default)]
struct SchemaCache {
    validators: HashMap<String, Rc<jsonschema::Validator>>,
    /// Text of the keys, in bytes.
    bytes: usize,
}

thread_local! {
    static SCHEMA_CACHE: RefCell<SchemaCache> = RefCell::new(SchemaCache::default());
}

/// A compiled schema. Compile once per tool; validation is then allocation-light.
pub struct CompiledSchema {
    validator: Rc<jsonschema::Validator>,
    /// Shared, so a request can carry the schema (a structured answer's response format)
    /// without copying it every turn.
    source: Rc<Value>,
}

impl fmt::Debug for CompiledSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledSchema").field("source", &self.source).finish()
    }
}

/// The schema itself is not valid JSON Schema.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid JSON Schema: {0}")]
pub struct SchemaError(pub String);

/// Who wrote a schema, which decides the regex engine its `pattern` and `patternProperties`
/// run on. Checks run on the host's main thread (the core), so a pattern's cost is the host's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaAuthor {
    /// The host (its tools, `returns`): ECMA-262 patterns in full, lookaround and
    /// backreferences included, on a backtracking engine (each match bounded at 1,000,000
    /// steps, but not the number of matches in one value).
    Host,
    /// A model or another untrusted party (a forged tool's schemas): patterns run on a
    /// linear-time engine, and one it cannot run (lookaround, backreferences) makes the schema
    /// invalid. A backtracking pattern chosen to take ~500k steps per string, over an output
    /// of many strings, held the main thread for minutes.
    Untrusted,
}

impl CompiledSchema {
    /// Compiles a schema the host wrote (see [`SchemaAuthor::Host`]).
    pub fn compile(schema: &Value) -> Result<Self, SchemaError> {
        Self::compile_by(schema, SchemaAuthor::Host)
    }

    pub fn compile_by(schema: &Value, author: SchemaAuthor) -> Result<Self, SchemaError> {
        // The engine is part of the key: the same text compiles differently for each.
        let mut key = String::from(match author {
            SchemaAuthor::Host => "h",
            SchemaAuthor::Untrusted => "u",
        });
        // Written into the key's buffer: no second copy of the schema's text.
        let _ = std::fmt::Write::write_fmt(&mut key, format_args!("{schema}"));
        if let Some(validator) = SCHEMA_CACHE.with(|c| c.borrow().validators.get(&key).cloned()) {
            return Ok(Self { validator, source: Rc::new(schema.clone()) });
        }
        let compiled = match author {
            SchemaAuthor::Host => jsonschema::validator_for(schema),
            SchemaAuthor::Untrusted => jsonschema::options().with_pattern_options(jsonschema::PatternOptions::regex()).build(schema),
        };
        let validator = Rc::new(compiled.map_err(|e| SchemaError(e.to_string()))?);
        if key.len() <= MAX_CACHED_SCHEMA_BYTES {
            SCHEMA_CACHE.with(|c| {
                let mut cache = c.borrow_mut();
                if cache.validators.len() >= SCHEMA_CACHE_CAPACITY || cache.bytes + key.len() > SCHEMA_CACHE_BYTES {
                    *cache = SchemaCache::default();
                }
                cache.bytes += key.len();
                cache.validators.insert(key, validator.clone());
            });
        }
        Ok(Self { validator, source: Rc::new(schema.clone()) })
    }

    pub fn source(&self) -> &Value {
        &self.source
    }

    /// The schema, shared rather than copied.
    pub fn shared_source(&self) -> Rc<Value> {
        self.source.clone()
    }

    /// `Ok` when `instance` is valid; otherwise a readable list of violations with their paths.
    pub fn check(&self, instance: &Value) -> Result<(), String> {
        if self.validator.is_valid(instance) {
            return Ok(());
        }
        let mut lines: Vec<String> = Vec::new();
        let mut total = 0usize;
        for error in self.validator.iter_errors(instance) {
            total += 1;
            if lines.len() < MAX_REPORTED_VIOLATIONS {
                let path = error.instance_path().to_string();
                let at = if path.is_empty() { "(root)".to_string() } else { path };
                lines.push(super::shorten(&format!("{at}: {error}"), MAX_VIOLATION_CHARS));
            }
        }
        if total > lines.len() {
            lines.push(format!("… and {} more", total - lines.len()));
        }
        Err(lines.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reports_path_and_reason_for_each_violation() {
        let s = CompiledSchema::compile(&json!({
            "type": "object",
            "properties": { "city": { "type": "string" }, "days": { "type": "integer" } },
            "required": ["city"]
        }))
        .unwrap();
        assert!(s.check(&json!({ "city": "Oslo" })).is_ok());
        let err = s.check(&json!({ "days": "x" })).unwrap_err();
        assert!(err.contains("city"), "{err}");
        assert!(err.contains("/days"), "{err}");
    }

    /// A schema of about `bytes` of text, distinct by `n`.
    fn schema_of(n: usize, bytes: usize) -> Value {
        json!({ "type": "object", "description": format!("{n} {}", "x".repeat(bytes)), "properties": { "a": { "type": "string" } } })
    }

    fn cached() -> (usize, usize) {
        SCHEMA_CACHE.with(|c| (c.borrow().validators.len(), c.borrow().bytes))
    }

    #[test]
    fn the_cache_holds_a_bounded_amount_of_schema_text_and_no_large_schema() {
        // Distinct 30 KiB schemas, as a stream of forges might bring: bounded by bytes, not
        // only by count, and what is cached still answers.
        for n in 0..200 {
            let schema = CompiledSchema::compile(&schema_of(n, 30 << 10)).unwrap();
            assert!(schema.check(&json!({ "a": "ok" })).is_ok());
            assert!(schema.check(&json!({ "a": 1 })).is_err());
            let (_, bytes) = cached();
            assert!(bytes <= SCHEMA_CACHE_BYTES, "{bytes} bytes cached after {n}");
        }
        let (held, _) = cached();
        assert!(held > 0 && held < 40, "{held} schemas of 30 KiB cached");
        // One over 64 KiB is compiled, checked and not cached.
        let before = cached();
        let large = CompiledSchema::compile(&schema_of(0, 100 << 10)).unwrap();
        assert!(large.check(&json!({ "a": 1 })).is_err());
        assert_eq!(cached(), before);
    }

    #[test]
    fn untrusted_schemas_get_patterns_only_a_linear_time_engine_runs() {
        let backreference = json!({ "type": "array", "items": { "type": "string", "pattern": "^(?:(a|a)*\\1c|a+)$" } });
        let lookahead = json!({ "type": "object", "patternProperties": { "^(?!x)": { "type": "string" } } });
        for schema in [&backreference, &lookahead] {
            assert!(CompiledSchema::compile(schema).is_ok(), "the host's may: {schema}");
            assert!(CompiledSchema::compile_by(schema, SchemaAuthor::Untrusted).is_err(), "{schema}");
        }
        // ECMA-262 syntax the linear engine runs is read as it is for the host's.
        let digits = json!({ "type": "string", "pattern": "^\\d{3}-[A-Z]+$" });
        let untrusted = CompiledSchema::compile_by(&digits, SchemaAuthor::Untrusted).unwrap();
        assert!(untrusted.check(&json!("123-AB")).is_ok());
        assert!(untrusted.check(&json!("12-AB")).is_err());
        // The same text compiled for the host is not served from the cache to an untrusted
        // author, nor the reverse.
        assert!(CompiledSchema::compile_by(&backreference, SchemaAuthor::Untrusted).is_err(), "after the host's compile");
    }

    #[test]
    fn violations_quote_a_huge_value_only_in_part() {
        let s = CompiledSchema::compile(&json!({ "type": "object", "properties": { "n": { "type": "number" } } })).unwrap();
        let err = s.check(&json!({ "n": "x".repeat(1 << 20) })).unwrap_err();
        assert!(err.starts_with("/n: \"xxx"), "{}", &err[..40]);
        assert!(err.chars().count() <= MAX_VIOLATION_CHARS + 1, "{} chars", err.len());
    }

    #[test]
    fn rejects_a_schema_that_is_not_json_schema() {
        assert!(CompiledSchema::compile(&json!({ "type": "no-such-type" })).is_err());
    }
}
