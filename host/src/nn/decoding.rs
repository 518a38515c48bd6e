//! What the host asks of a local generation beyond sampling: OpenAI's
//! `stop` sequences and a grammar for `response_format` (a JSON object, or
//! a JSON schema converted by llama.cpp). The host hands them to the
//! backend with the job, so the local-worker component does not change.

pub use edgeroute_request::Decoding;

/// Finds stop sequences in streamed text. Text that could be the start of
/// a stop sequence is held back until the next piece shows whether it is,
/// so a client never receives part of a stop sequence.
#[derive(Debug, Default)]
pub struct StopScan {
    stops: Vec<String>,
    held: String,
}

impl StopScan {
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Take the next piece of text: what may be sent now, and whether a
    /// stop sequence ended the text (the text after it is dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.stops.is_empty() {
            return (text.to_string(), false);
        }
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()))
            .min();
        if let Some(at) = first {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        // Hold back the longest tail that begins some stop sequence.
        let keep = self
            .stops
            .iter()
            .map(|stop| partial_suffix(&self.held, stop))
            .max()
            .unwrap_or(0);
        let send = self.held.len() - keep;
        let out = self.held[..send].to_string();
        self.held.drain(..send);
        (out, false)
    }

    /// The text held back, at the end of a generation that did not stop.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of
/// `stop`, on a character boundary.
fn partial_suffix(text: &str, stop: &str) -> usize {
    let longest = (stop.len() - 1).min(text.len());
    (1..=longest)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n)
                && stop.is_char_boundary(n)
                && stop.as_bytes()[..n] == text.as_bytes()[text.len() - n..]
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut scan = StopScan::new(&stops);
        let mut out = Vec::new();
        for piece in pieces {
            let (text, stopped) = scan.push(piece);
            out.push(text);
            if stopped {
                return (out, true, String::new());
            }
        }
        let rest = scan.flush();
        (out, false, rest)
    }

    #[test]
    fn text_ends_before_a_stop_sequence_split_across_pieces() {
        let (out, stopped, _) = run(&["END"], &["one two E", "N", "D three"]);
        assert!(stopped);
        // "E" and "N" were held back: no part of the stop reached the client.
        assert_eq!(out, ["one two ", "", ""]);
    }

    #[test]
    fn a_false_start_is_released_and_the_earliest_stop_wins() {
        let (out, stopped, rest) = run(&["\n\n", "###"], &["a\n", "b#", "#c"]);
        assert!(!stopped);
        assert_eq!(out.concat() + &rest, "a\nb##c");
        let (out, stopped, _) = run(&["###", "b"], &["a##", "#b"]);
        assert!(stopped);
        assert_eq!(out.concat(), "a");
    }

    #[test]
    fn held_text_is_flushed_at_the_end_and_no_stops_pass_everything() {
        let (out, stopped, rest) = run(&["STOP"], &["almost ST"]);
        assert!(!stopped);
        assert_eq!((out.concat(), rest.as_str()), ("almost ".to_string(), "ST"));
        let (out, stopped, rest) = run(&[], &["a", "b"]);
        assert_eq!(
            (out.concat(), stopped, rest),
            ("ab".to_string(), false, String::new())
        );
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        let (out, stopped, _) = run(&["éé"], &["café", "é!"]);
        assert!(stopped);
        assert_eq!(out.concat(), "caf");
        let (out, stopped, rest) = run(&["日本"], &["私は日", "曜日"]);
        assert!(!stopped);
        assert_eq!(out.concat() + &rest, "私は日曜日");
    }
}
