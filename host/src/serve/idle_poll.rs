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

/// The time connection threads have spent polling for work, process-wide.
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
    /// The previous poll's instant, to count the time spent.
    last_poll: Cell<Option<Instant>>,
    /// Nanoseconds this thread spent polling.
    spent: Cell<u64>,
}

impl Window {
    /// About to sleep at `now`: poll instead? A window opens when there
    /// was activity since the thread last ran out of work, and closes
    /// `length` later.
    fn poll_instead(&self, now: Instant, length: Duration) -> bool {
        let activity = self.activity.get();
        if self.seen.replace(activity) != activity {
            self.until.set(Some(now + length));
        }
        let polling = self.until.get().is_some_and(|until| now < until);
        let previous = self.last_poll.replace(polling.then_some(now));
        if let Some(previous) = previous {
            // Only the rounds spent polling, not the sleeps between windows.
            let spent = now.saturating_duration_since(previous).as_nanos() as u64;
            self.spent.set(self.spent.get() + spent);
            POLLED_NS.fetch_add(spent, Ordering::Relaxed);
        }
        polling
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

/// The runtime's `on_thread_park` hook. Inside the window it wakes the
/// thread's [`poller`], which makes tokio look at its sockets and timers
/// without blocking and come back here, rather than sleep.
pub fn before_sleeping(length: Duration) {
    if length.is_zero() {
        return;
    }
    if WINDOW.with(|w| w.poll_instead(Instant::now(), length)) {
        // Any other thread that wants this core goes first.
        std::thread::yield_now();
        POLLER.with(|p| {
            if let Some(waker) = p.borrow().as_ref() {
                waker.wake_by_ref();
            }
        });
    }
}

/// A task that does nothing when woken: waking it is what keeps the thread
/// from blocking. Spawned once on each connection thread.
pub async fn poller() {
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

    /// On a real runtime: after a request's mark the thread polls (the
    /// counted time grows), once the window is past it sleeps (it stops
    /// growing), and with no mark it never polls.
    #[test]
    fn a_thread_polls_for_its_window_then_sleeps() {
        let window = Duration::from_millis(5);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .on_thread_park(move || before_sleeping(window))
            .build()
            .unwrap();
        // This thread's own count: other tests' threads poll too.
        let spent = || Duration::from_nanos(WINDOW.with(|w| w.spent.get()));
        let sleep =
            || runtime.block_on(async { tokio::time::sleep(Duration::from_millis(20)).await });
        runtime.spawn(poller());
        sleep();
        let idle = spent();
        activity();
        sleep();
        let after_activity = spent() - idle;
        sleep();
        let after_window = spent() - idle - after_activity;
        assert_eq!(idle, Duration::ZERO, "no request yet: never polls");
        assert!(
            after_activity >= Duration::from_millis(4)
                && after_activity < Duration::from_millis(20),
            "{after_activity:?}"
        );
        assert_eq!(after_window, Duration::ZERO, "the window has closed");
        assert!(polled() >= after_activity, "counted for /metrics too");
    }
}
