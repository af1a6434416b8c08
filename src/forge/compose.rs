//! Compose mode (spec scope item 4): a forged tool that is a pipeline over registered tools.
//!
//! Each step's `inputMapping` is resolved against the pipeline state before the step runs:
//! - a string that is exactly one reference — `$input`, `$input.a.b`, `$prev`, `$prev.field`,
//!   `$steps.<name>`, `$steps.<name>.field` — becomes the referenced value with its JSON type;
//! - references inside a longer string are interpolated (`"Summarize: $prev.output"`): strings
//!   are inserted as-is, other values as compact JSON;
//! - arrays and objects are resolved element by element; anything else is a literal.
//!
//! Paths walk object fields and array indices (`$prev.items.0.id`). `$prev` in the first step
//! is the pipeline input. A reference that does not resolve fails the call (`execution_failed`)
//! rather than passing `null` silently. The pipeline's output is the last step's output.
//! Unknown tools, empty pipelines, self-reference, duplicate step names and `$steps.<name>`
//! pointing at a later or unknown step are rejected when the pipeline is built.
//!
//! Step tools are looked up when the pipeline runs, as the caller's session sees them then
//! (a demoted step tool fails the call with `unknown_tool`). A pipeline that reaches itself
//! through other pipelines stops at [`MAX_COMPOSE_DEPTH`] nested pipelines.
//!
//! Pipelines are bounded in width as well as depth: one has at most [`MAX_COMPOSE_STEPS`]
//! steps, one call runs at most [`MAX_PIPELINE_STEPS`] steps in all, nested pipelines
//! included, and holds at most [`MAX_PIPELINE_DATA_BYTES`] of step arguments and outputs.
//! Without the call's bounds a few small forges would multiply: a pipeline of 30 steps over
//! one of 30 steps over one of 30 steps is 27,000 calls, and every forge runs its tests; a
//! mapping naming a large value many times copies it that many times. A forge request's
//! pipeline is checked for its step count, and for `forge_tool` as a step, in
//! [`super::shape_check`] (stored pipelines are rebuilt as they are).

use std::cell::Cell;
use std::fmt::Write as _;
use std::rc::Rc;

use async_trait::async_trait;
use serde_json::{Map, Value};

use crate::tools::{invoke, json_len, CallContext, ToolFailure, ToolHandler, ToolLookup};

use super::request::ComposeStep;

/// Most compose pipelines one call may be nested in.
pub const MAX_COMPOSE_DEPTH: u32 = 8;

/// Most steps one pipeline may have.
pub const MAX_COMPOSE_STEPS: usize = 32;

/// Most pipeline steps one call may run, counting the steps of the pipelines it reaches.
pub const MAX_PIPELINE_STEPS: u32 = 256;

/// Why a pipeline could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ComposeBuildError {
    #[error("a compose pipeline needs at least one step")]
    Empty,
    #[error("step `{step}` uses unknown tool `{tool}`; available tools: {available}")]
    UnknownTool { step: String, tool: String, available: String },
    #[error("step `{step}` calls `{tool}` itself; a tool cannot compose itself")]
    SelfReference { step: String, tool: String },
    #[error("step `{step}` calls this pipeline again through {path}; a pipeline cannot call itself")]
    Cycle { step: String, path: String },
    #[error("two steps are named `{0}`")]
    DuplicateStep(String),
    #[error("step `{step}` references `$steps.{target}`, which is not an earlier step")]
    UnknownStepReference { step: String, target: String },
}

/// One segment of a reference path.
#[derive(Debug, Clone, PartialEq)]
enum Root {
    Input,
    Prev,
    Step(String),
}

/// A parsed reference: root and field path.
#[derive(Debug, Clone, PartialEq)]
struct Reference {
    root: Root,
    path: Vec<String>,
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// Parses the reference starting at `s[0] == '$'`; returns it and its byte length.
fn parse_reference(s: &str) -> Option<(Reference, usize)> {
    let rest = s.strip_prefix('$')?;
    let (root, mut used) = if let Some(r) = rest.strip_prefix("input") {
        if r.starts_with(is_ident) {
            return None;
        }
        (Root::Input, 1 + 5)
    } else if let Some(r) = rest.strip_prefix("prev") {
        if r.starts_with(is_ident) {
            return None;
        }
        (Root::Prev, 1 + 4)
    } else if let Some(r) = rest.strip_prefix("steps.") {
        let n = r.find(|c: char| !is_ident(c)).unwrap_or(r.len());
        if n == 0 {
            return None;
        }
        (Root::Step(r[..n].to_string()), 1 + 6 + n)
    } else {
        return None;
    };
    let mut path = vec![];
    loop {
        let r = &s[used..];
        let Some(after_dot) = r.strip_prefix('.') else { break };
        let n = after_dot.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after_dot.len());
        if n == 0 {
            break; // a trailing dot is punctuation ("… $prev.output.")
        }
        path.push(after_dot[..n].to_string());
        used += 1 + n;
    }
    Some((Reference { root, path }, used))
}

/// A string split into literal text and references.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Ref(Reference, String),
}

fn split(s: &str) -> Vec<Piece> {
    let mut pieces = vec![];
    let mut text = String::new();
    let mut i = 0;
    while i < s.len() {
        if s[i..].starts_with('$') {
            if let Some((r, n)) = parse_reference(&s[i..]) {
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Ref(r, s[i..i + n].to_string()));
                i += n;
                continue;
            }
        }
        let c = s[i..].chars().next().unwrap_or('\0');
        text.push(c);
        i += c.len_utf8().max(1);
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    pieces
}

/// A step's `inputMapping` value, parsed once when the pipeline is built (calls only look
/// values up).
#[derive(Debug, Clone, PartialEq)]
enum Mapping {
    /// A constant, with its size in bytes of JSON (charged to the budget on every call).
    Literal(Value, usize),
    /// A string that is exactly one reference: the referenced value keeps its JSON type.
    Whole(Reference, String),
    /// A string with references inside it: interpolated into a string.
    Text(Vec<Piece>),
    Array(Vec<Mapping>),
    Object(Vec<(String, Mapping)>),
}

impl Mapping {
    fn parse(v: &Value) -> Self {
        match v {
            Value::String(s) if s.contains('$') => {
                let pieces = split(s);
                if pieces.iter().all(|p| matches!(p, Piece::Text(_))) {
                    return Self::literal(v);
                }
                match <[Piece; 1]>::try_from(pieces) {
                    Ok([Piece::Ref(r, text)]) => Self::Whole(r, text),
                    Ok(one) => Self::Text(Vec::from(one)),
                    Err(pieces) => Self::Text(pieces),
                }
            }
            Value::Array(a) => Self::Array(a.iter().map(Self::parse).collect()),
            Value::Object(m) => Self::object(m),
            other => Self::literal(other),
        }
    }

    fn literal(v: &Value) -> Self {
        Self::Literal(v.clone(), json_len(v))
    }

    fn object(m: &Map<String, Value>) -> Self {
        Self::Object(m.iter().map(|(k, x)| (k.clone(), Self::parse(x))).collect())
    }

    /// Every reference in the mapping (for build-time checks).
    fn references<'m>(&'m self, out: &mut Vec<&'m Reference>) {
        match self {
            Self::Literal(..) => {}
            Self::Whole(r, _) => out.push(r),
            Self::Text(pieces) => out.extend(pieces.iter().filter_map(|p| match p {
                Piece::Ref(r, _) => Some(r),
                Piece::Text(_) => None,
            })),
            Self::Array(items) => items.iter().for_each(|x| x.references(out)),
            Self::Object(fields) => fields.iter().for_each(|(_, x)| x.references(out)),
        }
    }

    /// The step's arguments, each copy charged to `budget` before it is made.
    fn resolve(&self, scope: &Scope<'_>, budget: &PipelineBudget) -> Result<Value, ToolFailure> {
        match self {
            Self::Literal(v, size) => {
                budget.charge(*size)?;
                Ok(v.clone())
            }
            Self::Whole(r, text) => {
                let v = lookup(r, scope, text)?;
                budget.charge(json_len(v))?;
                Ok(v.clone())
            }
            Self::Text(pieces) => {
                let mut out = String::new();
                for p in pieces {
                    match p {
                        Piece::Text(t) => {
                            budget.charge(t.len())?;
                            out.push_str(t);
                        }
                        Piece::Ref(r, text) => match lookup(r, scope, text)? {
                            Value::String(s) => {
                                budget.charge(s.len())?;
                                out.push_str(s);
                            }
                            other => {
                                // Charged before it is written out.
                                budget.charge(json_len(other))?;
                                let _ = write!(out, "{other}");
                            }
                        },
                    }
                }
                Ok(Value::String(out))
            }
            Self::Array(items) => items.iter().map(|x| x.resolve(scope, budget)).collect::<Result<Vec<_>, _>>().map(Value::Array),
            Self::Object(fields) => {
                // Sized up front: collecting through `Result` gives the map no size hint, and
                // growing it rehashed every step's arguments.
                let mut out = Map::with_capacity(fields.len());
                for (k, x) in fields {
                    out.insert(k.clone(), x.resolve(scope, budget)?);
                }
                Ok(Value::Object(out))
            }
        }
    }
}

/// What one call may hold in step arguments and step outputs of the pipelines it runs, in
/// bytes of JSON: references copy the values they name, so a mapping naming a large
/// value many times would otherwise multiply it, step after step.
pub const MAX_PIPELINE_DATA_BYTES: usize = 16 << 20;

/// What a call may still spend in pipelines ([`MAX_PIPELINE_STEPS`] steps,
/// [`MAX_PIPELINE_DATA_BYTES`] of data): made by the outermost pipeline, shared with the
/// pipelines it reaches through [`CallContext::pipeline_budget`]. Nothing is given back.
#[derive(Debug)]
pub struct PipelineBudget {
    steps: Cell<u32>,
    bytes: Cell<usize>,
}

impl Default for PipelineBudget {
    fn default() -> Self {
        Self { steps: Cell::new(MAX_PIPELINE_STEPS), bytes: Cell::new(MAX_PIPELINE_DATA_BYTES) }
    }
}

impl PipelineBudget {
    fn charge(&self, bytes: usize) -> Result<(), ToolFailure> {
        let left = self.bytes.get().checked_sub(bytes).ok_or_else(|| {
            ToolFailure::new("execution_failed", format!("the call's pipeline step arguments and outputs passed {MAX_PIPELINE_DATA_BYTES} bytes"))
        })?;
        self.bytes.set(left);
        Ok(())
    }

    fn take_step(&self, step: &str) -> Result<(), ToolFailure> {
        let left = self.steps.get().checked_sub(1).ok_or_else(|| {
            ToolFailure::new(
                "execution_failed",
                format!("the call ran {MAX_PIPELINE_STEPS} pipeline steps, nested pipelines included, which is the limit; step `{step}` was not run"),
            )
        })?;
        self.steps.set(left);
        Ok(())
    }
}

/// One pipeline step, its mapping parsed.
#[derive(Debug)]
struct Step {
    name: String,
    tool: String,
    mapping: Mapping,
}

/// The values references resolve against while a pipeline runs: `steps[i]` produced
/// `outputs[i]` (only the steps run so far have outputs).
struct Scope<'a> {
    input: &'a Value,
    prev: &'a Value,
    steps: &'a [Step],
    outputs: &'a [Value],
}

fn walk<'v>(mut v: &'v Value, path: &[String]) -> Option<&'v Value> {
    for seg in path {
        v = match v {
            Value::Object(m) => m.get(seg)?,
            Value::Array(a) => a.get(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(v)
}

fn lookup<'v>(r: &Reference, scope: &Scope<'v>, text: &str) -> Result<&'v Value, ToolFailure> {
    let base = match &r.root {
        Root::Input => Some(scope.input),
        Root::Prev => Some(scope.prev),
        Root::Step(name) => scope.steps.iter().zip(scope.outputs).find(|(s, _)| &s.name == name).map(|(_, v)| v),
    };
    base.and_then(|b| walk(b, &r.path)).ok_or_else(|| ToolFailure::new("execution_failed", format!("reference `{text}` does not resolve")))
}

/// Runs a compose pipeline: each step's arguments are resolved, the step's tool is looked up
/// for the caller's session, its arguments are validated against its input schema, it runs
/// and its output is checked against its output schema.
pub struct ComposeHandler {
    steps: Vec<Step>,
    tools: Rc<dyn ToolLookup>,
}

impl std::fmt::Debug for ComposeHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComposeHandler").field("steps", &self.steps).finish_non_exhaustive()
    }
}

/// How the pipeline step calling `first` would reach `target` again through the pipelines the
/// lookup knows (`[first, …, target]`), if it would. Depth-first over the step graph, each
/// tool visited once; a pipeline that only a call could reveal (a lookup that cannot list a
/// tool's steps) is still stopped at run time by [`MAX_COMPOSE_DEPTH`].
fn path_back(target: &str, first: &str, tools: &dyn ToolLookup, session: &str) -> Option<Vec<String>> {
    let mut visited = std::collections::HashSet::new();
    let mut stack = vec![vec![first.to_string()]];
    while let Some(path) = stack.pop() {
        let last = path.last().expect("paths are never empty");
        if !visited.insert(last.clone()) {
            continue;
        }
        for next in tools.pipeline_steps(last, session) {
            let mut longer = path.clone();
            longer.push(next.clone());
            if next == target {
                return Some(longer);
            }
            stack.push(longer);
        }
    }
    None
}

impl ComposeHandler {
    /// Builds the pipeline for the tool `tool_name` over the tools `session` reaches,
    /// rejecting unknown tools, empty pipelines, self-reference (directly or through other
    /// pipelines) and bad step references.
    pub fn build(tool_name: &str, steps: &[ComposeStep], tools: Rc<dyn ToolLookup>, session: &str) -> Result<Self, ComposeBuildError> {
        if steps.is_empty() {
            return Err(ComposeBuildError::Empty);
        }
        let mut built: Vec<Step> = Vec::with_capacity(steps.len());
        for step in steps {
            if step.tool == tool_name {
                return Err(ComposeBuildError::SelfReference { step: step.name.clone(), tool: step.tool.clone() });
            }
            if let Some(path) = path_back(tool_name, &step.tool, tools.as_ref(), session) {
                return Err(ComposeBuildError::Cycle { step: step.name.clone(), path: path.join(" → ") });
            }
            if !tools.contains(&step.tool, session) {
                return Err(ComposeBuildError::UnknownTool {
                    step: step.name.clone(),
                    tool: step.tool.clone(),
                    available: tools.available(session).join(", "),
                });
            }
            let mapping = Mapping::object(&step.input_mapping);
            let mut refs = vec![];
            mapping.references(&mut refs);
            for r in refs {
                if let Root::Step(target) = &r.root {
                    if !built.iter().any(|s| &s.name == target) {
                        return Err(ComposeBuildError::UnknownStepReference { step: step.name.clone(), target: target.clone() });
                    }
                }
            }
            if built.iter().any(|s| s.name == step.name) {
                return Err(ComposeBuildError::DuplicateStep(step.name.clone()));
            }
            built.push(Step { name: step.name.clone(), tool: step.tool.clone(), mapping });
        }
        Ok(Self { steps: built, tools })
    }
}

/// The failure of a call that would need a human's approval where none can be asked: inside a
/// compose pipeline, or called directly through the registry API.
pub fn denied_without_approval(tool: &str) -> ToolFailure {
    ToolFailure::new(
        "denied",
        format!("`{tool}` needs a human's approval for this call, which can only be asked in a run (not from a pipeline or a direct call)"),
    )
}

#[async_trait(?Send)]
impl ToolHandler for ComposeHandler {
    async fn call(&self, args: Value, ctx: &CallContext) -> Result<Value, ToolFailure> {
        if ctx.depth >= MAX_COMPOSE_DEPTH {
            return Err(ToolFailure::new(
                "execution_failed",
                format!("compose pipelines nested {MAX_COMPOSE_DEPTH} deep; a pipeline that reaches itself is stopped here"),
            ));
        }
        let budget = ctx.pipeline_budget.clone().unwrap_or_default();
        let inner = CallContext { depth: ctx.depth + 1, pipeline_budget: Some(budget.clone()), ..ctx.clone() };
        let mut outputs: Vec<Value> = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            budget.take_step(&step.name)?;
            let step_args = {
                let prev = outputs.last().unwrap_or(&args);
                step.mapping.resolve(&Scope { input: &args, prev, steps: &self.steps, outputs: &outputs }, &budget)?
            };
            let fail = |f: ToolFailure| ToolFailure::new(f.code, format!("step `{}` ({}): {}", step.name, step.tool, f.message));
            let Some(tool) = self.tools.lookup(&step.tool, &ctx.session_id) else {
                return Err(fail(ToolFailure::new("unknown_tool", "the tool is no longer available to this session")));
            };
            // A call that needs a human's approval cannot be made from inside a pipeline, where
            // no one is asked: forging one over it must not be a way around the approval.
            if tool.handler().needs_approval(&step_args).await {
                return Err(fail(denied_without_approval(&step.tool)));
            }
            let output = invoke(&tool, step_args, &inner).await.map_err(fail)?;
            budget.charge(json_len(&output))?;
            outputs.push(output);
        }
        Ok(outputs.pop().unwrap_or(args))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scope_eval(v: Value) -> Result<Value, ToolFailure> {
        let input = json!({ "text": "Hi", "user": { "name": "Ada" } });
        let prev = json!({ "output": "short", "items": [{ "id": 7 }] });
        let steps = [Step { name: "first".into(), tool: "t".into(), mapping: Mapping::Object(vec![]) }];
        Mapping::parse(&v).resolve(&Scope { input: &input, prev: &prev, steps: &steps, outputs: &[json!({ "n": 2 })] }, &PipelineBudget::default())
    }

    #[test]
    fn whole_references_keep_their_type_and_strings_interpolate() {
        assert_eq!(scope_eval(json!("$input")).unwrap(), json!({ "text": "Hi", "user": { "name": "Ada" } }));
        assert_eq!(scope_eval(json!("$input.user.name")).unwrap(), json!("Ada"));
        assert_eq!(scope_eval(json!("$prev.items.0.id")).unwrap(), json!(7));
        assert_eq!(scope_eval(json!("$steps.first.n")).unwrap(), json!(2));
        assert_eq!(scope_eval(json!("Summarize: $prev.output.")).unwrap(), json!("Summarize: short."));
        assert_eq!(scope_eval(json!("n=$steps.first")).unwrap(), json!("n={\"n\":2}"));
        assert_eq!(scope_eval(json!(["$input.text", 3, "$5 price"])).unwrap(), json!(["Hi", 3, "$5 price"]));
        assert_eq!(scope_eval(json!("$inputs")).unwrap(), json!("$inputs"));
        assert!(scope_eval(json!("$input.missing")).is_err());
    }

    #[test]
    fn a_mapping_copying_a_value_many_times_is_stopped_before_the_copies_are_made() {
        let big = json!({ "s": "x".repeat(100_000) });
        let steps = [Step { name: "first".into(), tool: "t".into(), mapping: Mapping::Object(vec![]) }];
        let scope = Scope { input: &big, prev: &big, steps: &steps, outputs: &[] };
        let copies = Mapping::parse(&json!("$prev.s".repeat(200)));
        let err = copies.resolve(&scope, &PipelineBudget::default()).unwrap_err();
        assert!(err.message.contains("passed 16777216 bytes"), "{}", err.message);
        let whole = Mapping::parse(&json!(vec!["$prev"; 200]));
        assert!(whole.resolve(&scope, &PipelineBudget::default()).is_err());
        assert!(Mapping::parse(&json!(["$prev", "$prev.s"])).resolve(&scope, &PipelineBudget::default()).is_ok());
    }
}
