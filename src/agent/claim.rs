//! One resume of a run at a time, and never twice from the same point. Resuming a paused run
//! executes its approved calls; two resumes of the same state (two tabs, two calls, a state
//! object kept after its run went on) would execute them twice.
//!
//! Three guards, from narrow to wide:
//! - in this context (one wasm instance: a page, a worker, a Node process), a run being resumed
//!   cannot be resumed again until that resume ends;
//! - in this context, a paused state that was resumed once cannot be resumed again (its
//!   approved calls ran);
//! - across contexts, the agent's store lock `run:<agentId>/<runId>` is held for the whole
//!   resume (IndexedDB: Web Locks, so tabs take turns), and the state is read under it: the
//!   second resume finds the run moved on (a later state, or deleted because it completed).

use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};

use super::{AgentError, RunState};
use crate::store::{Store, StoreLock};

/// Resumed states remembered per context (their run ids and positions); older ones are
/// forgotten first. The store's check does not depend on it.
const RESUMED_KEPT: usize = 4096;

thread_local! {
    static RESUMING: RefCell<HashSet<String>> = RefCell::new(HashSet::new());
    static RESUMED: RefCell<VecDeque<(String, RunPosition)>> = const { RefCell::new(VecDeque::new()) };
}

/// How far a run has got: a resumed run always moves past the position it was resumed from.
/// Running a paused step's approved calls changes no counter, only `paused`: without it, the
/// state saved after them would pass for the paused one, and a kept paused state would run
/// them again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunPosition {
    turns: u32,
    steps: u32,
    output_retries: u32,
    paused: bool,
}

impl RunPosition {
    pub(crate) fn of(state: &RunState) -> Self {
        Self { turns: state.turns, steps: state.steps, output_retries: state.output_retries, paused: state.pending.is_some() }
    }
}

/// The right to resume one run, held until dropped.
pub(crate) struct ResumeClaim {
    run_id: String,
    _store_lock: Option<StoreLock>,
}

impl ResumeClaim {
    /// Claims `run_id` in this context, then (when there is a store) under the store's lock
    /// `lock_name`, waiting for a resume of it in another context to end.
    pub(crate) async fn take(run_id: &str, store: Option<&dyn Store>, lock_name: &str) -> Result<Self, AgentError> {
        if !RESUMING.with(|r| r.borrow_mut().insert(run_id.to_string())) {
            return Err(AgentError::InvalidResume(format!("run `{run_id}` is already being resumed")));
        }
        let mut claim = Self { run_id: run_id.to_string(), _store_lock: None };
        if let Some(store) = store {
            claim._store_lock = store.lock(lock_name).await.map_err(AgentError::Store)?;
        }
        Ok(claim)
    }

    /// Refuses `state` if it was resumed before in this context, and remembers it as resumed,
    /// when it waits on approvals: resuming it runs the approved calls, which must not run
    /// twice. A run interrupted between steps runs nothing on resume before its next save, so
    /// a resume that failed at once (the model still down) can be retried from the same state.
    pub(crate) fn consume(&self, state: &RunState) -> Result<(), AgentError> {
        if state.pending.is_none() {
            return Ok(());
        }
        let position = RunPosition::of(state);
        RESUMED.with(|r| {
            let mut resumed = r.borrow_mut();
            if resumed.iter().any(|(id, p)| *id == self.run_id && *p == position) {
                return Err(AgentError::InvalidResume(format!("run `{}` was already resumed from this state", self.run_id)));
            }
            if resumed.len() >= RESUMED_KEPT {
                resumed.pop_front();
            }
            resumed.push_back((self.run_id.clone(), position));
            Ok(())
        })
    }
}

impl ResumeClaim {
    /// Takes back [`ResumeClaim::consume`] of `state` when the resume failed (`error`) with a
    /// store: the store may still hold `state` (the save after the approved calls failed, or was
    /// abandoned by an abort), and resuming it from the store runs them again, at least once as
    /// a crash there would. Refusing that resume here alone, while another process takes it, is
    /// no guard; the store's own check stays one (a later state saved after all refuses it).
    /// Without a store this context's memory is the only guard, and the state stays consumed.
    pub(crate) fn unconsume_after_failure(&self, state_position: RunPosition, has_store: bool) {
        if !has_store {
            return;
        }
        RESUMED.with(|r| r.borrow_mut().retain(|(id, p)| !(*id == self.run_id && *p == state_position)));
    }
}

/// Whether a run or resume in this context holds `run_id`'s claim: the run is going.
pub(crate) fn claimed_here(run_id: &str) -> bool {
    RESUMING.with(|r| r.borrow().contains(run_id))
}

impl Drop for ResumeClaim {
    fn drop(&mut self) {
        RESUMING.with(|r| r.borrow_mut().remove(&self.run_id));
    }
}
