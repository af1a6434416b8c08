//! Schema inference from test cases (spec scope item 2): when the model forgot `properties`,
//! the input schema is inferred from the union of the fields across all test inputs, and the
//! output schema from the expected outputs, with JSON types taken from the values. A declared
//! schema that already has properties (or a non-object `type`) is never touched, so inference
//! can only fill gaps, never relax what the model declared.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::request::{type_name, ForgeRequest};

/// Whether `schema` declares nothing usable: an object schema (or one with no type) without
/// properties; an object type written as a list (`["object"]`, `["object", "null"]`) is one
/// too, and a list naming any other type declares that type. A map (`additionalProperties` or
/// `patternProperties` given as a schema, as a word count's output is) declares its values,
/// not fixed keys: it is usable as it is.
pub fn lacks_properties(schema: &Value) -> bool {
    let Value::Object(m) = schema else { return true };
    let object_typed = match m.get("type") {
        None => true,
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(types)) => types.iter().any(|t| t == "object") && types.iter().all(|t| t == "object" || t == "null"),
        Some(_) => false,
    };
    let map = ["additionalProperties", "patternProperties"].iter().any(|k| m.get(*k).is_some_and(Value::is_object));
    object_typed && !map && m.get("properties").and_then(Value::as_object).is_none_or(|p| p.is_empty())
}

/// Merges a set of observed types into one `type` value.
fn merge_types(mut types: Vec<&'static str>) -> Value {
    types.sort_unstable();
    types.dedup();
    if types.len() == 1 {
        Value::String(types[0].into())
    } else {
        Value::Array(types.into_iter().map(|t| Value::String(t.into())).collect())
    }
}

/// Infers an object schema from sample objects; `None` when no sample is an object.
/// Fields present in every sample are `required`.
pub fn infer_object_schema(samples: &[&Value]) -> Option<Value> {
    let objects: Vec<&Map<String, Value>> = samples.iter().filter_map(|v| v.as_object()).collect();
    if objects.is_empty() {
        return None;
    }
    let mut fields: BTreeMap<&str, Vec<&'static str>> = BTreeMap::new();
    for o in &objects {
        for (k, v) in o.iter() {
            fields.entry(k.as_str()).or_default().push(type_name(v));
        }
    }
    let required: Vec<&str> = fields.keys().copied().filter(|k| objects.iter().all(|o| o.contains_key(*k))).collect();
    // A field `null` in every sample says nothing of its type: `{"type":"null"}` would refuse
    // every value a later call gives it (or a later output holds), so it is left open.
    let schema = |t: Vec<&'static str>| if t.iter().all(|t| *t == "null") { json!({}) } else { json!({ "type": merge_types(t) }) };
    let properties: Map<String, Value> = fields.into_iter().map(|(k, t)| (k.to_string(), schema(t))).collect();
    Some(json!({ "type": "object", "properties": properties, "required": required }))
}

/// Keeps every keyword the model declared (e.g. `additionalProperties`, `required`) and fills
/// in the inferred `type`/`properties`/`required` only where missing. The declared
/// `properties` is the gap being filled (empty, `null` or not a mapping): it never stays.
fn fill(declared: &Value, inferred: Value) -> Value {
    let mut out = inferred.as_object().cloned().unwrap_or_default();
    if let Value::Object(d) = declared {
        for (k, v) in d {
            if k != "properties" {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// Fills the input and output schemas of `request` from its test cases where they lack
/// properties. Returns which schemas were inferred (`input`, `output`).
pub fn infer_schemas(request: &mut ForgeRequest) -> Vec<&'static str> {
    let mut inferred = vec![];
    if lacks_properties(&request.input_schema) {
        let inputs: Vec<&Value> = request.test_cases.iter().map(|c| &c.input).collect();
        if let Some(schema) = infer_object_schema(&inputs) {
            request.input_schema = fill(&request.input_schema, schema);
            inferred.push("input");
        }
    }
    if lacks_properties(&request.output_schema) {
        let outputs: Vec<&Value> = request.test_cases.iter().filter_map(|c| c.expected_output.as_ref()).collect();
        if let Some(mut schema) = infer_object_schema(&outputs) {
            // An expected output that is no object (`null` for "not found") keeps its type:
            // the object's alone would fail that test against the schema inferred from it.
            schema["type"] = merge_types(outputs.iter().map(|v| type_name(v)).collect());
            request.output_schema = fill(&request.output_schema, schema);
            inferred.push("output");
        } else if !outputs.is_empty() && !request.output_schema.as_object().is_some_and(|m| m.contains_key("type")) {
            // Scalar or array outputs: the type of the expected values.
            let types = outputs.iter().map(|v| type_name(v)).collect();
            request.output_schema = fill(&request.output_schema, json!({ "type": merge_types(types) }));
            inferred.push("output");
        }
    }
    inferred
}
