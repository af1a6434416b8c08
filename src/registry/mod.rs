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
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::rc::{Rc, Weak};

use crate::guard::{SessionTicket, SessionWork};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::agent::{unless_cancelled, AgentEvent, CancelSignal, Environment, EventBody, EventSink, UsageRecorder};
use crate::forge::{
    Admission, Checked, Evidence, Forge, ForgeOrigin, ForgeRequest, ForgeResult, ForgeStats, ForgeStatsAggregator, ForgeToolHandler, JudgeUsage, Kept,
    Rejection, Verified, FORGE_TOOL_NAME,
};
use crate::model::Model;
use crate::sandbox::SandboxRunner;
use crate::store::{BatchOp, Store, StoreError, Versioned};
use crate::tools::{invoke, CallContext, Nesting, Tool, ToolFailure, ToolSet};

mod background;
mod hash;
mod package;
mod promotion;
mod provider;
mod types;

pub use hash::{canonical_json, content_hash};
pub use package::{oversized_package, ImportOptions, ToolPackage, AGENTOS_FORMAT, MAX_EXPANDED_BYTES, MAX_FLOW_NESTING, MAX_PACKAGE_BYTES, PACKAGE_FORMAT};
pub use promotion::{PromotionOutcome, PromotionStatus};
pub use types::{
    AuditEntry, EmergentConfig, HeldOff, PendingApproval, PromotionMemo, PromotionThreshold, RejectedPromotion, Tier, ToolInfo, ToolRecord, ToolStats,
    ToolStatus, ToolVersion, MAX_REJECTED_PROMOTIONS, MAX_VERSIONS,
};

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

/// One tool at one tier, with its stats and its built handler (built on first use; an entry
/// whose record changes is replaced or has `built` cleared).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) record: ToolRecord,
    pub(crate) stats: ToolStats,
    /// Calls counted since the stats were last written. Shared-tier stats are written as
    /// these deltas added to what the store holds, so agents sharing a tool add up their
    /// calls instead of overwriting each other's counts.
    unflushed: ToolStats,
    built: Option<Tool>,
}

impl Entry {
    fn new(record: ToolRecord, stats: ToolStats) -> Self {
        Self { record, stats, unflushed: ToolStats::default(), built: None }
    }

    fn active(&self) -> bool {
        self.record.status == ToolStatus::Active
    }

    fn version(&self) -> Version {
        (self.record.current.hash.clone(), self.record.status)
    }
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) sessions: HashMap<String, BTreeMap<String, Entry>>,
    pub(crate) agent: BTreeMap<String, Entry>,
    pub(crate) shared: BTreeMap<String, Entry>,
    pub(crate) approvals: BTreeMap<String, PendingApproval>,
    pub(crate) audit: VecDeque<AuditEntry>,
    /// Store sequence number of each entry in `audit` (same order).
    audit_seqs: VecDeque<u64>,
    next_audit_seq: u64,
    forge_stats: ForgeStatsAggregator,
    dirty: BTreeSet<(Tier, String)>,
    calls_since_flush: u32,
    /// Session tools under promotion review, as (session, name): one review per tool at a
    /// time, however many calls cross the threshold together.
    pub(crate) promoting: BTreeSet<(String, String)>,
    /// The agent's rejected promotions, oldest first (see [`RejectedPromotion`]).
    pub(crate) rejected_promotions: Vec<RejectedPromotion>,
    /// What writes the store refused, or that were abandoned, left out of it and memory still holds (see
    /// [`Unwritten`]).
    unwritten: Unwritten,
}

/// Records what a refused or abandoned write left out of the store while the registry goes on showing them:
/// the audit entries and forge stats of a forge, a rejection or an import are written best
/// effort (the outcome stands without them). The next write carries them, built from what
/// memory holds then, so a restart does not lose them (and never writes one back stale).
#[derive(Debug, Default)]
struct Unwritten {
    /// Sequence numbers of audit entries (one since dropped from the ring, or undone, is not
    /// written).
    audit: BTreeSet<u64>,
    /// Names whose forge-name record is missing.
    names: BTreeSet<String>,
    forge_stats: bool,
    /// Names whose demotion notice was audited but not cleared: cleared with the audit entry,
    /// or the next load would audit it again.
    notices: BTreeSet<String>,
    /// Sequence numbers of stored audit entries the ring dropped whose delete was refused: a
    /// long-lived agent under quota pressure would otherwise keep one more ring's worth in
    /// the store per failure period until its next load trims them.
    dropped_audit: BTreeSet<u64>,
}

/// Most refused audit deletes kept in [`Unwritten`]. Past it the newest are forgotten: the
/// entries still stored are the oldest ones, and any forgotten one is older than the ring, so
/// the next load trims it.
const MAX_DROPPED_AUDIT: usize = 4096;

/// A store write going: unless it is marked done, what it was writing is noted as
/// [`Unwritten`] when it ends, refused by the store or dropped before the store answered (its
/// caller was abandoned: a run aborted while its forge was written). Memory holds it all the
/// same, so the next write carries it.
struct WriteGoing<'r> {
    registry: &'r Registry,
    /// What it writes that a refused write would leave out: what it retried and what it adds.
    left: Option<Unwritten>,
}

impl<'r> WriteGoing<'r> {
    fn new(registry: &'r Registry, left: Unwritten) -> Self {
        registry.writes.borrow_mut().count += 1;
        Self { registry, left: Some(left) }
    }
}

impl Drop for WriteGoing<'_> {
    fn drop(&mut self) {
        if let Some(left) = self.left.take() {
            self.registry.state.borrow_mut().unwritten.absorb(left);
        }
        let mut writes = self.registry.writes.borrow_mut();
        writes.count -= 1;
        if writes.count == 0 {
            writes.waiting.drain(..).for_each(std::task::Waker::wake);
        }
    }
}

/// The store writes of a registry that have not ended.
#[derive(Default)]
struct WritesGoing {
    count: usize,
    waiting: Vec<std::task::Waker>,
}

impl Unwritten {
    /// Adds what `other` names.
    fn absorb(&mut self, other: Unwritten) {
        self.audit.extend(other.audit);
        self.names.extend(other.names);
        self.forge_stats |= other.forge_stats;
        self.notices.extend(other.notices);
        self.dropped_audit.extend(other.dropped_audit);
        self.bound_dropped_audit();
    }

    /// Notes that the delete of dropped audit entry `seq` was refused.
    fn note_audit_delete(&mut self, seq: u64) {
        // An entry whose put was refused too never reached the store: nothing to delete. (One
        // an abandoned write put after all stays until the next load trims it.)
        if self.audit.remove(&seq) {
            return;
        }
        self.dropped_audit.insert(seq);
        self.bound_dropped_audit();
    }

    fn bound_dropped_audit(&mut self) {
        while self.dropped_audit.len() > MAX_DROPPED_AUDIT {
            self.dropped_audit.pop_last();
        }
    }

    /// Notes the record at `rest` (a key of the agent's, its prefix taken off) when it is one
    /// of the best-effort ones: an audit entry put or deleted, the forge stats, a forge name
    /// put, a demotion notice deleted.
    fn note_key(&mut self, rest: &str, put: bool) {
        let audit_seq = rest.strip_prefix("audit/").and_then(|seq| seq.parse().ok());
        if !put {
            if let Some(name) = rest.strip_prefix(NOTICE_KEYS) {
                self.notices.insert(name.to_string());
            } else if let Some(seq) = audit_seq {
                self.note_audit_delete(seq);
            }
        } else if rest == "forge-stats" {
            self.forge_stats = true;
        } else if let Some(seq) = audit_seq {
            self.audit.insert(seq);
        } else if let Some(name) = rest.strip_prefix("forge-name/") {
            self.names.insert(name.to_string());
        }
    }
}

impl State {
    pub(crate) fn tier(&self, tier: Tier, session: &str) -> Option<&BTreeMap<String, Entry>> {
        match tier {
            Tier::Session => self.sessions.get(session),
            Tier::Agent => Some(&self.agent),
            Tier::Shared => Some(&self.shared),
        }
    }

    pub(crate) fn tier_mut(&mut self, tier: Tier, session: &str) -> &mut BTreeMap<String, Entry> {
        match tier {
            Tier::Session => self.sessions.entry(session.to_string()).or_default(),
            Tier::Agent => &mut self.agent,
            Tier::Shared => &mut self.shared,
        }
    }

    /// A tier's map, without making one for a session that has none: a call, review or undo
    /// finishing after its session ended must not bring the session back.
    fn existing_tier_mut(&mut self, tier: Tier, session: &str) -> Option<&mut BTreeMap<String, Entry>> {
        match tier {
            Tier::Session => self.sessions.get_mut(session),
            Tier::Agent => Some(&mut self.agent),
            Tier::Shared => Some(&mut self.shared),
        }
    }

    /// The entry `name` of a tier, if that tier holds one.
    pub(crate) fn entry(&self, tier: Tier, session: &str, name: &str) -> Option<&Entry> {
        self.tier(tier, session)?.get(name)
    }

    /// The tier, `from` or above, whose active entry `name` is the version `hash` (a call that
    /// ran while its tool moved up, a promotion, counts where the tool is now): none when the
    /// version was demoted, rolled back or replaced.
    pub(crate) fn holder(&self, from: Tier, session: &str, name: &str, hash: &str) -> Option<Tier> {
        [Tier::Session, Tier::Agent, Tier::Shared]
            .into_iter()
            .filter(|t| *t >= from)
            .find(|t| self.entry(*t, session, name).is_some_and(|e| e.active() && e.record.current.hash == hash))
    }

    /// The entry `name` of a tier (see [`State::existing_tier_mut`]).
    pub(crate) fn entry_mut(&mut self, tier: Tier, session: &str, name: &str) -> Option<&mut Entry> {
        self.existing_tier_mut(tier, session)?.get_mut(name)
    }

    /// Takes the entry `name` out of a tier (see [`State::existing_tier_mut`]).
    pub(crate) fn remove_entry(&mut self, tier: Tier, session: &str, name: &str) -> Option<Entry> {
        self.existing_tier_mut(tier, session)?.remove(name)
    }

    /// The number a new version of `name` gets: after every version of it this registry holds,
    /// in any tier and any session. Numbered only after what the forging session reaches, two
    /// sessions would each make a v2, and promoting both would leave one v2 where a rollback
    /// to 2 had meant the other.
    pub(crate) fn next_version(&self, name: &str) -> u32 {
        let entries = self.sessions.values().filter_map(|m| m.get(name)).chain(self.agent.get(name)).chain(self.shared.get(name));
        entries.flat_map(|e| e.record.history.iter().map(|v| v.version).chain([e.record.current.version])).max().map_or(1, |v| v + 1)
    }

    /// The active entry callers of `session` reach for `name`: session, then agent, then shared.
    pub(crate) fn resolve(&self, name: &str, session: &str) -> Option<(Tier, &Entry)> {
        [Tier::Session, Tier::Agent, Tier::Shared].into_iter().find_map(|t| self.entry(t, session, name).filter(|e| e.active()).map(|e| (t, e)))
    }

    /// Whether `tier` has room for `name` under `max` active tools (a tool replacing its own
    /// version always fits); the count when it has none.
    pub(crate) fn room(&self, tier: Tier, session: &str, name: &str, max: usize) -> Result<(), usize> {
        // Counting the active entries walks the whole tier, twice a forge; while it holds fewer
        // entries than `max` at all (inactive ones included), none of them can be over it.
        let entries = self.tier(tier, session).map_or(0, |m| m.len() - usize::from(m.contains_key(name)));
        if entries < max {
            return Ok(());
        }
        let count = self.active_count(tier, session, name);
        if count >= max {
            return Err(count);
        }
        Ok(())
    }

    /// Active tools of a tier, not counting `except` (the tool being replaced). Entries are
    /// keyed by name, so `except` is one lookup rather than a name comparison per entry.
    fn active_count(&self, tier: Tier, session: &str, except: &str) -> usize {
        self.tier(tier, session).map_or(0, |m| {
            let active = m.values().filter(|e| e.active()).count();
            active - m.get(except).map_or(0, |e| usize::from(e.active()))
        })
    }
}

/// What a stats flush took out of memory to write. Until the write is sent (`sent`), a flush
/// that ends early puts the shared-tier deltas back: one dropped while it waits for the
/// shared-stats lock or reads the totals (its tool call was abandoned by an abort), or one that
/// failed there. Otherwise those calls would be missing from the totals for good. Agent-tier
/// names are dirty again unless the write is known to have landed (`written`): their stats are
/// written whole, so writing them twice is harmless, while a name left clean would never be
/// written until its tool is called again.
struct FlushTaken<'a> {
    registry: &'a Registry,
    shared: &'a [(String, ToolStats)],
    agent: Vec<String>,
    sent: std::cell::Cell<bool>,
    written: std::cell::Cell<bool>,
}

impl Drop for FlushTaken<'_> {
    fn drop(&mut self) {
        if self.written.get() {
            return;
        }
        if !self.sent.get() {
            self.registry.keep_unflushed(self.shared);
        }
        let mut state = self.registry.state.borrow_mut();
        for name in self.agent.drain(..) {
            state.dirty.insert((Tier::Agent, name));
        }
    }
}

/// What a lifecycle change (promote, approve, deny, demote, rollback) is about to touch: the
/// entries and approvals as they were, and where its audit entries start. Memory is changed first and the
/// store written after; when that write fails, [`State::undo`] puts these back, so memory never
/// claims a change the store does not hold (an approval that vanished from memory could not be
/// approved again, yet would reappear after a restart).
pub(crate) struct Undo {
    entries: Vec<Touched>,
    approvals: Vec<(String, Option<PendingApproval>)>,
    /// The change's own audit entries have sequence numbers from `audit_start` to before
    /// `audit_end`.
    audit_start: u64,
    audit_end: u64,
}

impl Undo {
    /// Marks the end of the change's own audit entries (call when its mutations are done).
    pub(crate) fn sealed(mut self, state: &State) -> Self {
        self.audit_end = state.next_audit_seq;
        for touched in &mut self.entries {
            touched.left = state.entry(touched.tier, &touched.session, &touched.name).map(Entry::version);
        }
        self
    }
}

/// Which version of a tool an entry holds, and in what status.
type Version = (String, ToolStatus);

/// An entry a change touches: where it is, what it was before, what the change left there.
struct Touched {
    tier: Tier,
    session: String,
    name: String,
    before: Option<Entry>,
    left: Option<Version>,
}

impl State {
    /// Remembers `entries` ((tier, session, name)) and `approvals` (ids) as they are now, for
    /// [`State::undo`].
    pub(crate) fn undo_point(&self, entries: &[(Tier, &str, &str)], approvals: &[&str]) -> Undo {
        Undo {
            entries: entries
                .iter()
                .map(|&(tier, session, name)| Touched {
                    tier,
                    session: session.to_string(),
                    name: name.to_string(),
                    before: self.entry(tier, session, name).cloned(),
                    left: None,
                })
                .collect(),
            approvals: approvals.iter().map(|&id| (id.to_string(), self.approvals.get(id).cloned())).collect(),
            audit_start: self.next_audit_seq,
            audit_end: self.next_audit_seq,
        }
    }

    /// [`State::undo_point`] of a change of `name` that may withdraw its pending shared-tier
    /// requests (see [`Registry::withdraw_stale_requests`]): they come back if its write fails.
    pub(crate) fn undo_point_withdrawing(&self, entries: &[(Tier, &str, &str)], name: &str) -> Undo {
        let requests = self.approvals.values().filter(|a| a.tool == name && a.to_tier == Some(Tier::Shared));
        let ids: Vec<&str> = requests.map(|a| a.id.as_str()).collect();
        self.undo_point(entries, &ids)
    }

    /// Puts back what `undo` remembered and drops the change's own audit entries. (Entries the
    /// change pushed out of a full audit ring stay out of memory until a restart reads them.)
    /// An entry changed again while the write was out (a forge registered a new version) is
    /// left as it is: putting back the one from before would drop a change that did succeed.
    pub(crate) fn undo(&mut self, undo: Undo) {
        for Touched { tier, session, name, before, left } in undo.entries {
            let Some(map) = self.existing_tier_mut(tier, &session) else { continue };
            if map.get(&name).map(Entry::version) != left {
                continue;
            }
            match before {
                Some(entry) => map.insert(name, entry),
                None => map.remove(&name),
            };
        }
        for (id, before) in undo.approvals {
            match before {
                Some(approval) => self.approvals.insert(id, approval),
                None => self.approvals.remove(&id),
            };
        }
        let own = undo.audit_start..undo.audit_end;
        while let Some(at) = self.audit_seqs.iter().position(|seq| own.contains(seq)) {
            self.audit_seqs.remove(at);
            self.audit.remove(at);
        }
    }
}

/// What the agents on one store's data take turns at (see [`store_turn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum TurnKind {
    /// Read-add-write flushes of shared-tier stats (see `flush_stats`).
    SharedStats,
    /// Changes of the shared tier and of the registry's records (approve, demote, rollback):
    /// each reads the shared tier fresh inside its turn, so two agents approving the same name
    /// at once see each other's write instead of both deciding on what they read before.
    SharedTier,
}

/// One turn: whoever holds it goes, the others wait in line.
type Turn = futures::lock::Mutex<()>;

thread_local! {
    /// The turns, one per kind and store's data: agents on other stores never wait for this
    /// one (a hung store stalls only the agents that use it).
    static STORE_TURNS: RefCell<HashMap<(TurnKind, usize), Weak<Turn>>> = RefCell::new(HashMap::new());
}

/// The turn of `kind` on the store whose data is `key`, made on first use; turns no agent
/// holds any more are dropped.
fn store_turn(kind: TurnKind, key: usize) -> Rc<Turn> {
    STORE_TURNS.with(|turns| {
        let mut turns = turns.borrow_mut();
        if let Some(turn) = turns.get(&(kind, key)).and_then(Weak::upgrade) {
            return turn;
        }
        turns.retain(|_, turn| turn.strong_count() > 0);
        let turn = Rc::new(Turn::new(()));
        turns.insert((kind, key), Rc::downgrade(&turn));
        turn
    })
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

/// Schema version of every registry record this build writes (and the newest it reads).
const RECORD_VERSION: u32 = 1;

/// Longest audit detail kept: a detail quotes reasons, and a reason may quote model output.
pub const MAX_AUDIT_DETAIL_CHARS: usize = 2000;

fn versioned<T: Serialize>(kind: &str, data: &T) -> Value {
    serde_json::to_value(Versioned { kind: kind.to_string(), v: RECORD_VERSION, data }).unwrap_or(Value::Null)
}

/// The data of a registry record of `kind`. A record of another kind, or one written by a
/// newer build (which this build would read with its older schema and write back without the
/// fields it does not know), is refused as corrupt rather than read half-right. The envelope
/// is checked before the data is read: a newer build's data may have changed shape, and a
/// serde error about it would hide that the runtime is what is out of date.
fn unversioned<T: DeserializeOwned>(key: &str, kind: &str, value: Value) -> Result<T, RegistryError> {
    let record = serde_json::from_value::<Versioned<Value>>(value).map_err(|e| unreadable_record(key, e.to_string()))?;
    if record.kind != kind {
        return Err(unreadable_record(key, format!("a `{}` record where a `{kind}` record belongs", record.kind)));
    }
    if record.v > RECORD_VERSION {
        return Err(newer_record(key, format!("written by a newer version of the runtime (`{kind}` v{}; this build reads up to v{RECORD_VERSION})", record.v)));
    }
    serde_json::from_value(record.data).map_err(|e| unreadable_record(key, e.to_string()))
}

/// Who a record at `key` that cannot be read stops: a `shared/` one is read by every agent.
fn stopped_by(key: &str) -> &'static str {
    if key.starts_with("shared/") {
        "every agent on this store"
    } else {
        "this agent"
    }
}

/// A record this build cannot read and no build could: loading stops at it rather than
/// skipping it (a skipped record may be one a later write would overwrite), so the error says
/// how to go on.
fn unreadable_record(key: &str, problem: String) -> RegistryError {
    let message = format!("{problem}. It stops {} from loading until it is gone: delete the key `{key}` from the store to go on without it", stopped_by(key));
    RegistryError::Corrupt { key: key.to_string(), message }
}

/// A record a newer runtime wrote: deleting it would lose that runtime's data, so the way on
/// is the newer runtime.
fn newer_record(key: &str, problem: String) -> RegistryError {
    let message = format!("{problem}. It stops {} from loading: upgrade the runtime to that newer version (the record is left as it is)", stopped_by(key));
    RegistryError::Corrupt { key: key.to_string(), message }
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

    /// [`Registry::close`], then completes once the store writes that began before it have
    /// ended: an approval, demotion or rollback whose write was out when its agent closed lands
    /// before the agent id is handed on, not among the records of the agent opened after it.
    pub async fn close_writes(&self) {
        self.close();
        std::future::poll_fn(|cx| {
            let mut writes = self.writes.borrow_mut();
            if writes.count == 0 {
                return std::task::Poll::Ready(());
            }
            if !writes.waiting.iter().any(|w| w.will_wake(cx.waker())) {
                writes.waiting.push(cx.waker().clone());
            }
            std::task::Poll::Pending
        })
        .await
    }

    /// Re-reads the shared tier from the store. Agents of one runtime share a store; after one
    /// of them changes the shared tier (approval, demotion, rollback) the others reload it, so
    /// the change is visible to all of them at once. Built handlers of unchanged tools stay.
    pub async fn reload_shared(&self) -> Result<(), RegistryError> {
        let _turn = self.shared_turn.lock().await;
        let tools = self.read_shared().await?;
        self.emit("", EventBody::RegistryReloaded { tier: Tier::Shared, tools, at: self.now() });
        Ok(())
    }

    /// The turn for a change of the shared tier or of this agent's records, with the shared tier
    /// read fresh: the agents of this context on this store wait for each other, and those of
    /// other contexts (tabs) too through the store's lock, so a decision (is the name taken?
    /// which version is current?) is made on what the store holds, not on a copy another agent
    /// has changed since.
    async fn shared_tier_turn(&self) -> Result<(futures::lock::MutexGuard<'_, ()>, Option<crate::store::StoreLock>), RegistryError> {
        let turn = self.shared_turn.lock().await;
        let lock = self.store.lock("shared-tier").await?;
        self.read_shared().await?;
        Ok((turn, lock))
    }

    /// Reads the shared tier from the store (its number of tools). A tool of this agent that
    /// left it since (another agent demoted it into this agent's tier) is read back into the
    /// agent tier too, otherwise only a restart would show it here, and the demotion goes into
    /// this agent's audit trail, its notice cleared (see [`Registry::audit_came_home`]): the
    /// other agent's trail has it, and the owner's is the record of where its tool went.
    async fn read_shared(&self) -> Result<u32, RegistryError> {
        let mut loaded = load_tier(self.store.as_ref(), "shared/").await?;
        let tools = loaded.len() as u32;
        let came_home: Vec<(String, u32)> = {
            let state = self.state.borrow();
            let mine = |e: &Entry| e.active() && e.record.origin.agent_id == self.agent_id;
            let left = state.shared.iter().filter(|(name, e)| mine(e) && !loaded.get(*name).is_some_and(Entry::active));
            left.map(|(name, e)| (name.clone(), e.record.current.version)).collect()
        };
        // Read after the shared tier: the demoter writes its notice in the batch that demotes,
        // so a demotion seen there has its notice here (unless an earlier build demoted it).
        let (mut own, mut notices): (_, Vec<(String, AuditEntry)>) = match came_home.is_empty() {
            true => (BTreeMap::new(), vec![]),
            false => {
                let prefix = self.prefix(Tier::Agent);
                (load_tier(self.store.as_ref(), &prefix).await?, load_notices(self.store.as_ref(), &prefix).await?)
            }
        };
        let audit = {
            let mut state = self.state.borrow_mut();
            let mut audit = vec![];
            for (name, version) in came_home {
                // An active entry in memory is newer than the store's (a version this agent
                // promoted since, with calls not written yet): it stays.
                let kept = state.agent.get(&name).filter(|e| e.active()).map(|e| e.record.current.version);
                if let Some(entry) = own.remove(&name).filter(|_| kept.is_none()) {
                    state.agent.insert(name.clone(), entry);
                }
                let notice = notices.iter().position(|(n, _)| *n == name).map(|at| notices.swap_remove(at));
                audit.extend(match notice {
                    Some((name, entry)) => self.audit_came_home(&mut state, &name, entry),
                    None => self.audit(&mut state, "demote", &name, Some(version), Some(Tier::Agent), came_home_detail(None, kept), None.into()),
                });
            }
            for (name, entry) in loaded.iter_mut() {
                if let Some(old) = state.shared.get(name) {
                    if old.record.current.hash == entry.record.current.hash && old.record.status == entry.record.status {
                        entry.built = old.built.clone();
                    }
                    // Calls this agent counted but has not written yet stay counted.
                    entry.stats.merge(&old.unflushed);
                    entry.unflushed = old.unflushed.clone();
                }
            }
            state.shared = loaded;
            audit
        };
        // Best effort, as a forge's audit entries are: the next write carries what this one
        // could not. (Nothing to write is no write: a reload is no occasion to retry others'.)
        if !audit.is_empty() {
            let _ = self.persist(audit).await;
        }
        Ok(tools)
    }

    /// Appends to the audit trail the `entry` another agent left this one when it took its
    /// shared tool `name` out of the shared tier (dated then, naming that agent), and deletes
    /// the notice in the same write: a notice already audited would be audited again at the
    /// next load. The agent reads its notices at load, or, open at the time, when a reload of
    /// the shared tier finds its tool gone: either way it appends each once.
    fn audit_came_home(&self, state: &mut State, name: &str, entry: AuditEntry) -> Vec<BatchOp> {
        let mut ops = self.append_audit(state, entry);
        ops.push(BatchOp::Delete { key: notice_key(&self.agent_id, name) });
        ops
    }

    /// Audits the demotions of this agent's shared tools that other agents left `notices` of
    /// (read before the tiers were, see [`Registry::load`]). Best effort, as loading is not a
    /// change anyone asked for: what a refused write leaves out is written with the next write
    /// that goes through, or, the agent closed before one, audited at the next load (the entry
    /// and the clearing are one write: neither or both are stored).
    async fn audit_notices_left(&self, notices: Vec<(String, AuditEntry)>) {
        if notices.is_empty() {
            return;
        }
        let ops = {
            let mut state = self.state.borrow_mut();
            let mut ops = vec![];
            for (name, entry) in notices {
                ops.extend(self.audit_came_home(&mut state, &name, entry));
            }
            ops
        };
        let _ = self.persist(ops).await;
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

    // ---- persistence -------------------------------------------------------------------

    fn prefix(&self, tier: Tier) -> String {
        match tier {
            Tier::Shared => "shared/".to_string(),
            _ => agent_prefix(&self.agent_id),
        }
    }

    pub(crate) fn tool_key(&self, tier: Tier, name: &str) -> String {
        tool_key_under(&self.prefix(tier), name)
    }

    pub(crate) fn stats_key(&self, tier: Tier, name: &str) -> String {
        stats_key_under(&self.prefix(tier), name)
    }

    pub(crate) fn approval_key(&self, id: &str) -> String {
        format!("{}approval/{id}", agent_prefix(&self.agent_id))
    }

    /// Ops writing `entry` when its tier is persisted: its record, and at the agent tier its
    /// stats. Shared-tier stats are every agent's calls added up, and change only through the
    /// read-add-write of [`Registry::flush_stats`]: a lifecycle change writing this agent's view
    /// of them would drop the calls other agents flushed since it last read them, and its own
    /// unflushed calls would be added again by its next flush.
    pub(crate) fn entry_ops(&self, entry: &Entry) -> Vec<BatchOp> {
        match entry.record.tier {
            Tier::Session => vec![],
            Tier::Agent => entry_ops_under(&self.prefix(Tier::Agent), entry),
            Tier::Shared => vec![record_op(&self.prefix(Tier::Shared), entry)],
        }
    }

    /// Ops deleting a persisted entry.
    pub(crate) fn delete_ops(&self, tier: Tier, name: &str) -> Vec<BatchOp> {
        if tier == Tier::Session {
            return vec![];
        }
        vec![BatchOp::Delete { key: self.tool_key(tier, name) }, BatchOp::Delete { key: self.stats_key(tier, name) }]
    }

    pub(crate) fn approval_op(&self, approval: &PendingApproval) -> BatchOp {
        BatchOp::Put { key: self.approval_key(&approval.id), value: versioned("approval", approval) }
    }

    /// Appends to the audit ring, dropping the oldest entries beyond capacity, and returns the
    /// ops persisting that change (one put, and a delete per dropped entry). The detail is cut
    /// to [`MAX_AUDIT_DETAIL_CHARS`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn audit<'a>(
        &self,
        state: &mut State,
        action: &str,
        tool: &str,
        version: Option<u32>,
        tier: Option<Tier>,
        detail: String,
        who: AuditSubject<'a>,
    ) -> Vec<BatchOp> {
        let entry = self.audit_entry(action, tool, version, tier, detail, who);
        self.append_audit(state, entry)
    }

    /// An audit entry made now, its detail cut to [`MAX_AUDIT_DETAIL_CHARS`].
    fn audit_entry(&self, action: &str, tool: &str, version: Option<u32>, tier: Option<Tier>, detail: String, who: AuditSubject<'_>) -> AuditEntry {
        AuditEntry {
            at: self.now(),
            action: action.to_string(),
            tool: tool.to_string(),
            version,
            tier,
            detail: crate::tools::shorten(&detail, MAX_AUDIT_DETAIL_CHARS),
            session_id: who.session.filter(|s| !s.is_empty()).map(str::to_string),
            scope: who.scope.map(str::to_string),
        }
    }

    /// Appends `entry` to the audit ring (see [`Registry::audit`]).
    fn append_audit(&self, state: &mut State, entry: AuditEntry) -> Vec<BatchOp> {
        let seq = state.next_audit_seq;
        state.next_audit_seq += 1;
        let mut ops = vec![BatchOp::Put { key: audit_entry_key(&self.agent_id, seq), value: versioned("audit-entry", &entry) }];
        state.audit.push_back(entry);
        state.audit_seqs.push_back(seq);
        while state.audit.len() > self.config.audit_capacity.max(1) {
            state.audit.pop_front();
            if let Some(old) = state.audit_seqs.pop_front() {
                ops.push(BatchOp::Delete { key: audit_entry_key(&self.agent_id, old) });
            }
        }
        ops
    }

    /// Ops persisting a forge outcome for `name`: the counters, and the name's record when
    /// this outcome changed it (first attempt, first approval).
    fn forge_stats_ops(&self, state: &State, name_changed: Option<(&str, bool)>) -> Vec<BatchOp> {
        let counters = BatchOp::Put { key: format!("{}forge-stats", agent_prefix(&self.agent_id)), value: versioned("forge-stats", &state.forge_stats) };
        std::iter::once(counters).chain(name_changed.map(|(name, approved)| self.forge_name_op(name, approved))).collect()
    }

    /// The op writing whether the forged name `name` was ever approved.
    fn forge_name_op(&self, name: &str, approved: bool) -> BatchOp {
        BatchOp::Put { key: format!("{}forge-name/{name}", agent_prefix(&self.agent_id)), value: versioned("forge-name", &ForgeNameRecord { approved }) }
    }

    /// Ops writing what `unwritten` names, as memory holds it now.
    fn unwritten_ops(&self, unwritten: &Unwritten) -> Vec<BatchOp> {
        let state = self.state.borrow();
        let mut ops: Vec<BatchOp> = unwritten
            .audit
            .iter()
            .filter_map(|seq| state.audit_seqs.iter().position(|s| s == seq).map(|at| (seq, &state.audit[at])))
            .map(|(seq, entry)| BatchOp::Put { key: audit_entry_key(&self.agent_id, *seq), value: versioned("audit-entry", entry) })
            .collect();
        if unwritten.forge_stats {
            ops.extend(self.forge_stats_ops(&state, None));
        }
        ops.extend(unwritten.names.iter().map(|name| self.forge_name_op(name, state.forge_stats.name_approved(name))));
        ops.extend(unwritten.notices.iter().map(|name| BatchOp::Delete { key: notice_key(&self.agent_id, name) }));
        ops.extend(unwritten.dropped_audit.iter().map(|seq| BatchOp::Delete { key: audit_entry_key(&self.agent_id, *seq) }));
        ops
    }

    /// [`Registry::persist`], undoing the change in memory when the write fails.
    pub(crate) async fn persist_or_undo(&self, ops: Vec<BatchOp>, undo: Undo) -> Result<(), RegistryError> {
        let written = self.persist(ops).await;
        if written.is_err() {
            self.state.borrow_mut().undo(undo);
        }
        written
    }

    /// Writes a batch, keeping only the last write per key, with what earlier refused writes
    /// left out (see [`Unwritten`]).
    pub(crate) async fn persist(&self, ops: Vec<BatchOp>) -> Result<(), RegistryError> {
        if self.is_closed() {
            return Err(RegistryError::Closed);
        }
        let retried = std::mem::take(&mut self.state.borrow_mut().unwritten);
        let mut last: BTreeMap<String, BatchOp> = BTreeMap::new();
        let mut order: Vec<String> = vec![];
        for op in self.unwritten_ops(&retried).into_iter().chain(ops) {
            let key = match &op {
                BatchOp::Put { key, .. } | BatchOp::Delete { key } => key.clone(),
            };
            if !last.contains_key(&key) {
                order.push(key.clone());
            }
            last.insert(key, op);
        }
        // What a refused write would leave out: what it retries, and the best-effort records
        // among its ops (the only ones a later write carries).
        let mut left = retried;
        let prefix = agent_prefix(&self.agent_id);
        for key in &order {
            if let Some(rest) = key.strip_prefix(&prefix) {
                left.note_key(rest, matches!(last.get(key), Some(BatchOp::Put { .. })));
            }
        }
        let ops: Vec<BatchOp> = order.into_iter().filter_map(|k| last.remove(&k)).collect();
        if ops.is_empty() {
            return Ok(());
        }
        let mut going = WriteGoing::new(self, left);
        let written = self.store.batch(ops).await;
        if written.is_ok() {
            going.left = None;
        }
        written.map_err(Into::into)
    }

    /// Writes the stats of agent/shared tools called since the last flush, in one batch.
    /// Agent-tier stats belong to this agent and are written as they are; shared-tier stats
    /// are read back and this agent's new calls added, so agents sharing a tool add up.
    pub async fn flush_stats(&self) -> Result<(), RegistryError> {
        if self.closed.get() {
            return Err(RegistryError::Closed);
        }
        let (ops, shared, agent) = {
            let mut state = self.state.borrow_mut();
            let dirty = std::mem::take(&mut state.dirty);
            state.calls_since_flush = 0;
            let mut ops = vec![];
            let mut shared: Vec<(String, ToolStats)> = vec![];
            let mut agent = vec![];
            for (tier, name) in dirty {
                if tier == Tier::Shared {
                    if let Some(e) = state.shared.get_mut(&name) {
                        shared.push((name, std::mem::take(&mut e.unflushed)));
                    }
                } else if let Some(e) = state.entry_mut(tier, "", &name) {
                    e.unflushed = ToolStats::default();
                    ops.push(BatchOp::Put { key: self.stats_key(tier, &name), value: versioned("stats", &e.stats) });
                    agent.push(name);
                }
            }
            (ops, shared, agent)
        };
        let taken = FlushTaken { registry: self, shared: &shared, agent, sent: Default::default(), written: Default::default() };
        let written = if shared.is_empty() { self.persist(ops).await } else { self.write_shared_stats(ops, &shared, &taken.sent).await };
        if written.is_err() && taken.sent.get() {
            self.keep_unflushed(&shared);
        }
        taken.written.set(written.is_ok());
        written
    }

    /// Adds this agent's shared-tier deltas to the totals the store holds and writes them with
    /// `ops`. Shared totals are read, added to and written back: flushes of the agents in this
    /// instance take turns, and with agents in other contexts through the store's lock, so no
    /// agent's write lands between another's read and write.
    async fn write_shared_stats(&self, mut ops: Vec<BatchOp>, shared: &[(String, ToolStats)], sent: &std::cell::Cell<bool>) -> Result<(), RegistryError> {
        let _turn = self.shared_stats_turn.lock().await;
        let _store_lock = self.store.lock("shared-stats").await?;
        let mut merged = Vec::with_capacity(shared.len());
        for (name, delta) in shared {
            let key = self.stats_key(Tier::Shared, name);
            let mut total = match self.store.get(&key).await? {
                Some(value) => unversioned::<ToolStats>(&key, "stats", value)?,
                None => ToolStats::default(),
            };
            total.merge(delta);
            merged.push((name, total));
        }
        {
            let mut state = self.state.borrow_mut();
            for (name, total) in merged {
                if let Some(e) = state.shared.get_mut(name.as_str()) {
                    // Others' calls, then this agent's calls counted while reading.
                    e.stats = total.clone();
                    e.stats.merge(&e.unflushed);
                }
                ops.push(BatchOp::Put { key: self.stats_key(Tier::Shared, name), value: versioned("stats", &total) });
            }
        }
        // From here the write is on its way: dropping this future no longer stops it.
        sent.set(true);
        self.persist(ops).await
    }

    /// Adds shared-tier deltas to what the next flush writes (calls a flush could not write,
    /// or an approved tool's calls joining the shared totals).
    fn keep_unflushed(&self, shared: &[(String, ToolStats)]) {
        let mut state = self.state.borrow_mut();
        for (name, delta) in shared {
            if let Some(e) = state.shared.get_mut(name) {
                e.unflushed.merge(delta);
            }
            state.dirty.insert((Tier::Shared, name.clone()));
        }
    }

    /// Counts one call of `name` at `tier`; returns whether a stats flush is due.
    pub(crate) fn record_call(&self, tier: Tier, session: &str, name: &str, hash: &str, ok: bool, latency_ms: f64) -> bool {
        let mut state = self.state.borrow_mut();
        // A call of a version no longer current counts nowhere: counted on the entry that now
        // holds the name, it promoted a version with no uses of its own.
        let Some(tier) = state.holder(tier, session, name, hash) else { return false };
        let Some(entry) = state.entry_mut(tier, session, name) else { return false };
        entry.stats.record(ok, latency_ms);
        if tier == Tier::Session {
            return false;
        }
        entry.unflushed.record(ok, latency_ms);
        state.dirty.insert((tier, name.to_string()));
        state.calls_since_flush += 1;
        state.calls_since_flush >= self.config.stats_flush_every.max(1)
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

    /// The forge stats snapshot.
    pub fn stats(&self) -> ForgeStats {
        self.state.borrow().forge_stats.snapshot()
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

    /// The audit trail, oldest first.
    pub fn audit_trail(&self) -> Vec<AuditEntry> {
        self.state.borrow().audit.iter().cloned().collect()
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

/// Where the records of agent `agent_id` live.
fn agent_prefix(agent_id: &str) -> String {
    format!("agent/{agent_id}/")
}

/// The key of tool `name`'s record in the tier stored under `prefix`.
fn tool_key_under(prefix: &str, name: &str) -> String {
    format!("{prefix}tool/{name}")
}

/// The key of tool `name`'s stats in the tier stored under `prefix`.
fn stats_key_under(prefix: &str, name: &str) -> String {
    format!("{prefix}stats/{name}")
}

/// Ops writing `entry` (record and stats) under `prefix` (the agent tier of some agent).
fn entry_ops_under(prefix: &str, entry: &Entry) -> Vec<BatchOp> {
    vec![record_op(prefix, entry), BatchOp::Put { key: stats_key_under(prefix, &entry.record.name), value: versioned("stats", &entry.stats) }]
}

/// The op writing `entry`'s tool record under `prefix`.
fn record_op(prefix: &str, entry: &Entry) -> BatchOp {
    BatchOp::Put { key: tool_key_under(prefix, &entry.record.name), value: versioned("tool", &entry.record) }
}

/// Reads one persisted tier (`agent/<id>/` or `shared/`): its tool records with their stats.
async fn load_tier(store: &dyn Store, prefix: &str) -> Result<BTreeMap<String, Entry>, RegistryError> {
    let stats_prefix = format!("{prefix}stats/");
    let mut stats: HashMap<String, ToolStats> = HashMap::new();
    for (key, value) in store.scan(&stats_prefix).await? {
        let Some(name) = key.strip_prefix(&stats_prefix) else { continue };
        stats.insert(name.to_string(), unversioned(&key, "stats", value)?);
    }
    let mut tier = BTreeMap::new();
    for (key, value) in store.scan(&format!("{prefix}tool/")).await? {
        let mut record: ToolRecord = unversioned(&key, "tool", value)?;
        // Stored before versions recorded their review: the version in service at an agent or
        // shared tier got there through that tier's review (what a rollback there may restore).
        // A tombstone's was taken back by its demotion.
        if record.tier != Tier::Session && record.status == ToolStatus::Active && record.current.reviewed_for.is_none() {
            record.mark_reviewed(record.tier);
        }
        let s = stats.remove(&record.name).unwrap_or_default();
        tier.insert(record.name.clone(), Entry::new(record, s));
    }
    Ok(tier)
}

/// Whom an audit entry concerns: the session, and for forge attempts their scope label.
pub(crate) struct AuditSubject<'a> {
    session: Option<&'a str>,
    scope: Option<&'a str>,
}

impl<'a> From<Option<&'a str>> for AuditSubject<'a> {
    fn from(session: Option<&'a str>) -> Self {
        Self { session, scope: None }
    }
}

impl<'a> AuditSubject<'a> {
    /// A forge attempt of `session`, labelled `scope`.
    fn attempt(session: &'a str, scope: Option<&'a str>) -> Self {
        Self { session: Some(session), scope }
    }
}

/// The store key of audit entry `seq` (zero-padded: key order is append order).
fn audit_entry_key(agent_id: &str, seq: u64) -> String {
    format!("{}audit/{seq:012}", agent_prefix(agent_id))
}

/// The persisted part of a forged name's stats: whether any attempt under it was approved.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct ForgeNameRecord {
    approved: bool,
}

/// The detail of the `demote` entry an agent's trail gets when another agent (`by`, when
/// known) took its tool out of the shared tier; `kept` is the version of its own that its
/// agent tier keeps instead, if any.
fn came_home_detail(by: Option<&str>, kept: Option<u32>) -> String {
    let who = by.map_or_else(|| "another agent".to_string(), |by| format!("another agent (`{by}`)"));
    match kept {
        Some(kept) => format!("{who} took it out of the shared tier; this agent's tier keeps its own v{kept}"),
        None => format!("{who} demoted it from the shared tier to this agent's tier"),
    }
}

/// The store key of the notice of `name`'s demotion left for agent `agent_id`.
fn notice_key(agent_id: &str, name: &str) -> String {
    format!("{}{NOTICE_KEYS}{name}", agent_prefix(agent_id))
}

/// Where an agent's demotion notices live under its prefix.
const NOTICE_KEYS: &str = "demotion-notice/";

/// The demotion notices left for the agent whose records are under `prefix`: (tool name,
/// audit entry).
async fn load_notices(store: &dyn Store, prefix: &str) -> Result<Vec<(String, AuditEntry)>, RegistryError> {
    let keys = format!("{prefix}{NOTICE_KEYS}");
    let mut notices = vec![];
    for (key, value) in store.scan(&keys).await? {
        let Some(name) = key.strip_prefix(&keys) else { continue };
        notices.push((name.to_string(), unversioned(&key, "demotion-notice", value)?));
    }
    Ok(notices)
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

/// A verdict as an audit entry's detail.
pub(crate) fn verdict_detail(v: &crate::forge::Verdict) -> String {
    format!("approved={} confidence={} {}", v.approved, v.confidence, v.reasoning)
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
