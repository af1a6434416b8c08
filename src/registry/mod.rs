//! Emergent tools, part two: the tiered registry (issue 4 scope items 7–9, DESIGN decision 6).
//!
//! Tiers: `session` (in memory, discarded by [`Registry::end_session`], at most
//! `maxSessionTools` per session), `agent` (persisted under `agent/<agentId>/…`, loaded by
//! [`Registry::load`], at most `maxAgentTools`) and `shared` (persisted under `shared/…`,
//! reached only through a human approval). Every tool keeps its versions with a content hash;
//! calls are counted per tool; an audit ring records forges, verdicts, promotions,
//! demotions, rollbacks, imports and approvals.
//!
//! Store layout (every value a `Versioned` envelope):
//! - `agent/<agentId>/tool/<name>`, `shared/tool/<name>` — [`ToolRecord`] (kind `tool`)
//! - `agent/<agentId>/stats/<name>`, `shared/stats/<name>` — [`ToolStats`] (kind `stats`)
//! - `agent/<agentId>/approval/<id>` — [`PendingApproval`] (kind `approval`)
//! - `agent/<agentId>/audit/<seq>` — one audit entry each (kind `audit-entry`; `seq` is
//!   zero-padded so key order is append order). Appending writes one key and trimming deletes
//!   the oldest, so a forge costs the same with 5 or 500 entries in the ring. Stores written
//!   before per-entry keys hold the whole ring under `agent/<agentId>/audit`; it is read and
//!   migrated on load.
//! - `agent/<agentId>/forge-stats` — forge counters and histogram (kind `forge-stats`), and
//!   `agent/<agentId>/forge-name/<name>` — whether a name attempted was ever approved (written
//!   only when that changes)
//! - `agent/<agentId>/demotion-notice/<name>` — the audit entry (kind `demotion-notice`)
//!   another agent that demoted this agent's shared tool leaves it: this agent appends it to
//!   its ring and deletes it in one write (see [`Registry::audit_came_home`])
//! - `agent/<agentId>/promotion-rejection/<hash>` — a promotion to the agent tier the review
//!   refused (kind `promotion-rejection`, [`RejectedPromotion`]), the newest
//!   [`MAX_REJECTED_PROMOTIONS`] kept

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::{Rc, Weak};

use crate::guard::{SessionTicket, SessionWork};

use serde_json::Value;

use crate::agent::{unless_cancelled, AgentEvent, CancelSignal, Environment, EventBody, EventSink, UsageRecorder};
use crate::forge::{
    Admission, Checked, Evidence, Forge, ForgeOrigin, ForgeRequest, ForgeResult, ForgeToolHandler, JudgeUsage, Kept, Rejection, Verified, FORGE_TOOL_NAME,
};
use crate::model::Model;
use crate::sandbox::SandboxRunner;
use crate::store::{BatchOp, Store, StoreError};
use crate::tools::{invoke, CallContext, Nesting, Tool, ToolFailure, ToolSet};

mod audit;
mod background;
mod hash;
mod package;
mod promotion;
mod provider;
mod records;
mod shared_tier;
mod state;
mod types;
mod writes;

pub use audit::MAX_AUDIT_DETAIL_CHARS;
pub use hash::{canonical_json, content_hash};
pub use package::{oversized_package, ImportOptions, ToolPackage, AGENTOS_FORMAT, MAX_EXPANDED_BYTES, MAX_FLOW_NESTING, MAX_PACKAGE_BYTES, PACKAGE_FORMAT};
pub use promotion::{PromotionOutcome, PromotionStatus};
pub use types::{
    AuditEntry, EmergentConfig, HeldOff, PendingApproval, PromotionMemo, PromotionThreshold, RejectedPromotion, Tier, ToolInfo, ToolRecord, ToolStats,
    ToolStatus, ToolVersion, MAX_REJECTED_PROMOTIONS, MAX_VERSIONS,
};

use audit::{audit_entry_key, verdict_detail, AuditSubject, ForgeNameRecord};
use records::{agent_prefix, entry_ops_under, load_tier, tool_key_under, unversioned, versioned};
use shared_tier::{came_home_detail, load_notices, notice_key, NOTICE_KEYS};
use state::{Entry, State, Undo};
use writes::{store_turn, Turn, TurnKind, Unwritten, WritesGoing};

/// A registry operation failed (bad requests to `forge` are not errors: they are rejected
/// [`ForgeResult`]s).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RegistryError {
    #[error("no tool named `{0}` at a tier that allows this")]
    NotFound(String),
    /// The name is one of the agent's own tools: a forged tool stored under it is reached
    /// nowhere (the own tool answers), so it is neither handed out (`export`) nor demoted or
    /// rolled back under that name. Code `tool_not_found`, as for any name the registry serves
    /// no forged tool under. `own` is the own tool the name is, or folds onto (see
    /// [`canonical_tool_name`]).
    #[error("{}", own_tool_message(name, own))]
    OwnTool { name: String, own: String },
    #[error("`{0}` is already at the lowest tier")]
    LowestTier(String),
    #[error("`{name}` has no version {version}")]
    NoSuchVersion { name: String, version: u32 },
    #[error("no pending approval `{0}`")]
    NoSuchApproval(String),
    #[error("cannot promote `{name}` from {from} to {to}")]
    InvalidPromotion { name: String, from: String, to: String },
    #[error("invalid tool package: {0}")]
    InvalidPackage(String),
    #[error("unreadable record `{key}`: {message}")]
    Corrupt { key: String, message: String },
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The agent was closed while the operation ran: its records belong to whoever opens the
    /// agent id next, so nothing more is written.
    #[error("the agent was closed; nothing more is written to its store")]
    Closed,
    #[error("`{name}` version {version} did not pass the {} tier's review; a rollback there restores only versions that did", tier.as_str())]
    Unreviewed { name: String, version: u32, tier: Tier },
    /// A rollback to a compose version whose steps would call it again (through tools that
    /// changed since that version was current).
    #[error("`{name}` version {version} cannot be restored: {reason}")]
    PipelineCycle { name: String, version: u32, reason: String },
    /// The caller's signal stopped the operation before it decided anything: nothing was
    /// recorded.
    #[error("{0} was aborted")]
    Aborted(&'static str),
}

impl RegistryError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound(_) | Self::OwnTool { .. } => "tool_not_found",
            Self::LowestTier(_) => "lowest_tier",
            Self::NoSuchVersion { .. } => "no_such_version",
            Self::NoSuchApproval(_) => "no_such_approval",
            Self::InvalidPromotion { .. } => "invalid_promotion",
            Self::InvalidPackage(_) => "invalid_package",
            Self::Corrupt { .. } => "store_corrupt",
            Self::Closed => "closed",
            Self::Unreviewed { .. } => "unreviewed_version",
            Self::PipelineCycle { .. } => "pipeline_cycle",
            Self::Aborted(_) => "aborted",
            // The store's own codes pass through (a full quota or a blocked upgrade is
            // something a caller can act on); anything else is a generic store error.
            Self::Store(e) => match e.code.as_str() {
                "store_corrupt" => "store_corrupt",
                "store_quota" => "store_quota",
                "store_blocked" => "store_blocked",
                _ => "store_error",
            },
        }
    }
}

/// [`RegistryError::OwnTool`]'s message: a look-alike names the own tool it is taken for.
fn own_tool_message(name: &str, own: &str) -> String {
    let what = match name == own {
        true => format!("`{name}` is one of the agent's own tools"),
        false => format!("`{name}` is too close to `{own}`, one of the agent's own tools (names are compared ignoring case and `-` vs `_`)"),
    };
    format!("{what}; the forged tool stored under that name is reached nowhere (the agent's own tool answers)")
}

/// The models the registry asks: the creation judge, and the (usually stronger) promotion
/// judge that sits on the two-reviewer panel (the creation judge when absent).
#[derive(Clone, Default)]
pub struct Judges {
    pub judge: Option<Rc<dyn Model>>,
    pub promotion_judge: Option<Rc<dyn Model>>,
}

impl std::fmt::Debug for Judges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Judges")
            .field("judge", &self.judge.as_ref().map(|m| m.id()))
            .field("promotion_judge", &self.promotion_judge.as_ref().map(|m| m.id()))
            .finish()
    }
}

/// Everything a registry needs from its host.
#[derive(Clone)]
pub struct RegistryDeps {
    pub store: Rc<dyn Store>,
    pub env: Rc<dyn Environment>,
    pub sandbox: Option<Rc<dyn SandboxRunner>>,
    pub judges: Judges,
}

impl std::fmt::Debug for RegistryDeps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryDeps").field("judges", &self.judges).finish_non_exhaustive()
    }
}

/// The tiered tool registry of one agent. Create with [`Registry::load`]; it is shared as
/// `Rc<Registry>` (the `forge_tool` meta-tool and the tool wrappers hold it weakly).
pub struct Registry {
    agent_id: String,
    config: EmergentConfig,
    store: Rc<dyn Store>,
    env: Rc<dyn Environment>,
    forge: Forge,
    promotion_judge: Option<Rc<dyn Model>>,
    host_tools: RefCell<ToolSet>,
    /// The agent's own tool names (host tools and `forge_tool`) by their [`canonical_tool_name`]:
    /// a forged tool whose name folds onto one of them is refused or hidden, as one of the same
    /// name is, else the model is offered `Refund` beside the `refund` that asks for approval.
    own_names: RefCell<HashMap<String, String>>,
    pub(crate) state: RefCell<State>,
    sink: RefCell<Option<Box<dyn EventSink>>>,
    /// Events emitted while the sink was busy delivering another: a listener may call back
    /// into the registry synchronously (a JS `agent.on` listener calling `tools.call`).
    deferred_events: RefCell<std::collections::VecDeque<AgentEvent>>,
    forge_tool: RefCell<Option<Tool>>,
    me: Weak<Registry>,
    /// Set by [`Registry::close`]; work still in flight then writes nothing.
    closed: std::cell::Cell<bool>,
    /// Store writes going, and who waits for there to be none ([`Registry::close_writes`]).
    writes: RefCell<WritesGoing>,
    /// This store's turn for changes of the shared tier (see [`TurnKind::SharedTier`] and
    /// [`Registry::shared_tier_turn`]), held by a reload of it too: a reload that read the
    /// store before such a change landed would replace the tier with a snapshot that lacks it.
    shared_turn: Rc<Turn>,
    /// This store's turn for shared-stats flushes (see [`TurnKind::SharedStats`]).
    shared_stats_turn: Rc<Turn>,
    /// Forges, imports and promotions to the agent tier going, per session.
    forges: SessionWork,
    /// Automatic promotions going on after the calls that started them returned.
    background: Rc<background::Background>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("agent_id", &self.agent_id).field("config", &self.config).finish_non_exhaustive()
    }
}

impl Registry {
    /// Loads the agent and shared tiers, stats, pending approvals and the audit trail of
    /// `agent_id` from `deps.store`; a pending shared-tier request whose version is no longer
    /// the agent tier's is withdrawn (audited `approval.withdrawn`, once however many loads it
    /// takes to delete it), as a change would have.
    pub async fn load(config: EmergentConfig, deps: RegistryDeps, agent_id: &str) -> Result<Rc<Registry>, RegistryError> {
        let mut state = State::default();
        let agent = agent_prefix(agent_id);
        // Before the tiers: a demotion landing after this read is audited at the next load,
        // not here and again by a reload that finds the tool gone from the shared tier read
        // before it landed.
        let notices = load_notices(deps.store.as_ref(), &agent).await?;
        let prefixes = [(Tier::Agent, agent.clone()), (Tier::Shared, "shared/".to_string())];
        for (tier, prefix) in &prefixes {
            *state.tier_mut(*tier, "") = load_tier(deps.store.as_ref(), prefix).await?;
        }
        for (key, value) in deps.store.scan(&format!("{agent}approval/")).await? {
            let approval: PendingApproval = unversioned(&key, "approval", value)?;
            state.approvals.insert(approval.id.clone(), approval);
        }
        state.rejected_promotions = promotion::load_rejected_promotions(deps.store.as_ref(), &agent).await?;
        let audit_prefix = format!("{agent}audit/");
        for (key, value) in deps.store.scan(&audit_prefix).await? {
            // A store of the host's own may return keys outside the prefix: skipped, not sliced.
            let Some(Ok(seq)) = key.strip_prefix(&audit_prefix).map(str::parse::<u64>) else { continue };
            state.audit.push_back(unversioned(&key, "audit-entry", value)?);
            state.audit_seqs.push_back(seq);
            state.next_audit_seq = seq + 1;
        }
        let legacy_audit_key = format!("{agent}audit");
        if let Some(value) = deps.store.get(&legacy_audit_key).await? {
            let entries: Vec<AuditEntry> = unversioned(&legacy_audit_key, "audit", value)?;
            let mut ops = vec![BatchOp::Delete { key: legacy_audit_key }];
            // The legacy ring is older than any per-entry key, so it goes below the first one.
            // Without room there, the per-entry entries move up after it (a legacy entry put
            // on an existing key would replace a newer entry).
            let front = state.audit_seqs.front().copied().unwrap_or(state.next_audit_seq);
            let (first, moved): (u64, Vec<(u64, AuditEntry)>) = match front.checked_sub(entries.len() as u64) {
                Some(first) => (first, vec![]),
                None => (state.next_audit_seq, state.audit_seqs.drain(..).zip(state.audit.drain(..)).collect()),
            };
            let mut ring = entries;
            for (seq, entry) in moved {
                ops.push(BatchOp::Delete { key: audit_entry_key(agent_id, seq) });
                ring.push(entry);
            }
            for (i, entry) in ring.into_iter().enumerate().rev() {
                let seq = first + i as u64;
                ops.push(BatchOp::Put { key: audit_entry_key(agent_id, seq), value: versioned("audit-entry", &entry) });
                state.audit.push_front(entry);
                state.audit_seqs.push_front(seq);
            }
            state.next_audit_seq = state.next_audit_seq.max(first + state.audit.len() as u64);
            deps.store.batch(ops).await?;
        }
        // The ring is bounded from the start: a store may hold more entries than it keeps (it
        // was opened with a larger `auditCapacity`, or a delete of dropped entries was refused).
        let excess = state.audit.len().saturating_sub(config.audit_capacity.max(1));
        if excess > 0 {
            state.audit.drain(..excess);
            let dropped = state.audit_seqs.drain(..excess).map(|seq| BatchOp::Delete { key: audit_entry_key(agent_id, seq) }).collect();
            // Best effort: entries a refused delete leaves are dropped again at the next load.
            let _ = deps.store.batch(dropped).await;
        }
        let forge_stats_key = format!("{agent}forge-stats");
        let names_prefix = format!("{agent}forge-name/");
        if let Some(value) = deps.store.get(&forge_stats_key).await? {
            state.forge_stats = unversioned(&forge_stats_key, "forge-stats", value)?;
            // Only a record written before names had records of their own carries names. The
            // counters are written without them from now on: each gets its record now, or the
            // next forge's write of the counters would lose it.
            let mut ops: Vec<BatchOp> = state
                .forge_stats
                .names()
                .map(|(name, approved)| BatchOp::Put { key: format!("{names_prefix}{name}"), value: versioned("forge-name", &ForgeNameRecord { approved }) })
                .collect();
            if !ops.is_empty() {
                ops.push(BatchOp::Put { key: forge_stats_key, value: versioned("forge-stats", &state.forge_stats) });
                deps.store.batch(ops).await?;
            }
        }
        for (key, value) in deps.store.scan(&names_prefix).await? {
            let Some(name) = key.strip_prefix(&names_prefix) else { continue };
            let record: ForgeNameRecord = unversioned(&key, "forge-name", value)?;
            state.forge_stats.restore_name(name, record.approved);
        }
        let forge = Forge::new(deps.judges.judge.clone(), deps.sandbox.clone(), deps.env.clone(), config.allowed_sandbox_apis.clone());
        let promotion_judge = deps.judges.promotion_judge.clone().or(deps.judges.judge.clone());
        let stats_turn_key = deps.store.data_key();
        let registry = Rc::new_cyclic(|me| Registry {
            agent_id: agent_id.to_string(),
            config,
            store: deps.store,
            env: deps.env,
            forge,
            promotion_judge,
            host_tools: RefCell::new(ToolSet::new()),
            own_names: RefCell::new(own_names(&ToolSet::new())),
            state: RefCell::new(state),
            sink: RefCell::new(None),
            deferred_events: RefCell::default(),
            forge_tool: RefCell::new(None),
            me: me.clone(),
            closed: Default::default(),
            writes: RefCell::default(),
            shared_turn: store_turn(TurnKind::SharedTier, stats_turn_key),
            shared_stats_turn: store_turn(TurnKind::SharedStats, stats_turn_key),
            forges: SessionWork::default(),
            background: Rc::default(),
        });
        registry.withdraw_requests_left_stale().await;
        registry.audit_notices_left(notices).await;
        Ok(registry)
    }

    /// Stops all writes to the store: forges, promotions and calls still in flight when their
    /// agent is closed may finish, but write nothing. Another agent may open the same agent id
    /// on the same store at once, and late writes would land among its records. Background
    /// work is aborted ([`Registry::stop_background`]).
    pub fn close(&self) {
        self.closed.set(true);
        self.stop_background();
    }

    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    pub fn config(&self) -> &EmergentConfig {
        &self.config
    }

    /// Where registry events go (forge stages, promotions, approvals). Events of forges made
    /// inside a run carry that run's id.
    pub fn set_event_sink(&self, sink: Box<dyn EventSink>) {
        *self.sink.borrow_mut() = Some(sink);
    }

    /// The host tools compose pipelines may use (the agent's own tools).
    pub fn set_host_tools(&self, tools: ToolSet) {
        *self.own_names.borrow_mut() = own_names(&tools);
        *self.host_tools.borrow_mut() = tools;
    }

    /// Refuses host tools this agent cannot serve as given: with emergent capabilities
    /// enabled, one named `forge_tool` or a look-alike of it (see [`canonical_tool_name`]).
    /// The model would be offered the meta-tool under that name while `tools.call` reached the
    /// host tool, or be offered both and not tell them apart. The host checks this where it
    /// creates the agent (an `invalid_config` error).
    pub fn refuse_reserved_host_tools(&self) -> Result<(), String> {
        let host = self.host_tools.borrow();
        let reserved = host.names().find(|name| self.config.enabled && same_tool_name(name, FORGE_TOOL_NAME));
        match reserved {
            Some(name) => Err(format!(
                "tool name `{name}` is reserved for the `{FORGE_TOOL_NAME}` meta-tool when emergent capabilities are enabled (names are compared ignoring case and `-` vs `_`)"
            )),
            None => Ok(()),
        }
    }

    pub(crate) fn host_tool_names(&self) -> Vec<String> {
        self.host_tools.borrow().names().map(str::to_string).collect()
    }

    /// Delivers an event to the sink. One emitted while the sink is delivering another (its
    /// listener called back into the registry) is delivered after it, in order, rather than
    /// borrowing the sink twice, which would panic and poison the wasm instance.
    pub(crate) fn emit(&self, run_id: &str, body: EventBody) {
        // Built only when someone listens: a registry without a sink emits on every forge.
        let event = || AgentEvent { run_id: run_id.to_string(), run_path: if run_id.is_empty() { vec![] } else { vec![run_id.to_string()] }, body };
        let Ok(mut sink) = self.sink.try_borrow_mut() else {
            self.deferred_events.borrow_mut().push_back(event());
            return;
        };
        let Some(sink) = sink.as_mut() else { return };
        sink.emit(event());
        loop {
            let Some(next) = self.deferred_events.borrow_mut().pop_front() else { break };
            sink.emit(next);
        }
    }

    pub(crate) fn now(&self) -> f64 {
        self.env.now_ms()
    }

    pub(crate) fn env(&self) -> &Rc<dyn Environment> {
        &self.env
    }

    pub(crate) fn forge_engine(&self) -> &Forge {
        &self.forge
    }

    pub(crate) fn promotion_judge(&self) -> Option<&Rc<dyn Model>> {
        self.promotion_judge.as_ref()
    }

    // ---- forging -----------------------------------------------------------------------

    /// Forges a tool for `session` outside any run. Never fails: a bad request is a rejected
    /// [`ForgeResult`] with a reason and category.
    pub async fn forge(&self, request: &Value, session: &str) -> ForgeResult {
        self.forge_scoped(request, session, None).await
    }

    /// [`Registry::forge`] with a scope label (a task id, say) tagging the attempt, its events
    /// and its audit entries; a `scope` in the request wins.
    pub async fn forge_scoped(&self, request: &Value, session: &str, scope: Option<String>) -> ForgeResult {
        self.forge_from(request, self.origin(session, scope, "", "")).await
    }

    /// Forges for the `forge_tool` call `ctx`, tagged with its run's scope label: within its
    /// run (events carry the run's id), or, for a call made through the registry API, in none
    /// (its id still reaches the forge's own calls, for their abort signal). The run's abort
    /// stops it as [`Registry::forge_cancellable`] does (`None`: nothing was recorded).
    /// The judge's tokens go to the call's usage recorder ([`CallContext::usage`]), so its run
    /// counts them; also when an abort then discards the forge, since they were spent.
    pub async fn forge_for_call(&self, request: &Value, ctx: &CallContext) -> Option<ForgeResult> {
        let run_id = if ctx.direct { "" } else { ctx.run_id.as_str() };
        let cancel = ctx.cancel.as_ref().map(|signal| &*signal.0);
        self.forge_until(request, self.origin(&ctx.session_id, ctx.scope.clone(), run_id, &ctx.run_id), cancel, ctx.usage.as_ref()).await
    }

    /// Rejects, and counts, a forge request the host could not even turn into JSON (a
    /// circular object, a `BigInt`): a bad request is a `parse_error` result, never an error.
    pub async fn reject_unreadable(&self, problem: &str, session: &str, scope: Option<String>) -> ForgeResult {
        let origin = self.origin(session, scope, "", "");
        let mut rejection = Rejection::new("", format!("could not read the forge request: {problem}"), Evidence { parse: true, ..Default::default() });
        rejection.scope = origin.scope.clone();
        self.reject(&rejection, &origin, "forge").await
    }

    fn origin(&self, session: &str, scope: Option<String>, run_id: &str, calls_run_id: &str) -> ForgeOrigin {
        ForgeOrigin {
            agent_id: self.agent_id.clone(),
            session_id: session.to_string(),
            scope: scope.as_deref().map(crate::forge::scope_label),
            run_id: run_id.to_string(),
            calls_run_id: calls_run_id.to_string(),
            imported_from: None,
        }
    }

    /// [`Registry::forge_scoped`] that `cancel` stops while the request is checked, tested and
    /// judged (`None`: nothing was recorded). Once the verdict is in, the forge runs to its end,
    /// so a forge that reports `aborted` never leaves a tool registered. The forge's judge and
    /// the host tools its tests call get `calls_run_id` as their run id, so the host can hand
    /// them the abort signal too (its events carry no run id: the forge is in none).
    pub async fn forge_cancellable(
        &self,
        request: &Value,
        session: &str,
        scope: Option<String>,
        cancel: Option<&dyn CancelSignal>,
        calls_run_id: &str,
    ) -> Option<ForgeResult> {
        self.forge_until(request, self.origin(session, scope, "", calls_run_id), cancel, None).await
    }

    /// `spent` receives what the judge spent as soon as it answered.
    async fn forge_until(&self, request: &Value, origin: ForgeOrigin, cancel: Option<&dyn CancelSignal>, spent: Option<&UsageRecorder>) -> Option<ForgeResult> {
        let ticket = self.ticket(&origin.session_id);
        let checked = unless_cancelled(cancel, self.verify(request, &origin, &self.lookup())).await?;
        if let (Some(spent), Some(judge)) = (spent, judge_usage(&checked)) {
            spent.record(&judge.model_id, judge.usage);
        }
        // The judge and the host tools see the same signal: their failure may end the work in
        // the very poll that cancels it, and is then the abort's doing, not the tool's. Closing
        // the agent stops its sandbox: tests ended that way are no verdict on the code either.
        if cancel.is_some_and(|c| c.is_cancelled()) || self.is_closed() {
            return None;
        }
        Some(self.settle(checked, &origin, &ticket, "forge").await)
    }

    /// Whether [`Registry::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    async fn forge_from(&self, request: &Value, origin: ForgeOrigin) -> ForgeResult {
        let ticket = self.ticket(&origin.session_id);
        let checked = self.verify(request, &origin, &self.lookup()).await;
        self.settle(checked, &origin, &ticket, "forge").await
    }

    /// Registers a verified tool (`action` names it in the audit trail), answers an unchanged
    /// request with the tool it already is, or records the rejection.
    pub(crate) async fn settle(&self, checked: Result<Checked, Rejection>, origin: &ForgeOrigin, ticket: &SessionTicket, action: &str) -> ForgeResult {
        match checked {
            Ok(Checked::Verified(verified)) => self.register_session(*verified, origin, action, ticket).await,
            Ok(Checked::Unchanged(kept)) => self.keep_unchanged(*kept, origin, action).await,
            Err(rejection) => self.reject(&rejection, origin, action).await,
        }
    }

    /// Answers a forge or import identical to the tool the session is offered under its name
    /// with that tool as it is: audited as `unchanged` (`import.unchanged`), announced with
    /// `forge.registered` for its current version, and not counted in the forge stats (nothing
    /// was forged or judged). A model that forges the same request again (small ones do, after
    /// success too), or a package imported twice, would otherwise pay a judge call for a new
    /// version whose fresh stats set its promotion back to zero uses. An import has nothing to
    /// re-check either: its content, tests included, is what this agent's own checks passed.
    async fn keep_unchanged(&self, kept: Kept, origin: &ForgeOrigin, action: &str) -> ForgeResult {
        let Kept { tool, verdict, scope } = kept;
        let ops = {
            let mut detail = format!("hash {}: identical to the registered version, not tested or judged again", tool.hash);
            if let Some(from) = &origin.imported_from {
                detail.push_str(&format!("; the package says it came from {from}"));
            }
            let who = AuditSubject::attempt(&origin.session_id, scope.as_deref());
            let entry = if action == "import" { "import.unchanged" } else { "unchanged" };
            self.audit(&mut self.state.borrow_mut(), entry, &tool.name, Some(tool.version), Some(tool.tier), detail, who)
        };
        self.emit(
            &origin.run_id,
            EventBody::ForgeRegistered {
                name: tool.name.clone(),
                tier: tool.tier,
                version: tool.version,
                hash: tool.hash.clone(),
                unchanged: true,
                agent_id: origin.agent_id.clone(),
                session_id: origin.session_id.clone(),
                scope: scope.clone(),
            },
        );
        let _ = self.persist(ops).await;
        ForgeResult { success: true, tool: Some(tool), verdict: Some(verdict), tests: Some(vec![]), reason: None, category: None, unchanged: true, usage: None }
    }

    /// Counts a forge or import of `session` as going until the ticket is dropped: its tool
    /// must not bring the session back if it ends meanwhile.
    pub(crate) fn ticket(&self, session: &str) -> SessionTicket {
        self.forges.begin(session)
    }

    /// Why `session` has no room for a new tool `name` (one replacing its own version always
    /// fits). Asked before the tests, and again at registration: forges that ran at the same
    /// time were all admitted against the same count.
    fn session_room(&self, state: &State, session: &str, name: &str) -> Result<(), String> {
        let max = self.config.max_session_tools;
        state
            .room(Tier::Session, session, name, max)
            .map_err(|count| format!("this session already has {count} forged tools (maxSessionTools is {max}); reuse or improve an existing tool"))
    }

    pub(crate) async fn verify(&self, request: &Value, origin: &ForgeOrigin, tools: &Rc<dyn crate::tools::ToolLookup>) -> Result<Checked, Rejection> {
        let session = origin.session_id.clone();
        let admit = |req: &ForgeRequest| {
            if req.name == FORGE_TOOL_NAME {
                return Err(format!("`{FORGE_TOOL_NAME}` is reserved"));
            }
            // Taking an own tool's name would put forged code behind every pipeline and every
            // turn that calls it, with tests that only show it behaving on their own inputs.
            self.refuse_own_name(&req.name)?;
            if let Some(kept) = self.unchanged(req, &session) {
                return Ok(Admission::Unchanged(kept));
            }
            let state = self.state.borrow();
            self.refuse_close_name(&state, &session, &req.name)?;
            self.refuse_shadowed_steps(&state, &session, req)?;
            self.session_room(&state, &session, &req.name).map(|()| Admission::New { next_version: state.next_version(&req.name) })
        };
        let run_id = origin.run_id.clone();
        let emit = |body: EventBody| self.emit(&run_id, body);
        self.forge.verify(request, origin, tools, &admit, &emit).await
    }

    /// The tool a request is already, if any: the one a run of `session` is offered under its
    /// name (built, its steps reachable), judged, with the request's content hash. One the
    /// session could not call is no answer: the forge is checked in full and says why.
    fn unchanged(&self, req: &ForgeRequest, session: &str) -> Option<Box<Kept>> {
        let (tier, _) = self.offered(&req.name, session)?;
        let state = self.state.borrow();
        let entry = state.entry(tier, session, &req.name)?;
        let verdict = entry.record.current.verdict.clone()?;
        // Hashed only when the name is taken: a new name (most forges) costs nothing here.
        (entry.record.current.hash == content_hash(req)).then(|| Box::new(Kept { tool: tool_info(entry), verdict, scope: None }))
    }

    /// Records a rejected forge, or a rejected import (`action` "import": audited as
    /// `import.rejected`, so the trail tells a package that failed its tests or its judge from a
    /// forge that did).
    pub(crate) async fn reject(&self, rejection: &Rejection, origin: &ForgeOrigin, action: &str) -> ForgeResult {
        let ops = {
            let mut state = self.state.borrow_mut();
            // A forge the sandbox could not test says nothing of the code: not a rejection to count.
            let mut ops = vec![];
            if !rejection.sandbox_unavailable {
                let name_changed = state.forge_stats.record_rejected(&rejection.name, rejection.category);
                ops = self.forge_stats_ops(&state, name_changed.then_some((rejection.name.as_str(), false)));
            }
            if let Some(v) = &rejection.verdict {
                ops.extend(self.audit(
                    &mut state,
                    "verdict",
                    &rejection.name,
                    None,
                    None,
                    verdict_detail(v),
                    AuditSubject::attempt(&origin.session_id, rejection.scope.as_deref()),
                ));
            }
            ops.extend(self.audit(
                &mut state,
                if action == "import" { "import.rejected" } else { "reject" },
                &rejection.name,
                None,
                None,
                format!("{}: {}", rejection.category.as_str(), rejection.reason),
                AuditSubject::attempt(&origin.session_id, rejection.scope.as_deref()),
            ));
            ops
        };
        self.emit(
            &origin.run_id,
            EventBody::ForgeRejected {
                name: rejection.name.clone(),
                category: rejection.category,
                reason: rejection.reason.clone(),
                agent_id: origin.agent_id.clone(),
                session_id: origin.session_id.clone(),
                scope: rejection.scope.clone(),
            },
        );
        let _ = self.persist(ops).await; // the audit write is best effort; the rejection stands
        ForgeResult::rejected(rejection)
    }

    /// Registers a verified tool in the session tier (a new version when the name exists).
    pub(crate) async fn register_session(&self, verified: Verified, origin: &ForgeOrigin, action: &str, ticket: &SessionTicket) -> ForgeResult {
        let session = origin.session_id.as_str();
        let ended = ticket.session_ended();
        // Forges and imports run at once (the calls of one step, say) are all checked before
        // any is registered: one identical to a tool registered meanwhile gets that tool, as it
        // would had it come after, and not a second version of the same content whose fresh
        // stats set the tool's promotion back to zero uses.
        if !ended {
            if let Some(mut kept) = self.unchanged(&verified.request, session) {
                kept.scope = verified.request.scope.clone();
                // Unchanged by the time it was judged: that judge call was still made.
                let usage = verified.judge_usage.map(|j| j.usage);
                return ForgeResult { usage, ..self.keep_unchanged(*kept, origin, action).await };
            }
        }
        let refusal = {
            let state = self.state.borrow();
            if ended {
                Err(format!("session `{session}` ended while the tool was being forged; it was not registered"))
            } else {
                // Own tools may have changed while it was tested (a host adding tools).
                self.refuse_own_name(&verified.request.name)
                    .and_then(|()| self.refuse_close_name(&state, session, &verified.request.name))
                    .and_then(|()| self.refuse_shadowed_steps(&state, session, &verified.request))
                    .and_then(|()| self.session_room(&state, session, &verified.request.name))
                    .and_then(|()| registered_since(&state, session, &verified.request.name, verified.next_version))
            }
        };
        if let Err(reason) = refusal {
            let mut rejection = Rejection::new(&verified.request.name, reason, Evidence::default());
            rejection.scope = verified.request.scope.clone();
            rejection.tests = verified.tests;
            rejection.verdict = Some(verified.verdict);
            rejection.judge_usage = verified.judge_usage;
            return self.reject(&rejection, origin, action).await;
        }
        let hash = content_hash(&verified.request);
        let now = self.now();
        let name = verified.request.name.clone();
        let scope = verified.request.scope.clone();
        let who = || AuditSubject::attempt(session, scope.as_deref());
        let (info, ops) = {
            let mut state = self.state.borrow_mut();
            let version = state.next_version(&name);
            // This session's entry (active or demoted) is replaced; its history carries over,
            // else that of the tool the session reaches above it (a new version of a promoted
            // tool keeps the versions before it).
            let own = state.remove_entry(Tier::Session, session, &name).map(|e| {
                let mut promotion = e.record.promotion;
                promotion.version_left(&e.record.current.hash, e.stats.successes);
                (e.record.history, promotion)
            });
            // The memo is kept: it names the versions it holds off (by hash), and a rollback to
            // one of them must not make a rejected or demoted version eligible again.
            // A new version of a tool above the session takes its memo too when this agent's
            // panel and operators kept it (another agent's shared tool carries its owner's).
            let (mut history, promotion) = own.unwrap_or_else(|| {
                let above = state.resolve(&name, session).map(|(_, e)| &e.record);
                let history = above.map(|r| r.history.clone()).unwrap_or_default();
                let promotion = above.filter(|r| r.origin.agent_id == self.agent_id).map(|r| r.promotion.clone()).unwrap_or_default();
                (history, promotion)
            });
            let current = ToolVersion {
                version,
                hash: hash.clone(),
                request: verified.request,
                verdict: Some(verified.verdict.clone()),
                created_at: now,
                reviewed_for: None,
            };
            history.push(current.clone());
            if history.len() > MAX_VERSIONS {
                history.remove(0);
            }
            let record = ToolRecord {
                name: name.clone(),
                tier: Tier::Session,
                status: ToolStatus::Active,
                current,
                history,
                session_id: Some(session.to_string()),
                origin: ForgeOrigin { scope: scope.clone(), ..origin.clone() },
                promotion,
            };
            let entry = Entry::new(record, ToolStats::default());
            let info = tool_info(&entry);
            state.tier_mut(Tier::Session, session).insert(name.clone(), entry);
            let name_changed = state.forge_stats.record_approved(&name, verified.verdict.confidence);
            let v = &verified.verdict;
            let mut ops = self.forge_stats_ops(&state, name_changed.then_some((info.name.as_str(), true)));
            let detail = match &origin.imported_from {
                Some(from) => format!("hash {hash}; the package says it came from {from}"),
                None => format!("hash {hash}"),
            };
            ops.extend(self.audit(&mut state, action, &info.name, Some(version), Some(Tier::Session), detail, who()));
            ops.extend(self.audit(&mut state, "verdict", &info.name, Some(version), None, verdict_detail(v), who()));
            ops.extend(self.audit(&mut state, "register", &info.name, Some(version), Some(Tier::Session), format!("registered in session `{session}`"), who()));
            (info, ops)
        };
        self.emit(
            &origin.run_id,
            EventBody::ForgeRegistered {
                name: info.name.clone(),
                tier: Tier::Session,
                version: info.version,
                hash: info.hash.clone(),
                unchanged: false,
                agent_id: origin.agent_id.clone(),
                session_id: session.to_string(),
                scope: scope.clone(),
            },
        );
        let _ = self.persist(ops).await;
        ForgeResult {
            success: true,
            tool: Some(info),
            verdict: Some(verified.verdict),
            tests: Some(verified.tests),
            reason: None,
            category: None,
            unchanged: false,
            usage: verified.judge_usage.map(|j| j.usage),
        }
    }

    // ---- tool sets and calls -----------------------------------------------------------

    /// The tools a run of `session` sees: host tools, then shared, agent and session tiers
    /// (the more specific tier wins a name), plus `forge_tool` when emergent is enabled.
    /// Demoted entries are left out, and so are compose tools whose step tools the session
    /// does not reach now.
    pub fn tool_set(&self, session: &str) -> ToolSet {
        let mut set = self.host_tools.borrow().clone();
        for name in self.forged_names(session) {
            if let Some((_, tool)) = self.offered(&name, session) {
                set.insert(tool);
            }
        }
        if self.config.enabled {
            if let Some(tool) = self.forge_tool() {
                set.insert(tool);
            }
        }
        set
    }

    /// The names of the active forged tools `session` sees at some tier, each once.
    fn forged_names(&self, session: &str) -> BTreeSet<String> {
        let state = self.state.borrow();
        [Tier::Shared, Tier::Agent, Tier::Session]
            .into_iter()
            .filter_map(|t| state.tier(t, session))
            .flat_map(|m| m.values().filter(|e| e.active()).map(|e| e.record.name.clone()))
            .collect()
    }

    /// The forged tool a run of `session` is offered under `name`, with its tier: the most
    /// specific tier's that builds, when its pipeline's steps are reachable now.
    fn offered(&self, name: &str, session: &str) -> Option<(Tier, Tool)> {
        let (tier, tool) = self.forged_tool(name, session)?;
        self.steps_reachable(tier, name, session).then_some((tier, tool))
    }

    /// The tools compose pipelines reach, resolved per call for the caller's session.
    pub(crate) fn lookup(&self) -> Rc<dyn crate::tools::ToolLookup> {
        Rc::new(RegistryTools(self.me.clone()))
    }

    /// The tool `session` reaches under `name`: forged (session, agent, shared), then host
    /// tools, then `forge_tool`. Only that tool is built (and cached on its entry).
    pub fn resolve_tool(&self, name: &str, session: &str) -> Option<Tool> {
        if let Some((_, tool)) = self.forged_tool(name, session) {
            return Some(tool);
        }
        if let Some(tool) = self.host_tools.borrow().get(name) {
            return Some(tool.clone());
        }
        (self.config.enabled && name == FORGE_TOOL_NAME).then(|| self.forge_tool()).flatten()
    }

    /// The names of the tools `session` reaches (host tools, forged tools whose pipeline steps
    /// it reaches, `forge_tool`), found without building any, unlike [`Registry::tool_set`]: a
    /// compose build that fails names what is available, and building the tool set for that
    /// built the failing pipeline again, which failed the same way, until the stack ran out (a
    /// trap in wasm, for every agent of the instance).
    fn reachable_names(&self, session: &str) -> Vec<String> {
        let mut names: Vec<String> = self.forged_names(session).into_iter().collect();
        names.retain(|name| {
            let tier = self.state.borrow().resolve(name, session).map(|(tier, _)| tier);
            !self.is_own(name) && tier.is_some_and(|tier| self.steps_reachable(tier, name, session) && self.look_alike_below(tier, name, session).is_none())
        });
        names.extend(self.host_tools.borrow().names().map(str::to_string));
        if self.config.enabled {
            names.push(FORGE_TOOL_NAME.to_string());
        }
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Whether `session` reaches a tool `name`, without building anything.
    fn reaches(&self, name: &str, session: &str) -> bool {
        let forged = self.state.borrow().resolve(name, session).map(|(tier, _)| tier);
        // A pipeline over a step this agent's own tool shadows is not run here: one calling it
        // is not offered either.
        forged.is_some_and(|tier| self.shadowed_step(tier, name, session).is_none() && self.look_alike_below(tier, name, session).is_none())
            || self.host_tools.borrow().contains(name)
            || (self.config.enabled && name == FORGE_TOOL_NAME)
    }

    /// Whether `name` is one of the agent's own tools. No forged tool stands in for one: a
    /// forged tool stored under its name (from before forging such names was refused, or
    /// before the own tool was added) is reached nowhere.
    fn is_own(&self, name: &str) -> bool {
        // The exact name first: every call of a host tool asks, and it needs no folding.
        self.host_tools.borrow().contains(name) || self.own_look_alike(name).is_some()
    }

    /// The own tool (host tool or `forge_tool`) whose name `name` is or folds onto (see
    /// [`canonical_tool_name`]).
    fn own_look_alike(&self, name: &str) -> Option<String> {
        let own = self.own_names.borrow();
        match is_canonical_name(name) {
            true => own.get(name).cloned(),
            false => own.get(&canonical_tool_name(name)).cloned(),
        }
    }

    /// The step tool of the compose entry `name` at `tier` that an own tool of this agent
    /// shadows, with that own tool. A step naming a tool forged at the pipeline's tier or above
    /// was tested, judged and approved calling that forged tool (where the pipeline was made);
    /// here the name reaches the own tool instead, so the pipeline would do what nobody
    /// reviewed (a real `send_email` behind a pipeline approved over a draft formatter). Such a
    /// pipeline is neither offered nor run here. A step naming a tool no tier holds forged is
    /// bound to the own tool, as documented.
    fn shadowed_step(&self, tier: Tier, name: &str, session: &str) -> Option<(String, String)> {
        let state = self.state.borrow();
        let entry = state.entry(tier, session, name)?;
        let crate::forge::Implementation::Compose { steps } = &entry.record.current.request.implementation else { return None };
        shadowed_in(&state, steps, tier, session, |step| self.own_look_alike(step))
    }

    /// The built forged tool `session` reaches under `name` (the most specific tier that
    /// builds), with its tier; none under an own tool's name (see [`Registry::is_own`]).
    fn forged_tool(&self, name: &str, session: &str) -> Option<(Tier, Tool)> {
        if self.is_own(name) {
            return None;
        }
        // The look-alike scan only for the tier that holds the tool: a call of a shared tool
        // would otherwise walk the session's tools for the agent tier too.
        [Tier::Session, Tier::Agent, Tier::Shared]
            .into_iter()
            .filter(|tier| self.shadowed_step(*tier, name, session).is_none())
            .find_map(|tier| self.built_at(tier, name, session).filter(|_| self.look_alike_below(tier, name, session).is_none()).map(|tool| (tier, tool)))
    }

    /// The forged tool of a more specific tier than `tier` that `session` reaches under a name
    /// folding onto `name` but not the same (see [`canonical_tool_name`]): the entry `name` at
    /// `tier` is then not reached here. Forging refuses such a pair, but a tool can arrive
    /// above one later: another agent's shared approval, which the approver could not check
    /// against this agent's own tools, would offer `Report` beside this agent's `report`, and
    /// a call of the look-alike would run the other agent's code on this agent's data.
    fn look_alike_below(&self, tier: Tier, name: &str, session: &str) -> Option<String> {
        let state = self.state.borrow();
        [Tier::Session, Tier::Agent]
            .into_iter()
            .filter(|below| *below < tier)
            .filter_map(|below| state.tier(below, session))
            .find_map(|entries| look_alike_in(entries, name))
            .cloned()
    }

    /// Whether every step tool of the compose entry `name` at `tier` is reachable by `session`
    /// now (true for sandbox tools).
    fn steps_reachable(&self, tier: Tier, name: &str, session: &str) -> bool {
        if self.shadowed_step(tier, name, session).is_some() {
            return false;
        }
        let state = self.state.borrow();
        let Some(entry) = state.entry(tier, session, name) else { return false };
        match &entry.record.current.request.implementation {
            crate::forge::Implementation::Compose { steps } => steps.iter().all(|step| self.reaches(&step.tool, session)),
            _ => true,
        }
    }

    /// The built tool of the active entry `name` at `tier`, building and caching it on first
    /// use; `None` when there is none or it cannot be built now.
    fn built_at(&self, tier: Tier, name: &str, session: &str) -> Option<Tool> {
        let record = {
            let state = self.state.borrow();
            let entry = state.entry(tier, session, name).filter(|e| e.active())?;
            if let Some(tool) = &entry.built {
                return Some(tool.clone());
            }
            entry.record.clone()
        };
        let inner = self.forge.build(&record.current.request, &self.lookup(), session).ok()?;
        let tool = provider::tracked(inner, self.me.clone(), tier, session, &record.current.hash)?;
        if let Some(entry) = self.state.borrow_mut().entry_mut(tier, session, name) {
            if entry.record.current.hash == record.current.hash {
                entry.built = Some(tool.clone());
            }
        }
        Some(tool)
    }

    /// The `forge_tool` meta-tool, built once (it never changes for a registry).
    fn forge_tool(&self) -> Option<Tool> {
        if let Some(tool) = self.forge_tool.borrow().as_ref() {
            return Some(tool.clone());
        }
        // Any arguments reach the handler, even text that is not JSON: the forge normalizes
        // what it can and rejects the rest with a category, counted in the forge stats (a
        // schema check here would bounce the synonyms `normalize` accepts with a bare
        // `invalid_arguments`). The model sees one concrete argument shape.
        let tool =
            Tool::new(FORGE_TOOL_NAME, crate::forge::forge_tool_description(), &serde_json::json!({}), None, Rc::new(ForgeToolHandler::new(self.me.clone())))
                .ok()?
                .advertising(crate::forge::forge_tool_advertised_schema());
        *self.forge_tool.borrow_mut() = Some(tool.clone());
        Some(tool)
    }

    /// Calls the tool `name` as a run of `session` would reach it (session, agent, shared,
    /// then host tools). Arguments and output are checked against the schemas; an output
    /// that violates the output schema is an `invalid_output` failure, never a success.
    pub async fn call(&self, name: &str, args: Value, session: &str) -> Result<Value, ToolFailure> {
        self.call_as(name, args, session, "", Nesting::default()).await
    }

    /// [`Registry::call`] whose handlers get `run_id` as their run id (a direct call has no
    /// run; the host may give it an id by which its tool adapters find the call's abort signal).
    ///
    /// `nesting` is what the call continues (see [`Nesting`]): a host tool that calls a forged
    /// tool back while a pipeline runs it (before its first await, on the same stack) passes
    /// its own, so a pipeline reaching itself that way meets the nesting and step limits, not
    /// the end of the stack, and a test's re-entry is no use of the tools it reaches.
    pub async fn call_as(&self, name: &str, args: Value, session: &str, run_id: &str, nesting: Nesting) -> Result<Value, ToolFailure> {
        let Some(tool) = self.resolve_tool(name, session) else {
            if let Some(failure) = self.unreached_here(name, session) {
                return Err(failure);
            }
            let (active, demoted) = {
                let state = self.state.borrow();
                let active = state.resolve(name, session).map(|(_, e)| e.record.current.request.clone());
                (active, [Tier::Session, Tier::Agent, Tier::Shared].into_iter().any(|t| state.entry(t, session, name).is_some()))
            };
            // Registered and active, but it does not build for this session (a tool its
            // pipeline calls is gone): the build's own reason says which.
            if let Some(request) = active {
                let reason =
                    self.forge.build(&request, &self.lookup(), session).err().map_or_else(|| "it cannot be built now".to_string(), |(reason, _)| reason);
                return Err(ToolFailure::new("unknown_tool", format!("`{name}` cannot be called by this session: {reason}")));
            }
            // A forge makes "Count Vowels" the tool `Count_Vowels`: a caller using the name as
            // it was asked for is told the name it got.
            let registered = crate::forge::snake_name(name);
            let hint = if registered != name && self.resolve_tool(&registered, session).is_some() {
                format!(" (forged tools are named `{registered}` for `{name}`: call it by that name)")
            } else {
                String::new()
            };
            return Err(if demoted {
                ToolFailure::new("denied", format!("`{name}` is demoted and cannot be called at its old tier"))
            } else {
                ToolFailure::new("unknown_tool", format!("no tool named `{name}`{hint}"))
            });
        };
        // A host tool that asks for approval is asked for it in runs only; a direct call
        // (`agent.tools.call`) has no one to ask, so it is refused rather than let through.
        if tool.handler().needs_approval(&args).await {
            return Err(crate::forge::denied_without_approval(name));
        }
        let Nesting { depth, trial, pipeline_budget } = nesting;
        invoke(&tool, args, &CallContext { depth, trial, pipeline_budget, ..self.direct_call(session, run_id) }).await
    }

    /// Why the forged tool `session` holds under `name` is not reached by this agent, when
    /// its name folds onto an own tool's or a step of it is shadowed by one: said as such,
    /// not as a build failure or a missing tool.
    fn unreached_here(&self, name: &str, session: &str) -> Option<ToolFailure> {
        let tier = self.state.borrow().resolve(name, session).map(|(tier, _)| tier)?;
        if let Some(own) = self.own_look_alike(name) {
            return Some(ToolFailure::new(
                "unknown_tool",
                format!("no tool named `{name}`: the forged tool of that name is too close to this agent's own tool `{own}` to be reached here (did you mean `{own}`?)"),
            ));
        }
        if let Some(own) = self.look_alike_below(tier, name, session) {
            return Some(ToolFailure::new(
                "unknown_tool",
                format!(
                    "no tool named `{name}`: the {} tool of that name is too close to this session's `{own}` to be reached here (did you mean `{own}`?)",
                    tier.as_str()
                ),
            ));
        }
        self.shadowed_step(tier, name, session).map(|(step, own)| shadowed_failure(name, &step, &own))
    }

    /// The context of a call made through the registry API, outside any run.
    fn direct_call(&self, session: &str, run_id: &str) -> CallContext {
        CallContext { direct: true, ..CallContext::new(run_id, self.env.new_id("call"), session) }
    }

    /// Calls `name` at exactly `tier`: fails with `denied` when the tool there is demoted.
    pub async fn call_at(&self, name: &str, tier: Tier, args: Value, session: &str) -> Result<Value, ToolFailure> {
        let status = self.state.borrow().entry(tier, session, name).map(|e| e.record.status);
        match status {
            None => Err(ToolFailure::new("unknown_tool", format!("no tool named `{name}` at the {} tier", tier.as_str()))),
            Some(ToolStatus::Demoted) => {
                Err(ToolFailure::new("denied", format!("`{name}` was demoted from the {} tier and cannot be called there", tier.as_str())))
            }
            Some(ToolStatus::Active) => {
                if let Some((step, own)) = self.shadowed_step(tier, name, session) {
                    return Err(shadowed_failure(name, &step, &own));
                }
                let Some(tool) = self.built_at(tier, name, session) else {
                    return Err(ToolFailure::new("unknown_tool", format!("`{name}` cannot be built")));
                };
                invoke(&tool, args, &self.direct_call(session, "")).await
            }
        }
    }

    /// Every registered tool `session` can see, demoted tombstones included (session tier
    /// first, then agent, then shared); not one stored under an own tool's name, which nothing
    /// reaches (see [`Registry::is_own`]).
    pub fn list(&self, session: &str) -> Vec<ToolInfo> {
        let state = self.state.borrow();
        [Tier::Session, Tier::Agent, Tier::Shared]
            .into_iter()
            .filter_map(|t| state.tier(t, session))
            .flat_map(|m| m.values().filter(|e| !self.is_own(&e.record.name)).map(|e| self.listed(e)))
            .collect()
    }

    /// `entry` as this agent lists it: another agent's shared tool without the session it was
    /// forged in (that agent's, a tenant's maybe; see `provenance` in the package module).
    fn listed(&self, entry: &Entry) -> ToolInfo {
        let mut info = tool_info(entry);
        if entry.record.origin.agent_id != self.agent_id {
            info.session_id = None;
        }
        info
    }

    /// Refuses to act on the forged tool stored under one of the agent's own tools' names
    /// ([`RegistryError::OwnTool`]): `export`, `demote` and `rollback` act on what the agent
    /// serves under a name, and it serves its own tool (see [`Registry::is_own`]).
    pub(crate) fn refuse_own_tool(&self, name: &str) -> Result<(), RegistryError> {
        let own = match self.host_tools.borrow().contains(name) {
            true => Some(name.to_string()),
            false => self.own_look_alike(name),
        };
        match own {
            Some(own) => Err(RegistryError::OwnTool { name: name.into(), own }),
            None => Ok(()),
        }
    }

    /// Refuses a forged tool under one of the agent's own tools' names (see [`Registry::is_own`]).
    pub(crate) fn refuse_own_name(&self, name: &str) -> Result<(), String> {
        if self.host_tools.borrow().contains(name) || name == FORGE_TOOL_NAME {
            return Err(format!("`{name}` is one of the agent's own tools; a forged tool needs a name of its own"));
        }
        match self.own_look_alike(name) {
            Some(own) => Err(format!(
                "`{name}` is too close to `{own}`, one of the agent's own tools (names are compared ignoring case and `-` vs `_`); a forged tool needs a name of its own"
            )),
            None => Ok(()),
        }
    }

    /// Refuses a new forged tool `name` that folds onto another forged tool `session` reaches
    /// (`Slugify` beside `slugify`): the model would be offered two tools it cannot tell apart,
    /// and a caller meaning one would get the other. A new version keeps the exact name.
    fn refuse_close_name(&self, state: &State, session: &str, name: &str) -> Result<(), String> {
        let mut reached = [Tier::Session, Tier::Agent, Tier::Shared].into_iter().filter_map(|t| state.tier(t, session)).flat_map(|m| m.values());
        match reached.find(|e| e.active() && e.record.name != name && same_tool_name(&e.record.name, name)) {
            Some(e) => Err(format!(
                "`{name}` is too close to the existing tool `{other}` (names are compared ignoring case and `-` vs `_`): forge it as `{other}` for a new version of that tool, or give it a name of its own",
                other = e.record.name
            )),
            None => Ok(()),
        }
    }

    /// Refuses a pipeline over a step tool this agent's own tool shadows here (see
    /// [`Registry::shadowed_step`]): registered, it could not be called.
    fn refuse_shadowed_steps(&self, state: &State, session: &str, req: &ForgeRequest) -> Result<(), String> {
        let crate::forge::Implementation::Compose { steps } = &req.implementation else { return Ok(()) };
        match shadowed_in(state, steps, Tier::Session, session, |step| self.own_look_alike(step)) {
            Some((step, own)) => Err(format!(
                "step tool `{step}` is a forged tool this agent cannot reach: its own tool `{own}` shadows it, and a pipeline over it would not be run here"
            )),
            None => Ok(()),
        }
    }

    /// Approvals waiting for `approve`/`deny`.
    pub fn pending_approvals(&self) -> Vec<PendingApproval> {
        self.state.borrow().approvals.values().cloned().collect()
    }

    /// Discards the session tier of `session` and flushes pending stats.
    pub async fn end_session(&self, session: &str) -> Result<(), RegistryError> {
        self.state.borrow_mut().sessions.remove(session);
        self.forges.end(session);
        self.flush_stats().await
    }

    // ---- lifecycle ---------------------------------------------------------------------

    /// Moves `name` down one tier (shared → agent, agent → session of `session`). The old
    /// tier keeps a demoted tombstone that cannot be called. The highest active tier holding
    /// the name is demoted. Under one of the agent's own tools' names it is refused
    /// ([`RegistryError::OwnTool`]).
    pub async fn demote(&self, name: &str, session: &str) -> Result<ToolInfo, RegistryError> {
        self.refuse_own_tool(name)?;
        let _turn = self.shared_tier_turn().await?;
        // Another agent's shared tool goes back to its owner's agent tier, unless the owner has
        // one of that name in use there already (a newer version it promoted since): that one
        // stays. A tombstone there is replaced, and its versions join the tool's history.
        let other_owner = self.state.borrow().shared.get(name).filter(|e| e.active()).map(|e| e.record.origin.agent_id.clone()).filter(|o| *o != self.agent_id);
        let owners_own: Option<ToolRecord> = match &other_owner {
            Some(owner) => {
                let key = tool_key_under(&agent_prefix(owner), name);
                // One it cannot read is replaced all the same (the owner could not load it).
                self.store.get(&key).await?.and_then(|own| unversioned(&key, "tool", own).ok())
            }
            None => None,
        };
        let kept = owners_own.as_ref().filter(|own| own.status == ToolStatus::Active).map(|own| own.current.version);
        let owners_tombstone = owners_own.filter(|_| kept.is_none());
        let owner_keeps_own = kept.is_some();
        let (info, ops, from, to, undo, withdrawn) = {
            let mut state = self.state.borrow_mut();
            let from = [Tier::Shared, Tier::Agent, Tier::Session]
                .into_iter()
                .find(|t| state.entry(*t, session, name).is_some_and(Entry::active))
                .ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
            let to = from.lower().ok_or_else(|| RegistryError::LowestTier(name.to_string()))?;
            let undo = state.undo_point_withdrawing(&[(from, session, name), (to, session, name)], name);
            let old = state.entry_mut(from, session, name).expect("found above");
            old.record.status = ToolStatus::Demoted;
            old.record.revoke_review(from);
            old.built = None;
            // A shared tombstone keeps its stats: the calls the tool got at the shared tier, to
            // which the flush still adds those this agent (or any other) has not written yet.
            // The agent tier below counts from zero: an approval adds the calls the tool got
            // there to the shared totals, and totals it started from would be added twice. A
            // tool demoted to a session keeps its agent-tier stats, which are written whole.
            let mut ops = self.entry_ops(old);
            let mut record = old.record.clone();
            let stats = if from == Tier::Shared { ToolStats::default() } else { old.stats.clone() };
            record.tier = to;
            record.status = ToolStatus::Active;
            // The uses that follow do not undo an operator's demotion: this version is not
            // promoted automatically again (a new version may be, and a request may ask).
            record.promotion.demote(&record.current.hash);
            if to == Tier::Session {
                record.session_id = Some(session.to_string());
            }
            // A shared tool goes back to the agent that forged it: another agent demoting it
            // takes it out of the shared tier, but does not gain it (it never passed this agent's
            // panel); the owner finds it in its agent tier when it next loads, and a notice
            // naming this agent for its audit trail, whether it is open now or not.
            let owner = other_owner.filter(|_| from == Tier::Shared);
            if let Some(owner) = &owner {
                let detail = came_home_detail(Some(&self.agent_id), kept);
                let notice = self.audit_entry("demote", name, Some(record.current.version), Some(Tier::Agent), detail, None.into());
                ops.push(BatchOp::Put { key: notice_key(owner, name), value: versioned("demotion-notice", &notice) });
            }
            // The tier below may hold a tool of the name that is in use there (a session's own
            // newer forge, a version the agent promoted since): it stays current, as the tool
            // that tier's callers run, and the demoted versions join its history for rollback.
            let below_in_use = owner.is_none() && state.entry(to, session, name).is_some_and(Entry::active);
            // Otherwise what it held (a tombstone) stays in the demoted tool's history: later
            // forges are numbered after it instead of reusing its number.
            if owner.is_none() && !below_in_use {
                if let Some(below) = state.entry(to, session, name) {
                    record.absorb_history(&below.record.history);
                }
            }
            let (info, detail) = match &owner {
                Some(owner) if owner_keeps_own => (
                    tool_info(&Entry::new(record, stats)),
                    format!("taken out of the shared tier; its owner `{owner}` keeps the `{name}` of its own agent tier"),
                ),
                Some(owner) => {
                    if let Some(tombstone) = &owners_tombstone {
                        record.absorb_history(&tombstone.history);
                    }
                    let entry = Entry::new(record, stats);
                    ops.extend(entry_ops_under(&agent_prefix(owner), &entry));
                    (tool_info(&entry), format!("demoted from shared to the agent tier of its owner `{owner}`"))
                }
                None if below_in_use => {
                    let below = state.entry_mut(to, session, name).expect("checked above");
                    below.record.absorb_history(&record.history);
                    // The versions demoted before stay held off with those demoted now, should a
                    // rollback restore one.
                    for hash in &record.promotion.demoted {
                        below.record.promotion.demote(hash);
                    }
                    ops.extend(self.entry_ops(below));
                    let kept = below.record.current.version;
                    (tool_info(below), format!("demoted from {} to {}, whose own v{kept} stays current", from.as_str(), to.as_str()))
                }
                None => {
                    let entry = Entry::new(record, stats);
                    ops.extend(self.entry_ops(&entry));
                    let info = tool_info(&entry);
                    state.tier_mut(to, session).insert(name.to_string(), entry);
                    (info, format!("demoted from {} to {}", from.as_str(), to.as_str()))
                }
            };
            ops.extend(self.audit(&mut state, "demote", name, Some(info.version), Some(to), detail, Some(session).into()));
            let why = format!("the tool was demoted from the {} tier", from.as_str());
            let (withdrawing, withdrawn) = match from {
                Tier::Agent => self.withdraw_stale_requests(&mut state, name, &why),
                _ => Default::default(),
            };
            ops.extend(withdrawing);
            let undo = undo.sealed(&state);
            (info, ops, from, to, undo, (withdrawn, why))
        };
        self.persist_or_undo(ops, undo).await?;
        self.emit("", EventBody::ToolDemoted { name: name.to_string(), from_tier: from, to_tier: to });
        self.announce_withdrawn(withdrawn.0, &withdrawn.1);
        Ok(info)
    }

    /// Restores version `version` of `name` (the entry `session` reaches) as its current
    /// version. Under one of the agent's own tools' names it is refused
    /// ([`RegistryError::OwnTool`]).
    pub async fn rollback(&self, name: &str, version: u32, session: &str) -> Result<ToolInfo, RegistryError> {
        self.refuse_own_tool(name)?;
        let _turn = self.shared_tier_turn().await?;
        // A forge refuses a pipeline that would call itself; an old version restored could be
        // one, as the tools it calls changed since. Restored, it would not build: it and every
        // tool on its loop would silently leave the session's tools.
        let steps = self.state.borrow().resolve(name, session).and_then(|(_, entry)| {
            entry.record.history.iter().find(|v| v.version == version).and_then(|v| match &v.request.implementation {
                crate::forge::Implementation::Compose { steps } => Some(steps.clone()),
                crate::forge::Implementation::Sandbox { .. } => None,
            })
        });
        if let Some(steps) = steps {
            if let Err(e @ crate::forge::ComposeBuildError::Cycle { .. }) = crate::forge::ComposeHandler::build(name, &steps, self.lookup(), session) {
                return Err(RegistryError::PipelineCycle { name: name.to_string(), version, reason: e.to_string() });
            }
        }
        let (info, ops, undo, withdrawn) = {
            let mut state = self.state.borrow_mut();
            let tier = state.resolve(name, session).map(|(t, _)| t).ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
            let undo = state.undo_point_withdrawing(&[(tier, session, name)], name);
            let entry = state.entry_mut(tier, session, name).expect("resolved above");
            let target =
                entry.record.history.iter().find(|v| v.version == version).cloned().ok_or(RegistryError::NoSuchVersion { name: name.to_string(), version })?;
            if !restorable(&target, tier) {
                return Err(RegistryError::Unreviewed { name: name.to_string(), version, tier });
            }
            let from = entry.record.current.version;
            let left_hash = std::mem::replace(&mut entry.record.current, target).hash;
            entry.built = None;
            // A session's stats count the uses of the version they were earned by, which is
            // what promotes it: the restored one starts afresh, as a new version does. Above
            // the session, stats are written by flushes (at the shared tier, they hold other
            // agents' calls) and decide no promotion: they stay.
            if tier == Tier::Session {
                entry.record.promotion.version_left(&left_hash, entry.stats.successes);
                entry.stats = ToolStats::default();
            }
            let mut ops = self.entry_ops(entry);
            let info = tool_info(entry);
            ops.extend(self.audit(
                &mut state,
                "rollback",
                name,
                Some(version),
                Some(tier),
                format!("rolled back from version {from} to {version}"),
                Some(session).into(),
            ));
            let why = format!("the agent tier rolled back from version {from} to {version}");
            let (withdrawing, withdrawn) = match tier {
                Tier::Agent => self.withdraw_stale_requests(&mut state, name, &why),
                _ => Default::default(),
            };
            ops.extend(withdrawing);
            let undo = undo.sealed(&state);
            (info, ops, undo, (withdrawn, why))
        };
        self.persist_or_undo(ops, undo).await?;
        self.announce_withdrawn(withdrawn.0, &withdrawn.1);
        Ok(info)
    }
}

/// The registry as the [`crate::tools::ToolLookup`] of compose pipelines (held weakly: tools
/// live inside the registry).
struct RegistryTools(Weak<Registry>);

impl crate::tools::ToolLookup for RegistryTools {
    fn lookup(&self, name: &str, session_id: &str) -> Option<Tool> {
        self.0.upgrade()?.resolve_tool(name, session_id)
    }

    fn contains(&self, name: &str, session_id: &str) -> bool {
        self.0.upgrade().is_some_and(|r| r.reaches(name, session_id))
    }

    fn available(&self, session_id: &str) -> Vec<String> {
        self.0.upgrade().map(|r| r.reachable_names(session_id)).unwrap_or_default()
    }

    fn pipeline_steps(&self, name: &str, session_id: &str) -> Vec<String> {
        let Some(registry) = self.0.upgrade() else { return vec![] };
        // An own tool of that name is what runs: a forged pipeline stored under it has no steps.
        if registry.is_own(name) {
            return vec![];
        }
        let state = registry.state.borrow();
        match state.resolve(name, session_id).map(|(_, entry)| &entry.record.current.request.implementation) {
            Some(crate::forge::Implementation::Compose { steps }) => steps.iter().map(|step| step.tool.clone()).collect(),
            _ => vec![],
        }
    }
}

/// The form tool names are compared in: ASCII lowercase, `-` read as `_`. A model, like a
/// person reading a tool list, takes `Send-Email` or `REFUND` for `send_email` or `refund`:
/// names that fold alike must not stand for two different tools of one agent.
pub fn canonical_tool_name(name: &str) -> String {
    name.chars().map(|c| if c == '-' { '_' } else { c.to_ascii_lowercase() }).collect()
}

/// One byte of a name as [`canonical_tool_name`] folds it. Byte-wise is exact: the folding
/// touches ASCII only, and a name's other bytes (UTF-8) are left as they are.
fn fold_name_byte(b: u8) -> u8 {
    if b == b'-' {
        b'_'
    } else {
        b.to_ascii_lowercase()
    }
}

/// Whether `name` is its own [`canonical_tool_name`] (most names are): looked up as it is,
/// without building the folded copy.
fn is_canonical_name(name: &str) -> bool {
    !name.bytes().any(|b| b == b'-' || b.is_ascii_uppercase())
}

/// Whether two tool names fold alike (see [`canonical_tool_name`]), without allocating: it is
/// asked of every tool a session reaches at each forge.
pub fn same_tool_name(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| fold_name_byte(x) == fold_name_byte(y))
}

/// The active tool of `entries` whose name folds onto `name` but is not `name` (see
/// [`canonical_tool_name`]).
pub(crate) fn look_alike_in<'e>(entries: &'e BTreeMap<String, Entry>, name: &str) -> Option<&'e String> {
    entries.iter().find(|(other, entry)| other.as_str() != name && entry.active() && same_tool_name(other, name)).map(|(other, _)| other)
}

/// The agent's own tool names (host tools and `forge_tool`), each under its canonical form.
/// `forge_tool` is always in: it names the meta-tool whenever emergent is enabled.
fn own_names(host: &ToolSet) -> HashMap<String, String> {
    host.names().chain([FORGE_TOOL_NAME]).map(|n| (canonical_tool_name(n), n.to_string())).collect()
}

/// The first step tool of `steps` that an own tool shadows (`own_of` gives the own tool a
/// name folds onto) while `state` holds a forged tool of that name at `tier` or above, with
/// that own tool. See [`Registry::shadowed_step`].
fn shadowed_in(
    state: &State,
    steps: &[crate::forge::ComposeStep],
    tier: Tier,
    session: &str,
    own_of: impl Fn(&str) -> Option<String>,
) -> Option<(String, String)> {
    steps.iter().find_map(|step| {
        let own = own_of(&step.tool)?;
        let forged = [Tier::Session, Tier::Agent, Tier::Shared].into_iter().filter(|t| *t >= tier).any(|t| state.entry(t, session, &step.tool).is_some());
        forged.then(|| (step.tool.clone(), own))
    })
}

/// The failure of a call of the pipeline `name` whose step tool `step` is shadowed here by the
/// own tool `own` (see [`Registry::shadowed_step`]).
fn shadowed_failure(name: &str, step: &str, own: &str) -> ToolFailure {
    ToolFailure::new(
        "denied",
        format!(
            "`{name}` cannot be called by this agent: its step tool `{step}` is a forged tool, which this agent's own tool `{own}` shadows here (the pipeline was tested and approved over the forged one)"
        ),
    )
}

/// Refuses a different tool `name` for `session` when a version of it numbered `next_version`
/// or later (one registered while this forge or import was checked: the calls of one step run
/// at once) is the session's current one. The first registered stands: replacing it, the later
/// one would leave whoever was told of the first holding a tool that is gone, and its caller
/// checked its request against a session that no longer is. Asked again later, with the
/// session's tool in view, a different request is a new version as usual.
/// What a checked forge's judge spent, if it was asked (an unchanged request never is).
fn judge_usage(checked: &Result<Checked, Rejection>) -> Option<&JudgeUsage> {
    match checked {
        Ok(Checked::Verified(verified)) => verified.judge_usage.as_ref(),
        Ok(Checked::Unchanged(_)) => None,
        Err(rejection) => rejection.judge_usage.as_ref(),
    }
}

fn registered_since(state: &State, session: &str, name: &str, next_version: u32) -> Result<(), String> {
    match state.entry(Tier::Session, session, name).map(|e| e.record.current.version) {
        Some(version) if version >= next_version => Err(format!(
            "another forge or import registered `{name}` v{version} in this session while this one was checked, so this different `{name}` was not registered; call `{name}` v{version} as it is, or forge this request again in a later step to replace it"
        )),
        _ => Ok(()),
    }
}

/// Whether a rollback at `tier` may restore `version`: above the session tier, a version got
/// there through a review (the panel, a human), and one that never had it must not come back.
fn restorable(version: &ToolVersion, tier: Tier) -> bool {
    tier == Tier::Session || version.reviewed_for >= Some(tier)
}

/// The listed view of an entry.
pub(crate) fn tool_info(entry: &Entry) -> ToolInfo {
    let r = &entry.record;
    let req = &r.current.request;
    ToolInfo {
        name: r.name.clone(),
        description: req.description.clone(),
        tier: r.tier,
        version: r.current.version,
        hash: r.current.hash.clone(),
        mode: req.implementation.mode().to_string(),
        input_schema: req.input_schema.clone(),
        output_schema: req.output_schema.clone(),
        implementation: Some(req.implementation.clone()),
        stats: entry.stats.clone(),
        verdict: r.current.verdict.clone(),
        session_id: r.session_id.clone(),
        created_at: r.current.created_at,
        versions: r.history.iter().map(|v| v.version).collect(),
        restorable_versions: r.history.iter().filter(|v| restorable(v, r.tier)).map(|v| v.version).collect(),
        status: r.status,
    }
}
