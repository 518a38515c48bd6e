//! Reading a request body the way the guard needs it: strict JSON (a key
//! twice in one object is refused, so `metadata.sensitivity` cannot be
//! given twice and judged by the wrong copy), chat messages and their
//! text, and every string a request carries.

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;

/// Why a body is not acceptable JSON; the text is meant for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    #[error("the request body is not valid JSON: {0}")]
    Syntax(String),
    #[error("the request body is not acceptable JSON: {0}")]
    Unacceptable(String),
}

/// Parse JSON refusing duplicate keys anywhere, in the one pass that
/// builds the value. serde_json keeps the last duplicate and has no option
/// to refuse them, and no maintained crate does this for arbitrary JSON
/// values, hence this small visitor.
pub fn strict_json(body: &[u8]) -> Result<Value, JsonError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    StrictValue
        .deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value))
        .map_err(|e| {
            if e.is_syntax() || e.is_eof() {
                JsonError::Syntax(e.to_string())
            } else {
                JsonError::Unacceptable(e.to_string())
            }
        })
}

/// Deserialises any JSON value; objects with a repeated key are an error.
struct StrictValue;

impl<'de> DeserializeSeed<'de> for StrictValue {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictValue {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(StrictValue)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "the key '{key}' appears twice in one object; send each key once"
                )));
            }
            let value = map.next_value_seed(StrictValue)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

/// A message's content: a string, or a list of parts of which edgeroute
/// serves the text ones.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

impl ChatMessage {
    /// The message's text, or why it has none edgeroute can serve.
    pub fn text(&self) -> Result<String, String> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(text)) => Ok(text.clone()),
            Some(Content::Parts(parts)) => parts
                .iter()
                .map(|part| match (part.kind.as_str(), &part.text) {
                    ("text", Some(text)) => Ok(text.as_str()),
                    (kind, _) => Err(format!("content part of type '{kind}' is not supported")),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|texts| texts.join("")),
        }
    }
}

/// Every string in a JSON value, keys of objects included (a tool's
/// argument names are text too; a key with a string value comes as
/// "key: value"), and numbers long enough to be an identifier (a card
/// number sent as a JSON number is still one).
pub fn strings<'a>(value: &'a Value, out: &mut Vec<Cow<'a, str>>) {
    match value {
        Value::String(s) => out.push(s.as_str().into()),
        // Parameters (max_tokens 256, temperature 0.7) are not identifiers,
        // and joined with a message's digits they could look like one.
        Value::Number(n) => {
            let text = n.to_string();
            if text.bytes().filter(u8::is_ascii_digit).count() >= 6 {
                out.push(text.into());
            }
        }
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(object) => {
            for (key, v) in object {
                match v {
                    // A name and its text together, as the JSON reads
                    // (`"password": "S3cr3t!x"`): a rule that needs the
                    // name before the value sees both.
                    Value::String(s) => out.push(format!("{key}: {s}").into()),
                    _ => {
                        out.push(key.as_str().into());
                        strings(v, out);
                    }
                }
            }
        }
        _ => {}
    }
}

/// A message's strings other than its text (a content string, or the
/// `text` of its parts): tool calls, names, a part's other fields.
pub fn other_message_strings<'a>(message: &'a Value, out: &mut Vec<Cow<'a, str>>) {
    for (key, value) in message.as_object().into_iter().flatten() {
        match (key.as_str(), value) {
            ("content", Value::String(_)) => {}
            ("content", Value::Array(parts)) => {
                for (k, v) in parts.iter().filter_map(|p| p.as_object()).flatten() {
                    if k != "text" {
                        strings(v, out);
                    }
                }
            }
            _ => strings(value, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_twice_in_any_object_is_refused() {
        let e = strict_json(br#"{"metadata":{"sensitivity":"restricted","sensitivity":"public"}}"#)
            .unwrap_err();
        assert!(e.to_string().contains("'sensitivity' appears twice"), "{e}");
        assert!(matches!(strict_json(b"{"), Err(JsonError::Syntax(_))));
        assert_eq!(
            strict_json(br#"{"a":[1,{"b":2}]}"#).unwrap()["a"][1]["b"],
            2
        );
    }

    #[test]
    fn every_string_but_the_message_text() {
        let message: Value = serde_json::from_str(
            r#"{"role":"assistant","content":"the text",
                "tool_calls":[{"function":{"name":"lookup","arguments":"{\"iban\":\"x\"}"}}]}"#,
        )
        .unwrap();
        let mut out = Vec::new();
        other_message_strings(&message, &mut out);
        assert!(!out.iter().any(|s| s == "the text"));
        assert!(out.iter().any(|s| s.contains("iban")));
        assert!(out.iter().any(|s| s == "name: lookup"));
    }
}
