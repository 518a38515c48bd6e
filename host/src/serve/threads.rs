//! The threads that serve connections. Each accepted connection is
//! served to its end on one of them, and each runs a single-threaded
//! tokio runtime, so everything a request sets going — the pipeline's
//! task, `wasi:http`'s send task, the upstream client's connection task
//! (`per_thread.rs`) — runs on the thread that read the request. On
//! tokio's work-stealing runtime those tasks wake each other across
//! cores, and on a virtual machine whose idle core must be woken first
//! each hand-off costs tens of microseconds (`edgeroute bench
//! --proxy-only` measures it). The same choice as Pingora's no-steal
//! runtimes. What it gives up: an idle core cannot take over work queued
//! behind a busy one, so a connection waits while its thread runs another
//! request's CPU work (parsing its body, up to `[limits] max_body_bytes`;
//! a policy call, bounded by its deadline; the cloud fetcher). Local
//! inference and the tokenizing and detection of bodies over 1 KiB run on
//! threads of their own, and a new connection goes to the thread with the
//! fewest open.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

/// Something to run on a connection thread, inside its runtime: what it
/// spawns stays on that thread.
type Job = Box<dyn FnOnce() + Send>;

pub struct ConnectionThreads {
    threads: Vec<Thread>,
}

struct Thread {
    jobs: mpsc::UnboundedSender<Job>,
    /// Connections open on it.
    open: Arc<AtomicUsize>,
}

/// Counts a connection as open on its thread until dropped.
pub struct OnThread(Arc<AtomicUsize>);

impl Drop for OnThread {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnectionThreads {
    /// `count` threads (at least one), named `edgeroute-conn-N`, each
    /// polling for `idle_poll` after a request starts or ends before it
    /// sleeps (`idle_poll.rs`). They end when this is dropped, and with
    /// them every connection still open on them.
    pub fn start(count: usize, idle_poll: Duration) -> std::io::Result<Self> {
        let mut threads = Vec::with_capacity(count.max(1));
        for i in 0..count.max(1) {
            let (jobs, mut received) = mpsc::unbounded_channel::<Job>();
            // Sockets and timers only: no process or signal driver to
            // check at every turn (the node's signals are the main
            // runtime's).
            let runtime = super::idle_poll::hooks(
                tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .enable_time()
                    .thread_name(format!("edgeroute-conn-{i}-blocking")),
                idle_poll,
            )
            .build()?;
            std::thread::Builder::new()
                .name(format!("edgeroute-conn-{i}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        tokio::spawn(super::idle_poll::poller());
                        while let Some(job) = received.recv().await {
                            // A connection that fails to start must not
                            // take the thread, and its others, with it.
                            let started =
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                            if started.is_err() {
                                tracing::error!("a connection panicked while starting; closed");
                            }
                        }
                    });
                    // Connections still open are cut here; blocking work
                    // already handed off finishes on its own threads.
                    runtime.shutdown_background();
                })?;
            threads.push(Thread {
                jobs,
                open: Arc::default(),
            });
        }
        Ok(Self { threads })
    }

    /// One thread a core the process may use.
    pub fn per_core(idle_poll: Duration) -> std::io::Result<Self> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::start(cores, idle_poll)
    }

    /// Run `connection` on the thread with the fewest connections open,
    /// inside its runtime; it holds its [`OnThread`] for as long as it is
    /// open.
    pub fn run(&self, connection: impl FnOnce(OnThread) + Send + 'static) {
        let thread = self
            .threads
            .iter()
            .min_by_key(|t| t.open.load(Ordering::Relaxed))
            .expect("at least one thread");
        thread.open.fetch_add(1, Ordering::Relaxed);
        let on_thread = OnThread(thread.open.clone());
        // A thread's loop ends only when this is dropped (a job's panic is
        // caught there), so the send succeeds; if it did not, the
        // connection would be dropped, closing its socket.
        let _ = thread.jobs.send(Box::new(move || connection(on_thread)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new connection goes to the thread with the fewest open, and a
    /// closed one makes room on its thread again.
    #[test]
    fn connections_go_to_the_least_busy_thread() {
        let threads = ConnectionThreads::start(2, Duration::ZERO).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let open = |tx: std::sync::mpsc::Sender<(String, OnThread)>| {
            move |on: OnThread| {
                let name = std::thread::current().name().unwrap().to_string();
                tx.send((name, on)).unwrap();
            }
        };
        threads.run(open(tx.clone()));
        threads.run(open(tx.clone()));
        let mut open_now = [rx.recv().unwrap(), rx.recv().unwrap()];
        assert_ne!(open_now[0].0, open_now[1].0, "two connections, two threads");
        // Close the one on the second thread: turn by turn, the next would
        // go to the first.
        open_now.sort_by(|a, b| a.0.cmp(&b.0));
        let [first, (second, second_on)] = open_now;
        assert_eq!(second, "edgeroute-conn-1");
        drop(second_on);
        threads.run(open(tx.clone()));
        let (next, _next_on) = rx.recv().unwrap();
        assert_eq!(next, second, "the thread whose connection closed");
        drop(first);
    }

    /// Polling rounds a connection thread makes over 10 ms after a
    /// request's mark, with windows of `window`.
    fn rounds_after_a_request(window: Duration) -> u64 {
        let threads = ConnectionThreads::start(1, window).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        threads.run(move |_on| {
            super::super::idle_poll::activity();
            tokio::spawn(async move {
                let (before, _) = super::super::idle_poll::on_this_thread();
                tokio::time::sleep(Duration::from_millis(10)).await;
                let (after, _) = super::super::idle_poll::on_this_thread();
                tx.send(after - before).unwrap();
            });
        });
        rx.recv().unwrap()
    }

    /// The threads install the polling hooks and their poller.
    #[test]
    fn connection_threads_poll_after_a_request_when_asked_to() {
        let polled = rounds_after_a_request(Duration::from_millis(100));
        assert!(polled >= 10, "{polled} rounds");
        assert_eq!(rounds_after_a_request(Duration::ZERO), 0);
    }
}
