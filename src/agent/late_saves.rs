//! Saves of run states that an abort left in the store's hands.
//!
//! An abort ends a run at once, also while its state is being saved: a store that never
//! answers must not hold a stopped run (nor `close()`, which waits for its runs). The write
//! itself cannot be called back, though, and lands when the store gets to it. A
//! `discard_run` made right after the abort read no state then and deleted nothing, and the
//! late write brought the run back for good (20 of 20 stopped runs, with a store taking
//! 30 ms a write); a resume read the step before.
//!
//! So a late save is kept until it settles. A resume waits for it (as long as its own signal
//! lets it: it would otherwise resume from the step before, and the late write would then
//! replace what the resumed run saves). A discard does not wait, since one write that never
//! settles must not hold every later discard: it marks the save, and the save deletes the
//! state it wrote once it lands.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use futures::future::{LocalBoxFuture, Shared};

use crate::store::{BatchOp, Store, StoreError};

use super::env::Environment;

/// A save as the run awaits it, and as a resume of the run may await it too.
pub(crate) type SaveWrite = Shared<LocalBoxFuture<'static, Result<(), StoreError>>>;

#[derive(Clone)]
struct LateSave {
    write: SaveWrite,
    /// The run was discarded while this save was out: what it writes is deleted once it lands.
    discarded: Rc<Cell<bool>>,
    store: Rc<dyn Store>,
    /// The run's records, all deleted when it was discarded.
    keys: [String; 2],
}

impl LateSave {
    /// Waits for the write to land, then deletes what it wrote if the run was discarded
    /// meanwhile (best effort, as the discard itself: a failure leaves the run listed, as a
    /// failed delete does).
    async fn settled(&self) {
        if self.write.clone().await.is_ok() && self.discarded.get() {
            let _ = self.store.batch(self.keys.iter().map(|key| BatchOp::Delete { key: key.clone() }).collect()).await;
        }
    }
}

/// The late saves of an agent's runs, by run id.
#[derive(Default)]
pub(crate) struct LateSaves(RefCell<HashMap<String, LateSave>>);

impl LateSaves {
    /// Keeps `write` of the run's records at `keys` in `store`, which an abort left unsettled, until it
    /// settles: followed in the background where `env` can spawn. Where it cannot (native
    /// callers), nothing polls the write unless a resume waits for it, and a discarded one is
    /// never written.
    pub(crate) fn leave(self: &Rc<Self>, run_id: &str, write: SaveWrite, store: Rc<dyn Store>, keys: [String; 2], env: &dyn Environment) {
        let late = LateSave { write, discarded: Rc::default(), store, keys };
        self.0.borrow_mut().insert(run_id.to_string(), late.clone());
        let me = Rc::downgrade(self);
        let run_id = run_id.to_string();
        let settle = Box::pin(async move {
            late.settled().await;
            if let Some(me) = me.upgrade() {
                me.forget(&run_id, &late.write);
            }
        });
        let _ = env.spawn_local(settle);
    }

    /// Waits for the late save of `run_id`, if there is one (its failure is the store's, and
    /// the read that follows meets the store as it is).
    pub(crate) async fn wait_for(&self, run_id: &str) {
        let late = self.0.borrow().get(run_id).cloned();
        if let Some(late) = late {
            late.settled().await;
            self.forget(run_id, &late.write);
        }
    }

    /// Marks the late save of `run_id`, if there is one, to delete what it writes once it
    /// lands; `true` when there was one.
    pub(crate) fn discard(&self, run_id: &str) -> bool {
        self.0.borrow().get(run_id).map(|late| late.discarded.set(true)).is_some()
    }

    /// Drops the entry of `run_id` if it is still `write` (a later save of a resumed run may
    /// have taken its place).
    fn forget(&self, run_id: &str, write: &SaveWrite) {
        let mut saves = self.0.borrow_mut();
        if saves.get(run_id).is_some_and(|kept| kept.write.ptr_eq(write)) {
            saves.remove(run_id);
        }
    }
}

impl std::fmt::Debug for LateSaves {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LateSaves").field("runs", &self.0.borrow().len()).finish()
    }
}
