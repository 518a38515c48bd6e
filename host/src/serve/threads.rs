//! The threads that serve connections. Each accepted connection is
//! served to its end on one of them, and each runs a single-threaded
//! tokio runtime, so everything a request sets going — the pipeline's
//! task, `wasi:http`'s send task, the upstream client's connection task —
//! runs on the thread that read the request. On tokio's work-stealing
//! runtime those tasks wake each other across cores, and on a virtual
//! machine whose idle core must be woken first each hand-off costs tens
//! of microseconds (`edgeroute bench --proxy-only` measures it). The same
//! choice as Pingora's no-steal runtimes: a connection's requests cannot
//! be taken over by an idle core, so one busy connection is not shared
//! out, but connections are spread over the threads as they arrive.
//! Work that is long (local inference, large bodies' detection) already
//! runs on threads of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::mpsc;

/// Something to run on a connection thread, inside its runtime: what it
/// spawns stays on that thread.
pub type Job = Box<dyn FnOnce() + Send>;

pub struct ConnectionThreads {
    threads: Vec<mpsc::UnboundedSender<Job>>,
    next: AtomicUsize,
}

impl ConnectionThreads {
    /// `count` threads (at least one), named `edgeroute-conn-N`. They end
    /// when this is dropped, and with them every connection still open on
    /// them.
    pub fn start(count: usize) -> std::io::Result<Self> {
        let mut threads = Vec::with_capacity(count.max(1));
        for i in 0..count.max(1) {
            let (jobs, mut received) = mpsc::unbounded_channel::<Job>();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .thread_name(format!("edgeroute-conn-{i}-blocking"))
                .build()?;
            std::thread::Builder::new()
                .name(format!("edgeroute-conn-{i}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        while let Some(job) = received.recv().await {
                            job();
                        }
                    });
                    // Connections still open are cut here; blocking work
                    // already handed off finishes on its own threads.
                    runtime.shutdown_background();
                })?;
            threads.push(jobs);
        }
        Ok(Self {
            threads,
            next: AtomicUsize::new(0),
        })
    }

    /// One thread a core the process may use.
    pub fn per_core() -> std::io::Result<Self> {
        Self::start(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// Run `job` on the next thread in turn.
    pub fn run(&self, job: Job) {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.threads.len();
        // A thread ends only when this is dropped, so the send succeeds.
        let _ = self.threads[i].send(job);
    }
}
