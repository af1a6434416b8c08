//! Export and import of a tool as a portable YAML package, format id `crucible.tool.v1`.
//!
//! A package carries the tool's content (name, description, schemas, implementation, test
//! cases), its content hash, version, verdict and provenance. Sandbox source is redacted
//! (`redacted: true`, no `code`) unless `persistSandboxSource` is set; a redacted package
//! cannot be imported. Import verifies the content hash, re-runs the whole forge pipeline
//! (tests and judge) and lands the tool in the session tier; a package identical (content
//! hash) to the tool the session is already offered under its name answers with that tool
//! unchanged, as the same forge again does.
//!
//! Packages of the `agentos.emergent-tool.v1` shape (as `@framers/agentos` writes them:
//! `schemaVersion`, content fields under `tool`, sandbox redaction marked by
//! `implementation.redactedAtRest` / `sourcePersisted: false`) are read where fields match,
//! snake_case accepted, the hash under `hash`/`contentHash`/`content_hash` (optionally
//! `sha256:`-prefixed). Such a package without a hash is accepted, since it is fully
//! re-verified by tests and judge anyway; a hash that is present must match. agentos packages
//! carry no test cases: the importer supplies them ([`ImportOptions::test_cases`]), and a
//! package with none from either side is refused, since nothing could be re-run.
//!
//! A package may be YAML or JSON. The YAML reader follows YAML 1.1, where NEL, U+2028 and U+2029
//! are line breaks: written raw (as agentos does), they are kept in an agentos JSON package and
//! refused in an agentos YAML one, never folded away.
//!
//! A package is untrusted input of bounded size ([`MAX_PACKAGE_BYTES`]), and reading it is
//! bounded too ([`MAX_EXPANDED_BYTES`]): YAML aliases repeat the value they name (the `yaml`
//! package agentos writes with makes them for repeated objects), so a few kilobytes of aliases
//! to aliases would otherwise expand to gigabytes.

use std::cell::Cell;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::agent::{unless_cancelled, CancelSignal};
use crate::forge::{normalize, type_name, ForgeOrigin, ForgeRequest, ForgeResult, ForgeTestCase, Implementation, Verdict, TEST_CASE_KEYS};
use crate::js_json::well_formed;

use super::{content_hash, Registry, RegistryError, Tier, ToolRecord};

/// This crate's package format id.
pub const PACKAGE_FORMAT: &str = "crucible.tool.v1";
/// The peer format read on import.
pub const AGENTOS_FORMAT: &str = "agentos.emergent-tool.v1";

/// A portable tool package (serialized as YAML).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolPackage {
    pub format: String,
    pub name: String,
    pub description: String,
    pub version: u32,
    /// sha256 hex of the canonical content (computed with the source present).
    pub hash: String,
    pub mode: String,
    pub input_schema: Value,
    pub output_schema: Value,
    pub implementation: Implementation,
    pub test_cases: Vec<ForgeTestCase>,
    /// True when the sandbox source was left out.
    #[serde(default)]
    pub redacted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    #[serde(default)]
    pub provenance: Value,
}

/// What the importer adds to a package (the TS `import(pkg, { sessionId, testCases })`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportOptions {
    /// Test cases for a package that carries none; ignored when the package has its own.
    /// Read as a request's are (`expected` for `expectedOutput`…): kept raw until then, as a
    /// typed list would drop the keys it does not name.
    #[serde(default)]
    pub test_cases: Vec<Value>,
}

fn invalid(msg: impl Into<String>) -> RegistryError {
    RegistryError::InvalidPackage(msg.into())
}

/// Largest package text accepted.
pub const MAX_PACKAGE_BYTES: usize = 2 << 20;

/// Most bytes (roughly, in memory) a package may expand to while it is read.
pub const MAX_EXPANDED_BYTES: usize = 8 << 20;

/// Deepest nesting of flow collections (`[`, `{`) a package may open: the YAML reader refuses
/// values nested past 128 levels anyway. It does so only after scanning ahead through every
/// collection opened, at a cost that grows with the square of their number (80,000 brackets
/// held the host's thread for 12.6 s in wasm; the 2 MiB a package may be, half an hour), so
/// the nesting is checked first by a scan that stops at this depth.
pub const MAX_FLOW_NESTING: usize = 128;

/// Whether YAML `text` nests flow collections more than `max` deep, as the YAML reader's own
/// scanner reads it (quotes, comments and block scalars as it sees them: brackets in a string
/// or in code are not collections, and a quoted `]` closes nothing), stopping as soon as it
/// does. A text the scanner cannot read is left to the reader, which reports why.
fn flow_nesting_exceeds(text: &str, max: usize) -> bool {
    use std::mem::MaybeUninit;
    use unsafe_libyaml_norway as unsafe_sys;

    /// The scanner's state, deleted on drop. Boxed: once given input it points at itself.
    struct Scanner(Box<MaybeUninit<unsafe_sys::yaml_parser_t>>);
    impl Drop for Scanner {
        fn drop(&mut self) {
            // SAFETY: initialized in `flow_nesting_exceeds` before the value was made.
            unsafe { unsafe_sys::yaml_parser_delete(self.0.as_mut_ptr()) }
        }
    }
    /// A scanned token, its buffers freed on drop.
    struct Token(MaybeUninit<unsafe_sys::yaml_token_t>);
    impl Drop for Token {
        fn drop(&mut self) {
            // SAFETY: `yaml_parser_scan` zeroes the token before anything else, so it is
            // initialized (empty on failure), and its buffers are freed once, here.
            unsafe { unsafe_sys::yaml_token_delete(self.0.as_mut_ptr()) }
        }
    }

    let mut scanner = Box::new(MaybeUninit::<unsafe_sys::yaml_parser_t>::uninit());
    // SAFETY: `yaml_parser_initialize` zeroes and sets up the parser (it cannot fail), and the
    // input, `text`, outlives the scanner, which is dropped at the end of this function.
    let mut scanner = unsafe {
        let _ = unsafe_sys::yaml_parser_initialize(scanner.as_mut_ptr());
        unsafe_sys::yaml_parser_set_encoding(scanner.as_mut_ptr(), unsafe_sys::YAML_UTF8_ENCODING);
        unsafe_sys::yaml_parser_set_input_string(scanner.as_mut_ptr(), text.as_ptr(), text.len() as u64);
        Scanner(scanner)
    };
    let mut depth = 0usize;
    loop {
        let mut token = Token(MaybeUninit::uninit());
        // SAFETY: both pointers are valid; the token is read only after the scan wrote it.
        let kind = unsafe {
            if unsafe_sys::yaml_parser_scan(scanner.0.as_mut_ptr(), token.0.as_mut_ptr()).fail {
                return false;
            }
            (*token.0.as_ptr()).type_
        };
        match kind {
            unsafe_sys::YAML_FLOW_SEQUENCE_START_TOKEN | unsafe_sys::YAML_FLOW_MAPPING_START_TOKEN => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            unsafe_sys::YAML_FLOW_SEQUENCE_END_TOKEN | unsafe_sys::YAML_FLOW_MAPPING_END_TOKEN => depth = depth.saturating_sub(1),
            unsafe_sys::YAML_STREAM_END_TOKEN | unsafe_sys::YAML_NO_TOKEN => return false,
            _ => {}
        }
    }
}

/// Reads a YAML or JSON value as a [`Value`], charging every node against a byte budget as it
/// is built (aliases' repeats included), and refusing a mapping that gives a key twice.
struct Budgeted<'b>(&'b Reading);

/// What a [`Budgeted`] read has left and has found.
struct Reading {
    /// Bytes it may still build.
    left: Cell<usize>,
    /// A mapping gave a key twice: its error is the package's, not the reader's (no "not YAML").
    repeated_key: Cell<bool>,
}

impl Reading {
    fn new(budget: usize) -> Self {
        Self { left: Cell::new(budget), repeated_key: Cell::new(false) }
    }
}

/// What one element, entry or collection is charged: about what it holds in memory (a
/// `Value` and its slot), not its few bytes of JSON, so aliases of empty collections
/// (`[*a, *a, …]` with `a: [[], [], …]`) cannot expand to hundreds of MiB within the budget.
const NODE_BYTES: usize = 32;

impl Budgeted<'_> {
    fn charge<E: serde::de::Error>(&self, bytes: usize) -> Result<(), E> {
        let left = self.0.left.get().checked_sub(bytes).ok_or_else(|| E::custom(format!("the package expands to more than {MAX_EXPANDED_BYTES} bytes")))?;
        self.0.left.set(left);
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Budgeted<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Budgeted<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Value, E> {
        self.charge(5)?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        self.charge(8)?;
        Ok(v.into())
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        self.charge(8)?;
        Ok(v.into())
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        self.charge(8)?;
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        self.charge(v.len() + 2)?;
        Ok(Value::String(v.to_string()))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        self.charge(4)?;
        Ok(Value::Null)
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.charge(NODE_BYTES)?;
        let mut items = vec![];
        while let Some(item) = seq.next_element_seed(Budgeted(self.0))? {
            self.charge(NODE_BYTES)?;
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.charge(NODE_BYTES)?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            self.charge(key.len() + NODE_BYTES)?;
            let value = map.next_value_seed(Budgeted(self.0))?;
            // Parsers keep the last, a reader sees the first: what was reviewed (by eye, or by
            // the exporter's judge) would not be what is imported.
            if out.contains_key(&key) {
                self.0.repeated_key.set(true);
                return Err(serde::de::Error::custom(format!("a mapping gives twice the key `{}`", crate::tools::shorten(&key, 64))));
            }
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// Characters the YAML reader (YAML 1.1) takes for line breaks, folding them and the spaces
/// around them away, where the JSON and YAML 1.2 agentos writes hold them as text: NEL, LINE
/// SEPARATOR, PARAGRAPH SEPARATOR.
const YAML_1_1_BREAKS: [char; 3] = ['\u{85}', '\u{2028}', '\u{2029}'];

/// Parses package text, within [`MAX_PACKAGE_BYTES`] and [`MAX_EXPANDED_BYTES`], and says
/// whether it was read as YAML: JSON text (agentos also writes packages as JSON) is read as JSON,
/// so its strings keep every character.
fn read_package(text: &str) -> Result<(Value, bool), RegistryError> {
    if text.len() > MAX_PACKAGE_BYTES {
        return Err(invalid(format!("the package is {} bytes; at most {MAX_PACKAGE_BYTES}", text.len())));
    }
    // Editors on Windows write a byte order mark first; the YAML reader took it for a second
    // document ("more than one document").
    let text = text.strip_prefix('\u{FEFF}').unwrap_or(text);
    // JSON has no aliases: what it holds grows with its text, which is bounded above.
    let json = Reading::new(usize::MAX);
    // A package written by `JSON.stringify` holds a lone surrogate (a description cut inside an
    // emoji) as a `\udXXX` escape: read as U+FFFD, as everywhere else in the runtime.
    match read_json(&well_formed(text), &json) {
        Ok(value) => return Ok((value, false)),
        // Read as YAML, it would be refused the same way, but called no YAML.
        Err(e) if json.repeated_key.get() => return Err(invalid(e.to_string())),
        Err(_) => {}
    }
    if flow_nesting_exceeds(text, MAX_FLOW_NESTING) {
        return Err(invalid(format!("the package nests flow collections ([…], {{…}}) more than {MAX_FLOW_NESTING} deep")));
    }
    let yaml = Reading::new(MAX_EXPANDED_BYTES);
    let value = Budgeted(&yaml)
        .deserialize(serde_norway::Deserializer::from_str(text))
        .map_err(|e| invalid(if yaml.repeated_key.get() { e.to_string() } else { format!("not YAML: {e}") }))?;
    Ok((value, true))
}

/// `text` read as one JSON value by [`Budgeted`], as `reading` says: a key given twice is
/// refused, as in YAML.
fn read_json(text: &str, reading: &Reading) -> Result<Value, serde_json::Error> {
    let mut reader = serde_json::Deserializer::from_str(text);
    let value = Budgeted(reading).deserialize(&mut reader)?;
    reader.end()?;
    Ok(value)
}

/// Refuses agentos YAML holding a character of [`YAML_1_1_BREAKS`] raw, as agentos writes them:
/// the reader may have folded it, and nothing would tell (such packages need no hash). This
/// crate's own packages read them back as written, and their hash would catch a change.
fn refuse_folded_breaks(text: &str) -> Result<(), RegistryError> {
    let Some(at) = text.find(YAML_1_1_BREAKS) else { return Ok(()) };
    let (line, c) = (text[..at].matches('\n').count() + 1, text[at..].chars().next().map_or(0, u32::from));
    Err(invalid(format!(
        "the package holds a raw U+{c:04X} (line {line}), which this YAML reader takes for a line break: escape it (\\u{c:04X} in double quotes) or send the package as JSON"
    )))
}

/// A package's `provenance`: who holds the tool and since when, and, for a tool imported
/// here, where its own package said it came from. Exported by another agent than the one that
/// forged it (a shared tool), it leaves out the forging session's id and scope label: they are
/// that agent's (a tenant's ticket or user, say), not the exporter's to hand out.
fn provenance(r: &ToolRecord, tier: Tier, exporter: &str) -> Value {
    let own = r.origin.agent_id == exporter;
    let mut provenance = json!({
        "agentId": r.origin.agent_id,
        "sessionId": own.then_some(&r.origin.session_id),
        "scope": r.origin.scope.as_ref().filter(|_| own),
        "tier": tier,
        "createdAt": r.current.created_at,
    });
    if let (Some(from), Value::Object(map)) = (&r.origin.imported_from, &mut provenance) {
        map.insert("importedFrom".into(), Value::String(from.clone()));
    }
    provenance
}

/// A redacted package's verdict reasoning (the judge's own words may quote the source).
const REDACTED_REASONING: &str = "(redacted with the sandbox source)";

impl Registry {
    /// Exports the tool `session` reaches as `name` as a YAML package. A forged tool stored
    /// under one of the agent's own tools' names is not exported ([`RegistryError::OwnTool`]):
    /// a package is what the agent serves under that name, and it serves its own tool.
    pub fn export(&self, name: &str, session: &str) -> Result<String, RegistryError> {
        self.refuse_own_tool(name)?;
        let package = {
            let state = self.state.borrow();
            let (tier, entry) = state.resolve(name, session).ok_or_else(|| RegistryError::NotFound(name.into()))?;
            let r = &entry.record;
            let req = &r.current.request;
            let mut implementation = req.implementation.clone();
            let mut redacted = false;
            if let Implementation::Sandbox { code, .. } = &mut implementation {
                if !self.config().persist_sandbox_source {
                    *code = None;
                    redacted = true;
                }
            }
            ToolPackage {
                format: PACKAGE_FORMAT.into(),
                name: r.name.clone(),
                description: req.description.clone(),
                version: r.current.version,
                hash: r.current.hash.clone(),
                mode: req.implementation.mode().into(),
                input_schema: req.input_schema.clone(),
                output_schema: req.output_schema.clone(),
                implementation,
                test_cases: req.test_cases.clone(),
                redacted,
                // The judge read the source and may quote it: its reasoning goes with it.
                verdict: r.current.verdict.clone().map(|mut v| {
                    if redacted {
                        v.reasoning = REDACTED_REASONING.into();
                    }
                    v
                }),
                provenance: provenance(r, tier, &self.agent_id),
            }
        };
        serde_norway::to_string(&package).map_err(|e| invalid(format!("cannot serialize: {e}")))
    }

    /// Imports a package into the session tier of `session`: rejects redacted packages and
    /// content hash mismatches, then re-runs normalization, tests and the judge (unless the
    /// package is the tool the session already reaches under its name: that tool is the
    /// result, `unchanged`). Package problems are errors; a failed verification is a rejected
    /// [`ForgeResult`].
    pub async fn import(&self, package: &str, session: &str) -> Result<ForgeResult, RegistryError> {
        self.import_with(package, session, &ImportOptions::default()).await
    }

    /// [`Registry::import`] with test cases for a package that carries none. A package refused
    /// before its tests (unreadable, redacted, its hash not matching) is audited as
    /// `import.refused`, under the name it gives when it can be read: a tampered package is
    /// worth a trace. The agent closed while the package was verified: [`RegistryError::Closed`].
    pub async fn import_with(&self, package: &str, session: &str, options: &ImportOptions) -> Result<ForgeResult, RegistryError> {
        self.import_cancellable(package, session, options, None, "").await?.ok_or(RegistryError::Closed)
    }

    /// [`Registry::import_with`] that `cancel` stops while the package's tests and judge run
    /// (`Ok(None)`: nothing was recorded), as [`Registry::forge_cancellable`] does a forge; its
    /// judge and the host tools its tests call get `calls_run_id` as their run id.
    pub async fn import_cancellable(
        &self,
        package: &str,
        session: &str,
        options: &ImportOptions,
        cancel: Option<&dyn CancelSignal>,
        calls_run_id: &str,
    ) -> Result<Option<ForgeResult>, RegistryError> {
        let mut name = String::new();
        let (request, imported_from) = match read_import(package, options, &mut name) {
            Ok(read) => read,
            Err(error) => return Err(self.refuse_import(error, &name, session).await),
        };
        let origin = ForgeOrigin {
            agent_id: self.agent_id().to_string(),
            session_id: session.to_string(),
            scope: request.scope.clone(),
            calls_run_id: calls_run_id.to_string(),
            imported_from,
            ..Default::default()
        };
        let request_value = serde_json::to_value(&request).map_err(|e| invalid(e.to_string()))?;
        let ticket = self.ticket(session);
        let Some(checked) = unless_cancelled(cancel, self.verify(&request_value, &origin, &self.lookup())).await else { return Ok(None) };
        // As for a forge: a failure in the poll that cancels is the abort's doing, and tests
        // cut short by closing the agent are no verdict on the tool.
        if cancel.is_some_and(|c| c.is_cancelled()) || self.is_closed() {
            return Ok(None);
        }
        Ok(Some(self.settle(checked, &origin, &ticket, "import").await))
    }

    /// Audits a package refused before its tests as `import.refused`, under the tool name it
    /// gives (empty when it could not be read), and hands back the error.
    pub async fn refuse_import(&self, error: RegistryError, name: &str, session: &str) -> RegistryError {
        let ops = self.audit(&mut self.state.borrow_mut(), "import.refused", name, None, None, error.to_string(), Some(session).into());
        let _ = self.persist(ops).await; // best effort, as for a rejection: the error stands
        error
    }
}

/// The refusal of a package of `units` UTF-16 units, for a host that measures one before it
/// copies it in: each unit is at least one byte of UTF-8, so more units than
/// [`MAX_PACKAGE_BYTES`] are more bytes than a package may be.
pub fn oversized_package(units: usize) -> Option<RegistryError> {
    (units > MAX_PACKAGE_BYTES).then(|| invalid(format!("the package is {units} characters, more than the {MAX_PACKAGE_BYTES} bytes a package may be")))
}

/// Where a package says its tool came from, as one short line for the importer's record and
/// audit trail: this crate's `provenance` (agent, session, tier, and `importedFrom` when the
/// exporter had imported it) and `version`, or agentos' `createdBy`, `originalTier` and
/// `source`. `None` when it says nothing readable.
fn stated_origin(top: &Map<String, Value>) -> Option<String> {
    let provenance = top.get("provenance").and_then(Value::as_object);
    // The package's words go into an audit line: line breaks and other controls become spaces.
    let one_line = |s: &str, most: usize| crate::tools::shorten(&s.trim().replace(char::is_control, " "), most);
    let field = |key: &str, agentos: &str| {
        provenance.and_then(|p| p.get(key)).or_else(|| top.get(agentos)).and_then(|v| match v {
            Value::String(s) if !s.trim().is_empty() => Some(one_line(s, 80)),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
    };
    let parts: Vec<String> = [
        field("agentId", "createdBy").map(|a| format!("agent `{a}`")),
        field("sessionId", "sessionId").map(|s| format!("session `{s}`")),
        field("tier", "originalTier").map(|t| format!("{t} tier")),
        field("version", "version").map(|v| format!("v{v}")),
        field("source", "source").map(|s| format!("“{s}”")),
        // A package exported by an importer: where it had the tool from, or a second import
        // would keep only the last hop. Shortened, so the line stays short hop after hop.
        provenance
            .and_then(|p| p.get("importedFrom"))
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty())
            .map(|s| format!("imported from {}", one_line(s, IMPORTED_FROM_CHARS))),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// Most characters of the earlier origin a package states that an import keeps.
const IMPORTED_FROM_CHARS: usize = 240;

/// The forge request a package holds, checked as a package (format, redaction, content hash),
/// and where the package says it came from ([`stated_origin`]). `name` gets the tool name the
/// package gives as soon as it is read, for the audit of a refusal.
fn read_import(package: &str, options: &ImportOptions, name: &mut String) -> Result<(ForgeRequest, Option<String>), RegistryError> {
    let (raw, yaml) = read_package(package)?;
    let Value::Object(mut top) = raw else { return Err(invalid("the package must be a mapping")) };
    let format = ["format", "schemaVersion", "schema_version", "kind"].iter().find_map(|k| top.get(*k).and_then(Value::as_str)).unwrap_or_default().to_string();
    if format != PACKAGE_FORMAT && format != AGENTOS_FORMAT {
        return Err(invalid(format!("unknown format `{format}`; expected `{PACKAGE_FORMAT}` or `{AGENTOS_FORMAT}`")));
    }
    if yaml && format == AGENTOS_FORMAT {
        refuse_folded_breaks(package)?;
    }
    if let Some(Value::Object(tool)) = top.remove("tool") {
        for (k, v) in tool {
            top.entry(k).or_insert(v);
        }
    }
    if let Some(Value::String(given)) = top.get("name") {
        *name = crate::tools::shorten(given, 64);
    }
    let implementation = top.get("implementation");
    let redacted_at_rest = implementation.and_then(|i| i.get("redactedAtRest")).and_then(Value::as_bool) == Some(true)
        || implementation.and_then(|i| i.get("sourcePersisted")).and_then(Value::as_bool) == Some(false);
    let redacted = top.get("redacted").and_then(Value::as_bool).unwrap_or(false) || redacted_at_rest;
    // An empty list carries none either (an exporter writing `testCases: []`).
    let carries = |v: &Value| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty());
    if TEST_CASE_KEYS.iter().any(|k| top.get(*k).is_some_and(carries)) {
        // Its own cases are what its content hash and its judge's review covered; the
        // importer's would be dropped without a word.
        if !options.test_cases.is_empty() {
            return Err(invalid("the package carries its own test cases, which are re-run; `testCases` is for a package that carries none (an agentos one)"));
        }
    } else {
        if options.test_cases.is_empty() {
            return Err(invalid("the package carries no test cases (agentos packages never do), so nothing could be re-run: pass `testCases` with the import"));
        }
        top.insert("testCases".into(), Value::Array(options.test_cases.clone()));
    }
    let body = Value::Object(top.clone());
    let request = normalize(&body)
        .map_err(|e| invalid(if redacted { "the sandbox source is redacted; a redacted package cannot be imported".to_string() } else { e.to_string() }))?;
    if redacted || matches!(&request.implementation, Implementation::Sandbox { code: None, .. }) {
        return Err(invalid("the sandbox source is redacted; a redacted package cannot be imported"));
    }
    // A hash that is there must be one: a number or a mapping in its place is not "no hash".
    let declared = match ["hash", "contentHash", "content_hash"].iter().find_map(|k| top.get(*k).map(|v| (*k, v))) {
        None | Some((_, Value::Null)) => None,
        Some((_, Value::String(h))) => Some(h.to_ascii_lowercase().trim_start_matches("sha256:").to_string()),
        Some((key, other)) => return Err(invalid(format!("the package's `{key}` must be a string, not a JSON {}", type_name(other)))),
    };
    let actual = content_hash(&request);
    match declared {
        Some(h) if h != actual => return Err(invalid(format!("content hash mismatch: the package says {h}, the content hashes to {actual}"))),
        None if format == PACKAGE_FORMAT => return Err(invalid("the package has no content hash")),
        _ => {}
    }
    Ok((request, stated_origin(&top)))
}
