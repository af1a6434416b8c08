//! Content hashes: sha256 over the canonical JSON (object keys sorted, no whitespace) of a
//! tool's name, description, schemas, implementation and test cases. Scope, provenance,
//! verdicts and stats are not content.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::forge::ForgeRequest;

/// Canonical JSON text: keys sorted at every level, compact.
pub fn canonical_json(v: &Value) -> String {
    let mut out = Vec::new();
    write(v, &mut out);
    // serde_json writes UTF-8, and writing into a Vec cannot fail.
    String::from_utf8(out).unwrap_or_default()
}

fn write(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(&str, &Value)> = m.iter().map(|(k, x)| (k.as_str(), x)).collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            write_object(entries, out);
        }
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(x, out);
            }
            out.push(b']');
        }
        leaf => {
            let _ = serde_json::to_writer(&mut *out, leaf);
        }
    }
}

/// An object from entries already in key order.
fn write_object<'a>(entries: impl IntoIterator<Item = (&'a str, &'a Value)>, out: &mut Vec<u8>) {
    out.push(b'{');
    for (i, (k, x)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut *out, k);
        out.push(b':');
        write(x, out);
    }
    out.push(b'}');
}

/// The content hash of a request (hex sha256). The canonical object is written from the
/// request's fields in sorted key order, so the schemas are not copied into an intermediate
/// object.
pub fn content_hash(request: &ForgeRequest) -> String {
    let typed = |v: Result<Value, serde_json::Error>| v.unwrap_or(Value::Null);
    let implementation = typed(serde_json::to_value(&request.implementation));
    let test_cases = typed(serde_json::to_value(&request.test_cases));
    let (name, description) = (Value::String(request.name.clone()), Value::String(request.description.clone()));
    let mut out = Vec::with_capacity(1024);
    let fields = [
        ("description", &description),
        ("implementation", &implementation),
        ("inputSchema", &request.input_schema),
        ("name", &name),
        ("outputSchema", &request.output_schema),
        ("testCases", &test_cases),
    ];
    write_object(fields, &mut out);
    let digest = Sha256::digest(&out);
    const HEX: &[u8; 16] = b"0123456789abcdef";
    digest.iter().flat_map(|b| [HEX[usize::from(b >> 4)] as char, HEX[usize::from(b & 15)] as char]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Hashes are persisted and carried in exported packages: the canonical form must not
    /// drift (escapes, key order, number text), whatever the implementation.
    #[test]
    fn the_content_hash_of_a_fixed_request_never_changes() {
        let v = json!({"name":"slugify","description":"Turn \"text\" into a slug é ✓ \u{1}","inputSchema":{"type":"object","properties":{"text":{"type":"string"},"b":{"type":"number"}},"required":["text"]},"outputSchema":{"type":"object","properties":{"slug":{"type":"string"}}},"implementation":{"mode":"sandbox","code":"function execute(input){return {slug:input.text.toLowerCase().replace(/[^a-z0-9]+/g,'-')};}\n\t"},"testCases":[{"input":{"text":"Hello World!","n":1.5e300},"expectedOutput":{"slug":"hello-world"}},{"input":{"text":"x"}}]});
        let request = crate::forge::normalize(&v).unwrap();
        assert_eq!(content_hash(&request), "6475a06fe933e3f14177c21ef8033f00726a968b4319753f964f3440fbe038fd");
        assert_eq!(canonical_json(&json!({"b": [1, "\u{1}"], "a": {"d": null, "c": true}})), r#"{"a":{"c":true,"d":null},"b":[1,"\u0001"]}"#);
    }
}
