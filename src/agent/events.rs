//! The one event stream (DESIGN decision 5): every event of a run, tagged by `type`, carrying
//! the run id and run path. The TS `AgentEvent` union is generated from these types (tsify),
//! so consumers narrow on `type` exhaustively.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::forge::{RejectionCategory, TestResult, Verdict};
use crate::model::Usage;
use crate::registry::{PendingApproval, Tier};
use crate::tools::ToolFailure;

use super::usage::RunUsage;

/// A typed error as carried by events and results: stable `code`, readable `message`, and for
/// a provider's HTTP error its `status` (a 401 and a 429 call for different handling).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
pub struct ErrorInfo {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "wasm-core", tsify(optional))]
    pub status: Option<u16>,
}

/// An event of a run. `runPath` lists the run ids from the outermost run to this one.
/// (Its TS type, `EventBody & { runId; runPath }`, is declared in `src/wasm/core.rs`: tsify
/// renders a flattened union as an invalid `interface … extends`.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentEvent {
    pub run_id: String,
    pub run_path: Vec<String>,
    #[serde(flatten)]
    pub body: EventBody,
}

/// What happened. Serialized with `type` as the tag (`"tool.execute.end"`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(tag = "type")]
pub enum EventBody {
    /// The run started.
    #[serde(rename = "agent.start", rename_all = "camelCase")]
    AgentStart { session_id: String, input: String, model: String },
    /// A model turn starts (`step` counts turns from 0).
    #[serde(rename = "step.start", rename_all = "camelCase")]
    StepStart { step: u32 },
    /// A piece of the model's text, as it streams.
    #[serde(rename = "text.delta", rename_all = "camelCase")]
    TextDelta { step: u32, delta: String },
    /// The model asked for a tool call. `arguments` is the parsed JSON, or the raw text when
    /// it did not parse.
    #[serde(rename = "tool.call", rename_all = "camelCase")]
    ToolCall { step: u32, call_id: String, name: String, arguments: Value },
    /// A validated call starts executing.
    #[serde(rename = "tool.execute.start", rename_all = "camelCase")]
    ToolExecuteStart { step: u32, call_id: String, name: String },
    /// A call finished with output.
    #[serde(rename = "tool.execute.end", rename_all = "camelCase")]
    ToolExecuteEnd { step: u32, call_id: String, name: String, result: Value, duration_ms: f64 },
    /// A call failed (unknown tool, invalid arguments, thrown error, oversized result…); the
    /// model receives the error and the loop goes on.
    #[serde(rename = "tool.execute.error", rename_all = "camelCase")]
    ToolExecuteError { step: u32, call_id: String, name: String, error: ToolFailure, duration_ms: f64 },
    /// A model turn ended.
    #[serde(rename = "step.end", rename_all = "camelCase")]
    StepEnd { step: u32, finish_reason: String, usage: Usage, tool_calls: u32 },
    /// The final answer did not validate against `returns`; the model is asked again.
    #[serde(rename = "output.retry", rename_all = "camelCase")]
    OutputRetry { step: u32, reason: String },
    /// The run finished with a final answer (`output` is the parsed value when `returns` is
    /// set, else the text). `finishReason` says why the answer ended (see
    /// [`crate::model::finish_kind`]): `length` is an answer cut off at the token limit.
    #[serde(rename = "agent.end", rename_all = "camelCase")]
    AgentEnd {
        output: Value,
        text: String,
        usage: RunUsage,
        turns: u32,
        steps: u32,
        #[cfg_attr(feature = "wasm-core", tsify(type = "'stop' | 'length' | 'content_filter' | 'other'"))]
        finish_reason: String,
    },
    /// The run paused for approvals; continue it with `resume`.
    #[serde(rename = "agent.paused", rename_all = "camelCase")]
    AgentPaused {
        approvals: Vec<PendingApproval>,
        usage: RunUsage,
        /// The run's resumable state (plain JSON; also persisted when the agent has a store).
        state: Value,
    },
    /// The run failed (limit, model error, abort).
    #[serde(rename = "agent.error", rename_all = "camelCase")]
    AgentError { error: ErrorInfo, usage: RunUsage },
    /// A forge attempt passed normalization (`mode`: `compose` or `sandbox`), tagged with who
    /// asked: agent, session and the optional scope label.
    #[serde(rename = "forge.start", rename_all = "camelCase")]
    ForgeStart {
        name: String,
        mode: String,
        agent_id: String,
        session_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<String>,
    },
    /// One forge-time test ran.
    #[serde(rename = "forge.test", rename_all = "camelCase")]
    ForgeTest { name: String, test: TestResult },
    /// The judge returned a verdict. `usage`: the tokens that judge call spent, as the judge's
    /// model reported them (zero when it reported none).
    #[serde(rename = "forge.judge", rename_all = "camelCase")]
    ForgeJudge { name: String, verdict: Verdict, usage: Usage },
    /// A verified tool was registered; or, `unchanged`, the forge was identical to the tool
    /// the session reaches under that name, which stays as it is (this is its tier and version).
    /// Tagged with the attempt's agent, session and scope, as `forge.rejected` is: forges of one
    /// name in two sessions, or under two scopes, are told apart by their outcome alone.
    #[serde(rename = "forge.registered", rename_all = "camelCase")]
    ForgeRegistered {
        name: String,
        tier: Tier,
        version: u32,
        hash: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        unchanged: bool,
        agent_id: String,
        session_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<String>,
    },
    /// A forge was rejected, with its category and the attempt's tags (a request that did not
    /// parse has no `forge.start`, so these are its only ones).
    #[serde(rename = "forge.rejected", rename_all = "camelCase")]
    ForgeRejected {
        name: String,
        category: RejectionCategory,
        reason: String,
        agent_id: String,
        session_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<String>,
    },
    /// A tool moved up a tier.
    #[serde(rename = "tool.promoted", rename_all = "camelCase")]
    ToolPromoted { name: String, from_tier: Tier, to_tier: Tier, version: u32 },
    /// A tool moved down a tier.
    #[serde(rename = "tool.demoted", rename_all = "camelCase")]
    ToolDemoted { name: String, from_tier: Tier, to_tier: Tier },
    /// A promotion was refused after review: tests failing on re-run, the panel, a human
    /// denying a shared promotion, or a pending shared promotion withdrawn because the version
    /// it asks for left the agent tier (its `reason` names the approval). The tool stays where
    /// it was; `reason` says why.
    #[serde(rename = "promotion.rejected", rename_all = "camelCase")]
    PromotionRejected { name: String, from_tier: Tier, to_tier: Tier, reason: String },
    /// A human decision is needed: a tool call with `needsApproval` (kind `tool_call`; the
    /// run pauses) or a shared-tier promotion (kind `promotion`; `approve`/`deny`).
    #[serde(rename = "approval.requested", rename_all = "camelCase")]
    ApprovalRequested { approval: PendingApproval },
    /// The registry re-read a tier from the store because another agent of the runtime (or
    /// another tab) changed it; `tools` is how many tools that tier now holds.
    #[serde(rename = "registry.reloaded", rename_all = "camelCase")]
    RegistryReloaded { tier: Tier, tools: u32, at: f64 },
}

/// Receives events as they happen.
pub trait EventSink {
    fn emit(&mut self, event: AgentEvent);
}

/// Collects events in memory (tests, and `run()`-style callers).
#[derive(Debug, Default)]
pub struct CollectingSink {
    pub events: Vec<AgentEvent>,
}

impl EventSink for CollectingSink {
    fn emit(&mut self, event: AgentEvent) {
        self.events.push(event);
    }
}

impl<F: FnMut(AgentEvent)> EventSink for F {
    fn emit(&mut self, event: AgentEvent) {
        self(event)
    }
}
