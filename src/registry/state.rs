//! What the registry holds in memory: each tier's tools ([`Entry`] in [`State`]), and how a
//! lifecycle change whose store write failed is undone ([`Undo`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::forge::ForgeStatsAggregator;
use crate::tools::Tool;

use super::{AuditEntry, PendingApproval, RejectedPromotion, Tier, ToolRecord, ToolStats, ToolStatus, Unwritten};

/// One tool at one tier, with its stats and its built handler (built on first use; an entry
/// whose record changes is replaced or has `built` cleared).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) record: ToolRecord,
    pub(crate) stats: ToolStats,
    /// Calls counted since the stats were last written. Shared-tier stats are written as
    /// these deltas added to what the store holds, so agents sharing a tool add up their
    /// calls instead of overwriting each other's counts.
    pub(super) unflushed: ToolStats,
    /// This agent's calls of the entry, counted since it was made or loaded: only ever added to
    /// (reading the shared totals replaces `stats`), so an undo can tell the calls made here
    /// while its write was out from other agents' calls that a read brought in.
    pub(super) calls_here: ToolStats,
    pub(super) built: Option<Tool>,
}

impl Entry {
    pub(super) fn new(record: ToolRecord, stats: ToolStats) -> Self {
        Self { record, stats, unflushed: ToolStats::default(), calls_here: ToolStats::default(), built: None }
    }

    pub(super) fn active(&self) -> bool {
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
    pub(super) audit_seqs: VecDeque<u64>,
    pub(super) next_audit_seq: u64,
    pub(super) forge_stats: ForgeStatsAggregator,
    pub(super) dirty: BTreeSet<(Tier, String)>,
    pub(super) calls_since_flush: u32,
    /// Session tools under promotion review, as (session, name): one review per tool at a
    /// time, however many calls cross the threshold together.
    pub(crate) promoting: BTreeSet<(String, String)>,
    /// The agent's rejected promotions, oldest first (see [`RejectedPromotion`]).
    pub(crate) rejected_promotions: Vec<RejectedPromotion>,
    /// What writes the store refused, or that were abandoned, left out of it and memory still holds (see
    /// [`Unwritten`]).
    pub(super) unwritten: Unwritten,
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
            let left = state.entry(touched.tier, &touched.session, &touched.name);
            touched.left = left.map(Entry::version);
            touched.left_calls = left.map(|e| e.calls_here.clone());
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
    /// This agent's calls of the entry the change left, as it left it: calls counted on it
    /// after are the tool's uses while the write was out, which an undo keeps.
    left_calls: Option<ToolStats>,
}

/// Calls counted on an entry an undo takes away, since its change left it there.
struct CountedMeanwhile {
    tier: Tier,
    session: String,
    name: String,
    since: ToolStats,
    /// Of those, the calls no flush has written yet (at the shared tier, deltas to add to the
    /// stored totals).
    unwritten: ToolStats,
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
                    left_calls: None,
                })
                .collect(),
            approvals: approvals.iter().map(|&id| (id.to_string(), self.approvals.get(id).cloned())).collect(),
            audit_start: self.next_audit_seq,
            audit_end: self.next_audit_seq,
        }
    }

    /// [`State::undo_point`] of a change of `name` that may withdraw its pending shared-tier
    /// requests (see [`Registry::withdraw_stale_requests`]): they come back if its write fails.
    ///
    /// [`Registry::withdraw_stale_requests`]: super::Registry::withdraw_stale_requests
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
        let mut meanwhile = vec![];
        let mut put_back = vec![];
        for Touched { tier, session, name, before, left, left_calls } in undo.entries {
            let Some(map) = self.existing_tier_mut(tier, &session) else { continue };
            if map.get(&name).map(Entry::version) != left {
                continue;
            }
            if before.is_some() {
                put_back.push((tier, session.clone(), name.clone()));
            }
            let undone = match before {
                Some(entry) => map.insert(name.clone(), entry),
                None => map.remove(&name),
            };
            if let (Some(undone), Some(left_calls)) = (undone, left_calls) {
                let since = undone.calls_here.since(&left_calls);
                meanwhile.push(CountedMeanwhile { tier, session, name, since, unwritten: undone.unflushed });
            }
        }
        for counted in meanwhile {
            self.keep_calls(counted, &put_back);
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

    /// Keeps the calls an undone change's entry counted while its write was out on the entry
    /// put back that callers reach now: they were real uses of the tool, and a flush in between
    /// may have written them, so dropping them would make the stored count go backwards. At the
    /// entry's own place (a rollback) its stats and unwritten calls simply stay; moved (an
    /// approval or demotion undone), the calls are added to the entry put back, and at the
    /// shared tier also to what the next flush adds to the totals. A session's stats count one
    /// version's uses toward its promotion, so none are carried into a session.
    fn keep_calls(&mut self, counted: CountedMeanwhile, put_back: &[(Tier, String, String)]) {
        let CountedMeanwhile { tier, session, name, since, unwritten } = counted;
        let reached = put_back.iter().find(|(t, s, n)| *n == name && self.entry(*t, s, n).is_some_and(Entry::active));
        let Some((to, to_session, _)) = reached else { return };
        let (to, to_session) = (*to, to_session.clone());
        if to == Tier::Session {
            return;
        }
        let Some(entry) = self.entry_mut(to, &to_session, &name) else { return };
        entry.stats.merge(&since);
        if (to, to_session.as_str()) == (tier, session.as_str()) {
            entry.unflushed = unwritten;
        } else if to == Tier::Shared {
            entry.unflushed.merge(&since);
        }
        if since.calls > 0 || entry.unflushed.calls > 0 {
            self.dirty.insert((to, name));
        }
    }
}
