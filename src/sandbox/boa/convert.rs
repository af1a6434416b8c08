//! Our own value converter between guest values and JSON, both ways.
//!
//! Guest → JSON is iterative (an explicit stack, never Rust recursion) and checks depth, node
//! count and byte caps *before* allocating. It reads only own data properties straight from the
//! object's property storage: it never calls getters, `toJSON`, `valueOf`, Proxy traps or
//! `then`. Proxies, own accessors, BigInts and cycles are errors; shared references (a DAG)
//! are copied and bounded by the node cap. JSON semantics otherwise: `undefined`, functions and
//! symbols are omitted from objects and become `null` in arrays; non-finite numbers are `null`;
//! holes are `null`; symbol-keyed and non-enumerable properties are skipped.
//!
//! JSON → guest builds plain objects with `CreateDataProperty`, so `__proto__` in input is an
//! ordinary own key and never a prototype change.

use boa_engine::{
    builtins::proxy::Proxy,
    js_string,
    object::{
        builtins::{JsArray, JsTypedArray},
        JsObject,
    },
    property::PropertyKey,
    Context, JsResult, JsString, JsValue,
};
use serde_json::{Map, Number, Value};

/// Caps for one conversion.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caps {
    pub max_depth: usize,
    pub max_nodes: usize,
    pub max_bytes: usize,
}

/// Why a guest value could not become JSON.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ConvertError(pub String);

impl std::fmt::Display for ConvertError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, ConvertError> {
    Err(ConvertError(msg.into()))
}

enum Kind {
    Array { len: u32, next: u32, out: Vec<Value> },
    Object { keys: Vec<PropertyKey>, next: usize, out: Map<String, Value>, pending: Option<String> },
}

struct Frame {
    obj: JsObject,
    kind: Kind,
}

/// What a single value is, before descending.
enum Classified {
    Leaf(Value),
    /// `undefined`, a function or a symbol: omitted from objects, `null` in arrays.
    Skip,
    Container(JsObject),
}

struct Budget {
    caps: Caps,
    nodes: usize,
    bytes: usize,
}

impl Budget {
    fn node(&mut self, bytes: usize) -> Result<(), ConvertError> {
        self.nodes += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        if self.nodes > self.caps.max_nodes {
            return err(format!("value has more than {} nodes", self.caps.max_nodes));
        }
        if self.bytes > self.caps.max_bytes {
            return err(format!("value is larger than {} bytes", self.caps.max_bytes));
        }
        Ok(())
    }
}

fn number(n: f64) -> Value {
    if !n.is_finite() {
        return Value::Null;
    }
    if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 {
        return Value::Number(Number::from(n as i64));
    }
    Number::from_f64(n).map_or(Value::Null, Value::Number)
}

/// How many bytes serde_json writes for `n`, at most: an integer's digits and sign, and 24 for
/// any other number (`-1.2345678901234567e-300`), so an array of long fractions cannot pass
/// the byte cap at a third of its JSON size.
fn number_len(n: &Value) -> usize {
    match n.as_i64() {
        Some(i) => i.unsigned_abs().checked_ilog10().map_or(1, |d| d as usize + 1) + usize::from(i < 0),
        None => 24,
    }
}

/// How many bytes serde_json writes for `text` inside a JSON string: a control character is
/// `\uXXXX` (6 bytes) or, for five of them, two (`\n`), and `"` and `\` are two. The byte cap
/// counts this, so it bounds the JSON text the host receives: `'\x01'.repeat(4e6)` is 4 MB of
/// UTF-8 but 24 MB of JSON.
fn json_len(text: &str) -> usize {
    text.bytes().fold(text.len(), |n, b| match b {
        b'\n' | b'\t' | b'\r' | 0x08 | 0x0c | b'"' | b'\\' => n + 1,
        0..=0x1f => n + 5,
        _ => n,
    })
}

fn string(s: &JsString, budget: &mut Budget) -> Result<Value, ConvertError> {
    // At least one JSON byte per UTF-16 unit: check that bound before converting.
    budget.node(2)?;
    if budget.bytes.saturating_add(s.len()) > budget.caps.max_bytes {
        return err(format!("value is larger than {} bytes", budget.caps.max_bytes));
    }
    let text = s.to_std_string_lossy();
    budget.bytes = budget.bytes.saturating_add(json_len(&text));
    if budget.bytes > budget.caps.max_bytes {
        return err(format!("value is larger than {} bytes", budget.caps.max_bytes));
    }
    Ok(Value::String(text))
}

fn classify(value: &JsValue, budget: &mut Budget) -> Result<Classified, ConvertError> {
    if value.is_undefined() || value.is_symbol() {
        return Ok(Classified::Skip);
    }
    if value.is_null() {
        budget.node(4)?;
        return Ok(Classified::Leaf(Value::Null));
    }
    if let Some(b) = value.as_boolean() {
        budget.node(5)?;
        return Ok(Classified::Leaf(Value::Bool(b)));
    }
    if let Some(n) = value.as_number() {
        let n = number(n);
        budget.node(number_len(&n))?;
        return Ok(Classified::Leaf(n));
    }
    if let Some(s) = value.as_string() {
        return Ok(Classified::Leaf(string(&s, budget)?));
    }
    if value.is_bigint() {
        return err("BigInt values cannot be converted to JSON");
    }
    if let Some(obj) = value.as_object() {
        if obj.is::<Proxy>() {
            return err("Proxy objects cannot be converted to JSON");
        }
        if obj.is_callable() {
            return Ok(Classified::Skip);
        }
        return Ok(Classified::Container(obj.clone()));
    }
    err("unsupported value")
}

/// Reads an own property's value without running guest code. `Ok(None)`: absent, or present
/// but not enumerable. Accessors are an error.
fn own_data(obj: &JsObject, key: &PropertyKey) -> Result<Option<JsValue>, ConvertError> {
    let desc = obj.borrow().properties().get(key);
    let Some(desc) = desc else { return Ok(None) };
    if desc.is_accessor_descriptor() {
        return err(format!("property '{key}' is an accessor (getter/setter); return plain data"));
    }
    if !desc.expect_enumerable() {
        return Ok(None);
    }
    Ok(Some(desc.value().cloned().unwrap_or_default()))
}

/// Why `what` does not fit: said of the whole output, which the limit is about (an array of 2
/// past it, after a value shared a million times over, is not itself too long).
fn past_node_limit(budget: &Budget, what: &str) -> String {
    let max = budget.caps.max_nodes;
    match budget.nodes {
        0 => format!("{what} exceeds the output's limit of {max} values (arrays, objects and their members)"),
        so_far => format!("{what} would take the output past its limit of {max} values (arrays, objects and their members; {so_far} so far)"),
    }
}

fn open(obj: JsObject, budget: &mut Budget, context: &mut Context) -> Result<Frame, ConvertError> {
    let room = budget.caps.max_nodes.saturating_sub(budget.nodes);
    if obj.is_array() {
        let len = obj.borrow().properties().get(&js_string!("length").into()).and_then(|d| d.value().and_then(JsValue::as_number)).unwrap_or(0.0);
        let len = len as u64;
        if len > room as u64 {
            return err(past_node_limit(budget, &format!("an array of length {len}")));
        }
        budget.node(2)?;
        return Ok(Frame { obj, kind: Kind::Array { len: len as u32, next: 0, out: Vec::with_capacity(len as usize) } });
    }
    // A String wrapper has a key per character and a typed array one per element, and listing
    // them allocates them all: their size is checked first (`Object('x'.repeat(2e7))` would
    // otherwise allocate ~160 MB of keys before the node limit is looked at).
    let exotic_len = match obj.downcast_ref::<JsString>().map(|s| s.len()) {
        Some(len) => Some(len),
        None => JsTypedArray::from_object(obj.clone()).ok().and_then(|array| array.length(context).ok()),
    };
    if let Some(len) = exotic_len.filter(|len| *len > room) {
        return err(past_node_limit(budget, &format!("an object with {len} indexed keys")));
    }
    let keys = obj.own_property_keys(context).map_err(|e| ConvertError(format!("cannot list properties: {e}")))?;
    if keys.len() > room {
        return err(past_node_limit(budget, &format!("an object with {} keys", keys.len())));
    }
    budget.node(2)?;
    Ok(Frame { obj, kind: Kind::Object { keys, next: 0, out: Map::new(), pending: None } })
}

/// Converts a guest value to JSON without running guest code.
pub(crate) fn to_json(value: &JsValue, caps: Caps, context: &mut Context) -> Result<Value, ConvertError> {
    let mut budget = Budget { caps, nodes: 0, bytes: 0 };
    let root = match classify(value, &mut budget)? {
        Classified::Leaf(v) => return Ok(v),
        Classified::Skip => return Ok(Value::Null),
        Classified::Container(obj) => obj,
    };
    let mut stack: Vec<Frame> = vec![open(root, &mut budget, context)?];
    loop {
        // Next child of the top frame, or None when the frame is complete.
        let child: Option<(JsValue, bool)> = {
            let top = stack.last_mut().expect("stack is non-empty");
            match &mut top.kind {
                Kind::Array { len, next, .. } => {
                    if *next < *len {
                        let key = PropertyKey::from(*next);
                        *next += 1;
                        let v = own_data(&top.obj, &key)?.unwrap_or(JsValue::null());
                        Some((v, true))
                    } else {
                        None
                    }
                }
                Kind::Object { keys, next, pending, .. } => {
                    let mut found = None;
                    while *next < keys.len() {
                        let key = keys[*next].clone();
                        *next += 1;
                        let name = match &key {
                            PropertyKey::String(s) => s.to_std_string_lossy(),
                            PropertyKey::Index(i) => i.get().to_string(),
                            PropertyKey::Symbol(_) => continue,
                        };
                        if let Some(v) = own_data(&top.obj, &key)? {
                            budget.bytes = budget.bytes.saturating_add(json_len(&name) + 4);
                            *pending = Some(name);
                            found = Some((v, false));
                            break;
                        }
                    }
                    found
                }
            }
        };
        let done_value = match child {
            None => {
                let frame = stack.pop().expect("stack is non-empty");
                match frame.kind {
                    Kind::Array { out, .. } => Value::Array(out),
                    Kind::Object { out, .. } => Value::Object(out),
                }
            }
            Some((v, in_array)) => match classify(&v, &mut budget)? {
                Classified::Leaf(leaf) => leaf,
                Classified::Skip if in_array => Value::Null,
                Classified::Skip => {
                    if let Some(Frame { kind: Kind::Object { pending, .. }, .. }) = stack.last_mut() {
                        *pending = None;
                    }
                    continue;
                }
                Classified::Container(obj) => {
                    if stack.iter().any(|f| JsObject::equals(&f.obj, &obj)) {
                        return err("value contains a cycle");
                    }
                    if stack.len() >= caps.max_depth {
                        return err(format!("value is nested deeper than {}", caps.max_depth));
                    }
                    let frame = open(obj, &mut budget, context)?;
                    stack.push(frame);
                    continue;
                }
            },
        };
        match stack.last_mut() {
            None => return Ok(done_value),
            Some(parent) => match &mut parent.kind {
                Kind::Array { out, .. } => out.push(done_value),
                Kind::Object { out, pending, .. } => {
                    if let Some(key) = pending.take() {
                        out.insert(key, done_value);
                    }
                }
            },
        }
    }
}

/// Builds a guest value from JSON with plain objects and arrays. Depth is capped (the host's
/// JSON parser caps it as well), so the recursion is bounded.
pub(crate) fn from_json(value: &Value, max_depth: usize, context: &mut Context) -> JsResult<JsValue> {
    fn build(value: &Value, depth: usize, max_depth: usize, context: &mut Context) -> JsResult<JsValue> {
        if depth > max_depth {
            return Err(boa_engine::JsNativeError::range().with_message(format!("input is nested deeper than {max_depth}")).into());
        }
        Ok(match value {
            Value::Null => JsValue::null(),
            Value::Bool(b) => JsValue::from(*b),
            Value::Number(n) => JsValue::from(n.as_f64().unwrap_or(f64::NAN)),
            Value::String(s) => JsValue::from(JsString::from(s.as_str())),
            Value::Array(items) => {
                let mut values = Vec::with_capacity(items.len());
                for item in items {
                    values.push(build(item, depth + 1, max_depth, context)?);
                }
                JsArray::from_iter(values, context).into()
            }
            Value::Object(map) => {
                let obj = JsObject::with_object_proto(context.intrinsics());
                for (k, v) in map {
                    let v = build(v, depth + 1, max_depth, context)?;
                    obj.create_data_property_or_throw(JsString::from(k.as_str()), v, context)?;
                }
                obj.into()
            }
        })
    }
    build(value, 0, max_depth, context)
}

#[cfg(test)]
mod tests {
    use super::json_len;

    #[test]
    fn json_len_is_the_length_serde_json_writes() {
        let mut all: String = (0u32..0x80).filter_map(char::from_u32).collect();
        all.push_str("é€😀\u{7f}\u{2028}\u{fffd}");
        for c in all.chars() {
            let s = c.to_string();
            assert_eq!(json_len(&s) + 2, serde_json::to_string(&s).unwrap().len(), "{c:?}");
        }
        assert_eq!(json_len(&all) + 2, serde_json::to_string(&all).unwrap().len());
    }
}
