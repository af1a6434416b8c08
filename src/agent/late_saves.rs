//! Saves of run states that an abort left in the store's hands.
//!
//! An abort ends a run at once, also while its state is being saved: a store that never
//! answers must not hold a stopped run (nor `close()`, which waits for its runs). The write
//! itself cannot be called back, though, and lands when the store gets to it. A
//! `discard_run` made right after the abort read no state then and deleted nothing, and the
//! late write brought the run back for good (20 of 20 stopped runs, with a store taking
//! 30 ms a write); a resume read the step before. Reads of a run's state wait for its late
//! save first.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use futures::future::{LocalBoxFuture, Shared};

use crate::store::StoreError;

use super::env::Environment;

/// A save as the run awaits it, and as whoever reads the run's state next may await it too.
pub(crate) type SaveWrite = Shared<LocalBoxFuture<'static, Result<(), StoreError>>>;

/// The late saves of an agent's runs, by run id.
#[derive(Default)]
pub(crate) struct LateSaves(RefCell<HashMap<String, SaveWrite>>);

impl LateSaves {
    /// Keeps `write`, which an abort left unsettled, until it settles: driven to its end in the
    /// background where `env` can spawn, else by the next read of the run that waits for it.
    pub(crate) fn leave(self: &Rc<Self>, run_id: &str, write: SaveWrite, env: &dyn Environment) {
        self.0.borrow_mut().insert(run_id.to_string(), write.clone());
        let me = Rc::downgrade(self);
        let run_id = run_id.to_string();
        let settle = Box::pin(async move {
            let _ = write.clone().await;
            if let Some(me) = me.upgrade() {
                me.forget(&run_id, &write);
            }
        });
        // Unspawned, the entry stays for the next read of the run (it holds no state: the
        // write took its value when it started).
        let _ = env.spawn_local(settle);
    }

    /// Waits for the late save of `run_id`, if there is one (its failure is the store's, and
    /// the read that follows meets the store as it is).
    pub(crate) async fn wait_for(&self, run_id: &str) {
        let write = self.0.borrow().get(run_id).cloned();
        if let Some(write) = write {
            let _ = write.clone().await;
            self.forget(run_id, &write);
        }
    }

    /// Waits for every late save.
    pub(crate) async fn wait_for_all(&self) {
        let writes: Vec<(String, SaveWrite)> = self.0.borrow().iter().map(|(id, w)| (id.clone(), w.clone())).collect();
        for (run_id, write) in writes {
            let _ = write.clone().await;
            self.forget(&run_id, &write);
        }
    }

    /// Drops the entry of `run_id` if it is still `write` (a later save of a resumed run may
    /// have taken its place).
    fn forget(&self, run_id: &str, write: &SaveWrite) {
        let mut saves = self.0.borrow_mut();
        if saves.get(run_id).is_some_and(|kept| kept.ptr_eq(write)) {
            saves.remove(run_id);
        }
    }
}

impl std::fmt::Debug for LateSaves {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LateSaves").field("runs", &self.0.borrow().len()).finish()
    }
}
