//! Poll before sleeping: a connection thread that runs out of work right
//! after a request started or finished keeps polling its sockets for a
//! short window (`[limits] idle_poll_us`) before it sleeps.
//!
//! Why: a proxied request is a chain of hand-offs (client → node →
//! upstream → node → client), and the next one usually comes within
//! microseconds. A thread that sleeps at each hand-off lets its core go
//! idle, and waking an idle core costs tens of microseconds on a virtual
//! machine whose kernel does not poll before halting
//! (`haltpoll.guest_halt_poll_ns=0`, as here): the core must be woken by
//! the hypervisor first. The kernel's own guest halt-polling (200 µs by
//! default where it is on) and Seastar's reactor (`--idle-poll-time-us`,
//! 200 µs) make the same trade. `edgeroute bench --proxy-only` measures it
//! both ways in one run.
//!
//! What it costs: up to one window of CPU after each request starts and
//! after it ends, counted in `edgeroute_idle_poll_seconds_total`. It
//! gives the core away while polling (`sched_yield` each round), so any
//! other runnable thread (local inference, the upstream on the same host)
//! goes first, and a thread with no recent request never polls.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// Nanoseconds every connection thread of the process spent polling.
static POLLED_NS: AtomicU64 = AtomicU64::new(0);

/// The time connection threads have spent polling for work, process-wide:
/// the polling rounds' own time, not the work they found nor what other
/// threads ran while a round yielded the core.
pub fn polled() -> Duration {
    Duration::from_nanos(POLLED_NS.load(Ordering::Relaxed))
}

/// One thread's window: whether it should poll rather than sleep.
#[derive(Default)]
struct Window {
    /// Requests started or finished on this thread.
    activity: Cell<u64>,
    /// `activity` when the thread last ran out of work.
    seen: Cell<u64>,
    /// Polling until then.
    until: Cell<Option<Instant>>,
    /// When the current polling round's own time started, if one is on:
    /// set before the round's `sched_yield` returns, read when the
    /// runtime comes back from its non-blocking look at the driver.
    round: Cell<Option<Instant>>,
    /// Polling rounds ended on this thread.
    rounds: Cell<u64>,
    /// Nanoseconds this thread spent polling, not yet added to
    /// `POLLED_NS` (added when the thread next sleeps, so that polling
    /// threads do not share a counter's cache line every round).
    unpublished: Cell<u64>,
    /// Nanoseconds this thread spent polling, in all.
    spent: Cell<u64>,
}

impl Window {
    /// About to sleep at `now`: poll instead? A window opens when there
    /// was activity since the thread last ran out of work, and closes
    /// `length` later.
    fn poll_instead(&self, now: Instant, length: Duration) -> bool {
        let activity = self.activity.get();
        if self.seen.replace(activity) != activity {
            // A bound on `length` is checked with the config; an overflow
            // here would only mean no polling.
            self.until.set(now.checked_add(length));
        }
        let polling = self.until.get().is_some_and(|until| now < until);
        if !polling {
            self.publish();
        }
        polling
    }

    fn add(&self, nanos: u64) {
        self.spent.set(self.spent.get() + nanos);
        self.unpublished.set(self.unpublished.get() + nanos);
    }

    fn publish(&self) {
        let nanos = self.unpublished.replace(0);
        if nanos > 0 {
            POLLED_NS.fetch_add(nanos, Ordering::Relaxed);
        }
    }
}

thread_local! {
    static WINDOW: Window = Window::default();
    /// The waker of this thread's [`poller`] task.
    static POLLER: RefCell<Option<Waker>> = const { RefCell::new(None) };
}

/// A request started or finished on this thread: the next time it runs out
/// of work, it polls for a window before sleeping.
pub fn activity() {
    WINDOW.with(|w| w.activity.set(w.activity.get().wrapping_add(1)));
}

/// `builder` with both hooks, polling for `length` after a request; the
/// runtime also needs its [`poller`] spawned.
pub fn hooks(
    builder: &mut tokio::runtime::Builder,
    length: Duration,
) -> &mut tokio::runtime::Builder {
    builder
        .on_thread_park(move || before_sleeping(length))
        .on_thread_unpark(after_waking)
}

/// The runtime's `on_thread_park` hook. Inside the window it wakes the
/// thread's [`poller`], which makes tokio look at its sockets and timers
/// without blocking (tokio ≥ 1.54.1) and come back here, rather than
/// sleep.
pub fn before_sleeping(length: Duration) {
    if length.is_zero() {
        return;
    }
    let started = Instant::now();
    WINDOW.with(|w| {
        if !w.poll_instead(started, length) {
            return;
        }
        let woken = POLLER.with(|p| p.borrow().as_ref().map(Waker::wake_by_ref).is_some());
        if !woken {
            // No poller on this thread: the runtime will sleep.
            return;
        }
        // Offer the core to any other runnable thread (local inference,
        // an upstream on the same host); what runs meanwhile is not
        // counted as polling.
        let yielding = Instant::now();
        std::thread::yield_now();
        w.add(yielding.duration_since(started).as_nanos() as u64);
        w.round.set(Some(Instant::now()));
    });
}

/// The runtime's `on_thread_unpark` hook: a polling round ends.
pub fn after_waking() {
    WINDOW.with(|w| {
        if let Some(round) = w.round.take() {
            w.add(round.elapsed().as_nanos() as u64);
            w.rounds.set(w.rounds.get() + 1);
        }
    });
}

/// A task that does nothing when woken: waking it is what keeps the thread
/// from blocking. Spawned once on each connection thread; when it is
/// dropped (its runtime ends), the thread has no poller again.
pub async fn poller() {
    struct Forget;
    impl Drop for Forget {
        fn drop(&mut self) {
            // The thread may be ending: its locals may be gone already.
            let _ = POLLER.try_with(|p| p.borrow_mut().take());
        }
    }
    let _forget = Forget;
    std::future::poll_fn(|cx| {
        POLLER.with(|p| {
            let mut p = p.borrow_mut();
            if !p.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *p = Some(cx.waker().clone());
            }
        });
        Poll::<()>::Pending
    })
    .await
}

/// This thread's polling so far: rounds ended and time spent (tests).
#[cfg(test)]
pub fn on_this_thread() -> (u64, Duration) {
    WINDOW.with(|w| (w.rounds.get(), Duration::from_nanos(w.spent.get())))
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_micros(500);

    #[test]
    fn a_window_opens_on_activity_and_closes_after_its_length() {
        let window = Window::default();
        let t0 = Instant::now();
        assert!(!window.poll_instead(t0, W), "no request yet: sleep");
        window.activity.set(1);
        assert!(window.poll_instead(t0, W));
        assert!(window.poll_instead(t0 + W / 2, W));
        assert!(!window.poll_instead(t0 + W, W), "the window has closed");
        assert!(!window.poll_instead(t0 + W * 3, W), "and stays closed");
    }

    #[test]
    fn activity_inside_a_window_starts_a_new_one() {
        let window = Window::default();
        let t0 = Instant::now();
        window.activity.set(1);
        assert!(window.poll_instead(t0, W));
        // A request finishes while polling: a full window from then on.
        window.activity.set(2);
        assert!(window.poll_instead(t0 + W * 3 / 4, W));
        assert!(window.poll_instead(t0 + W * 3 / 2, W));
        assert!(!window.poll_instead(t0 + W * 2, W));
    }

    #[test]
    fn a_window_too_long_to_represent_polls_not_at_all() {
        let window = Window::default();
        window.activity.set(1);
        assert!(!window.poll_instead(Instant::now(), Duration::MAX));
    }

    /// A runtime as a connection thread's: both hooks and the poller.
    fn runtime(window: Duration) -> tokio::runtime::Runtime {
        let runtime = hooks(
            tokio::runtime::Builder::new_current_thread().enable_time(),
            window,
        )
        .build()
        .unwrap();
        runtime.spawn(poller());
        runtime
    }

    /// On a real runtime: without a request the thread sleeps through a
    /// timer; after one it keeps turning (many rounds) and still fires
    /// its timers on time, which it could not if the rounds skipped the
    /// driver; once the window is past it sleeps again.
    #[test]
    fn a_thread_polls_for_its_window_then_sleeps() {
        let window = Duration::from_millis(200);
        let runtime = runtime(window);
        let sleep = |ms| {
            runtime.block_on(async move {
                let start = Instant::now();
                tokio::time::sleep(Duration::from_millis(ms)).await;
                start.elapsed()
            })
        };
        let (rounds, _) = on_this_thread();
        sleep(20);
        assert_eq!(on_this_thread().0, rounds, "no request yet: no polling");

        activity();
        let (rounds, spent) = on_this_thread();
        let took = sleep(10);
        let (polled_rounds, polled) = (on_this_thread().0 - rounds, on_this_thread().1 - spent);
        assert!(polled_rounds >= 10, "{polled_rounds} rounds in {took:?}");
        assert!(
            polled > Duration::ZERO && polled <= took,
            "{polled:?} of {took:?}"
        );
        // A 10 ms timer that waited for the window's end would show it.
        assert!(took < window / 2, "{took:?}");
        assert!(process_count_includes_this_thread(), "counted for /metrics");

        // Past the window (no request since): sleeping again.
        sleep(window.as_millis() as u64 + 50);
        let (rounds, _) = on_this_thread();
        sleep(20);
        assert_eq!(on_this_thread().0, rounds, "the window has closed");
    }

    /// What this thread published is in the process's count.
    fn process_count_includes_this_thread() -> bool {
        WINDOW.with(|w| {
            w.publish();
            polled() >= Duration::from_nanos(w.spent.get())
        })
    }

    #[test]
    fn a_window_of_zero_never_polls() {
        let runtime = runtime(Duration::ZERO);
        activity();
        let (rounds, _) = on_this_thread();
        runtime.block_on(async { tokio::time::sleep(Duration::from_millis(5)).await });
        assert_eq!(on_this_thread().0, rounds);
    }
}
