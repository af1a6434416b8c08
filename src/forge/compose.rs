//! Compose mode (spec scope item 4): a forged tool that is a pipeline over registered tools.
//!
//! Each step's `inputMapping` is resolved against the pipeline state before the step runs:
//! - a string that is exactly one reference — `$input`, `$input.a.b`, `$prev`, `$prev.field`,
//!   `$steps.<name>`, `$steps.<name>.field` — becomes the referenced value with its JSON type;
//! - references inside a longer string are interpolated (`"Summarize: $prev.output"`): strings
//!   are inserted as-is, other values as compact JSON;
//! - arrays and objects are resolved element by element; anything else is a literal;
//! - the whole mapping may be one reference instead of an object (`"inputMapping": "$prev"`):
//!   the step's arguments are that value, checked by the step tool's input schema as any are.
//!
//! Paths walk object fields and array indices (`$prev.items.0.id`). A dotted segment is
//! letters, digits and combining marks of any script and `_`, so a hyphen or a trailing dot ends it and prose
//! reads as prose (`"$prev.name-based"` is `$prev.name` then `-based`, `"$input-based"` is
//! `$input` then `-based`; a step name after `$steps.` may hold `-`: `$steps.fetch-page`); any
//! other key, and a step whose name is no word, goes in brackets: `$input["first-name"]`, `$input['first-name']`,
//! `$prev.items[0]`, `$steps["a.b"].text` (no escapes: a key with `"` goes in `'…'`). `$$` is
//! a literal `$` (`"$$input"` is the text `$input`); a `$` that starts no reference (`$5`) is
//! text. Template-literal syntax around a reference (`${input.text}`; `${inputs}` is text) and
//! a bracket that holds no index or quoted key (`$prev.items[i]`) are
//! refused when the pipeline is built, with what to write instead, rather than passing as text.
//!
//! `$prev` in the first step is the pipeline input. A reference that does not resolve fails the
//! call (`execution_failed`) rather than passing `null` silently. The pipeline's output is the
//! last step's output. Unknown tools, empty pipelines, self-reference, duplicate step names,
//! `$steps.<name>` pointing at a later or unknown step and mappings that cannot be read are
//! rejected when the pipeline is built.
//!
//! Step tools are looked up when the pipeline is called, as the caller's session sees them
//! then, all of them before the first step runs (a step tool demoted out of the session's
//! reach fails the call with `unknown_tool`, and no step runs). A pipeline that reaches itself
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

use crate::tools::{invoke, json_len, CallContext, Tool, ToolFailure, ToolHandler, ToolLookup};

use super::prompt::FORGE_TOOL_NAME;
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
    // The step's name as given, not as `$steps.…`: a name with a dot is referenced in brackets.
    #[error("step `{step}` references step `{target}`, which is not an earlier step")]
    UnknownStepReference { step: String, target: String },
    #[error("step `{step}` inputMapping: {reason}")]
    BadMapping { step: String, reason: String },
}

/// What a reference starts from.
#[derive(Debug, Clone, PartialEq)]
enum Root {
    Input,
    Prev,
    Step(String),
}

/// One step of a reference path: an object key, and the array index it names when it is a
/// number (read once when the pipeline is built, not on every call).
#[derive(Debug, Clone, PartialEq)]
struct Segment {
    key: String,
    index: Option<usize>,
}

impl Segment {
    fn new(key: &str) -> Self {
        Self { key: key.to_string(), index: index_of(key) }
    }
}

/// The array index a key written as digits names (`"0"`, `"12"`; not `"+0"`, `" 0"` or
/// `"00"`, which JavaScript does not read as an index either: `a["00"]` is `undefined`).
fn index_of(key: &str) -> Option<usize> {
    if key.bytes().all(|b| b.is_ascii_digit()) && (key == "0" || !key.starts_with('0')) {
        key.parse().ok()
    } else {
        None
    }
}

/// A parsed reference: root and field path.
#[derive(Debug, Clone, PartialEq)]
struct Reference {
    root: Root,
    path: Vec<Segment>,
}

/// A character of a dotted path segment: a letter, digit or combining mark of any script, or
/// `_`. A hyphen is not one, so that prose reads as prose (`"$prev.name-based"` is
/// `$prev.name` then text); other keys are written in brackets.
fn is_segment_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || (!c.is_ascii() && is_mark(c))
}

/// Whether `c` is a combining mark (Unicode category M), which std does not tell: without
/// them a word ends at a Devanagari virama (`ग्राहक`), a Thai tone mark (`ชื่อ`) or an accent
/// typed decomposed. jsonschema's regex engine, already in the build, has the table.
fn is_mark(c: char) -> bool {
    static MARK: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    MARK.get_or_init(|| regex::Regex::new(r"^\p{M}$").ok()).as_ref().is_some_and(|m| m.is_match(c.encode_utf8(&mut [0; 4])))
}

/// A character of a step name after `$steps.`: a path segment's, or `-`, which step names, as
/// tool names, may hold (`$steps.fetch-page`). After `$input` and `$prev` a hyphen ends the
/// root as it ends a path segment (`$input-based` is `$input` then `-based`); a segment's
/// character makes them a longer word instead (`$inputs`).
fn is_name_char(c: char) -> bool {
    is_segment_char(c) || c == '-'
}

/// A bracket segment: its key, its byte length, and whether the key was quoted.
struct Bracket<'s> {
    key: &'s str,
    len: usize,
    quoted: bool,
}

/// The bracket segment at `s[0] == '['`: a run of digits (`[0]`) or a quoted key
/// (`["first-name"]`, `['first-name']`, no escapes).
fn bracket(s: &str) -> Option<Bracket<'_>> {
    let inner = s.strip_prefix('[')?;
    if let Some(quote) = inner.chars().next().filter(|c| *c == '"' || *c == '\'') {
        let body = &inner[1..];
        let end = body.find(quote)?;
        body[end + 1..].starts_with(']').then(|| Bracket { key: &body[..end], len: end + 4, quoted: true })
    } else {
        let n = inner.find(|c: char| !c.is_ascii_digit()).unwrap_or(inner.len());
        (n > 0 && inner[n..].starts_with(']')).then(|| Bracket { key: &inner[..n], len: n + 2, quoted: false })
    }
}

/// The root a reference starts with, `rest` being what follows its `$`, and the root's byte
/// length in `rest`; `None` when `rest` starts no reference (`5`, `inputs`), or why a step
/// bracket is not one.
fn parse_root(rest: &str) -> Result<Option<(Root, usize)>, String> {
    Ok(Some(if let Some(r) = rest.strip_prefix("input") {
        if r.starts_with(is_segment_char) {
            return Ok(None);
        }
        (Root::Input, 5)
    } else if let Some(r) = rest.strip_prefix("prev") {
        if r.starts_with(is_segment_char) {
            return Ok(None);
        }
        (Root::Prev, 4)
    } else if let Some(r) = rest.strip_prefix("steps.") {
        let n = r.find(|c: char| !is_name_char(c)).unwrap_or(r.len());
        if n == 0 {
            return Ok(None);
        }
        (Root::Step(r[..n].to_string()), 6 + n)
    } else if rest.starts_with("steps[") {
        // A step whose name is no word (`a.b`, `step 1`): `$steps["a.b"]`.
        match bracket(&rest[5..]) {
            // `$steps[0]` would read as the first step; steps are named, not counted. Quoted,
            // digits are a name (`$steps["0"]`), as the refusal below tells to write it.
            Some(Bracket { key, len, quoted: true }) if !key.is_empty() => (Root::Step(key.to_string()), 5 + len),
            _ => return Err("`$steps[` is not a reference: a step is named in brackets as `$steps[\"step name\"]`".to_string()),
        }
    } else {
        return Ok(None);
    }))
}

/// Parses the reference starting at `s[0] == '$'`; returns it and its byte length, `None` for
/// a `$` that starts no reference (`$5`), or why a bracket after a reference is not one.
fn parse_reference(s: &str) -> Result<Option<(Reference, usize)>, String> {
    let Some(rest) = s.strip_prefix('$') else { return Ok(None) };
    let bad_bracket = |at: usize| {
        let r = &s[..at];
        format!("`{r}[` is not a reference path: brackets hold an index (`{r}[0]`) or a quoted key (`{r}[\"first-name\"]`)")
    };
    let Some((root, n)) = parse_root(rest)? else { return Ok(None) };
    let mut used = 1 + n;
    let mut path = vec![];
    loop {
        let r = &s[used..];
        if let Some(after_dot) = r.strip_prefix('.') {
            let n = after_dot.find(|c: char| !is_segment_char(c)).unwrap_or(after_dot.len());
            if n == 0 {
                break; // a trailing dot is punctuation ("… $prev.output.")
            }
            path.push(Segment::new(&after_dot[..n]));
            used += 1 + n;
        } else if r.starts_with('[') {
            let b = bracket(r).ok_or_else(|| bad_bracket(used))?;
            path.push(Segment::new(b.key));
            used += b.len;
        } else {
            break;
        }
    }
    Ok(Some((Reference { root, path }, used)))
}

/// A string split into literal text and references.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    /// A reference, and what the call fails with when it does not resolve.
    Ref(Reference, String),
}

/// Whether `s` holds a reference (`"Summary: $input.summary"`), or template-literal syntax or a
/// bracket a mapping refuses after one: text a mapping would read as arguments.
pub(crate) fn has_reference(s: &str) -> bool {
    s.contains('$') && split(s).map_or(true, |pieces| pieces.iter().any(|p| matches!(p, Piece::Ref(..))))
}

/// Whether `s` is exactly one reference.
fn is_reference(s: &str) -> bool {
    matches!(parse_reference(s), Ok(Some((_, n))) if n == s.len())
}

/// The reference a `${…}` meant, for the hint: as written when it reads as one, else its
/// dotted parts that are no path segment (`first-name`) put in brackets, quoted with a quote
/// the key does not hold (brackets have no escapes); `None` when even that is no reference
/// (`input[i]`: a path here is written out, never computed).
fn unbraced(inner: &str) -> Option<String> {
    let written = format!("${inner}");
    if is_reference(&written) {
        return Some(written);
    }
    let mut parts = inner.split('.').map(str::trim);
    let mut out = format!("${}", parts.next().unwrap_or_default());
    for part in parts {
        if !part.is_empty() && part.chars().all(is_segment_char) {
            let _ = write!(out, ".{part}");
        } else {
            let quote = if part.contains('"') { '\'' } else { '"' };
            let _ = write!(out, "[{quote}{part}{quote}]");
        }
    }
    is_reference(&out).then_some(out)
}

/// What a call fails with when the reference `written` does not resolve. A hyphen right after
/// it most likely meant a hyphenated key (`$input.first-name`), so the message says how to
/// write that key.
fn unresolved(written: &str, after: &str) -> String {
    let hyphenated = after.len() - after.trim_start_matches(is_name_char).len();
    match written.rfind('.').filter(|_| after.starts_with('-') && written.ends_with(is_segment_char)) {
        Some(dot) => {
            let (base, key) = (&written[..dot], format!("{}{}", &written[dot + 1..], &after[..hyphenated]));
            format!("reference `{written}` does not resolve (a `-` ends a dotted key: the key `{key}` is written `{base}[\"{key}\"]`)")
        }
        None => format!("reference `{written}` does not resolve"),
    }
}

/// Splits `s` into text and references: `$$` is a literal `$`, a `$` that starts no reference
/// is text, and `${input…}` (template-literal syntax, which would pass silently as text) is
/// refused with what to write instead.
fn split(s: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = vec![];
    let mut text = String::new();
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        if rest.starts_with("$$") {
            text.push('$');
            i += 2;
            continue;
        }
        if let Some(inner) = rest.strip_prefix("${") {
            // Only a reference in braces is refused: `${previousValue}` or `${inputs}` in source
            // code passed as an argument is that code's own template literal. Its root is enough
            // to tell, and reading no further keeps a string of many `${` linear.
            if !matches!(parse_root(inner.trim_start()), Ok(None)) {
                let inner = inner.split('}').next().unwrap_or(inner).trim();
                let instead = match unbraced(inner) {
                    Some(reference) => format!("write `{reference}` (no braces)"),
                    None => "write a reference without braces, its path spelt out: `$input.field`, `$input[0]`, `$input[\"key\"]`".to_string(),
                };
                return Err(format!("`${{{inner}}}` is template-literal syntax, which is not read here: {instead}, or `$${{` for that text"));
            }
        }
        if rest.starts_with('$') {
            if let Some((r, n)) = parse_reference(rest)? {
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Ref(r, unresolved(&rest[..n], &rest[n..])));
                i += n;
                continue;
            }
        }
        let c = rest.chars().next().unwrap_or('\0');
        text.push(c);
        i += c.len_utf8().max(1);
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
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
    /// Parses a mapping value; `Err` says why a string in it cannot be read.
    fn parse(v: &Value) -> Result<Self, String> {
        Ok(match v {
            Value::String(s) if s.contains('$') => match <[Piece; 1]>::try_from(split(s)?) {
                Ok([Piece::Ref(r, unresolved)]) => Self::Whole(r, unresolved),
                // Only text: `$$` made `$`, or a `$` started no reference.
                Ok([Piece::Text(t)]) => Self::literal(&Value::String(t)),
                Err(pieces) => Self::Text(pieces),
            },
            Value::Array(a) => Self::Array(a.iter().map(Self::parse).collect::<Result<_, _>>()?),
            Value::Object(m) => Self::object(m)?,
            other => Self::literal(other),
        })
    }

    fn literal(v: &Value) -> Self {
        Self::Literal(v.clone(), json_len(v))
    }

    fn object(m: &Map<String, Value>) -> Result<Self, String> {
        m.iter().map(|(k, x)| Ok((k.clone(), Self::parse(x)?))).collect::<Result<_, _>>().map(Self::Object)
    }

    /// A step's whole `inputMapping`: an object of arguments, or a string that is exactly one
    /// reference (`"$input"`, `"$prev.payload"`), whose value is the step's arguments.
    fn step(v: &Value) -> Result<Self, String> {
        match v {
            Value::Object(m) => Self::object(m),
            // Spaces around the one reference say nothing: `" $input "` is `$input`.
            Value::String(s) => match Self::parse(&Value::String(s.trim().to_string()))? {
                whole @ Self::Whole(..) => Ok(whole),
                _ => Err("as a string it must be exactly one reference, such as `$input` or `$prev.payload`".to_string()),
            },
            other => Err(format!("it must be an object of arguments or one reference such as `$input`, got {}", super::request::type_name(other))),
        }
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
            Self::Whole(r, unresolved) => {
                let v = lookup(r, scope, unresolved)?;
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
                        Piece::Ref(r, unresolved) => match lookup(r, scope, unresolved)? {
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

fn walk<'v>(mut v: &'v Value, path: &[Segment]) -> Option<&'v Value> {
    for seg in path {
        v = match v {
            Value::Object(m) => m.get(&seg.key)?,
            Value::Array(a) => a.get(seg.index?)?,
            _ => return None,
        };
    }
    Some(v)
}

fn lookup<'v>(r: &Reference, scope: &Scope<'v>, unresolved: &str) -> Result<&'v Value, ToolFailure> {
    let base = match &r.root {
        Root::Input => Some(scope.input),
        Root::Prev => Some(scope.prev),
        Root::Step(name) => scope.steps.iter().zip(scope.outputs).find(|(s, _)| &s.name == name).map(|(_, v)| v),
    };
    base.and_then(|b| walk(b, &r.path)).ok_or_else(|| ToolFailure::new("execution_failed", unresolved))
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

/// Why `$steps.<target>` is refused when `target` is no earlier step but its start before a
/// `-` is (`$steps.fetch-based`): a step name after `$steps.` takes `-`, so the text after it
/// was read as part of the name. Says how to write that step followed by the text.
fn hyphen_after_step(target: &str, built: &[Step]) -> Option<String> {
    let (at, _) = target.rmatch_indices('-').find(|(at, _)| built.iter().any(|s| s.name == target[..*at]))?;
    let (name, rest) = target.split_at(at);
    let quote = if name.contains('"') { '\'' } else { '"' };
    Some(format!(
        "`$steps.{target}` names the step `{target}`, which is not an earlier step (a step name after `$steps.` takes `-`): the step `{name}` followed by `{rest}` is written `$steps[{quote}{name}{quote}]{rest}`"
    ))
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
                // Not `forge_tool` (refused as a step by the shape check) nor this tool (refused
                // above as self-reference): offered, they would be tried and refused in turn.
                let available: Vec<String> = tools.available(session).into_iter().filter(|t| t != FORGE_TOOL_NAME && t != tool_name).collect();
                let available = if available.is_empty() { "none".to_string() } else { available.join(", ") };
                return Err(ComposeBuildError::UnknownTool { step: step.name.clone(), tool: step.tool.clone(), available });
            }
            let mapping = Mapping::step(&step.input_mapping).map_err(|reason| ComposeBuildError::BadMapping { step: step.name.clone(), reason })?;
            let mut refs = vec![];
            mapping.references(&mut refs);
            for r in refs {
                if let Root::Step(target) = &r.root {
                    if !built.iter().any(|s| &s.name == target) {
                        if let Some(reason) = hyphen_after_step(target, &built) {
                            return Err(ComposeBuildError::BadMapping { step: step.name.clone(), reason });
                        }
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
        // The run's bound on results is the pipeline's, not its steps' (theirs is the budget's).
        let inner = CallContext { depth: ctx.depth + 1, pipeline_budget: Some(budget.clone()), result_limit: None, ..ctx.clone() };
        // Every step tool is looked up before the first step runs: a call that cannot finish
        // (a step tool demoted out of this session's reach) must not do the side effects of
        // the steps before it.
        let step_tools = self
            .steps
            .iter()
            .map(|step| {
                self.tools.lookup(&step.tool, &ctx.session_id).ok_or_else(|| {
                    ToolFailure::new("unknown_tool", format!("step `{}` ({}): the tool is no longer available to this session", step.name, step.tool))
                })
            })
            .collect::<Result<Vec<Tool>, ToolFailure>>()?;
        let mut outputs: Vec<Value> = Vec::with_capacity(self.steps.len());
        for (step, tool) in self.steps.iter().zip(step_tools) {
            budget.take_step(&step.name)?;
            let step_args = {
                let prev = outputs.last().unwrap_or(&args);
                step.mapping.resolve(&Scope { input: &args, prev, steps: &self.steps, outputs: &outputs }, &budget)?
            };
            // `too_many_calls` (a host tool calling back into its agent past the host's bound on
            // calls waiting) fails every call it is nested in, a thousand levels deep: a step
            // prefix per level would bury its own words (messages are bounded) under them.
            let fail = |f: ToolFailure| {
                if f.code == "too_many_calls" {
                    return f;
                }
                ToolFailure::new(f.code, format!("step `{}` ({}): {}", step.name, step.tool, f.message))
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
        let input = json!({ "text": "Hi", "user": { "name": "Ada" }, "first-name": "Grace", "título": "Dr", "0": "zero", "ग्राहक": "Ravi", "ชื่อ": "Somchai", "cafe\u{301}": "nfd" });
        let prev = json!({ "output": "short", "items": [{ "id": 7 }] });
        let steps = [
            Step { name: "first".into(), tool: "t".into(), mapping: Mapping::Object(vec![]) },
            Step { name: "a.b".into(), tool: "t".into(), mapping: Mapping::Object(vec![]) },
            Step { name: "0".into(), tool: "t".into(), mapping: Mapping::Object(vec![]) },
        ];
        let outputs = [json!({ "n": 2 }), json!({ "n": 3 }), json!({ "n": 4 })];
        Mapping::parse(&v).expect("parses").resolve(&Scope { input: &input, prev: &prev, steps: &steps, outputs: &outputs }, &PipelineBudget::default())
    }

    /// Why the mapping `v` is refused when the pipeline is built.
    fn refused(v: Value) -> String {
        Mapping::parse(&v).expect_err("refused")
    }

    #[test]
    fn whole_references_keep_their_type_and_strings_interpolate() {
        assert_eq!(scope_eval(json!("$input.user")).unwrap(), json!({ "name": "Ada" }));
        assert_eq!(scope_eval(json!("$input.user.name")).unwrap(), json!("Ada"));
        assert_eq!(scope_eval(json!("$prev.items.0.id")).unwrap(), json!(7));
        assert_eq!(scope_eval(json!("$input.0")).unwrap(), json!("zero"), "a number is a key on an object");
        assert_eq!(scope_eval(json!("$steps.first.n")).unwrap(), json!(2));
        assert_eq!(scope_eval(json!("Summarize: $prev.output.")).unwrap(), json!("Summarize: short."));
        assert_eq!(scope_eval(json!("n=$steps.first")).unwrap(), json!("n={\"n\":2}"));
        assert_eq!(scope_eval(json!(["$input.text", 3, "$5 price"])).unwrap(), json!(["Hi", 3, "$5 price"]));
        assert_eq!(scope_eval(json!("$inputs")).unwrap(), json!("$inputs"));
        assert!(scope_eval(json!("$input.missing")).is_err());
    }

    #[test]
    fn a_double_dollar_is_a_literal_dollar() {
        assert_eq!(scope_eval(json!("$$input")).unwrap(), json!("$input"));
        assert_eq!(scope_eval(json!("costs $$input, $$5 and $$$input.text")).unwrap(), json!("costs $input, $5 and $Hi"));
        assert_eq!(scope_eval(json!("$$")).unwrap(), json!("$"));
        assert_eq!(scope_eval(json!("$${input.text}")).unwrap(), json!("${input.text}"), "the escape also writes template syntax as text");
        assert!(matches!(Mapping::parse(&json!("$$prev")), Ok(Mapping::Literal(Value::String(s), 7)) if s == "$prev"), "text, sized as it is sent");
    }

    #[test]
    fn path_segments_take_letters_of_any_script_and_brackets_take_any_key() {
        assert_eq!(scope_eval(json!("$input.título")).unwrap(), json!("Dr"));
        assert_eq!(scope_eval(json!("Hola $input.título.")).unwrap(), json!("Hola Dr."));
        // Combining marks are part of the word: a Devanagari virama, a Thai tone mark, an
        // accent typed decomposed (NFD, as macOS file names are).
        assert_eq!(scope_eval(json!("$input.ग्राहक")).unwrap(), json!("Ravi"));
        assert_eq!(scope_eval(json!("$input.ชื่อ")).unwrap(), json!("Somchai"));
        assert_eq!(scope_eval(json!("$input.cafe\u{301}!")).unwrap(), json!("nfd!"));
        assert_eq!(scope_eval(json!("$input[\"first-name\"]")).unwrap(), json!("Grace"));
        assert_eq!(scope_eval(json!("$input['first-name'] Hopper")).unwrap(), json!("Grace Hopper"));
        assert_eq!(scope_eval(json!("$prev.items[0].id")).unwrap(), json!(7));
        assert_eq!(scope_eval(json!("$prev.items[0][\"id\"]")).unwrap(), json!(7));
        // Digits with a leading zero are no index, as in JavaScript (`items["00"]` is undefined).
        assert!(scope_eval(json!("$prev.items.00.id")).is_err());
        assert!(scope_eval(json!("$prev.items[00]")).is_err());
        // A hyphen ends a dotted segment, so prose after a reference stays prose.
        assert_eq!(scope_eval(json!("$prev.output-based")).unwrap(), json!("short-based"));
        let err = scope_eval(json!("$input.user.given-name")).unwrap_err();
        assert_eq!(err.code, "execution_failed");
        assert_eq!(
            err.message,
            "reference `$input.user.given` does not resolve (a `-` ends a dotted key: the key `given-name` is written `$input.user[\"given-name\"]`)"
        );
        assert_eq!(scope_eval(json!("$input.nope")).unwrap_err().message, "reference `$input.nope` does not resolve");
    }

    #[test]
    fn a_bracket_after_a_reference_that_is_no_index_or_quoted_key_is_refused() {
        let reason = refused(json!({ "x": "$prev.items[i]" }));
        assert!(reason.contains("`$prev.items[` is not a reference path") && reason.contains("`$prev.items[0]`"), "{reason}");
        assert!(refused(json!("$input[\"first-name]")).contains("$input[\"first-name\"]"));
        assert!(refused(json!("$steps[0]")).contains("$steps[\"step name\"]"));
    }

    #[test]
    fn template_literal_syntax_is_refused_with_what_to_write() {
        let reason = refused(json!({ "text": "Hello ${input.text}!" }));
        assert!(reason.contains("`${input.text}` is template-literal syntax") && reason.contains("write `$input.text` (no braces)"), "{reason}");
        assert!(refused(json!(["${ prev.items }"])).contains("write `$prev.items`"));
        assert!(refused(json!("${steps.first.n}")).contains("write `$steps.first.n`"));
        assert!(refused(json!("${input.first-name}")).contains("write `$input[\"first-name\"]`"), "the hint is a reference that reads as meant");
        // A computed index has no reference to suggest: the hint must not be one that is refused.
        let reason = refused(json!("${input[i]}"));
        assert!(reason.contains("its path spelt out") && !reason.contains("write `$input[i]`"), "{reason}");
        assert_eq!(scope_eval(json!("${total} and $ {input}")).unwrap(), json!("${total} and $ {input}"), "other braces are text");
    }

    #[test]
    fn braces_around_a_word_that_only_starts_like_a_root_are_text() {
        // Source code passed as an argument keeps its own template literals.
        let code = "const a = `${previousValue} ${inputs} ${stepsTaken} ${steps}`;";
        assert_eq!(scope_eval(json!(code)).unwrap(), json!(code));
        assert!(refused(json!("${input}")).contains("write `$input`"), "a root alone is still refused");
    }

    #[test]
    fn a_long_mapping_of_unclosed_braces_parses_in_linear_time() {
        // Reading on from every `${` to the end would be quadratic: ~20 s here in a debug build.
        let started = std::time::Instant::now();
        let text = "${".repeat(500_000);
        assert_eq!(scope_eval(json!(text)).unwrap(), json!(text));
        assert!(started.elapsed() < std::time::Duration::from_secs(3), "{:?}", started.elapsed());
    }

    #[test]
    fn the_template_literal_hint_is_a_reference_that_reads_as_meant() {
        assert!(refused(json!("${ input . text }")).contains("write `$input.text`"));
        // No escapes in brackets: a key with a double quote is written in single quotes.
        let reason = refused(json!("${input.say \"hi\"}"));
        assert!(reason.contains("write `$input['say \"hi\"']`"), "{reason}");
        assert_eq!(scope_eval(json!("$input['say \"hi\"']")).unwrap_err().message, "reference `$input['say \"hi\"']` does not resolve");
    }

    #[test]
    fn a_step_whose_name_is_no_word_is_named_in_brackets() {
        assert_eq!(scope_eval(json!("$steps[\"a.b\"].n")).unwrap(), json!(3));
        assert_eq!(scope_eval(json!("$steps['a.b']")).unwrap(), json!({ "n": 3 }));
        // Quoted, digits are a name; only a bare `$steps[0]` reads as counting steps.
        assert_eq!(scope_eval(json!("$steps[\"0\"].n")).unwrap(), json!(4));
        assert_eq!(scope_eval(json!("$steps.0.n")).unwrap(), json!(4));
        // Dotted, the name stops at the dot: step `a`, which does not exist.
        assert!(scope_eval(json!("$steps.a.b")).is_err());
        assert_eq!(
            ComposeBuildError::UnknownStepReference { step: "s".into(), target: "a.b".into() }.to_string(),
            "step `s` references step `a.b`, which is not an earlier step",
            "the name as given: `$steps.a.b` would be another reference"
        );
    }

    #[test]
    fn a_step_mapping_is_an_object_or_exactly_one_reference() {
        assert!(matches!(Mapping::step(&json!("$input")), Ok(Mapping::Whole(Reference { root: Root::Input, path }, _)) if path.is_empty()));
        assert!(matches!(Mapping::step(&json!("$prev.payload")), Ok(Mapping::Whole(Reference { root: Root::Prev, .. }, _))));
        assert!(matches!(Mapping::step(&json!({ "text": "$input.text" })), Ok(Mapping::Object(_))));
        assert!(matches!(Mapping::step(&json!(" $prev.payload\n")), Ok(Mapping::Whole(Reference { root: Root::Prev, .. }, _))), "spaces around it say nothing");
        assert!(Mapping::step(&json!("Say $input.text")).unwrap_err().contains("exactly one reference"));
        assert!(Mapping::step(&json!("$$input")).unwrap_err().contains("exactly one reference"));
        assert!(Mapping::step(&json!([1])).unwrap_err().contains("got array"));
    }

    #[test]
    fn a_mapping_copying_a_value_many_times_is_stopped_before_the_copies_are_made() {
        let big = json!({ "s": "x".repeat(100_000) });
        let steps = [Step { name: "first".into(), tool: "t".into(), mapping: Mapping::Object(vec![]) }];
        let scope = Scope { input: &big, prev: &big, steps: &steps, outputs: &[] };
        let copies = Mapping::parse(&json!("$prev.s".repeat(200))).unwrap();
        let err = copies.resolve(&scope, &PipelineBudget::default()).unwrap_err();
        assert!(err.message.contains("passed 16777216 bytes"), "{}", err.message);
        let whole = Mapping::parse(&json!(vec!["$prev"; 200])).unwrap();
        assert!(whole.resolve(&scope, &PipelineBudget::default()).is_err());
        assert!(Mapping::parse(&json!(["$prev", "$prev.s"])).unwrap().resolve(&scope, &PipelineBudget::default()).is_ok());
    }
}
