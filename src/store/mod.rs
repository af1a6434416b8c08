//! Persistence boundary (DESIGN decision 7): the [`Store`] trait and the in-memory store.
//!
//! Keys are ordered strings, values plain JSON. Every record the core writes is a
//! [`Versioned`] envelope so later releases can migrate old records. The wasm layer adapts the
//! TS stores (`indexedDbStore`, `nodeStore`, `memoryStore`) to this trait.

use std::cell::RefCell;
use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Whether `id` can name an agent's records (`agent/<id>/…`): 1 to 128 characters, none of
/// them `/`. With a `/`, agent `a`'s prefix scans would pick up the records of agent `a/tool`.
pub fn is_valid_agent_id(id: &str) -> bool {
    !id.is_empty() && id.chars().count() <= 128 && !id.contains('/')
}

/// A store operation failed. `code` mirrors the TS `StoreError` codes.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct StoreError {
    /// `store_error`, `store_quota`, `store_blocked`, or `store_corrupt` for unreadable records.
    pub code: String,
    pub message: String,
}

impl StoreError {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { code: code.into(), message: message.into() }
    }
}

/// One operation of an atomic batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum BatchOp {
    Put { key: String, value: Value },
    Delete { key: String },
}

/// Ordered key-value persistence. `batch` is all-or-nothing.
#[async_trait(?Send)]
pub trait Store {
    async fn get(&self, key: &str) -> Result<Option<Value>, StoreError>;
    async fn put(&self, key: &str, value: Value) -> Result<(), StoreError>;
    async fn delete(&self, key: &str) -> Result<(), StoreError>;
    /// Every entry whose key starts with `prefix`, in key order.
    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Value)>, StoreError>;
    async fn batch(&self, ops: Vec<BatchOp>) -> Result<(), StoreError>;

    /// Holds the lock `name` on this store's data until the returned guard is dropped: agents
    /// on the same data in other contexts (browser tabs) wait for it. `None` when the store has
    /// no such locks; the agents of one context already take turns inside the core.
    async fn lock(&self, _name: &str) -> Result<Option<StoreLock>, StoreError> {
        Ok(None)
    }

    /// Whether a holder (in any context) has the lock `name` right now, as far as this store
    /// can tell, without waiting for it or keeping it: how an agent tells a run another tab is
    /// driving from one that stopped (a run holds `run:<agentId>/<runId>` while it goes).
    /// `false` when the store has no such locks.
    async fn lock_held(&self, _name: &str) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// Names the data behind this handle within this context: handles on the same data (the
    /// agents given one store) answer the same, so the turns the core keeps per store are
    /// shared by them and by no one else. The default, 0, is one key for every store that
    /// does not say (they all take turns together, which is safe if slower); a wrapper around
    /// another store answers with the inner store's key.
    fn data_key(&self) -> usize {
        0
    }
}

/// A held [`Store::lock`]; dropping it releases the lock.
pub struct StoreLock(crate::guard::OnDrop);

impl StoreLock {
    /// A lock that `release` gives back.
    pub fn new(release: impl FnOnce() + 'static) -> Self {
        Self(crate::guard::OnDrop::new(release))
    }
}

impl std::fmt::Debug for StoreLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreLock").field("held", &self.0.armed()).finish()
    }
}

/// The envelope of every record the core persists: kind, schema version, payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Versioned<T> {
    /// Record kind, e.g. `tool`, `run`, `approval`, `audit`.
    pub kind: String,
    /// Schema version of `data` for this kind.
    pub v: u32,
    pub data: T,
}

/// Process-local store: the default when none is configured, and the native test store.
#[derive(Debug, Default)]
pub struct MemoryStore {
    entries: RefCell<BTreeMap<String, Value>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of entries (for tests and diagnostics).
    pub fn len(&self) -> usize {
        self.entries.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.borrow().is_empty()
    }
}

#[async_trait(?Send)]
impl Store for MemoryStore {
    async fn get(&self, key: &str) -> Result<Option<Value>, StoreError> {
        Ok(self.entries.borrow().get(key).cloned())
    }

    /// Its data is its own: the address names it.
    fn data_key(&self) -> usize {
        self as *const Self as usize
    }

    async fn put(&self, key: &str, value: Value) -> Result<(), StoreError> {
        self.entries.borrow_mut().insert(key.to_string(), value);
        Ok(())
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.entries.borrow_mut().remove(key);
        Ok(())
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Value)>, StoreError> {
        Ok(self.entries.borrow().range(prefix.to_string()..).take_while(|(k, _)| k.starts_with(prefix)).map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    async fn batch(&self, ops: Vec<BatchOp>) -> Result<(), StoreError> {
        let mut entries = self.entries.borrow_mut();
        for op in ops {
            match op {
                BatchOp::Put { key, value } => {
                    entries.insert(key, value);
                }
                BatchOp::Delete { key } => {
                    entries.remove(&key);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;
    use serde_json::json;

    #[test]
    fn scan_returns_only_the_prefix_in_key_order() {
        let s = MemoryStore::new();
        block_on(async {
            s.put("a/2", json!(2)).await.unwrap();
            s.put("a/1", json!(1)).await.unwrap();
            s.put("b/1", json!(3)).await.unwrap();
            let got = s.scan("a/").await.unwrap();
            assert_eq!(got, vec![("a/1".to_string(), json!(1)), ("a/2".to_string(), json!(2))]);
        });
    }

    #[test]
    fn batch_applies_puts_and_deletes() {
        let s = MemoryStore::new();
        block_on(async {
            s.put("k", json!(1)).await.unwrap();
            s.batch(vec![BatchOp::Delete { key: "k".into() }, BatchOp::Put { key: "j".into(), value: json!(2) }]).await.unwrap();
            assert_eq!(s.get("k").await.unwrap(), None);
            assert_eq!(s.get("j").await.unwrap(), Some(json!(2)));
        });
    }
}
