//! Writing to the store: a batch written with what earlier refused or abandoned writes left
//! out ([`Unwritten`]), calls counted and their stats flushed, and the turns the agents on one
//! store take at its shared data.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::{Rc, Weak};

use crate::store::BatchOp;

use super::{agent_prefix, audit_entry_key, notice_key, unversioned, versioned, Registry, RegistryError, Tier, ToolStats, Undo, NOTICE_KEYS};

/// Records what a refused or abandoned write left out of the store while the registry goes on showing them:
/// the audit entries and forge stats of a forge, a rejection or an import are written best
/// effort (the outcome stands without them). The next write carries them, built from what
/// memory holds then, so a restart does not lose them (and never writes one back stale).
#[derive(Debug, Default)]
pub(super) struct Unwritten {
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
    _counted: WriteCounted<'r>,
}

impl<'r> WriteGoing<'r> {
    fn new(registry: &'r Registry, left: Unwritten) -> Self {
        Self { registry, left: Some(left), _counted: WriteCounted::new(registry) }
    }
}

impl Drop for WriteGoing<'_> {
    fn drop(&mut self) {
        if let Some(left) = self.left.take() {
            self.registry.state.borrow_mut().unwritten.absorb(left);
        }
    }
}

/// A write counted among those [`Registry::close_writes`] waits for, from when its caller has
/// taken what it writes out of memory until it ends. A stats flush is counted before it waits
/// for its turn and reads the shared totals: a `close()` meanwhile would otherwise find nothing
/// left to flush, stop writes, and lose the calls the flush had taken.
struct WriteCounted<'r>(&'r Registry);

impl<'r> WriteCounted<'r> {
    fn new(registry: &'r Registry) -> Self {
        registry.writes.borrow_mut().count += 1;
        Self(registry)
    }
}

impl Drop for WriteCounted<'_> {
    fn drop(&mut self) {
        let mut writes = self.0.writes.borrow_mut();
        writes.count -= 1;
        if writes.count == 0 {
            writes.waiting.drain(..).for_each(std::task::Waker::wake);
        }
    }
}

/// The store writes of a registry that have not ended.
#[derive(Default)]
pub(super) struct WritesGoing {
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

/// What the agents on one store's data take turns at (see [`store_turn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum TurnKind {
    /// Read-add-write flushes of shared-tier stats (see `flush_stats`).
    SharedStats,
    /// Changes of the shared tier and of the registry's records (approve, demote, rollback):
    /// each reads the shared tier fresh inside its turn, so two agents approving the same name
    /// at once see each other's write instead of both deciding on what they read before.
    SharedTier,
}

/// One turn: whoever holds it goes, the others wait in line.
pub(super) type Turn = futures::lock::Mutex<()>;

thread_local! {
    /// The turns, one per kind and store's data: agents on other stores never wait for this
    /// one (a hung store stalls only the agents that use it).
    static STORE_TURNS: RefCell<HashMap<(TurnKind, usize), Weak<Turn>>> = RefCell::new(HashMap::new());
}

/// The turn of `kind` on the store whose data is `key`, made on first use; turns no agent
/// holds any more are dropped.
pub(super) fn store_turn(kind: TurnKind, key: usize) -> Rc<Turn> {
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

impl Registry {
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
    /// left out (see [`Unwritten`]). (A plain function: one state machine in the wasm, not two.)
    pub(crate) fn persist(&self, ops: Vec<BatchOp>) -> impl std::future::Future<Output = Result<(), RegistryError>> + '_ {
        self.write(ops, false)
    }

    /// [`Registry::persist`]; `began_before_close` for a write that began before the registry
    /// was closed and is counted ([`WriteCounted`]) since: `close_writes` waits for it, so it
    /// lands before the agent id is handed on.
    async fn write(&self, ops: Vec<BatchOp>, began_before_close: bool) -> Result<(), RegistryError> {
        if self.is_closed() && !began_before_close {
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
        let _counted = WriteCounted::new(self);
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
        let written = if shared.is_empty() { self.write(ops, true).await } else { self.write_shared_stats(ops, &shared, &taken.sent, true).await };
        if written.is_err() && taken.sent.get() {
            self.keep_unflushed(&shared);
        }
        taken.written.set(written.is_ok());
        written
    }

    /// Adds this agent's shared-tier deltas to the totals the store holds and writes them with
    /// `ops`. Shared totals are read, added to and written back: flushes of the agents in this
    /// instance take turns, and with agents in other contexts through the store's lock, so no
    /// agent's write lands between another's read and write. `began_before_close`: a stats
    /// flush counted for `close_writes` (see [`Registry::write`]); an approval is not, and is
    /// refused once the registry is closed.
    pub(super) async fn write_shared_stats(
        &self,
        mut ops: Vec<BatchOp>,
        shared: &[(String, ToolStats)],
        sent: &std::cell::Cell<bool>,
        began_before_close: bool,
    ) -> Result<(), RegistryError> {
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
        self.write(ops, began_before_close).await
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
        entry.calls_here.record(ok, latency_ms);
        if tier == Tier::Session {
            return false;
        }
        entry.unflushed.record(ok, latency_ms);
        state.dirty.insert((tier, name.to_string()));
        state.calls_since_flush += 1;
        state.calls_since_flush >= self.config.stats_flush_every.max(1)
    }
}
