//! The machine as a shared resource. The end-to-end tests run in one binary,
//! two at a time on a 2-core machine, and most of them do not mind a
//! neighbour. A few must have the cores to themselves: instantiating a
//! Python or JavaScript policy takes seconds of both cores, and its
//! `configure` call runs under the 20 ms policy deadline, which it can miss
//! while another test's node decodes beside it.
//!
//! Such work runs under [`exclusive`]. Every [`Node`](crate::Node) holds a
//! share of the machine while it runs; `exclusive` waits until no other
//! test's node is running and holds new ones back until it is dropped. A
//! test that already runs a node may start another one meanwhile, so two
//! tests never wait for each other.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::{self, ThreadId};

use crate::lock;

struct State {
    /// The thread running alone, if any.
    alone: Option<ThreadId>,
    /// Threads waiting to run alone.
    waiting: usize,
    /// Running nodes per thread that started them.
    shares: Vec<(ThreadId, usize)>,
}

impl State {
    fn shares_of(&self, thread: ThreadId) -> usize {
        self.shares
            .iter()
            .find(|(t, _)| *t == thread)
            .map_or(0, |(_, n)| *n)
    }

    fn others_share(&self, thread: ThreadId) -> bool {
        self.shares.iter().any(|(t, n)| *t != thread && *n > 0)
    }
}

static STATE: Mutex<State> = Mutex::new(State {
    alone: None,
    waiting: 0,
    shares: Vec::new(),
});
static CHANGED: Condvar = Condvar::new();

fn wait(state: MutexGuard<'static, State>) -> MutexGuard<'static, State> {
    CHANGED
        .wait(state)
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Held while the caller has the machine to itself; see the module docs.
/// Not reentrant: a test holds one at a time.
#[must_use = "the machine is shared again as soon as this is dropped"]
pub struct Exclusive {
    _private: (),
}

/// Waits until no other test runs a node, then keeps new ones from
/// starting until the returned guard is dropped.
pub fn exclusive() -> Exclusive {
    let me = thread::current().id();
    let mut state = lock(&STATE);
    state.waiting += 1;
    while state.alone.is_some() || state.others_share(me) {
        state = wait(state);
    }
    state.waiting -= 1;
    state.alone = Some(me);
    Exclusive { _private: () }
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        lock(&STATE).alone = None;
        CHANGED.notify_all();
    }
}

/// A running node's share of the machine.
#[derive(Debug)]
pub(crate) struct Share {
    thread: ThreadId,
}

/// Waits while another test runs alone or waits to (unless this thread
/// already runs a node: holding it back would make the two wait for each
/// other).
pub(crate) fn share() -> Share {
    let me = thread::current().id();
    let mut state = lock(&STATE);
    loop {
        let blocked = match state.alone {
            Some(thread) => thread != me,
            None => state.waiting > 0 && state.shares_of(me) == 0,
        };
        if !blocked {
            break;
        }
        state = wait(state);
    }
    match state.shares.iter_mut().find(|(t, _)| *t == me) {
        Some((_, n)) => *n += 1,
        None => state.shares.push((me, 1)),
    }
    Share { thread: me }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut state = lock(&STATE);
        if let Some((_, n)) = state.shares.iter_mut().find(|(t, _)| *t == self.thread) {
            *n -= 1;
        }
        state.shares.retain(|(_, n)| *n > 0);
        drop(state);
        CHANGED.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn exclusive_waits_for_other_nodes_and_holds_new_ones_back() {
        let (events, seen) = mpsc::channel();
        // Another test runs a node.
        let (started_tx, started) = mpsc::channel();
        let (release_tx, release) = mpsc::channel::<()>();
        let neighbour = {
            let events = events.clone();
            thread::spawn(move || {
                let first = share();
                started_tx.send(()).unwrap();
                release.recv().unwrap();
                // A second node of the same test starts although someone waits.
                let second = share();
                events.send("neighbour: second node").unwrap();
                events.send("neighbour: done").unwrap();
                drop((first, second));
            })
        };
        started.recv().unwrap();
        let (acquired_tx, acquired) = mpsc::channel();
        let alone = {
            let events = events.clone();
            thread::spawn(move || {
                let guard = exclusive();
                events.send("alone").unwrap();
                acquired_tx.send(()).unwrap();
                thread::sleep(Duration::from_millis(50));
                events.send("alone: done").unwrap();
                drop(guard);
            })
        };
        // Wait until the exclusive caller is waiting, then let the neighbour go on.
        while lock(&STATE).waiting == 0 {
            thread::sleep(Duration::from_millis(1));
        }
        release_tx.send(()).unwrap();
        neighbour.join().unwrap();
        // A node of a third test, started meanwhile, waits for the exclusive caller.
        acquired.recv().unwrap();
        let late = thread::spawn({
            let events = events.clone();
            move || {
                let _share = share();
                events.send("late node").unwrap();
            }
        });
        alone.join().unwrap();
        late.join().unwrap();
        drop(events);
        let order: Vec<&str> = seen.iter().collect();
        assert_eq!(
            order,
            [
                "neighbour: second node",
                "neighbour: done",
                "alone",
                "alone: done",
                "late node"
            ]
        );
    }
}
