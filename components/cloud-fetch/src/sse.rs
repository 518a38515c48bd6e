//! Server-sent events as an upstream streams them. Plain Rust with no
//! WASI in it, so the fuzz target `sse` (fuzz/) compiles this same file
//! natively.

/// Splits a server-sent-events body into the data of its events, however
/// the bytes arrive. Only `data:` fields matter here; an event's data lines
/// are joined with '\n' and the event ends at a blank line.
#[derive(Default)]
pub struct SseEvents {
    /// Bytes after the last newline seen.
    partial: Vec<u8>,
    /// Data lines of the event being read.
    data: Option<String>,
}

impl SseEvents {
    /// Feeds more of the body; returns the data of each event it completes.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        // Only the new bytes are searched: a long line arriving in small
        // pieces would otherwise be rescanned whole on every piece.
        let before = self.partial.len();
        self.partial.extend_from_slice(bytes);
        let Some(last_newline) = bytes
            .iter()
            .rposition(|&b| b == b'\n')
            .map(|at| before + at)
        else {
            return Vec::new();
        };
        let rest = self.partial.split_off(last_newline + 1);
        let complete = std::mem::replace(&mut self.partial, rest);
        let mut done = Vec::new();
        for line in complete[..last_newline].split(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(line);
            self.line(line.strip_suffix('\r').unwrap_or(&line), &mut done);
        }
        done
    }

    /// The end of the body ends its last line and event.
    pub fn finish(&mut self) -> Vec<String> {
        let mut done = self.push(b"\n");
        self.line("", &mut done);
        done
    }

    fn line(&mut self, line: &str, done: &mut Vec<String>) {
        if line.is_empty() {
            done.extend(self.data.take());
        } else if let Some(value) = line.strip_prefix("data:") {
            let value = value.strip_prefix(' ').unwrap_or(value);
            match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            }
        }
        // Anything else is a comment (":") or a field we do not use.
    }
}
