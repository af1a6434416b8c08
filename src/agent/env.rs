//! The effects the loop needs besides the model and tools: a clock, run ids, cancellation.
//! Behind traits so the core stays host-agnostic (DESIGN decision 1).

use std::cell::Cell;

/// Clock and id source.
pub trait Environment {
    /// Milliseconds on a monotonic clock (only differences are used).
    fn now_ms(&self) -> f64;
    /// A fresh id, unique within this process, starting with `prefix`.
    fn new_id(&self, prefix: &str) -> String;
}

/// Cancellation as seen by the loop: checked between model turns and before tool dispatch.
/// (The in-flight fetch is aborted by the host's `AbortSignal` directly.)
pub trait CancelSignal {
    fn is_cancelled(&self) -> bool;
}

/// A cancel flag set by the owner (native callers and tests).
#[derive(Debug, Default)]
pub struct CancelFlag(Cell<bool>);

impl CancelFlag {
    pub fn cancel(&self) {
        self.0.set(true);
    }
}

impl CancelSignal for CancelFlag {
    fn is_cancelled(&self) -> bool {
        self.0.get()
    }
}

/// Native environment: `std::time::Instant` and a counter.
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
        self.start.elapsed().as_secs_f64() * 1000.0
    }

    fn new_id(&self, prefix: &str) -> String {
        self.counter.set(self.counter.get() + 1);
        format!("{prefix}_{}", self.counter.get())
    }
}
