//! Where the node's log goes: stderr, written by a thread of its own in
//! batches. A request's log line is appended to a buffer under a lock (no
//! write, no thread woken); every [`FLUSH_EVERY`] the writer thread takes
//! what has gathered and writes it out.
//!
//! Why not a `write` per line: a node logs every request at `info`, and
//! writing each line to stderr on the connection's thread cost ~20 µs of
//! a cloud call's added p50 (`edgeroute bench --proxy-only` with
//! `EDGEROUTE_LOG=info` and stderr a pipe); worse, a reader of that pipe
//! that stops (a paused terminal, a stuck log shipper) blocked every
//! request at the next line. Why not `tracing-appender`'s non-blocking
//! writer: its worker thread is woken for every line, and those wake-ups
//! took the other core (the same benchmark's direct-call baseline p50
//! went from 50 to 87–90 µs), as the audit log's did before it was batched.
//!
//! While stderr is not being read the buffer grows to [`MAX_PENDING`];
//! past that, lines are dropped and counted, and a line saying how many
//! is written once stderr takes writes again. Dropping the [`Flushing`]
//! guard writes what is left (at the end of `main`, before an error exit);
//! a line logged after that is written directly. Lines printed with
//! `eprintln!` (not through the log) reach stderr at once, so they may
//! come before log lines up to [`FLUSH_EVERY`] older.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tracing_subscriber::fmt::MakeWriter;

/// How long a line may wait before it is written.
pub const FLUSH_EVERY: Duration = Duration::from_millis(10);
/// The most log bytes gathered while the sink does not take them (one
/// more batch may be in the writer's hands).
pub const MAX_PENDING: usize = 4 << 20;

/// A `MakeWriter` for the `fmt` subscriber: each event's text is appended
/// to the shared buffer.
#[derive(Clone)]
pub struct Batched {
    shared: Arc<Shared>,
}

struct Shared {
    pending: Mutex<Pending>,
    /// The sink, handed back by the writer thread when it ends: a line
    /// logged after that (a connection still closing after the shutdown
    /// deadline) is written directly.
    after: Mutex<Option<Box<dyn Write + Send>>>,
    /// Set when the guard is dropped: the thread writes what is left and ends.
    stopping: AtomicBool,
    stopped: Condvar,
}

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    /// Lines dropped since the last notice.
    dropped: u64,
    /// The writer thread has written its last batch.
    done: bool,
}

/// Writes what is left when dropped, then stops the writer thread.
pub struct Flushing {
    shared: Arc<Shared>,
}

/// A batched writer to `sink` (stderr for the node) and its guard.
pub fn start<W: Write + Send + 'static>(sink: W) -> std::io::Result<(Batched, Flushing)> {
    let shared = Arc::new(Shared {
        pending: Mutex::new(Pending::default()),
        after: Mutex::new(None),
        stopping: AtomicBool::new(false),
        stopped: Condvar::new(),
    });
    let thread = shared.clone();
    std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || write_batches(&thread, sink))?;
    Ok((
        Batched {
            shared: shared.clone(),
        },
        Flushing { shared },
    ))
}

fn write_batches<W: Write + Send + 'static>(shared: &Shared, mut sink: W) {
    let mut batch = Vec::new();
    loop {
        let stopping = shared.stopping.load(Ordering::Acquire);
        let dropped = {
            let mut pending = lock(&shared.pending);
            std::mem::swap(&mut pending.bytes, &mut batch);
            std::mem::take(&mut pending.dropped)
        };
        if dropped > 0 {
            // In the batch, so one write carries it whole.
            let _ = writeln!(
                batch,
                "edgeroute: {dropped} log lines dropped: the log's reader fell more than {} MiB behind",
                MAX_PENDING >> 20
            );
        }
        // A sink that fails (stderr closed) loses the batch: there is
        // nowhere else to say so.
        let _ = sink.write_all(&batch);
        let _ = sink.flush();
        batch.clear();
        // After a burst, give the memory back rather than hold it for good.
        if batch.capacity() > 256 << 10 {
            batch = Vec::new();
        }
        if stopping {
            *lock(&shared.after) = Some(Box::new(sink));
            lock(&shared.pending).done = true;
            shared.stopped.notify_all();
            return;
        }
        std::thread::sleep(FLUSH_EVERY);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for Flushing {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        // Bounded: a sink that blocks for good must not hold the exit.
        let pending = lock(&self.shared.pending);
        let _ = self
            .shared
            .stopped
            .wait_timeout_while(pending, Duration::from_secs(2), |p| !p.done);
    }
}

/// One event's text, appended whole when the subscriber is done with it.
pub struct Line<'a> {
    shared: &'a Shared,
    text: Vec<u8>,
}

impl Write for Line<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.text.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        if self.text.is_empty() {
            return;
        }
        let mut pending = lock(&self.shared.pending);
        if pending.done {
            drop(pending);
            if let Some(sink) = lock(&self.shared.after).as_mut() {
                let _ = sink.write_all(&self.text);
                let _ = sink.flush();
            }
            return;
        }
        if pending.bytes.len() + self.text.len() > MAX_PENDING {
            pending.dropped += 1;
        } else {
            pending.bytes.extend_from_slice(&self.text);
        }
    }
}

impl<'a> MakeWriter<'a> for Batched {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Line<'a> {
        Line {
            shared: &self.shared,
            text: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Instant;

    /// A sink that hands each write to a channel, or blocks while `held`;
    /// it says when a write begins.
    struct Sink {
        tx: mpsc::Sender<Vec<u8>>,
        held: Arc<Mutex<()>>,
        writing: Option<mpsc::Sender<()>>,
    }

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if let Some(writing) = &self.writing {
                let _ = writing.send(());
            }
            let _held = self.held.lock().unwrap();
            let _ = self.tx.send(bytes.to_vec());
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn log(writer: &Batched, text: &str) {
        write!(writer.make_writer(), "{text}").unwrap();
    }

    fn received(rx: &mpsc::Receiver<Vec<u8>>, until: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut all = String::new();
        while !all.contains(until) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(bytes) => all.push_str(&String::from_utf8_lossy(&bytes)),
                Err(_) => panic!("'{until}' never written; got: {all}"),
            }
        }
        all
    }

    /// A writer to a sink that never stalls, and what the sink receives.
    fn started() -> (Batched, Flushing, mpsc::Receiver<Vec<u8>>) {
        let (tx, rx) = mpsc::channel();
        let held = Arc::new(Mutex::new(()));
        let writing = None;
        let (writer, flushing) = start(Sink { tx, held, writing }).unwrap();
        (writer, flushing, rx)
    }

    /// What the sink has received so far, without waiting.
    fn written(rx: &mpsc::Receiver<Vec<u8>>) -> String {
        rx.try_iter()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .collect()
    }

    #[test]
    fn lines_reach_the_sink_whole_and_in_order() {
        let (writer, _flushing, rx) = started();
        for i in 0..100 {
            log(&writer, &format!("line {i}\n"));
        }
        let all = received(&rx, "line 99\n");
        let expected: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(all, expected);
    }

    #[test]
    fn a_stalled_sink_never_blocks_a_line_and_its_losses_are_told() {
        let (tx, rx) = mpsc::channel();
        let (writing, began) = mpsc::channel();
        let held = Arc::new(Mutex::new(()));
        let stall = held.lock().unwrap();
        let sink = Sink {
            tx,
            held: held.clone(),
            writing: Some(writing),
        };
        let (writer, _flushing) = start(sink).unwrap();
        log(&writer, "first\n");
        // The writer thread has taken the first line and is blocked on the sink.
        began.recv_timeout(Duration::from_secs(5)).unwrap();
        let line = "x".repeat(1023) + "\n";
        let lines = 2 * MAX_PENDING / line.len();
        // Twice the cap, from a thread of its own: a line that waited on
        // the sink would never finish while it is held.
        let (finished, logged) = mpsc::channel();
        let (logging, text) = (writer.clone(), line.clone());
        std::thread::spawn(move || {
            for _ in 0..lines {
                log(&logging, &text);
            }
            let _ = finished.send(());
        });
        logged
            .recv_timeout(Duration::from_secs(30))
            .expect("logging waited on a stalled sink");
        drop(stall);
        let all = received(&rx, "log lines dropped");
        let kept = all.matches(&line).count();
        assert_eq!(kept, MAX_PENDING / line.len(), "the cap's worth is kept");
        let dropped = lines - kept;
        assert!(
            all.contains(&format!("edgeroute: {dropped} log lines dropped")),
            "{dropped}: {}",
            &all[all.len().saturating_sub(200)..]
        );
    }

    #[test]
    fn a_line_after_the_end_is_written_directly() {
        let (writer, flushing, rx) = started();
        drop(flushing);
        log(&writer, "late\n");
        let all = written(&rx);
        assert!(all.contains("late"), "{all}");
    }

    #[test]
    fn dropping_the_guard_writes_what_is_left() {
        let (writer, flushing, rx) = started();
        log(&writer, "the last words\n");
        drop(flushing);
        // Already written when the drop returned: no waiting here.
        let all = written(&rx);
        assert!(all.contains("the last words"), "{all}");
    }
}
