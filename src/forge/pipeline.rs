//! The forge pipeline: normalize → infer schemas → shape check → build (compose | sandbox) →
//! test → judge. [`Forge::verify`] returns a verified tool or a classified [`Rejection`],
//! emitting `forge.start`, one `forge.test` per test and `forge.judge`; the registry
//! (`crate::registry`) performs the final step — register, with `forge.registered` or
//! `forge.rejected` — because only it knows tier limits and versions.

use std::fmt;
use std::ops::Deref;
use std::rc::Rc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::agent::{Environment, EventBody};
use crate::model::{Model, Usage};
use crate::registry::ToolInfo;
use crate::sandbox::SandboxRunner;
use crate::tools::{CallContext, SchemaAuthor, Tool, ToolHandler, ToolLookup};

use super::classify::{classify, is_syntax_error, shows_extra_output_field, Evidence, RejectionCategory};
use super::compose::ComposeHandler;
use super::infer::infer_schemas;
use super::judge::{ask, review_prompt, JudgeError, JudgeUsage, ReviewKind, Verdict};
use super::request::{attempt_labels, normalize, ForgeOrigin, ForgeRequest, Implementation};
use super::sandboxed::{SandboxToolHandler, UNAVAILABLE_CODE};
use super::shape::{oversized_request_text, shape_check};
use super::testing::{failure_reason, run_tests, TestResult};

/// The outcome of a forge as callers see it (the TS `ForgeResult` union: `success: true` with
/// `tool`, `verdict`, `tests`; or `success: false` with `reason`, `category` and, when the
/// pipeline got that far, `tests` and `verdict`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "camelCase")]
pub struct ForgeResult {
    pub success: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<ToolInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tests: Option<Vec<TestResult>>,
    /// Serialized as the text alone; what the model is told instead travels with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "wasm-core", tsify(type = "string"))]
    pub reason: Option<Reason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<RejectionCategory>,
    /// The request was identical to the tool the session already reaches under its name: that
    /// tool is the result, as it was (no new version, tests or judge call: `tests` is empty
    /// and `verdict` is the one it was registered with).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unchanged: bool,
    /// The tokens the judge (the agent's `emergent.judge`) spent reviewing this request, as its
    /// model reported them: present whenever it was asked, verdict or not (zero when its
    /// provider reported none); absent when the forge ended before review or was `unchanged`.
    /// A `forge_tool` call adds them to its run's usage as well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl ForgeResult {
    /// A rejection result.
    pub fn rejected(r: &Rejection) -> Self {
        Self {
            success: false,
            tool: None,
            verdict: r.verdict.clone(),
            tests: (!r.tests.is_empty()).then(|| r.tests.clone()),
            reason: Some(Reason { text: r.reason.clone(), for_model: r.for_model.clone() }),
            category: Some(r.category),
            unchanged: false,
            usage: r.judge_usage.as_ref().map(|j| j.usage),
        }
    }
}

/// What `forge_tool` tells the model when the judge's provider failed or did not answer.
pub const JUDGE_UNAVAILABLE_FOR_MODEL: &str = "the reviewer was unavailable, so the tool was not reviewed and nothing was registered. This says nothing about your request: call forge_tool again later with the same request, or go on without the tool";

/// What the model is told when the agent has no judge: no request can pass, so it is not told
/// to fix one (a compliant model would forge again every turn).
pub const NO_JUDGE_FOR_MODEL: &str = "this agent has no reviewer configured, so no forged tool can be approved and nothing was registered. This says nothing about your request: do not call forge_tool again; answer with the tools you have";

/// A rejected forge's reason. The host reads it whole (`agent.forge()`); the model may be told
/// something else (see [`Reason::for_model`]), which is never serialized: a host reading the
/// result wants what happened, and a result read back was the host's.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Reason {
    text: String,
    #[serde(skip)]
    for_model: Option<String>,
}

impl Reason {
    /// What the model is told in place of the text, when the text is not for it.
    pub fn for_model(&self) -> Option<&str> {
        self.for_model.as_deref()
    }
}

impl From<String> for Reason {
    fn from(text: String) -> Self {
        Self { text, for_model: None }
    }
}

impl Deref for Reason {
    type Target = str;
    fn deref(&self) -> &str {
        &self.text
    }
}

/// As the text alone unless the model is told otherwise: test output reads as it did when the
/// reason was a string.
impl fmt::Debug for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.for_model {
            None => fmt::Debug::fmt(&self.text, f),
            Some(for_model) => f.debug_struct("Reason").field("text", &self.text).field("for_model", for_model).finish(),
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// What the registry says of a named request before it is tested (see [`Forge::verify`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Test, judge and register it. `next_version` is the number a new version of the name
    /// would get now: a version numbered from it on was registered while this one was checked.
    New { next_version: u32 },
    /// Identical (content hash) to the active, judged tool the session reaches under its name.
    Unchanged(Box<Kept>),
}

/// The tool an unchanged request already is, with the verdict it was registered with.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    pub tool: ToolInfo,
    pub verdict: Verdict,
    /// The attempt's scope label.
    pub scope: Option<String>,
}

/// A request that passed [`Forge::verify`].
#[derive(Debug, Clone)]
pub enum Checked {
    Verified(Box<Verified>),
    /// Nothing to test or judge: the request is a tool the session already has.
    Unchanged(Box<Kept>),
}

/// A request that passed every check: ready to register.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The normalized request, schemas inferred where they were missing.
    pub request: ForgeRequest,
    pub tool: Tool,
    pub verdict: Verdict,
    pub tests: Vec<TestResult>,
    /// What [`Admission::New`] said when the request was admitted.
    pub next_version: u32,
    /// What the judge's review spent.
    pub judge_usage: Option<JudgeUsage>,
}

/// A rejected forge, classified.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    /// The tool name when the request got far enough to have one.
    pub name: String,
    pub reason: String,
    pub category: RejectionCategory,
    pub tests: Vec<TestResult>,
    pub verdict: Option<Verdict>,
    /// The attempt's scope label (the request's, else the caller's).
    pub scope: Option<String>,
    /// The sandbox could not run the tests (its queue was full, say): no verdict on the code,
    /// so the attempt is reported but not counted in the forge stats.
    pub sandbox_unavailable: bool,
    /// What the model is told instead of `reason` (see [`Reason::for_model`]).
    pub for_model: Option<String>,
    /// What the judge spent when it was asked (a rejection it gave, or one after it).
    pub judge_usage: Option<JudgeUsage>,
}

impl Rejection {
    pub fn new(name: &str, reason: impl Into<String>, evidence: Evidence) -> Self {
        Self {
            name: name.to_string(),
            reason: reason.into(),
            category: classify(&evidence),
            tests: vec![],
            verdict: None,
            scope: None,
            sandbox_unavailable: false,
            for_model: None,
            judge_usage: None,
        }
    }
}

/// The forge: judge model, sandbox runner, clock and the sandbox API allowlist.
#[derive(Clone)]
pub struct Forge {
    judge: Option<Rc<dyn Model>>,
    sandbox: Option<Rc<dyn SandboxRunner>>,
    env: Rc<dyn Environment>,
    allowed_sandbox_apis: Vec<String>,
}

impl std::fmt::Debug for Forge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forge").field("judge", &self.judge.as_ref().map(|m| m.id())).finish_non_exhaustive()
    }
}

impl Forge {
    /// A forge. Without a judge every forge is rejected (fail-closed); without a sandbox
    /// runner only compose tools can be built.
    pub fn new(judge: Option<Rc<dyn Model>>, sandbox: Option<Rc<dyn SandboxRunner>>, env: Rc<dyn Environment>, allowed_sandbox_apis: Vec<String>) -> Self {
        Self { judge, sandbox, env, allowed_sandbox_apis }
    }

    /// The judge model, if any.
    pub fn judge(&self) -> Option<&Rc<dyn Model>> {
        self.judge.as_ref()
    }

    /// Builds the runnable tool for a request over the visible `tools`.
    pub fn build(&self, request: &ForgeRequest, tools: &Rc<dyn ToolLookup>, session: &str) -> Result<Tool, (String, Evidence)> {
        let handler: Rc<dyn ToolHandler> = match &request.implementation {
            Implementation::Compose { steps } => match ComposeHandler::build(&request.name, steps, tools.clone(), session) {
                Ok(h) => Rc::new(h),
                Err(e) => return Err((format!("compose pipeline rejected: {e}"), Evidence::default())),
            },
            Implementation::Sandbox { code, allowlist } => {
                let Some(code) = code else {
                    return Err(("the sandbox source is redacted; a tool without code cannot be built".into(), Evidence { parse: true, ..Default::default() }));
                };
                let Some(runner) = &self.sandbox else {
                    return Err(("no sandbox runner is configured; only compose tools can be forged".into(), Evidence::default()));
                };
                Rc::new(SandboxToolHandler::new(runner.clone(), code.clone(), allowlist, &self.allowed_sandbox_apis))
            }
        };
        Tool::new_by(SchemaAuthor::Untrusted, &request.name, &request.description, &request.input_schema, Some(&request.output_schema), handler).map_err(|e| {
            // What the linear-time engine refuses is valid ECMA-262: say what to change.
            let hint = match e.0.contains("is not a \"regex\"") {
                true => " (a forged tool's `pattern` and `patternProperties` may not use lookaround such as `(?=` or `(?!`, nor backreferences such as `\\1`)",
                false => "",
            };
            (format!("a schema is not valid JSON Schema: {e}{hint}"), Evidence { parse: true, ..Default::default() })
        })
    }

    /// Runs the pipeline up to (not including) registration. `admit` is asked once the name is
    /// known and missing schemas are inferred (reserved names, tier limits, an unchanged
    /// request); its `Err` rejects with category `other`. `emit` receives the stage events.
    pub async fn verify(
        &self,
        raw: &Value,
        origin: &ForgeOrigin,
        tools: &Rc<dyn ToolLookup>,
        admit: &dyn Fn(&ForgeRequest) -> Result<Admission, String>,
        emit: &dyn Fn(EventBody),
    ) -> Result<Checked, Rejection> {
        if let Some(reason) = raw.as_str().and_then(|text| oversized_request_text(text.len())) {
            let mut r = Rejection::new("", reason, Evidence { shape: true, ..Default::default() });
            r.scope = origin.scope.clone();
            return Err(r);
        }
        let mut request = match normalize(raw) {
            Ok(r) => r,
            Err(e) => {
                // The name is recorded (stats, audit, a store key): made a tool name, as a
                // request that parses would have it, or none.
                let (name, scope) = attempt_labels(raw);
                let mut r = Rejection::new(
                    &name.unwrap_or_default(),
                    format!("could not parse the forge request: {e}"),
                    Evidence { parse: true, ..Default::default() },
                );
                r.scope = scope.or_else(|| origin.scope.clone());
                return Err(r);
            }
        };
        if request.scope.is_none() {
            request.scope = origin.scope.clone();
        }
        let scope = request.scope.clone();
        self.verify_request(request, origin, tools, admit, emit).await.map_err(|r| Rejection { scope, ..r })
    }

    /// [`Forge::verify`] after normalization.
    async fn verify_request(
        &self,
        mut request: ForgeRequest,
        origin: &ForgeOrigin,
        tools: &Rc<dyn ToolLookup>,
        admit: &dyn Fn(&ForgeRequest) -> Result<Admission, String>,
        emit: &dyn Fn(EventBody),
    ) -> Result<Checked, Rejection> {
        emit(EventBody::ForgeStart {
            name: request.name.clone(),
            mode: request.implementation.mode().into(),
            agent_id: origin.agent_id.clone(),
            session_id: origin.session_id.clone(),
            scope: request.scope.clone(),
        });
        // Inferred first: an unchanged request is recognised by the content it is stored with.
        infer_schemas(&mut request);
        // Before admission: a malformed request is `shape_check` whether or not there is room
        // for it (a registered tool passed this check, so an unchanged one still does).
        if let Err(issues) = shape_check(&request) {
            return Err(Rejection::new(&request.name, issues.reasons.join("; "), issues.evidence));
        }
        let next_version = match admit(&request) {
            Err(reason) => return Err(Rejection::new(&request.name, reason, Evidence::default())),
            Ok(Admission::Unchanged(mut kept)) => {
                kept.scope = request.scope;
                return Ok(Checked::Unchanged(kept));
            }
            Ok(Admission::New { next_version }) => next_version,
        };
        let tool = self.build(&request, tools, &origin.session_id).map_err(|(reason, evidence)| Rejection::new(&request.name, reason, evidence))?;

        let ctx = CallContext::for_trial(origin.calls_run_id.clone(), format!("forge-test-{}", request.name), origin.session_id.clone());
        let tests = run_tests(&tool, &request.test_cases, &ctx, self.env.as_ref()).await;
        for test in &tests {
            emit(EventBody::ForgeTest { name: request.name.clone(), test: test.clone() });
        }
        if tests.iter().any(|t| t.error.as_deref().is_some_and(|e| e.starts_with(UNAVAILABLE_CODE))) {
            let reason = format!(
                "the sandbox could not run the tests, so this says nothing of the tool and is not counted in the forge stats; try again: {}",
                failure_reason(&tests).unwrap_or_default()
            );
            let mut r = Rejection::new(&request.name, reason, Evidence::default());
            r.tests = tests;
            r.sandbox_unavailable = true;
            return Err(r);
        }
        if let Some(reason) = failure_reason(&tests) {
            let syntax = tests.iter().any(|t| t.error.as_deref().is_some_and(is_syntax_error));
            let extra_field = tests.iter().any(|t| shows_extra_output_field(&request.output_schema, t));
            let mut r = Rejection::new(&request.name, reason, Evidence { syntax, extra_field, ..Default::default() });
            r.tests = tests;
            return Err(r);
        }

        let prompt = review_prompt(ReviewKind::Creation, &request, &tests, &self.allowed_sandbox_apis);
        let judged = ask(self.judge.as_ref(), ReviewKind::Creation, prompt, &origin.calls_run_id).await;
        let judge_usage = judged.usage;
        let verdict = match judged.verdict {
            Ok(v) => v,
            Err(e) => {
                let evidence = Evidence { parse: e.is_unreadable_answer(), ..Default::default() };
                let mut r = Rejection::new(&request.name, format!("no verdict, so the tool is rejected: {e}"), evidence);
                r.tests = tests;
                // The provider's error stays with the host (result, event, audit): it can quote
                // keys, internal hosts and paths, and the model could fix nothing in it.
                r.for_model = match e {
                    JudgeError::NotConfigured => Some(NO_JUDGE_FOR_MODEL.to_string()),
                    _ => e.is_provider_failure().then(|| JUDGE_UNAVAILABLE_FOR_MODEL.to_string()),
                };
                r.judge_usage = judge_usage;
                return Err(r);
            }
        };
        let usage = judge_usage.as_ref().map(|j| j.usage).unwrap_or_default();
        emit(EventBody::ForgeJudge { name: request.name.clone(), verdict: verdict.clone(), usage });
        if !verdict.approved {
            let evidence = Evidence { judge_correctness: verdict.is_correctness_rejection(), ..Default::default() };
            let mut r = Rejection::new(&request.name, format!("the judge rejected the tool: {}", verdict.reasoning), evidence);
            r.tests = tests;
            r.verdict = Some(verdict);
            r.judge_usage = judge_usage;
            return Err(r);
        }
        Ok(Checked::Verified(Box::new(Verified { request, tool, verdict, tests, next_version, judge_usage })))
    }
}
