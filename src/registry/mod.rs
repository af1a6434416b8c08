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
use std::collections::HashMap;
use std::rc::{Rc, Weak};

use crate::guard::SessionWork;

use crate::agent::{AgentEvent, Environment, EventBody, EventSink};
use crate::forge::{Forge, FORGE_TOOL_NAME};
use crate::model::Model;
use crate::sandbox::SandboxRunner;
use crate::store::{BatchOp, Store, StoreError};
use crate::tools::{Tool, ToolSet};

mod audit;
mod background;
mod calls;
mod forging;
mod hash;
mod let_go;
mod lifecycle;
mod listing;
mod names;
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
pub use names::{canonical_tool_name, same_tool_name};
pub use package::{oversized_package, ImportOptions, ToolPackage, AGENTOS_FORMAT, MAX_EXPANDED_BYTES, MAX_FLOW_NESTING, MAX_PACKAGE_BYTES, PACKAGE_FORMAT};
pub use promotion::{PromotionOutcome, PromotionStatus};
pub use types::{
    AuditEntry, EmergentConfig, HeldOff, PendingApproval, PromotionMemo, PromotionThreshold, RejectedPromotion, Tier, ToolInfo, ToolRecord, ToolStats,
    ToolStatus, ToolVersion, MAX_REJECTED_PROMOTIONS, MAX_VERSIONS,
};

use audit::{audit_entry_key, verdict_detail, AuditSubject, ForgeNameRecord};
use let_go::UntilLetGo;
use lifecycle::restorable;
use listing::tool_info;
use names::{look_alike_in, own_names, shadowed_failure};
use records::{agent_prefix, entry_ops_under, load_tier, tool_key_under, unversioned, versioned};
use shared_tier::{came_home_detail, load_notices, notice_key, NOTICE_KEYS};
use state::{Entry, State, Undo};
use writes::{store_turn, Turn, TurnKind, Unwritten, WritesGoing};

/// A registry operation failed (bad requests to `forge` are not errors: they are rejected
/// [`ForgeResult`]s).
///
/// [`ForgeResult`]: crate::forge::ForgeResult
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
                // An operation the agent was let go of while it waited (see `let_go.rs`).
                "closed" => "closed",
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
    /// Set when the agent is let go: the store operations still waiting end ([`let_go`]).
    let_go: Rc<crate::agent::CancelFlag>,
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
        let let_go = Rc::new(crate::agent::CancelFlag::default());
        let registry = Rc::new_cyclic(|me| Registry {
            agent_id: agent_id.to_string(),
            config,
            store: Rc::new(UntilLetGo::new(deps.store, let_go.clone())),
            let_go,
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
    /// on the same store at once, and late writes would land among its records. (Writes already
    /// going, a stats flush among them, still land: [`Registry::close_writes`] waits for them.)
    /// Background work is aborted ([`Registry::stop_background`]).
    pub fn close(&self) {
        self.closed.set(true);
        self.stop_background();
    }

    /// [`Registry::close`], and the store operations still waiting end as `closed` (see
    /// [`let_go`]): for an agent freed after its `close()` gave up waiting for the store, so
    /// that the turns they hold do not hold up the agents on that store after it.
    pub fn let_go(&self) {
        self.close();
        self.let_go.cancel();
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

    /// Whether [`Registry::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }
}
