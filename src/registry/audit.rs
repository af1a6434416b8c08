//! The audit trail (a ring of entries, one store key each) and the forge stats, with the ops
//! that persist them.

use crate::forge::ForgeStats;
use crate::store::BatchOp;

use super::{agent_prefix, versioned, AuditEntry, Registry, State, Tier};

/// Longest audit detail kept: a detail quotes reasons, and a reason may quote model output.
pub const MAX_AUDIT_DETAIL_CHARS: usize = 2000;

impl Registry {
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
    pub(super) fn audit_entry(&self, action: &str, tool: &str, version: Option<u32>, tier: Option<Tier>, detail: String, who: AuditSubject<'_>) -> AuditEntry {
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
    pub(super) fn append_audit(&self, state: &mut State, entry: AuditEntry) -> Vec<BatchOp> {
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
    pub(super) fn forge_stats_ops(&self, state: &State, name_changed: Option<(&str, bool)>) -> Vec<BatchOp> {
        let counters = BatchOp::Put { key: format!("{}forge-stats", agent_prefix(&self.agent_id)), value: versioned("forge-stats", &state.forge_stats) };
        std::iter::once(counters).chain(name_changed.map(|(name, approved)| self.forge_name_op(name, approved))).collect()
    }

    /// The op writing whether the forged name `name` was ever approved.
    pub(super) fn forge_name_op(&self, name: &str, approved: bool) -> BatchOp {
        BatchOp::Put { key: format!("{}forge-name/{name}", agent_prefix(&self.agent_id)), value: versioned("forge-name", &ForgeNameRecord { approved }) }
    }

    /// The audit trail, oldest first.
    pub fn audit_trail(&self) -> Vec<AuditEntry> {
        self.state.borrow().audit.iter().cloned().collect()
    }

    /// The forge stats snapshot.
    pub fn stats(&self) -> ForgeStats {
        self.state.borrow().forge_stats.snapshot()
    }
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
    pub(super) fn attempt(session: &'a str, scope: Option<&'a str>) -> Self {
        Self { session: Some(session), scope }
    }
}

/// The store key of audit entry `seq` (zero-padded: key order is append order).
pub(super) fn audit_entry_key(agent_id: &str, seq: u64) -> String {
    format!("{}audit/{seq:012}", agent_prefix(agent_id))
}

/// The persisted part of a forged name's stats: whether any attempt under it was approved.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub(super) struct ForgeNameRecord {
    pub(super) approved: bool,
}

/// A verdict as an audit entry's detail.
pub(crate) fn verdict_detail(v: &crate::forge::Verdict) -> String {
    format!("approved={} confidence={} {}", v.approved, v.confidence, v.reasoning)
}
