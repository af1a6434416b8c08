//! Content hashes: sha256 over the canonical JSON (object keys sorted, no whitespace) of a
//! tool's name, description, schemas, implementation and test cases. Scope, provenance,
//! verdicts and stats are not content.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::forge::ForgeRequest;

/// Canonical JSON text: keys sorted at every level, compact.
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write(v, &mut out);
    out
}

fn write(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The content hash of a request (hex sha256).
pub fn content_hash(request: &ForgeRequest) -> String {
    let content = json!({
        "name": request.name,
        "description": request.description,
        "inputSchema": request.input_schema,
        "outputSchema": request.output_schema,
        "implementation": request.implementation,
        "testCases": request.test_cases,
    });
    let digest = Sha256::digest(canonical_json(&content).as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
