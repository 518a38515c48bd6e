//! Every level a request was given: what the client declared (each value
//! of each sensitivity header, `metadata.sensitivity`) and what detection
//! found in any string of the request. The node's pipeline and the Spin
//! gateway both collect through here, so they judge a request alike.

use crate::body::{other_message_strings, strings};
use crate::{Alone, Detector};
use edgeroute_core::{Sensitivity, SensitivitySet, Source};
use serde_json::{Map, Value};

/// Adds the levels a client declared. `headers` holds every value of
/// every sensitivity header in order, `None` for one that is not text; a
/// value may itself be a list (`public, restricted`), the same as
/// repeating the header. Whatever is not a known label counts as
/// restricted (`Sensitivity::from_client_label`).
pub fn declared(
    set: &mut SensitivitySet,
    headers: &[Option<String>],
    metadata: &Map<String, Value>,
) {
    for value in headers {
        match value {
            Some(text) => {
                for label in text.split(',') {
                    set.add(Source::Header, Sensitivity::from_client_label(label));
                }
            }
            None => set.add(Source::Header, Sensitivity::Restricted),
        }
    }
    if let Some(value) = metadata.get("sensitivity") {
        let level = match value.as_str() {
            Some(label) => Sensitivity::from_client_label(label),
            None => Sensitivity::Restricted,
        };
        set.add(Source::Body, level);
    }
}

/// Adds what detection finds, each kind as restricted. `messages` are the
/// messages' texts as the client wrote them (`Prepared::client_texts`),
/// `metadata` the body's `metadata`, `rest` the body
/// less `metadata`: an upstream receives the client's body as sent, so
/// tool arguments and results, names and unknown fields are judged too,
/// and so is the metadata's text (a client may put a customer's email in
/// `metadata.user`).
///
/// Each text is judged alone by `alone`: [`Detector::alone`], or (the
/// node) the same through its memory of clean texts seen before.
pub fn detected<'a>(
    set: &mut SensitivitySet,
    detector: &Detector,
    messages: impl IntoIterator<Item = &'a str>,
    metadata: &Map<String, Value>,
    rest: &Map<String, Value>,
    alone: impl FnMut(&str) -> Alone,
) {
    // Message text is in `messages` already: scanning it twice would let
    // the split-number check join a number with its own copy.
    let mut others = Vec::new();
    for (key, value) in rest {
        match (key.as_str(), value.as_array()) {
            ("messages", Some(messages)) => {
                for message in messages {
                    other_message_strings(message, &mut others);
                }
            }
            _ => strings(value, &mut others),
        }
    }
    let texts = messages
        .into_iter()
        // Down to the lifetime of the strings found here.
        .map(|text| -> &str { text })
        .chain(metadata.values().filter_map(|v| v.as_str()))
        .chain(others.iter().map(|s| s.as_ref()));
    for kind in detector.scan_each(texts.map(alone)) {
        set.add(Source::Detected(kind), Sensitivity::Restricted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Settings;

    fn object(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn the_most_restrictive_declared_level_wins_wherever_it_is() {
        let mut set = SensitivitySet::new();
        declared(
            &mut set,
            &[Some("public".into()), Some("public, restricted".into())],
            &Map::new(),
        );
        assert_eq!(set.level(), Sensitivity::Restricted);
        let mut set = SensitivitySet::new();
        declared(&mut set, &[None], &Map::new());
        assert_eq!(set.level(), Sensitivity::Restricted);
        let mut set = SensitivitySet::new();
        declared(
            &mut set,
            &[Some("public".into())],
            &object(r#"{"sensitivity":7}"#),
        );
        assert_eq!(set.level(), Sensitivity::Restricted);
    }

    #[test]
    fn detection_reads_tool_arguments_and_metadata_too() {
        let detector = Detector::new(&Settings::default()).unwrap();
        let rest = object(
            r#"{"messages":[{"role":"assistant","content":"",
                "tool_calls":[{"function":{"name":"pay","arguments":"{\"card\":\"4111 1111 1111 1111\"}"}}]}]}"#,
        );
        let mut set = SensitivitySet::new();
        detected(&mut set, &detector, ["hello"], &Map::new(), &rest, |t| {
            detector.alone(t)
        });
        assert_eq!(set.level(), Sensitivity::Restricted);
        let mut set = SensitivitySet::new();
        let metadata = object(r#"{"user":"jane.doe@example.com"}"#);
        detected(&mut set, &detector, ["hi"], &metadata, &Map::new(), |t| {
            detector.alone(t)
        });
        assert_eq!(set.detected().collect::<Vec<_>>(), vec!["email"]);
        let mut set = SensitivitySet::new();
        detected(&mut set, &detector, ["hi"], &Map::new(), &Map::new(), |t| {
            detector.alone(t)
        });
        assert_eq!(set.level(), Sensitivity::Public);
    }
}
