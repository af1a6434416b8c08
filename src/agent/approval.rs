//! Human approval of tool calls: which calls of a step wait for a decision, and how decisions
//! given at resume time are applied.

use serde::{Deserialize, Serialize};

use crate::model::{ToolCall, Usage};

/// Approvals (tool calls waiting for a human, and shared-tier promotions) share one type and
/// one event, `approval.requested`; tool-call approvals have kind `tool_call`.
pub use crate::registry::PendingApproval;

/// Kind of a tool-call approval.
pub const TOOL_CALL_APPROVAL: &str = "tool_call";

/// A human decision on one approval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalDecision {
    pub id: String,
    pub approved: bool,
    /// Why it was denied; fed back to the model.
    #[serde(default)]
    pub reason: Option<String>,
}

/// The step a paused run stopped in: its calls, and which of them wait for approval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingStep {
    pub step: u32,
    pub finish_reason: String,
    pub calls: Vec<ToolCall>,
    pub approvals: Vec<PendingApproval>,
    /// The tokens of the turn that asked for the calls, reported by the step's `step.end`
    /// when the resumed step finishes (states saved before this field read as zero).
    #[serde(default)]
    pub usage: Usage,
}

/// What to do with one call of a resumed step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CallDecision {
    /// It needed no approval: it runs as any call does, abandoned when the run is aborted.
    Run,
    /// A human approved it: it runs to its end even when the run is aborted meanwhile, so its
    /// result is saved and resuming again does not run it twice.
    Approved,
    Deny(String),
}

impl PendingStep {
    /// Resolves each call against `decisions`. Fails naming the first approval with no
    /// decision, or a decision for an unknown approval id.
    pub(crate) fn resolve(&self, decisions: &[ApprovalDecision]) -> Result<Vec<CallDecision>, String> {
        if let Some(unknown) = decisions.iter().find(|d| !self.approvals.iter().any(|a| a.id == d.id)) {
            return Err(format!("no pending approval with id `{}`", unknown.id));
        }
        // Two decisions for one approval would leave which one counts to their order.
        if let Some(twice) = decisions.iter().enumerate().find_map(|(i, d)| decisions[..i].iter().any(|e| e.id == d.id).then_some(d)) {
            return Err(format!("two decisions for approval `{}`", twice.id));
        }
        self.calls
            .iter()
            .map(|call| match self.approvals.iter().find(|a| a.call_id.as_deref() == Some(call.id.as_str())) {
                None => Ok(CallDecision::Run),
                Some(approval) => match decisions.iter().find(|d| d.id == approval.id) {
                    None => Err(format!("approval `{}` for `{}` has no decision", approval.id, approval.tool)),
                    Some(d) if d.approved => Ok(CallDecision::Approved),
                    Some(d) => Ok(CallDecision::Deny(d.reason.clone().unwrap_or_else(|| "no reason given".into()))),
                },
            })
            .collect()
    }
}
