//! Work the registry does after the call that started it returned: the automatic promotion of
//! a session tool that reached `promotionThreshold.uses`. Its review (tests re-run, two-reviewer
//! panel) may take the judge's deadline twice over; the call's caller gets the result at once,
//! and the review goes on on the host's executor ([`Environment::spawn_local`]).
//!
//! Background work is not the triggering call's: a run that ends normally leaves it going; only
//! [`Registry::stop_background`] (the agent closing) aborts it, recording nothing. Its judge's
//! requests and its tests' host tools carry the registry's background run id, which the host
//! maps to a signal its close aborts. [`Registry::settled`] waits for it.
//!
//! [`Environment::spawn_local`]: crate::agent::Environment::spawn_local

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::task::{Poll, Waker};

use crate::agent::{CancelFlag, CancelSignal};

use super::{Registry, RegistryError, Tier};

/// The registry's background work: what is in flight, and the stop that aborts it.
#[derive(Debug, Default)]
pub(crate) struct Background {
    /// Set by [`Registry::stop_background`]: work in flight ends aborted, and none starts.
    stop: CancelFlag,
    /// The run id background work's judge requests and host tool calls carry.
    run_id: RefCell<String>,
    /// Automatic promotions spawned and not finished, as (session, name): one per tool, from
    /// the call that spawned it until it ended (its review's own marker is set only once the
    /// task first runs, and a call finishing meanwhile must not spawn a second).
    promoting: RefCell<BTreeSet<(String, String)>>,
    /// Waiting in [`Registry::settled`].
    idle: RefCell<Vec<Waker>>,
}

impl Background {
    pub(crate) fn is_promoting(&self, session: &str, name: &str) -> bool {
        self.promoting.borrow().iter().any(|(s, n)| s == session && n == name)
    }
}

/// Marks one background promotion in flight; dropping it (the task ended, or was dropped
/// unspawned or unfinished) clears the mark and wakes [`Registry::settled`].
struct InFlight {
    background: Rc<Background>,
    key: (String, String),
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut promoting = self.background.promoting.borrow_mut();
        promoting.remove(&self.key);
        if promoting.is_empty() {
            drop(promoting);
            for waker in self.background.idle.take() {
                waker.wake();
            }
        }
    }
}

impl Registry {
    /// The run id background work's judge requests and its tests' host tool calls carry (none
    /// by default): the host maps it to the signal that stops that work with the agent.
    pub fn set_background_run_id(&self, run_id: &str) {
        *self.background.run_id.borrow_mut() = run_id.to_string();
    }

    /// Aborts the background work in flight (an automatic promotion under review records
    /// nothing; one whose panel already approved commits) and starts none from now on.
    /// [`Registry::close`] does it too; call it first to wait for the work to end with
    /// [`Registry::settled`] while the store still takes writes.
    pub fn stop_background(&self) {
        self.background.stop.cancel();
    }

    /// Completes once no background work is in flight (at once when none is).
    pub async fn settled(&self) {
        std::future::poll_fn(|cx| {
            if self.background.promoting.borrow().is_empty() {
                return Poll::Ready(());
            }
            let mut idle = self.background.idle.borrow_mut();
            if !idle.iter().any(|w| w.will_wake(cx.waker())) {
                idle.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }

    /// Promotes the session tool `name` to the agent tier by itself (it just became due): in
    /// the background when the environment can spawn, else here, as the call's own work (under
    /// `calls_run_id`, so stopping the call's run aborts the judge's request too).
    pub(crate) async fn promote_automatically(&self, name: &str, session: &str, calls_run_id: &str) {
        let Some(registry) = self.me.upgrade() else { return };
        if self.background.stop.is_cancelled() {
            return;
        }
        let key = (session.to_string(), name.to_string());
        self.background.promoting.borrow_mut().insert(key.clone());
        let in_flight = InFlight { background: self.background.clone(), key };
        let task = Box::pin(async move {
            let (session, name) = in_flight.key.clone();
            let run_id = registry.background.run_id.borrow().clone();
            let stop: &dyn CancelSignal = &registry.background.stop;
            registry.auto_promotion(&name, &session, Some(stop), &run_id).await;
            drop(in_flight);
        });
        if let Err(unspawned) = self.env().spawn_local(task) {
            // Dropped unpolled: its mark goes with it.
            drop(unspawned);
            self.auto_promotion(name, session, None, calls_run_id).await;
        }
    }

    /// One automatic promotion; its outcome is in the events and the audit trail.
    async fn auto_promotion(&self, name: &str, session: &str, cancel: Option<&dyn CancelSignal>, calls_run_id: &str) {
        // The version the review takes up (it reads the tool before its first await).
        let version = self.state.borrow().entry(Tier::Session, session, name).map(|e| e.record.current.version);
        let promoted = self.request_promotion_cancellable(name, Tier::Agent, session, cancel, calls_run_id).await;
        // Not recorded because the store failed: held off like a rejection, so a failing store
        // does not bring the tests and the panel back on every use. An abort records nothing,
        // and a closed agent tells nothing more.
        let Err(error) = promoted else { return };
        if matches!(error, RegistryError::Aborted(_) | RegistryError::Closed) {
            return;
        }
        self.hold_off_promotion(&mut self.state.borrow_mut(), name, session, false);
        // Nobody awaits this promotion: a store's error returned would be told nowhere, so it is
        // announced, and audited (the trail is the promotions' provenance record; a store that
        // takes writes again gets the entry with its next write). A tool gone before the review
        // began, with its session, has nothing to tell.
        if let (RegistryError::Store(error), Some(version)) = (error, version) {
            let reason = format!("it could not be recorded: {error}");
            let _ = self.refuse_promotion(name, version, session, reason, vec![]).await;
        }
    }
}
