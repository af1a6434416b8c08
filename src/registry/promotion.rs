//! Promotion between tiers.
//!
//! session → agent: the tool needs `promotionThreshold.uses` successful calls and a creation
//! verdict with confidence above `promotionThreshold.confidence` (as the spec words it: equal is
//! not enough); its tests are re-run;
//! then a two-reviewer panel (a safety reviewer and a correctness reviewer: two judge calls with
//! different prompts) must both approve, each with confidence above that same threshold (an
//! approval at or below it is a rejection). A panel or test rejection is remembered: the same
//! version is not re-asked until `promotionRetryUses` more successful calls have passed or the
//! tool changed (new hash). Each rejected version keeps its count (see
//! [`super::PromotionMemo`]), so a rollback to one does not re-ask the panel before its uses
//! have passed, not even after another version was promoted and demoted in between. The
//! agent remembers a rejection by content hash too ([`super::RejectedPromotion`], stored), so
//! the same content forged in another session or after a restart waits as long. A panel
//! that gave no answer at all (its deadline passed, its request was aborted) holds off only
//! the automatic promotion: it said nothing of the tool.
//! A compose tool moves up only above the tools its steps call ([`Registry::steps_reached`]):
//! its tests re-run in the promoting session, which reaches tools the new tier's callers do not.
//! agent → shared: emits `approval.requested` and waits for
//! [`Registry::approve`] / [`Registry::deny`]; pending approvals are persisted.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::agent::{unless_cancelled, CancelSignal, EventBody};
use crate::forge::{ask_judge, review_prompt, run_tests, ForgeRequest, Implementation, ReviewKind, Verdict, FORGE_TOOL_NAME};
use crate::guard::OnDrop;
use crate::model::Usage;
use crate::store::{BatchOp, Store};
use crate::tools::CallContext;

use super::{
    tool_info, Entry, PendingApproval, Registry, RegistryError, RejectedPromotion, State, Tier, ToolInfo, ToolStats, ToolStatus, MAX_REJECTED_PROMOTIONS,
};

/// How a promotion request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromotionStatus {
    /// The tool moved up.
    Promoted,
    /// Waiting for a human (`approve`/`deny`).
    Pending,
    /// Refused (thresholds, tests, panel, limits); see `reason`.
    Rejected,
    /// Not asked now: the same version was rejected and not enough uses passed since, or a
    /// review of this tool is already under way.
    Suppressed,
}

/// The outcome of [`Registry::request_promotion`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromotionOutcome {
    pub status: PromotionStatus,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<ToolInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<PendingApproval>,
    /// The panel's verdicts (safety, correctness) when it was asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verdicts: Vec<Verdict>,
    /// The tokens the panel's judge calls spent, together, as its model reported them: present
    /// when the panel was asked, whatever it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl PromotionOutcome {
    fn new(status: PromotionStatus, reason: impl Into<String>) -> Self {
        Self { status, reason: reason.into(), tool: None, approval: None, verdicts: vec![], usage: None }
    }

    /// This outcome, with what the panel spent reaching it.
    fn spent(self, usage: Option<Usage>) -> Self {
        Self { usage, ..self }
    }
}

/// Why a review for the agent tier did not approve, as [`Registry::remember_rejection`] keeps it.
struct Refusal {
    reason: String,
    verdicts: Vec<Verdict>,
    /// No answer rather than a no (see [`super::PromotionMemo::unanswered`]).
    unanswered: bool,
}

impl Refusal {
    fn new(reason: String, verdicts: Vec<Verdict>) -> Self {
        Self { reason, verdicts, unanswered: false }
    }
}

/// Why a promotion to the agent tier withdraws a pending shared request for the version it
/// replaces.
const REPLACED: &str = "another version was promoted to the agent tier in its place";

/// Why the panel's verdicts (safety, then correctness) do not promote, if they do not: a
/// reviewer rejected, or approved with a confidence not above `threshold`
/// (`promotionThreshold.confidence`, held to the panel as to the creation verdict: an approval
/// its reviewer is unsure of is no approval).
fn panel_refusal(verdicts: &[Verdict], threshold: f64) -> Option<String> {
    let reviewer = |i: usize| if i == 0 { "safety" } else { "correctness" };
    if let Some(no) = verdicts.iter().position(|v| !v.approved) {
        return Some(format!("the {} reviewer rejected: {}", reviewer(no), verdicts[no].reasoning));
    }
    let unsure = verdicts.iter().position(|v| v.confidence <= threshold)?;
    Some(format!(
        "the {} reviewer approved with confidence {}, not above promotionThreshold.confidence {threshold}: an approval that unsure counts as a rejection",
        reviewer(unsure),
        verdicts[unsure].confidence
    ))
}

/// Whether the audit trail already records the request `id` as withdrawn. A withdrawal at
/// load is best effort: when the store refuses it, a later write carries its audit entry (see
/// `Unwritten`) but not the request's delete, so the next load finds the request again and
/// withdraws it again; one request is audited withdrawn once.
fn withdrawal_audited(state: &super::State, id: &str) -> bool {
    let names = |a: &super::AuditEntry| a.detail.strip_prefix(id).is_some_and(|rest| rest.starts_with(':'));
    state.audit.iter().any(|a| a.action == "approval.withdrawn" && names(a))
}

/// Why a pending shared request the store kept is withdrawn at load (see
/// [`Registry::withdraw_requests_left_stale`]).
const LEFT_BEFORE_LOAD: &str = "the version it asks for had left the agent tier before this agent loaded";

/// Where an agent's rejected promotions live under its prefix.
const REJECTION_KEYS: &str = "promotion-rejection/";

/// The store kind of a [`RejectedPromotion`].
const REJECTION_KIND: &str = "promotion-rejection";

/// The rejected promotions the store keeps for the agent whose records are under `prefix`,
/// oldest first, the newest [`MAX_REJECTED_PROMOTIONS`]. A record it cannot read (a newer
/// build's) is left out rather than failing the load: forgetting one costs a panel asked
/// sooner, as before rejections were stored. The excess is deleted best effort (again at the
/// next load if refused).
pub(super) async fn load_rejected_promotions(store: &dyn Store, prefix: &str) -> Result<Vec<RejectedPromotion>, RegistryError> {
    let keys = format!("{prefix}{REJECTION_KEYS}");
    let records = store.scan(&keys).await?;
    // A store of the host's own may return keys outside the prefix: skipped.
    let readable = records.into_iter().filter(|(key, _)| key.starts_with(&keys));
    let mut rejected: Vec<RejectedPromotion> = readable.filter_map(|(key, value)| super::unversioned(&key, REJECTION_KIND, value).ok()).collect();
    rejected.sort_by(|a, b| a.rejected_at.total_cmp(&b.rejected_at));
    let excess = rejected.len().saturating_sub(MAX_REJECTED_PROMOTIONS);
    let dropped: Vec<BatchOp> = rejected.drain(..excess).map(|r| BatchOp::Delete { key: format!("{keys}{}", r.hash) }).collect();
    if !dropped.is_empty() {
        let _ = store.batch(dropped).await;
    }
    Ok(rejected)
}

/// The successful uses a session tool of content `hash` with `successes` still needs before
/// its promotion is asked again, after the agent's review refused that content (in this
/// session or another, before a restart or after).
fn uses_before_reasking(state: &State, hash: &str, successes: u64) -> Option<u64> {
    let rejected = state.rejected_promotions.iter().find(|r| r.hash == hash)?;
    rejected.uses.checked_sub(successes).filter(|needed| *needed > 0)
}

/// The tools the steps of `request` call, as (the tool whose step it is, step, tool called).
fn step_calls(request: &ForgeRequest) -> Vec<(String, String, String)> {
    match &request.implementation {
        Implementation::Compose { steps } => steps.iter().map(|s| (request.name.clone(), s.name.clone(), s.tool.clone())).collect(),
        Implementation::Sandbox { .. } => vec![],
    }
}

/// How the callers of a tier reach a tool a step calls.
enum StepTool<'s> {
    /// As one of their own (a host tool, `forge_tool`): nothing more to check.
    Own,
    /// A forged tool at that tier or above: its own steps must be reached too.
    Forged(&'s ForgeRequest),
    /// Not at all: where it is instead, and what to do about it.
    Unreached(String),
}

impl Registry {
    /// Asks to move `name` up to `to` (`agent` from the session tier of `session`, or
    /// `shared` from the agent tier).
    pub async fn request_promotion(&self, name: &str, to: Tier, session: &str) -> Result<PromotionOutcome, RegistryError> {
        self.request_promotion_cancellable(name, to, session, None, "").await
    }

    /// [`Registry::request_promotion`] that `cancel` stops while the tool's tests re-run and
    /// the panel reviews it: it then fails with [`RegistryError::Aborted`] and nothing is
    /// recorded (no rejection remembered, the tool stays callable where it was). Once the
    /// panel approved, the promotion commits. The panel's judge and the host tools the tests
    /// call get `calls_run_id` as their run id, so the host can hand them the signal too.
    pub async fn request_promotion_cancellable(
        &self,
        name: &str,
        to: Tier,
        session: &str,
        cancel: Option<&dyn CancelSignal>,
        calls_run_id: &str,
    ) -> Result<PromotionOutcome, RegistryError> {
        // A forged tool under an own tool's name is reached nowhere; it does not move up either.
        if let Err(reason) = self.refuse_own_name(name) {
            return Ok(PromotionOutcome::new(PromotionStatus::Rejected, reason));
        }
        match to {
            Tier::Agent => self.promote_to_agent(name, session, cancel, calls_run_id).await,
            Tier::Shared => self.request_shared(name, session).await,
            Tier::Session => Err(RegistryError::InvalidPromotion { name: name.into(), from: "any".into(), to: "session".into() }),
        }
    }

    /// Whether a session tool just became eligible for automatic promotion: enough successful
    /// uses, a confident verdict, and no rejected promotion of this version waiting for more
    /// uses. Cheap; the promotion itself re-runs tests and asks the panel.
    pub(crate) fn auto_promotion_due(&self, name: &str, session: &str) -> bool {
        let config = self.config();
        if !config.enabled || !config.auto_promote {
            return false;
        }
        let state = self.state.borrow();
        let Some(e) = state.entry(Tier::Session, session, name) else { return false };
        if e.record.status != ToolStatus::Active || e.stats.successes < config.promotion_threshold.uses {
            return false;
        }
        let confidence = e.record.current.verdict.as_ref().map(|v| v.confidence).unwrap_or(0.0);
        let memo = &e.record.promotion;
        let suppressed = memo.held_off(&e.record.current.hash).is_some_and(|h| e.stats.successes < h.until_successes)
            || uses_before_reasking(&state, &e.record.current.hash, e.stats.successes).is_some();
        // An operator demoted this very content out of the agent tier (its tombstone there holds
        // the hash): forged again, in another session or after a restart, its uses do not
        // undo that either.
        let demoted = memo.is_demoted(&e.record.current.hash)
            || state.agent.get(name).is_some_and(|above| !above.active() && above.record.current.hash == e.record.current.hash);
        let reviewing = state.promoting.iter().any(|(s, n)| s == session && n == name) || self.background.is_promoting(session, name);
        confidence > config.promotion_threshold.confidence && !suppressed && !demoted && !reviewing
    }

    /// Records, announces and answers a review of `version` (content `hash`) for the agent tier
    /// that did not approve; remembered so that it is not asked again too soon, in this session
    /// and, unless the panel gave no answer (it said nothing of the content), in any other.
    async fn remember_rejection(&self, name: &str, version: u32, hash: &str, session: &str, refusal: Refusal) -> Result<PromotionOutcome, RegistryError> {
        let Refusal { reason, verdicts, unanswered } = refusal;
        let ops = {
            let mut state = self.state.borrow_mut();
            self.hold_off_promotion(&mut state, name, session, unanswered);
            if unanswered {
                vec![]
            } else {
                self.remember_rejected_content(&mut state, name, hash)
            }
        };
        // Best effort, as the audit entry is: memory holds it for as long as the agent runs.
        if !ops.is_empty() {
            let _ = self.persist(ops).await;
        }
        self.refuse_promotion(name, version, session, reason, verdicts).await
    }

    /// Remembers for the agent that its review refused the content `hash` of `name` (the
    /// rejection before of that content replaced); returns the ops storing it and deleting
    /// the oldest beyond [`MAX_REJECTED_PROMOTIONS`].
    fn remember_rejected_content(&self, state: &mut State, name: &str, hash: &str) -> Vec<BatchOp> {
        let rejected = RejectedPromotion { hash: hash.to_string(), name: name.to_string(), uses: self.config().promotion_retry_uses, rejected_at: self.now() };
        let mut ops = vec![BatchOp::Put { key: self.rejection_key(hash), value: super::versioned(REJECTION_KIND, &rejected) }];
        let list = &mut state.rejected_promotions;
        list.retain(|r| r.hash != hash);
        list.push(rejected);
        let excess = list.len().saturating_sub(MAX_REJECTED_PROMOTIONS);
        let forgotten: Vec<RejectedPromotion> = list.drain(..excess).collect();
        ops.extend(forgotten.iter().map(|r| BatchOp::Delete { key: self.rejection_key(&r.hash) }));
        ops
    }

    fn rejection_key(&self, hash: &str) -> String {
        format!("{}{REJECTION_KEYS}{hash}", super::agent_prefix(&self.agent_id))
    }

    /// Why a compose tool (`request`) moved up to `target` would fail there, if it would: a step
    /// of it, or of a compose tool it calls, calls a tool the callers of that tier do not reach.
    fn steps_reached(&self, state: &State, request: &ForgeRequest, target: Tier, session: &str) -> Result<(), String> {
        let mut pending = step_calls(request);
        let mut seen = BTreeSet::new();
        while let Some((owner, step, tool)) = pending.pop() {
            // A loop of pipelines is refused when forged; a tool checked once is checked.
            if !seen.insert(tool.clone()) {
                continue;
            }
            match self.step_tool_at(state, &tool, target, session) {
                StepTool::Own => {}
                StepTool::Forged(called) => pending.extend(step_calls(called)),
                StepTool::Unreached(why) => {
                    let of = if owner == request.name { String::new() } else { format!(" of `{owner}`") };
                    return Err(format!("step `{step}`{of} calls `{tool}`, which {why}"));
                }
            }
        }
        Ok(())
    }

    /// How the callers of `target` reach the tool `name` a step calls. Those of the agent tier
    /// reach the host tools, the agent tier and the shared tier. Those of the shared tier are
    /// every agent of the runtime: the shared tier, and host tools of their own that this
    /// agent cannot know, so a name no tier here holds forged is taken for one (the README
    /// tells hosts so), and one forged below the shared tier is not reached.
    fn step_tool_at<'s>(&self, state: &'s State, name: &str, target: Tier, session: &str) -> StepTool<'s> {
        if self.is_own(name) || (self.config().enabled && name == FORGE_TOOL_NAME) {
            return StepTool::Own;
        }
        let reached: &[Tier] = match target {
            Tier::Session => &[Tier::Session, Tier::Agent, Tier::Shared],
            Tier::Agent => &[Tier::Agent, Tier::Shared],
            Tier::Shared => &[Tier::Shared],
        };
        let active = |tier: Tier| state.entry(tier, session, name).filter(|e| e.active());
        if let Some(entry) = reached.iter().find_map(|tier| active(*tier)) {
            return StepTool::Forged(&entry.record.current.request);
        }
        let why = if active(Tier::Agent).is_some() {
            "is only at this agent's tier: promote it to the shared tier first".to_string()
        } else if active(Tier::Session).is_some() {
            format!("is only in session `{session}`: promote it first")
        } else if target == Tier::Shared {
            return StepTool::Own;
        } else {
            format!("no tier from the {} tier up holds", target.as_str())
        };
        StepTool::Unreached(why)
    }

    /// Audits (with the panel's verdicts), announces and answers a promotion of `version` to the
    /// agent tier that did not happen.
    pub(super) async fn refuse_promotion(
        &self,
        name: &str,
        version: u32,
        session: &str,
        reason: String,
        verdicts: Vec<Verdict>,
    ) -> Result<PromotionOutcome, RegistryError> {
        let ops = {
            let mut state = self.state.borrow_mut();
            let mut ops = self.panel_audit(&mut state, name, version, &verdicts, session);
            ops.extend(self.audit(
                &mut state,
                "promote",
                name,
                Some(version),
                Some(Tier::Agent),
                format!("promotion rejected: {reason}"),
                Some(session).into(),
            ));
            ops
        };
        // Best effort: the memo lives in memory (session tools are not stored), and a failed
        // audit write must not drop it, or every later use would ask the panel again.
        let _ = self.persist(ops).await;
        self.emit("", EventBody::PromotionRejected { name: name.into(), from_tier: Tier::Session, to_tier: Tier::Agent, reason: reason.clone() });
        let mut out = PromotionOutcome::new(PromotionStatus::Rejected, reason);
        out.verdicts = verdicts;
        Ok(out)
    }

    /// Audit entries of the panel's verdicts on `version` (safety first, then correctness, as
    /// far as it answered).
    fn panel_audit(&self, state: &mut super::State, name: &str, version: u32, verdicts: &[Verdict], session: &str) -> Vec<crate::store::BatchOp> {
        let reviewers = ["safety", "correctness"].into_iter().zip(verdicts);
        reviewers
            .flat_map(|(who, v)| {
                let detail = format!("{who} review: {}", super::verdict_detail(v));
                self.audit(state, "verdict", name, Some(version), None, detail, Some(session).into())
            })
            .collect()
    }

    /// Remembers that this version's promotion did not happen: it is not asked again until
    /// `promotionRetryUses` more successful uses or a new version (`unanswered`: not by
    /// itself; an explicit request may ask at once).
    pub(crate) fn hold_off_promotion(&self, state: &mut super::State, name: &str, session: &str, unanswered: bool) {
        let until = |successes: u64| successes + self.config().promotion_retry_uses;
        if let Some(e) = state.entry_mut(Tier::Session, session, name) {
            e.record.promotion.hold_off(&e.record.current.hash, until(e.stats.successes), unanswered);
        }
    }

    /// Why `request` does not fit the agent tier: no room, or steps calling tools out of reach.
    fn fits_agent_tier(&self, state: &State, request: &ForgeRequest, session: &str) -> Result<(), String> {
        let name = &request.name;
        // Forged in a session that did not reach it then, a look-alike may be there since.
        if let Some(other) = super::look_alike_in(&state.agent, name) {
            return Err(format!("the agent tier already has `{other}`, a name too close to `{name}` (names are compared ignoring case and `-` vs `_`)"));
        }
        self.agent_room(state, name).and_then(|()| self.steps_reached(state, request, Tier::Agent, session))
    }

    /// Why the agent tier's `name` would fail at the shared tier, if it would (see
    /// [`Registry::steps_reached`]); `session`, that of the request, names where a step tool is.
    fn fits_shared_tier(&self, state: &State, name: &str, session: &str) -> Result<(), String> {
        match state.agent.get(name) {
            Some(entry) => self.steps_reached(state, &entry.record.current.request, Tier::Shared, session),
            None => Ok(()),
        }
    }

    /// Why the agent tier has no room for `name` (a tool already there by that name fits).
    fn agent_room(&self, state: &super::State, name: &str) -> Result<(), String> {
        let max = self.config().max_agent_tools;
        state.room(Tier::Agent, "", name, max).map_err(|count| format!("the agent tier is full ({count} of maxAgentTools {max})"))
    }

    async fn promote_to_agent(
        &self,
        name: &str,
        session: &str,
        cancel: Option<&dyn CancelSignal>,
        calls_run_id: &str,
    ) -> Result<PromotionOutcome, RegistryError> {
        let threshold = self.config().promotion_threshold;
        let (record, stats) = {
            let state = self.state.borrow();
            let e = state
                .entry(Tier::Session, session, name)
                .filter(|e| e.record.status == ToolStatus::Active)
                .ok_or_else(|| RegistryError::NotFound(name.into()))?;
            (e.record.clone(), e.stats.clone())
        };
        let successes = stats.successes;
        let held = record.promotion.held_off(&record.current.hash).filter(|h| !h.unanswered && successes < h.until_successes);
        let remembered = uses_before_reasking(&self.state.borrow(), &record.current.hash, successes);
        if let Some(needed) = held.map(|h| h.until_successes - successes).max(remembered) {
            return Ok(PromotionOutcome::new(
                PromotionStatus::Suppressed,
                format!("this version's promotion was rejected; {needed} more successful uses (or a new version) before asking again"),
            ));
        }
        if successes < threshold.uses {
            return Ok(PromotionOutcome::new(PromotionStatus::Rejected, format!("needs {} successful uses, has {successes}", threshold.uses)));
        }
        let confidence = record.current.verdict.as_ref().map(|v| v.confidence).unwrap_or(0.0);
        if confidence <= threshold.confidence {
            return Ok(PromotionOutcome::new(
                PromotionStatus::Rejected,
                format!("verdict confidence {confidence} is not above the threshold {}", threshold.confidence),
            ));
        }
        // Before the tests and the panel: a tool that would fail at the agent tier is not reviewed.
        if let Err(reason) = self.fits_agent_tier(&self.state.borrow(), &record.current.request, session) {
            return Ok(PromotionOutcome::new(PromotionStatus::Rejected, reason));
        }
        let reviewing = (session.to_string(), name.to_string());
        if !self.state.borrow_mut().promoting.insert(reviewing.clone()) {
            return Ok(PromotionOutcome::new(PromotionStatus::Suppressed, "this tool's promotion is already under review"));
        }
        let registry = self.me.clone();
        let _reviewed = OnDrop::new(move || {
            if let Some(registry) = registry.upgrade() {
                if let Ok(mut state) = registry.state.try_borrow_mut() {
                    state.promoting.remove(&reviewing);
                }
            }
        });

        // An operator's demotion of this very content out of the agent tier (its tombstone there
        // holds the hash) made while the panel reviews it must stand.
        let demoted_above =
            |state: &super::State| state.agent.get(name).is_some_and(|above| !above.active() && above.record.current.hash == record.current.hash);
        let demoted_before = demoted_above(&self.state.borrow());
        // An automatic promotion outlives its call, and the session may end meanwhile: what the
        // panel approved still moves up (it leaves the session), instead of vanishing unsaid.
        let session_work = self.ticket(session);
        let review = unless_cancelled(cancel, self.review_for_agent(&record.current.request, name, session, calls_run_id)).await;
        // The judge sees the same signal: its failure in the poll that cancels is the abort's
        // doing, not a refusal.
        let Some((review, usage)) = review.filter(|_| !cancel.is_some_and(|c| c.is_cancelled())) else {
            return Err(RegistryError::Aborted("the promotion"));
        };
        let version = record.current.version;
        let verdicts = match review {
            Ok(verdicts) => verdicts,
            Err(refusal) => return Ok(self.remember_rejection(name, version, &record.current.hash, session, refusal).await?.spent(usage)),
        };

        // The tests and the panel reviewed `record`: a version forged meanwhile was not, and a
        // tool demoted meanwhile stays demoted. Not remembered as a rejection: the tool as it is
        // now was never judged.
        let changed = match self.state.borrow().entry(Tier::Session, session, name) {
            Some(now) => now.record.current.hash != record.current.hash || now.record.status != ToolStatus::Active,
            None => !session_work.session_ended(),
        } || (!demoted_before && demoted_above(&self.state.borrow()));
        // Promotions that ran at the same time were all admitted against the same count.
        let refusal = match changed {
            true => Err("the tool changed while the panel reviewed it (a new version, or a demotion); it is not promoted".to_string()),
            // The tools its steps call may have left the agent tier meanwhile.
            false => self.fits_agent_tier(&self.state.borrow(), &record.current.request, session),
        };
        if let Err(reason) = refusal {
            return Ok(self.refuse_promotion(name, version, session, reason, verdicts).await?.spent(usage));
        }
        let hash = record.current.hash.clone();
        let (info, ops, undo, withdrawn) = {
            let mut state = self.state.borrow_mut();
            // The verdicts were given whether or not the promotion can be recorded: they are
            // not undone with it.
            let mut ops = self.panel_audit(&mut state, name, version, &verdicts, session);
            // The panel's approval overrides its rejection of this content, as in the session's
            // memo (forgotten in memory once written).
            if state.rejected_promotions.iter().any(|r| r.hash == hash) {
                ops.push(BatchOp::Delete { key: self.rejection_key(&hash) });
            }
            let undo = state.undo_point_withdrawing(&[(Tier::Session, session, name), (Tier::Agent, "", name)], name);
            // Gone only with its session (checked above): the version reviewed, with the stats it
            // had then.
            let entry = state.remove_entry(Tier::Session, session, name).unwrap_or_else(|| Entry::new(record, stats));
            let mut record = entry.record;
            record.tier = Tier::Agent;
            record.status = ToolStatus::Active;
            record.promotion.promoted(&record.current.hash);
            record.mark_reviewed(Tier::Agent);
            if let Some(replaced) = state.agent.get(name) {
                record.absorb_history(&replaced.record.history);
            }
            let entry = Entry::new(record, entry.stats);
            ops.extend(self.entry_ops(&entry));
            let info = tool_info(&entry);
            state.agent.insert(name.to_string(), entry);
            ops.extend(self.audit(
                &mut state,
                "promote",
                name,
                Some(info.version),
                Some(Tier::Agent),
                "promoted session → agent; panel approved".into(),
                Some(session).into(),
            ));
            let (withdrawing, withdrawn) = self.withdraw_stale_requests(&mut state, name, REPLACED);
            ops.extend(withdrawing);
            let undo = undo.sealed(&state);
            (info, ops, undo, withdrawn)
        };
        self.persist_or_undo(ops, undo).await?;
        self.state.borrow_mut().rejected_promotions.retain(|r| r.hash != hash);
        self.emit("", EventBody::ToolPromoted { name: name.into(), from_tier: Tier::Session, to_tier: Tier::Agent, version });
        self.announce_withdrawn(withdrawn, REPLACED);
        let mut out = PromotionOutcome::new(PromotionStatus::Promoted, "promoted to the agent tier");
        out.tool = Some(info);
        out.verdicts = verdicts;
        Ok(out.spent(usage))
    }

    /// The tool's tests re-run against it as it is built now, then the two-reviewer panel:
    /// both verdicts when both approve confidently enough ([`panel_refusal`]), else why not;
    /// with what the panel's calls spent together (`None`: it was not asked).
    async fn review_for_agent(&self, request: &ForgeRequest, name: &str, session: &str, calls_run_id: &str) -> (Result<Vec<Verdict>, Refusal>, Option<Usage>) {
        let tool = match self.forge_engine().build(request, &self.lookup(), session) {
            Ok(tool) => tool,
            Err((reason, _)) => return (Err(Refusal::new(format!("cannot rebuild: {reason}"), vec![])), None),
        };
        let ctx = CallContext::for_trial(calls_run_id, format!("promotion-test-{name}"), session);
        let tests = run_tests(&tool, &request.test_cases, &ctx, self.env().as_ref()).await;
        if let Some(reason) = crate::forge::test_failure_reason(&tests) {
            return (Err(Refusal::new(format!("tests failed on re-run: {reason}"), vec![])), None);
        }
        let config = self.config();
        let mut verdicts = vec![];
        let mut spent: Option<Usage> = None;
        for kind in [ReviewKind::Safety, ReviewKind::Correctness] {
            let prompt = review_prompt(kind, request, &tests, &config.allowed_sandbox_apis);
            let judged = ask_judge(self.promotion_judge(), kind, prompt, calls_run_id).await;
            if let Some(judge) = judged.usage {
                spent.get_or_insert_with(Usage::default).add(judge.usage);
            }
            match judged.verdict {
                Ok(v) => verdicts.push(v),
                Err(e) => {
                    let unanswered = e.is_unanswered();
                    return (Err(Refusal { reason: format!("panel: no verdict ({e})"), verdicts, unanswered }), spent);
                }
            }
        }
        let review = match panel_refusal(&verdicts, config.promotion_threshold.confidence) {
            Some(reason) => Err(Refusal::new(reason, verdicts)),
            None => Ok(verdicts),
        };
        (review, spent)
    }

    async fn request_shared(&self, name: &str, session: &str) -> Result<PromotionOutcome, RegistryError> {
        let (approval, ops, undo) = {
            let mut state = self.state.borrow_mut();
            let Some(hash) = state.agent.get(name).filter(|e| e.active()).map(|e| e.record.current.hash.clone()) else {
                return Err(RegistryError::InvalidPromotion { name: name.into(), from: "a tier other than agent".into(), to: "shared".into() });
            };
            // Before a human is asked: another agent would list the tool and fail every call.
            if let Err(reason) = self.fits_shared_tier(&state, name, session) {
                return Ok(PromotionOutcome::new(PromotionStatus::Rejected, reason));
            }
            let existing = state.approvals.values().find(|a| a.tool == name && a.to_tier == Some(Tier::Shared)).cloned();
            // A request still waiting for the version in service is that request; one made for a
            // version since replaced (a new one, a rollback) is replaced by a request for this one.
            let stale = match existing {
                Some(existing) if existing.hash.as_ref().is_none_or(|h| *h == hash) => {
                    let mut out = PromotionOutcome::new(PromotionStatus::Pending, "already waiting for approval");
                    out.approval = Some(existing);
                    return Ok(out);
                }
                other => other,
            };
            let approval = PendingApproval {
                id: self.env().new_id("approval"),
                kind: "promotion".into(),
                tool: name.into(),
                from_tier: Some(Tier::Agent),
                to_tier: Some(Tier::Shared),
                requested_at: self.now(),
                reason: format!("promote `{name}` to the shared tier (all agents of this runtime)"),
                run_id: None,
                call_id: None,
                arguments: None,
                hash: Some(hash),
            };
            let stale_id = stale.as_ref().map(|a| a.id.as_str()).unwrap_or_default();
            let undo = state.undo_point(&[], &[&approval.id, stale_id]);
            let mut ops = vec![self.approval_op(&approval)];
            if let Some(stale) = &stale {
                state.approvals.remove(&stale.id);
                ops.push(crate::store::BatchOp::Delete { key: self.approval_key(&stale.id) });
            }
            state.approvals.insert(approval.id.clone(), approval.clone());
            ops.extend(self.audit(&mut state, "approval.requested", name, None, Some(Tier::Shared), approval.id.clone(), Some(session).into()));
            let undo = undo.sealed(&state);
            (approval, ops, undo)
        };
        self.persist_or_undo(ops, undo).await?;
        self.emit("", EventBody::ApprovalRequested { approval: approval.clone() });
        let mut out = PromotionOutcome::new(PromotionStatus::Pending, "waiting for human approval");
        out.approval = Some(approval);
        Ok(out)
    }

    /// Withdraws the pending shared-tier requests for `name` that no longer ask for what the
    /// agent tier holds, as a change (`why`: demoted, rolled back, replaced) just left it:
    /// approving one could only fail, and whoever waits for its answer would wait forever.
    /// Returns the ops deleting them, with their `approval.withdrawn` audit entries, and the
    /// requests withdrawn, for [`Registry::announce_withdrawn`] once the change is written.
    pub(crate) fn withdraw_stale_requests(&self, state: &mut super::State, name: &str, why: &str) -> (Vec<crate::store::BatchOp>, Vec<PendingApproval>) {
        let current = state.agent.get(name).filter(|e| e.active()).map(|e| e.record.current.hash.clone());
        // A request from before requests named their version asks for whatever is current.
        let stands = |a: &PendingApproval| current.as_ref().is_some_and(|now| a.hash.as_ref().is_none_or(|h| h == now));
        let stale: Vec<PendingApproval> =
            state.approvals.values().filter(|a| a.tool == name && a.to_tier == Some(Tier::Shared) && !stands(a)).cloned().collect();
        let mut ops = vec![];
        for approval in &stale {
            state.approvals.remove(&approval.id);
            ops.push(crate::store::BatchOp::Delete { key: self.approval_key(&approval.id) });
            if !withdrawal_audited(state, &approval.id) {
                ops.extend(self.audit(state, "approval.withdrawn", name, None, Some(Tier::Shared), format!("{}: {why}", approval.id), None.into()));
            }
        }
        (ops, stale)
    }

    /// Withdraws, by [`Registry::withdraw_stale_requests`]'s rule, the pending shared-tier
    /// requests the store kept for versions no longer at the agent tier: a build before such
    /// requests were withdrawn when their version left it listed them until an `approve` was
    /// refused. Best effort, as loading is not a change anyone asked for: a request a refused
    /// write leaves in the store is out of memory all the same, and withdrawn again at the next
    /// load, audited only if its withdrawal is not in the trail yet.
    pub(crate) async fn withdraw_requests_left_stale(&self) {
        let (ops, withdrawn) = {
            let mut state = self.state.borrow_mut();
            let shared = state.approvals.values().filter(|a| a.to_tier == Some(Tier::Shared));
            let names: std::collections::BTreeSet<String> = shared.map(|a| a.tool.clone()).collect();
            let mut all = (vec![], vec![]);
            for name in names {
                let (ops, withdrawn) = self.withdraw_stale_requests(&mut state, &name, LEFT_BEFORE_LOAD);
                all.0.extend(ops);
                all.1.extend(withdrawn);
            }
            all
        };
        if withdrawn.is_empty() {
            return;
        }
        let _ = self.persist(ops).await;
        self.announce_withdrawn(withdrawn, LEFT_BEFORE_LOAD);
    }

    /// Tells the listeners that the requests `withdrawn` will get no answer (the one typed end a
    /// request waiting for a human has besides `approve` and `deny`).
    pub(crate) fn announce_withdrawn(&self, withdrawn: Vec<PendingApproval>, why: &str) {
        for approval in withdrawn {
            let reason = format!("the approval request `{}` was withdrawn: {why}", approval.id);
            self.emit("", EventBody::PromotionRejected { name: approval.tool, from_tier: Tier::Agent, to_tier: Tier::Shared, reason });
        }
    }

    /// Grants a pending approval: the tool moves from the agent to the shared tier.
    pub async fn approve(&self, id: &str) -> Result<ToolInfo, RegistryError> {
        let _turn = self.shared_tier_turn().await?;
        let mut joining = ToolStats::default();
        let (info, ops, undo) = {
            let mut state = self.state.borrow_mut();
            let (name, approved_hash) =
                state.approvals.get(id).map(|a| (a.tool.clone(), a.hash.clone())).ok_or_else(|| RegistryError::NoSuchApproval(id.into()))?;
            let undo = state.undo_point(&[(Tier::Agent, "", &name), (Tier::Shared, "", &name)], &[id]);
            state.approvals.remove(id);
            let mut ops = vec![crate::store::BatchOp::Delete { key: self.approval_key(id) }];
            // A shared tool of the same name forged by another agent is not overwritten, and a
            // tool demoted since the request keeps its tombstone at the agent tier (calls there
            // are still refused).
            // Nor is one whose name folds alike (`Report` beside `report`): every agent would
            // be offered both. Said without naming the other agent (another tenant, maybe).
            let other_owner = state.shared.get(&name).is_some_and(|e| e.active() && e.record.origin.agent_id != self.agent_id);
            let look_alike = super::look_alike_in(&state.shared, &name).cloned();
            let refusal = match (other_owner, look_alike) {
                (true, _) => Some((
                    format!("the shared tier already has another agent's `{name}`"),
                    RegistryError::InvalidPromotion {
                        name: name.clone(),
                        from: "agent".into(),
                        to: format!("shared, which already has another agent's `{name}` (demote that one first)"),
                    },
                )),
                (false, Some(other)) => Some((
                    format!("the shared tier already has `{other}`, a name too close to `{name}`"),
                    RegistryError::InvalidPromotion {
                        name: name.clone(),
                        from: "agent".into(),
                        to: format!("shared, which already has `{other}` (names are compared ignoring case and `-` vs `_`)"),
                    },
                )),
                (false, None) if !state.agent.get(&name).is_some_and(Entry::active) => {
                    Some(("tool no longer at the agent tier".to_string(), RegistryError::NotFound(name.clone())))
                }
                // The human approved the version they were shown, not whatever is current now.
                (false, None) if approved_hash.as_ref().is_some_and(|h| state.agent.get(&name).is_some_and(|e| e.record.current.hash != *h)) => Some((
                    "the tool changed since the approval was requested".to_string(),
                    RegistryError::InvalidPromotion {
                        name: name.clone(),
                        from: "agent".into(),
                        to: "shared: it changed since the approval was requested (a new version or a rollback); request the promotion again".into(),
                    },
                )),
                (false, None) => None,
            };
            // The tools its steps call may have left the shared tier since the request.
            let refusal = refusal.or_else(|| {
                let reason = self.fits_shared_tier(&state, &name, "").err()?;
                let to = format!("shared: {reason}");
                Some((reason, RegistryError::InvalidPromotion { name: name.clone(), from: "agent".into(), to }))
            });
            let outcome = match refusal {
                Some((detail, error)) => {
                    ops.extend(self.audit(&mut state, "approval.approved", &name, None, Some(Tier::Shared), format!("{id}: {detail}"), None.into()));
                    Err(error)
                }
                // Checked active above; only a refusal-free approval takes the entry.
                None => match state.agent.remove(&name) {
                    None => Err(RegistryError::NotFound(name.clone())),
                    Some(entry) => {
                        ops.extend(self.delete_ops(Tier::Agent, &name));
                        let mut record = entry.record;
                        record.tier = Tier::Shared;
                        record.mark_reviewed(Tier::Shared);
                        // The agent's calls join the shared totals (those of the version replaced,
                        // as a rollback keeps them) as a delta added to what the store holds, in
                        // the write that moves the tool: writing them whole would drop the calls
                        // other agents counted, and a later flush would lose them to a crash or
                        // `close()` in between, the agent tier's record of them deleted already.
                        let mut promoted = Entry::new(record, entry.stats.clone());
                        if let Some(replaced) = state.shared.get(&name) {
                            promoted.record.absorb_history(&replaced.record.history);
                            promoted.stats = replaced.stats.clone();
                            promoted.stats.merge(&entry.stats);
                            promoted.unflushed = replaced.unflushed.clone();
                        }
                        joining = entry.stats;
                        ops.extend(self.entry_ops(&promoted));
                        let info = tool_info(&promoted);
                        state.shared.insert(name.clone(), promoted);
                        ops.extend(self.audit(&mut state, "approval.approved", &name, Some(info.version), Some(Tier::Shared), id.to_string(), None.into()));
                        ops.extend(self.audit(
                            &mut state,
                            "promote",
                            &name,
                            Some(info.version),
                            Some(Tier::Shared),
                            "promoted agent → shared with human approval".into(),
                            None.into(),
                        ));
                        Ok(info)
                    }
                },
            };
            (outcome, ops, undo.sealed(&state))
        };
        let written = match &info {
            Ok(approved) => self.write_shared_stats(ops, &[(approved.name.clone(), joining)], &std::cell::Cell::new(false), false).await,
            Err(_) => self.persist(ops).await,
        };
        if written.is_err() {
            self.state.borrow_mut().undo(undo);
        }
        written?;
        let info = info?;
        self.emit("", EventBody::ToolPromoted { name: info.name.clone(), from_tier: Tier::Agent, to_tier: Tier::Shared, version: info.version });
        Ok(info)
    }

    /// Refuses a pending approval; the tool stays where it is.
    pub async fn deny(&self, id: &str, reason: &str) -> Result<(), RegistryError> {
        let (approval, ops, undo) = {
            let mut state = self.state.borrow_mut();
            let undo = state.undo_point(&[], &[id]);
            let approval = state.approvals.remove(id).ok_or_else(|| RegistryError::NoSuchApproval(id.into()))?;
            let mut ops = vec![crate::store::BatchOp::Delete { key: self.approval_key(id) }];
            ops.extend(self.audit(&mut state, "approval.denied", &approval.tool, None, approval.to_tier, format!("{id}: {reason}"), None.into()));
            (approval, ops, undo.sealed(&state))
        };
        self.persist_or_undo(ops, undo).await?;
        if let (Some(from_tier), Some(to_tier)) = (approval.from_tier, approval.to_tier) {
            let reason = format!("a human denied it: {reason}");
            self.emit("", EventBody::PromotionRejected { name: approval.tool, from_tier, to_tier, reason });
        }
        Ok(())
    }
}
