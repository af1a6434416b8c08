//! The effects the loop needs besides the model and tools: a clock, run ids, cancellation,
//! background tasks. Behind traits so the core stays host-agnostic (DESIGN decision 1).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Poll, Waker};

/// Work handed to [`Environment::spawn_local`]: local (not `Send`), as the whole core is.
pub type LocalTask = Pin<Box<dyn Future<Output = ()>>>;

/// Clocks, id source and background executor.
pub trait Environment {
    /// Wall-clock milliseconds since the Unix epoch: the timestamps users read and stores keep
    /// (`requestedAt`, audit entries), which must mean the same after a restart.
    fn now_ms(&self) -> f64;
    /// Milliseconds on a monotonic clock with sub-millisecond resolution where the host has
    /// one; only differences mean anything. Durations (test results, tool latency stats) are
    /// measured on it: a wall clock moves with clock adjustments, and `Date.now()`'s whole
    /// milliseconds measured a 50 µs tool call as 0 or 1 ms. Defaults to [`Self::now_ms`].
    fn elapsed_ms(&self) -> f64 {
        self.now_ms()
    }
    /// A fresh id, unique within this process, starting with `prefix`.
    fn new_id(&self, prefix: &str) -> String;
    /// Runs `task` in the background, on the host's executor, so its caller can return first
    /// (an automatic promotion outlives the tool call that started it). An environment with no
    /// executor hands `task` back unpolled (the default): the caller then does the work itself.
    fn spawn_local(&self, task: LocalTask) -> Result<(), LocalTask> {
        Err(task)
    }
}

/// Cancellation as seen by the loop: checked between model turns and before tool dispatch,
/// and awaited beside the calls of a step, which are abandoned when it fires (a tool that
/// ignores its signal, or forge tests running to their sandbox deadline, must not hold a
/// stopped run). The in-flight fetch is aborted by the host's `AbortSignal` directly.
pub trait CancelSignal {
    fn is_cancelled(&self) -> bool;
    /// Completes once cancelled.
    fn cancelled(&self) -> Pin<Box<dyn Future<Output = ()> + '_>>;
}

/// `work`'s output, or `None` when `cancel` fires first: then `work` is dropped where it is.
/// Work that finishes in the same poll as the cancel wins.
pub async fn unless_cancelled<T>(cancel: Option<&dyn CancelSignal>, work: impl Future<Output = T>) -> Option<T> {
    let Some(cancel) = cancel else { return Some(work.await) };
    let work = std::pin::pin!(work);
    let first = futures::future::select(work, cancel.cancelled()).await;
    match first {
        futures::future::Either::Left((out, _)) => Some(out),
        futures::future::Either::Right(_) => None,
    }
}

/// A cancel flag set by the owner (native callers and tests; the registry's let-go signal,
/// which lives as long as its agent).
#[derive(Debug, Default)]
pub struct CancelFlag {
    set: Cell<bool>,
    /// The wakers of the waits still pending, by key: a wait removes its own when dropped, so a
    /// flag that outlives many waits (the registry's, one per store operation) keeps none of
    /// theirs.
    waiting: RefCell<std::collections::BTreeMap<u64, Waker>>,
    next_key: Cell<u64>,
}

impl CancelFlag {
    pub fn cancel(&self) {
        self.set.set(true);
        for waker in self.waiting.take().into_values() {
            waker.wake();
        }
    }

    /// How many waits are pending (for tests).
    pub fn waiting(&self) -> usize {
        self.waiting.borrow().len()
    }
}

/// One wait for a [`CancelFlag`]; its waker leaves the flag when it is dropped.
struct Cancelled<'a> {
    flag: &'a CancelFlag,
    key: Option<u64>,
}

impl Future for Cancelled<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        if self.flag.set.get() {
            return Poll::Ready(());
        }
        let flag = self.flag;
        let key = *self.key.get_or_insert_with(|| {
            let key = flag.next_key.get();
            flag.next_key.set(key.wrapping_add(1));
            key
        });
        flag.waiting.borrow_mut().insert(key, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Cancelled<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            self.flag.waiting.borrow_mut().remove(&key);
        }
    }
}

impl CancelSignal for CancelFlag {
    fn is_cancelled(&self) -> bool {
        self.set.get()
    }

    fn cancelled(&self) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(Cancelled { flag: self, key: None })
    }
}

/// Native environment: the system clock, `std::time::Instant` for durations, and a counter.
#[derive(Debug)]
pub struct NativeEnvironment {
    start: std::time::Instant,
    counter: Cell<u64>,
}

impl Default for NativeEnvironment {
    fn default() -> Self {
        Self { start: std::time::Instant::now(), counter: Cell::new(0) }
    }
}

impl Environment for NativeEnvironment {
    fn now_ms(&self) -> f64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    }

    fn elapsed_ms(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1000.0
    }

    fn new_id(&self, prefix: &str) -> String {
        self.counter.set(self.counter.get() + 1);
        format!("{prefix}_{}", self.counter.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn a_flag_keeps_no_waker_of_a_wait_that_ended_and_wakes_those_still_pending() {
        let flag = CancelFlag::default();
        // A registry's flag sees one wait per store operation that did not answer at once.
        for _ in 0..1_000 {
            let mut wait = flag.cancelled();
            assert!(wait.as_mut().now_or_never().is_none());
        }
        assert_eq!(flag.waiting(), 0, "each wait took its waker with it");
        let mut pending = flag.cancelled();
        assert!(pending.as_mut().now_or_never().is_none());
        assert_eq!(flag.waiting(), 1);
        flag.cancel();
        assert_eq!(pending.as_mut().now_or_never(), Some(()));
        assert_eq!(flag.waiting(), 0);
    }
}
