//! The job executor: promise jobs run FIFO under a job budget and the execution deadline; host
//! futures (bridged `fetch`) are truly awaited when no promise job is left, instead of spinning
//! like Boa's `SimpleJobExecutor` does in wasm. Timers and FinalizationRegistry jobs are never
//! accepted (those globals do not exist here). Queues are cleared between executions, so nothing
//! a previous execution scheduled can run later.

use std::{
    cell::{Cell, RefCell},
    collections::VecDeque,
    future::Future,
    pin::Pin,
    rc::Rc,
    task::Poll,
};

use boa_engine::{
    builtins::promise::PromiseState,
    job::{Job, JobExecutor, NativeAsyncJob, PromiseJob},
    object::builtins::JsPromise,
    Context, JsError, JsResult, JsValue,
};

use super::clock::now_ms;

/// Why driving the jobs stopped early.
#[derive(Debug)]
pub(crate) enum Stop {
    /// More promise jobs ran than the budget allows (promise flood, `for(;;) await 0`).
    Budget(u64),
    /// The wall-clock deadline passed between jobs.
    Deadline,
    /// The promise can never settle: no job and no host future is left.
    Stalled,
    /// An uncatchable error (e.g. a runtime limit) escaped a job.
    Error(JsError),
}

#[derive(Default)]
pub(crate) struct GuardedExecutor {
    promise_jobs: RefCell<VecDeque<PromiseJob>>,
    async_jobs: RefCell<VecDeque<NativeAsyncJob>>,
    rejected_jobs: Cell<u64>,
}

impl std::fmt::Debug for GuardedExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedExecutor").finish_non_exhaustive()
    }
}

impl GuardedExecutor {
    /// Drops every queued job (called before and after each execution).
    pub(crate) fn clear(&self) {
        self.promise_jobs.borrow_mut().clear();
        self.async_jobs.borrow_mut().clear();
    }

    /// Runs jobs until `promise` settles, the budget or deadline is exhausted, or nothing is
    /// left that could settle it.
    pub(crate) async fn drive(&self, promise: &JsPromise, context: &mut Context, max_jobs: u64, deadline_ms: f64) -> Result<(), Stop> {
        let cell = RefCell::new(context);
        let mut pending: Vec<Pin<Box<dyn Future<Output = JsResult<JsValue>> + '_>>> = Vec::new();
        let mut ran = 0u64;
        loop {
            loop {
                if !matches!(promise.state(), PromiseState::Pending) {
                    return Ok(());
                }
                let job = self.promise_jobs.borrow_mut().pop_front();
                let Some(job) = job else { break };
                ran += 1;
                if ran > max_jobs {
                    return Err(Stop::Budget(max_jobs));
                }
                if ran % 64 == 0 && now_ms() > deadline_ms {
                    return Err(Stop::Deadline);
                }
                job.call(&mut cell.borrow_mut()).map_err(Stop::Error)?;
            }
            let new_async: Vec<NativeAsyncJob> = self.async_jobs.borrow_mut().drain(..).collect();
            for job in new_async {
                pending.push(Box::pin(job.call(&cell)));
            }
            if !matches!(promise.state(), PromiseState::Pending) {
                return Ok(());
            }
            if pending.is_empty() {
                if self.promise_jobs.borrow().is_empty() {
                    return Err(Stop::Stalled);
                }
                continue;
            }
            if now_ms() > deadline_ms {
                return Err(Stop::Deadline);
            }
            // Await until at least one host future completes.
            let mut errors = Vec::new();
            std::future::poll_fn(|cx| {
                let before = pending.len();
                pending.retain_mut(|f| match f.as_mut().poll(cx) {
                    Poll::Ready(Ok(_)) => false,
                    Poll::Ready(Err(e)) => {
                        errors.push(e);
                        false
                    }
                    Poll::Pending => true,
                });
                if pending.len() < before {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
            if let Some(e) = errors.into_iter().next() {
                return Err(Stop::Error(e));
            }
        }
    }

    /// Number of jobs refused (timers, finalization) since creation, for tests.
    #[allow(dead_code)]
    pub(crate) fn refused(&self) -> u64 {
        self.rejected_jobs.get()
    }
}

impl JobExecutor for GuardedExecutor {
    fn enqueue_job(self: Rc<Self>, job: Job, _context: &mut Context) {
        match job {
            Job::PromiseJob(job) => self.promise_jobs.borrow_mut().push_back(job),
            Job::AsyncJob(job) => self.async_jobs.borrow_mut().push_back(job),
            _ => self.rejected_jobs.set(self.rejected_jobs.get() + 1),
        }
    }

    /// Jobs only run inside [`GuardedExecutor::drive`], under a budget and a deadline.
    fn run_jobs(self: Rc<Self>, _context: &mut Context) -> JsResult<()> {
        Ok(())
    }
}
