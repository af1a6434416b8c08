//! The registry's records in the store: the versioned envelope every value is written in, the
//! keys of each tier's records, and reading a tier back.

use std::collections::{BTreeMap, HashMap};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::store::{BatchOp, Store, Versioned};

use super::{Entry, PendingApproval, Registry, RegistryError, Tier, ToolRecord, ToolStats, ToolStatus};

/// Schema version of every registry record this build writes (and the newest it reads).
const RECORD_VERSION: u32 = 1;

pub(super) fn versioned<T: Serialize>(kind: &str, data: &T) -> Value {
    serde_json::to_value(Versioned { kind: kind.to_string(), v: RECORD_VERSION, data }).unwrap_or(Value::Null)
}

/// The data of a registry record of `kind`. A record of another kind, or one written by a
/// newer build (which this build would read with its older schema and write back without the
/// fields it does not know), is refused as corrupt rather than read half-right. The envelope
/// is checked before the data is read: a newer build's data may have changed shape, and a
/// serde error about it would hide that the runtime is what is out of date.
pub(super) fn unversioned<T: DeserializeOwned>(key: &str, kind: &str, value: Value) -> Result<T, RegistryError> {
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
    pub(super) fn prefix(&self, tier: Tier) -> String {
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
}

/// Where the records of agent `agent_id` live.
pub(super) fn agent_prefix(agent_id: &str) -> String {
    format!("agent/{agent_id}/")
}

/// The key of tool `name`'s record in the tier stored under `prefix`.
pub(super) fn tool_key_under(prefix: &str, name: &str) -> String {
    format!("{prefix}tool/{name}")
}

/// The key of tool `name`'s stats in the tier stored under `prefix`.
fn stats_key_under(prefix: &str, name: &str) -> String {
    format!("{prefix}stats/{name}")
}

/// Ops writing `entry` (record and stats) under `prefix` (the agent tier of some agent).
pub(super) fn entry_ops_under(prefix: &str, entry: &Entry) -> Vec<BatchOp> {
    vec![record_op(prefix, entry), BatchOp::Put { key: stats_key_under(prefix, &entry.record.name), value: versioned("stats", &entry.stats) }]
}

/// The op writing `entry`'s tool record under `prefix`.
fn record_op(prefix: &str, entry: &Entry) -> BatchOp {
    BatchOp::Put { key: tool_key_under(prefix, &entry.record.name), value: versioned("tool", &entry.record) }
}

/// Reads one persisted tier (`agent/<id>/` or `shared/`): its tool records with their stats.
pub(super) async fn load_tier(store: &dyn Store, prefix: &str) -> Result<BTreeMap<String, Entry>, RegistryError> {
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
