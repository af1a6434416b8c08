//! The shared tier as the store holds it: reloads, the turn a change of it takes, and the
//! demotions of this agent's shared tools that other agents left notices of.

use std::collections::BTreeMap;

use crate::agent::EventBody;
use crate::store::{BatchOp, Store};

use super::{agent_prefix, load_tier, unversioned, AuditEntry, Entry, Registry, RegistryError, State, Tier};

impl Registry {
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
    pub(super) async fn shared_tier_turn(&self) -> Result<(futures::lock::MutexGuard<'_, ()>, Option<crate::store::StoreLock>), RegistryError> {
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
    pub(super) async fn audit_notices_left(&self, notices: Vec<(String, AuditEntry)>) {
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
}

/// The detail of the `demote` entry an agent's trail gets when another agent (`by`, when
/// known) took its tool out of the shared tier; `kept` is the version of its own that its
/// agent tier keeps instead, if any.
pub(super) fn came_home_detail(by: Option<&str>, kept: Option<u32>) -> String {
    let who = by.map_or_else(|| "another agent".to_string(), |by| format!("another agent (`{by}`)"));
    match kept {
        Some(kept) => format!("{who} took it out of the shared tier; this agent's tier keeps its own v{kept}"),
        None => format!("{who} demoted it from the shared tier to this agent's tier"),
    }
}

/// The store key of the notice of `name`'s demotion left for agent `agent_id`.
pub(super) fn notice_key(agent_id: &str, name: &str) -> String {
    format!("{}{NOTICE_KEYS}{name}", agent_prefix(agent_id))
}

/// Where an agent's demotion notices live under its prefix.
pub(super) const NOTICE_KEYS: &str = "demotion-notice/";

/// The demotion notices left for the agent whose records are under `prefix`: (tool name,
/// audit entry).
pub(super) async fn load_notices(store: &dyn Store, prefix: &str) -> Result<Vec<(String, AuditEntry)>, RegistryError> {
    let keys = format!("{prefix}{NOTICE_KEYS}");
    let mut notices = vec![];
    for (key, value) in store.scan(&keys).await? {
        let Some(name) = key.strip_prefix(&keys) else { continue };
        notices.push((name.to_string(), unversioned(&key, "demotion-notice", value)?));
    }
    Ok(notices)
}
