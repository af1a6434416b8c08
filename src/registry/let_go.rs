//! What a registry's store operations do once its agent is let go (freed, after `close()` gave
//! up waiting for a store that did not answer): they end as `closed` instead of waiting on.
//!
//! The futures of an operation still in flight outlive the agent (the host's promise holds
//! them), and with them the turns they hold: the shared-tier and shared-stats turns are kept
//! per store's data, so an approval whose write the store never answers would hold up every
//! later approval, demotion, rollback and shared-stats flush of every agent on that store,
//! the agent reopened with the same id among them. Ended, the operation drops its turns. What
//! it had handed to the store may still land (as `close()` says), but nobody waits for it.

use std::future::Future;
use std::rc::Rc;
use std::task::Poll;

use async_trait::async_trait;
use serde_json::Value;

use crate::agent::{CancelFlag, CancelSignal};
use crate::store::{BatchOp, Store, StoreError, StoreLock};

/// The registry's store: the agent's store, each operation ending as `closed` once the agent
/// is let go.
pub(super) struct UntilLetGo {
    store: Rc<dyn Store>,
    /// Set when the agent is let go.
    let_go: Rc<CancelFlag>,
}

impl UntilLetGo {
    pub(super) fn new(store: Rc<dyn Store>, let_go: Rc<CancelFlag>) -> Self {
        Self { store, let_go }
    }

    async fn or_let_go<T>(&self, operation: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        if self.let_go.is_cancelled() {
            return Err(let_go_error());
        }
        let mut operation = std::pin::pin!(operation);
        // The wait for the let-go is made only once the operation is pending: an in-memory
        // store answers at the first poll, and setting up the race for every operation cost a
        // forge ~10-20 µs in the bench.
        let mut let_go = None;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(done) = operation.as_mut().poll(cx) {
                return Poll::Ready(done);
            }
            let gone = let_go.get_or_insert_with(|| self.let_go.cancelled());
            match gone.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(let_go_error())),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }
}

fn let_go_error() -> StoreError {
    StoreError::new("closed", "the agent was closed while this waited for its store; a write it had begun may still land")
}

#[async_trait(?Send)]
impl Store for UntilLetGo {
    async fn get(&self, key: &str) -> Result<Option<Value>, StoreError> {
        self.or_let_go(self.store.get(key)).await
    }

    async fn put(&self, key: &str, value: Value) -> Result<(), StoreError> {
        self.or_let_go(self.store.put(key, value)).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.or_let_go(self.store.delete(key)).await
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Value)>, StoreError> {
        self.or_let_go(self.store.scan(prefix)).await
    }

    async fn batch(&self, ops: Vec<BatchOp>) -> Result<(), StoreError> {
        self.or_let_go(self.store.batch(ops)).await
    }

    async fn lock(&self, name: &str) -> Result<Option<StoreLock>, StoreError> {
        self.or_let_go(self.store.lock(name)).await
    }

    async fn lock_held(&self, name: &str) -> Result<bool, StoreError> {
        self.or_let_go(self.store.lock_held(name)).await
    }

    fn data_key(&self) -> usize {
        self.store.data_key()
    }
}
