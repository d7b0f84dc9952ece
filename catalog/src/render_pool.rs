//! The threads heavy calls compute on.
//!
//! Rendering bundles and scanning the catalog run here, not on the runtime's
//! workers, on [`Limits::work_slots`](crate::Limits::work_slots) threads at
//! a lower CPU priority (nice +[`NICE`]). A runtime worker that wakes to read
//! a request or answer a cheap call (GetPackage, health) then preempts a
//! render in progress instead of waiting behind it: measured with
//! `make bench-tenancy` (docs/catalog-server.md).
//!
//! Our own pool rather than tokio's blocking pool, whose threads are shared
//! with every other blocking task and come and go (a priority set on one
//! would stay with whatever it runs next), or rayon, whose work stealing and
//! size we do not need for a fixed number of threads fed in turn.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

/// How much lower than the server's other threads the render threads run.
pub const NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A fixed set of low-priority threads; jobs run in arrival order.
#[derive(Debug)]
pub struct RenderPool {
    jobs: Mutex<mpsc::Sender<Job>>,
    /// Jobs handed to the pool and not finished (queued or running).
    pending: Arc<std::sync::atomic::AtomicUsize>,
}

/// The job did not finish (it panicked, or the pool is gone).
#[derive(Debug, thiserror::Error)]
#[error("the render job did not finish")]
pub struct JobLost;

impl RenderPool {
    /// Starts `threads` (at least one) render threads. They end when the
    /// pool is dropped.
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = Arc::clone(&rx);
            std::thread::Builder::new()
                .name(format!("render-{i}"))
                .spawn(move || {
                    // Best effort: a server that cannot lower it still serves,
                    // only without the preemption.
                    if let Err(e) = rustix::process::setpriority_process(None, NICE) {
                        tracing::warn!(error = %e, "render thread keeps the default priority");
                    }
                    loop {
                        let job = {
                            let Ok(rx) = rx.lock() else { return };
                            match rx.recv() {
                                Ok(job) => job,
                                Err(_) => return,
                            }
                        };
                        // A panicking job drops its answer channel (the caller
                        // sees JobLost); the thread lives on.
                        let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                    }
                })?;
        }
        Ok(RenderPool {
            jobs: Mutex::new(tx),
            pending: Arc::default(),
        })
    }

    /// Jobs handed to the pool and not finished yet (queued or running).
    pub fn pending(&self) -> usize {
        self.pending.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Runs `f` on a render thread and waits for its answer.
    pub async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, JobLost> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let pending = Arc::clone(&self.pending);
        pending.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let job: Job = Box::new(move || {
            // Counted down even when `f` panics.
            struct Done(Arc<std::sync::atomic::AtomicUsize>);
            impl Drop for Done {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                }
            }
            let _done = Done(pending);
            let _ = tx.send(f());
        });
        self.jobs
            .lock()
            .map_err(|_| JobLost)?
            .send(job)
            .map_err(|_| JobLost)?;
        rx.await.map_err(|_| JobLost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_at_the_lower_priority_and_answer() {
        let pool = RenderPool::new(1).expect("pool");
        let base = rustix::process::getpriority_process(None).expect("own priority");
        let (prio, name) = pool
            .run(|| {
                (
                    rustix::process::getpriority_process(None).expect("priority"),
                    std::thread::current().name().map(str::to_string),
                )
            })
            .await
            .expect("answer");
        assert_eq!(prio, (base + NICE).min(19));
        assert_eq!(name.as_deref(), Some("render-0"));
    }

    #[tokio::test]
    async fn a_panicking_job_is_lost_and_the_pool_serves_on() {
        let pool = RenderPool::new(1).expect("pool");
        let lost = pool.run(|| -> u8 { panic!("bad job") }).await;
        assert!(lost.is_err());
        assert_eq!(pool.run(|| 7).await.expect("next job"), 7);
    }
}
