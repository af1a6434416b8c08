//! The registry's data: tiers, per-tool stats, tool records with their versions, audit
//! entries, pending approvals (the TS shapes of `npm/src/emergent/types.ts`), and the
//! emergent configuration.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::forge::{ForgeOrigin, ForgeRequest, Implementation, Verdict};

/// Where a tool lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// One session; discarded when the session ends.
    Session,
    /// One agent; persisted through the store.
    Agent,
    /// Every agent of the runtime; reached only with human approval.
    Shared,
}

impl Tier {
    /// The tier below (`None` for session).
    pub fn lower(self) -> Option<Tier> {
        match self {
            Tier::Session => None,
            Tier::Agent => Some(Tier::Session),
            Tier::Shared => Some(Tier::Agent),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Session => "session",
            Tier::Agent => "agent",
            Tier::Shared => "shared",
        }
    }
}

/// Usage of one tool (the TS `ToolStats`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "camelCase")]
pub struct ToolStats {
    pub calls: u64,
    pub successes: u64,
    pub failures: u64,
    /// successes / calls, 0 when never called.
    pub success_rate: f64,
    pub avg_latency_ms: f64,
}

impl ToolStats {
    /// Adds one call.
    pub fn record(&mut self, ok: bool, latency_ms: f64) {
        let one = ToolStats { calls: 1, successes: u64::from(ok), failures: u64::from(!ok), success_rate: f64::from(u8::from(ok)), avg_latency_ms: latency_ms };
        self.merge(&one);
    }

    /// The calls counted since `earlier`, a reading of these same stats before them.
    pub fn since(&self, earlier: &ToolStats) -> ToolStats {
        let calls = self.calls.saturating_sub(earlier.calls);
        if calls == 0 {
            return ToolStats::default();
        }
        let successes = self.successes.saturating_sub(earlier.successes);
        let failures = self.failures.saturating_sub(earlier.failures);
        let latency_total = self.avg_latency_ms * self.calls as f64 - earlier.avg_latency_ms * earlier.calls as f64;
        ToolStats { calls, successes, failures, success_rate: successes as f64 / calls as f64, avg_latency_ms: latency_total.max(0.0) / calls as f64 }
    }

    /// Adds the calls counted in `other` (another agent's, or calls not yet written).
    pub fn merge(&mut self, other: &ToolStats) {
        let calls = self.calls + other.calls;
        if calls == 0 {
            return;
        }
        self.avg_latency_ms = (self.avg_latency_ms * self.calls as f64 + other.avg_latency_ms * other.calls as f64) / calls as f64;
        self.calls = calls;
        self.successes += other.successes;
        self.failures += other.failures;
        self.success_rate = self.successes as f64 / calls as f64;
    }
}

/// Whether a tool may be called at its tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "lowercase")]
pub enum ToolStatus {
    Active,
    /// Moved down a tier; this tier's entry is kept as a tombstone and cannot be called.
    Demoted,
}

/// One version of a tool: its full content, hash and verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolVersion {
    pub version: u32,
    /// sha256 (hex) of the canonical content (see `hash.rs`).
    pub hash: String,
    pub request: ForgeRequest,
    pub verdict: Option<Verdict>,
    pub created_at: f64,
    /// The highest tier whose review this version passed: the panel's (agent) or a human's
    /// approval (shared); absent for a version that was only forged. A demotion takes back the
    /// review of the tier it left. A rollback at a tier restores only versions reviewed for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reviewed_for: Option<Tier>,
}

/// What rejected promotions remember so they are not re-asked too soon.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromotionMemo {
    /// The versions whose promotion was rejected, oldest first, one per hash and at most
    /// [`MAX_VERSIONS`] (what a rollback can restore): remembering only the last, a rollback
    /// to an earlier rejected version would have the panel asked about it again at once. A
    /// version leaves this list only when it is promoted itself ([`PromotionMemo::promoted`]):
    /// the promotion of another version, demoted later and rolled back from, does not make a
    /// rejected one eligible again, and a session forging a new version over this agent's
    /// promoted tool takes the memo with its history.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<HeldOff>,
    /// Hashes of the versions an operator demoted, oldest first, at most [`MAX_VERSIONS`]: their
    /// uses do not promote them again by themselves. Remembering only the last, a rollback to
    /// a version demoted before it would be promoted back by its uses. (Records written before
    /// this list held one, as `demotedHash`.)
    #[serde(default, alias = "demotedHash", deserialize_with = "one_or_many", skip_serializing_if = "Vec::is_empty")]
    pub demoted: Vec<String>,
}

/// A list, or the one value an older record held in its place.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    // Through `Value`, which the registry reads records with anyway: an untagged enum costs
    // the wasm more.
    match Value::deserialize(d)? {
        Value::String(hash) => Ok(vec![hash]),
        list => serde_json::from_value(list).map_err(serde::de::Error::custom),
    }
}

/// Puts `item` last in `list`, in place of the one `same` finds, and forgets the oldest beyond
/// [`MAX_VERSIONS`] (the versions a rollback can restore): what the memo's lists hold.
fn remember<T>(list: &mut Vec<T>, item: T, same: impl Fn(&T) -> bool) {
    list.retain(|t| !same(t));
    list.push(item);
    let excess = list.len().saturating_sub(MAX_VERSIONS);
    list.drain(..excess);
}

/// One version whose promotion was rejected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldOff {
    /// The version's content hash.
    pub hash: String,
    /// The successful uses (counted by the tool's current stats) before it is asked again.
    pub until_successes: u64,
    /// The panel gave no answer (a deadline, an abort) rather than a no: that holds off only
    /// the automatic promotion (a stalled judge must not hold every later call for its
    /// deadline); an explicit request asks again at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unanswered: bool,
}

impl PromotionMemo {
    /// What holds off the promotion of the version `hash`, if anything does.
    pub fn held_off(&self, hash: &str) -> Option<&HeldOff> {
        self.rejected.iter().find(|h| h.hash == hash)
    }

    /// Holds off the version `hash` until `until_successes` successful uses; the oldest
    /// version held off is forgotten beyond [`MAX_VERSIONS`].
    pub(crate) fn hold_off(&mut self, hash: &str, until_successes: u64, unanswered: bool) {
        remember(&mut self.rejected, HeldOff { hash: hash.to_string(), until_successes, unanswered }, |h| h.hash == hash);
    }

    /// Whether an operator demoted the version `hash`.
    pub fn is_demoted(&self, hash: &str) -> bool {
        self.demoted.iter().any(|h| h == hash)
    }

    /// Remembers that an operator demoted the version `hash`; the oldest version demoted is
    /// forgotten beyond [`MAX_VERSIONS`].
    pub(crate) fn demote(&mut self, hash: &str) {
        remember(&mut self.demoted, hash.to_string(), |h| h == hash);
    }

    /// The version `hash` was promoted (an explicit request may promote a demoted one): the
    /// panel's approval overrides its own rejection and an operator's request its own
    /// demotion, so both are forgotten; the other versions' rejections and demotions still
    /// hold, should a demotion and a rollback make one of them current again.
    pub(crate) fn promoted(&mut self, hash: &str) {
        self.rejected.retain(|h| h.hash != hash);
        self.demoted.retain(|h| h != hash);
    }

    /// The version `hash` stops being current after `successes` successful uses (a new
    /// version, a rollback): the uses it still needs are kept, counted from zero, as the uses
    /// of a version made current again are.
    pub(crate) fn version_left(&mut self, hash: &str, successes: u64) {
        if let Some(h) = self.rejected.iter_mut().find(|h| h.hash == hash) {
            h.until_successes = h.until_successes.saturating_sub(successes);
        }
    }
}

/// A promotion to the agent tier the review refused, as the agent remembers it across its
/// sessions and restarts: a session's [`PromotionMemo`] goes with the session, and the same
/// content forged in another one, or after a restart, would have the panel asked again after
/// `promotionThreshold.uses` instead of `promotionRetryUses` more uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RejectedPromotion {
    /// The content hash refused (another content is asked as any other tool is).
    pub hash: String,
    /// For the reader of the store; the hash covers the name.
    pub name: String,
    /// Successful uses a session tool of this content needs, counted by its stats (from when
    /// the version became current there), before it is asked again: the uses in the session
    /// that was refused are not known elsewhere, so another session waits them all.
    pub uses: u64,
    pub rejected_at: f64,
}

/// Most rejected promotions an agent remembers across sessions (the oldest is forgotten
/// first), so that its records in the store do not grow with all it ever forged.
pub const MAX_REJECTED_PROMOTIONS: usize = 100;

/// A registered tool at one tier: current version, history, provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolRecord {
    pub name: String,
    pub tier: Tier,
    pub status: ToolStatus,
    pub current: ToolVersion,
    /// Every version kept for rollback, oldest first (the current one included).
    pub history: Vec<ToolVersion>,
    /// Session that forged or imported it.
    pub session_id: Option<String>,
    pub origin: ForgeOrigin,
    #[serde(default)]
    pub promotion: PromotionMemo,
}

impl ToolRecord {
    /// Adds the versions of `older` (the record this one replaces) that this history lacks,
    /// in version order, keeping the newest [`MAX_VERSIONS`].
    pub(crate) fn absorb_history(&mut self, older: &[ToolVersion]) {
        // Versions are restored by number: one this history already numbers (a lineage forged
        // in another session may reuse numbers) is not taken, nor one it already holds.
        let missing: Vec<ToolVersion> = older.iter().filter(|v| !self.history.iter().any(|h| h.hash == v.hash || h.version == v.version)).cloned().collect();
        self.history.extend(missing);
        self.history.sort_by_key(|v| v.version);
        let excess = self.history.len().saturating_sub(MAX_VERSIONS);
        self.history.drain(..excess);
    }

    /// Records that the current version passed the review for `tier` (in its history too,
    /// where a rollback looks).
    pub(crate) fn mark_reviewed(&mut self, tier: Tier) {
        self.set_review(|reviewed| reviewed.max(Some(tier)));
    }

    /// Takes back the review for `from` of the current version, which an operator demoted
    /// out of that tier: a rollback there must not restore it past the panel or the human
    /// who would have to let it in again. It keeps the review of the tier it went to.
    pub(crate) fn revoke_review(&mut self, from: Tier) {
        let kept = from.lower().filter(|t| *t > Tier::Session);
        self.set_review(|reviewed| reviewed.min(kept));
    }

    /// Sets the review of the current version, in its history too (where a rollback looks).
    fn set_review(&mut self, review: impl Fn(Option<Tier>) -> Option<Tier>) {
        let version = self.current.version;
        for v in std::iter::once(&mut self.current).chain(self.history.iter_mut().filter(|v| v.version == version)) {
            v.reviewed_for = review(v.reviewed_for);
        }
    }
}

/// Most versions a record keeps.
pub const MAX_VERSIONS: usize = 20;

/// A registered tool as listed (the TS `ToolInfo`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "camelCase")]
pub struct ToolInfo {
    pub name: String,
    pub description: String,
    pub tier: Tier,
    pub version: u32,
    pub hash: String,
    /// `compose`, `sandbox` or `host`.
    pub mode: String,
    pub input_schema: Value,
    pub output_schema: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub implementation: Option<Implementation>,
    pub stats: ToolStats,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    /// The session that forged it; absent for another agent's shared tool (that agent's to
    /// know, not this one's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub created_at: f64,
    pub versions: Vec<u32>,
    /// The versions `rollback` restores at this tier: every kept one at the session tier,
    /// above it only those that passed this tier's review (the others are `unreviewed_version`).
    pub restorable_versions: Vec<u32>,
    pub status: ToolStatus,
}

/// An audit trail entry (the TS `AuditEntry`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    pub at: f64,
    /// `forge`, `verdict` (the creation judge's, or one promotion reviewer's: `safety review: …`,
    /// `correctness review: …`, before the `promote` entry saying how it ended), `register`, `reject`, `unchanged` (a forge identical to the tool it
    /// names), `promote`, `demote`, `rollback`, `import`, `import.unchanged` (a package identical
    /// to the tool it names), `import.rejected` (its tests or judge refused it), `import.refused`
    /// (the package itself: unreadable, redacted, its hash not matching), `approval.requested`,
    /// `approval.approved`, `approval.denied`, `approval.withdrawn` (a pending shared-tier request
    /// whose version left the agent tier: demoted, rolled back, replaced, or before the agent
    /// loaded, a request an earlier build kept).
    pub action: String,
    pub tool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Tier>,
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The scope label of the forge attempt the entry records, when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// A request waiting for a human (the TS `PendingApproval`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "camelCase")]
pub struct PendingApproval {
    pub id: String,
    /// `promotion` or `tool_call`.
    #[cfg_attr(feature = "wasm-core", tsify(type = "'promotion' | 'tool_call'"))]
    pub kind: String,
    pub tool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_tier: Option<Tier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_tier: Option<Tier>,
    pub requested_at: f64,
    pub reason: String,
    /// Tool-call approvals: the paused run, the call, and its arguments: those the tool will act
    /// on (a host tool's Standard Schema defaults and transforms applied), not only the model's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<serde_json::Value>,
    /// Promotion approvals: the content hash of the version the human is asked about; a tool
    /// that changed since (a new version, a rollback) is not promoted by this approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
}

/// Promotion thresholds: successful uses and minimum verdict confidence.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PromotionThreshold {
    pub uses: u64,
    pub confidence: f64,
}

impl Default for PromotionThreshold {
    fn default() -> Self {
        Self { uses: 5, confidence: 0.8 }
    }
}

/// `emergent` options of `createAgent` (models are passed separately, see [`super::Judges`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EmergentConfig {
    pub enabled: bool,
    pub max_session_tools: usize,
    pub max_agent_tools: usize,
    /// Applied by the host's sandbox runner.
    pub sandbox_timeout_ms: u64,
    /// Applied by the host's sandbox runner (spelled as the TS option is).
    #[serde(rename = "sandboxMemoryMB")]
    pub sandbox_memory_mb: u64,
    pub promotion_threshold: PromotionThreshold,
    /// Promote a session tool to the agent tier by itself once its successful uses reach the
    /// threshold (same checks and panel as `request_promotion`).
    pub auto_promote: bool,
    /// After a rejected promotion, successful uses needed before asking again (unless the
    /// tool changes first).
    pub promotion_retry_uses: u64,
    #[serde(rename = "allowedSandboxAPIs")]
    pub allowed_sandbox_apis: Vec<String>,
    /// Applied by the host's fetch bridge.
    pub fetch_domain_allowlist: Vec<String>,
    pub persist_sandbox_source: bool,
    /// Most audit entries kept (oldest dropped first).
    pub audit_capacity: usize,
    /// Calls between batched writes of agent/shared tool stats.
    pub stats_flush_every: u32,
}

impl Default for EmergentConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_session_tools: 10,
            max_agent_tools: 50,
            sandbox_timeout_ms: 5000,
            sandbox_memory_mb: 128,
            promotion_threshold: PromotionThreshold::default(),
            auto_promote: true,
            promotion_retry_uses: 5,
            allowed_sandbox_apis: vec![],
            fetch_domain_allowlist: vec![],
            persist_sandbox_source: false,
            audit_capacity: 500,
            stats_flush_every: 16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PromotionMemo;

    #[test]
    fn a_memo_stored_with_one_demoted_hash_reads_as_a_list_of_it() {
        let memo: PromotionMemo = serde_json::from_value(serde_json::json!({ "demotedHash": "h1" })).unwrap();
        assert!(memo.is_demoted("h1"));
        let written = serde_json::to_value(&memo).unwrap();
        assert_eq!(written, serde_json::json!({ "demoted": ["h1"] }));
        assert_eq!(serde_json::from_value::<PromotionMemo>(written).unwrap(), memo);
    }

    #[test]
    fn the_demoted_versions_are_bounded_and_the_oldest_is_forgotten_first() {
        let mut memo = PromotionMemo::default();
        for i in 0..=super::MAX_VERSIONS {
            memo.demote(&format!("h{i}"));
        }
        memo.demote("h5");
        assert_eq!(memo.demoted.len(), super::MAX_VERSIONS);
        assert!(!memo.is_demoted("h0") && memo.is_demoted("h1") && memo.demoted.last().map(String::as_str) == Some("h5"));
    }
}
