//! Lifecycle changes the host makes: ending a session, demoting a tool one tier down, rolling
//! it back to an earlier version. (Promotions and approvals are in the promotion module.)

use crate::agent::EventBody;
use crate::store::BatchOp;

use super::{
    agent_prefix, came_home_detail, entry_ops_under, notice_key, tool_info, tool_key_under, unversioned, versioned, Entry, PendingApproval, Registry,
    RegistryError, Tier, ToolInfo, ToolRecord, ToolStats, ToolStatus, ToolVersion,
};

impl Registry {
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

/// Whether a rollback at `tier` may restore `version`: above the session tier, a version got
/// there through a review (the panel, a human), and one that never had it must not come back.
pub(super) fn restorable(version: &ToolVersion, tier: Tier) -> bool {
    tier == Tier::Session || version.reviewed_for >= Some(tier)
}
