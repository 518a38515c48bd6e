//! Responses as a test sees them: any status, the routing headers, the body
//! as JSON or as an OpenAI chat completion stream (SSE).

use std::fmt;

use serde_json::Value;

use crate::{MAX_READ, truncate};

/// An HTTP response, whatever its status.
#[derive(Clone)]
pub struct Resp {
    pub status: u16,
    /// Lower-case names, in received order.
    pub headers: Vec<(String, String)>,
    pub body_text: String,
}

impl Resp {
    pub(crate) fn from_ureq(
        mut response: ureq::http::Response<ureq::Body>,
    ) -> Result<Resp, ureq::Error> {
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_ascii_lowercase(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect();
        let bytes = response
            .body_mut()
            .with_config()
            .limit(MAX_READ)
            .read_to_vec()?;
        Ok(Resp {
            status,
            headers,
            body_text: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }

    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The entry names of the `Server-Timing` header that carry a
    /// duration (`name;dur=ms, …`), in order: the steps, and a part such
    /// as `upstream` after the step it belongs to.
    pub fn server_timing_steps(&self) -> Vec<&str> {
        self.server_timing()
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }

    /// Each `Server-Timing` entry's name and milliseconds, in order.
    pub fn server_timing(&self) -> Vec<(&str, f64)> {
        edgeroute_core::timing::entries(self.header("server-timing").unwrap_or_default()).collect()
    }

    /// `x-edgeroute-target`, e.g. `local:smollm2` or `cloud:frontier`.
    pub fn target(&self) -> Option<&str> {
        self.header("x-edgeroute-target")
    }

    /// `x-edgeroute-reason`.
    pub fn reason(&self) -> Option<&str> {
        self.header("x-edgeroute-reason")
    }

    /// `reason()` without the host's note on prefix reuse (`; N prompt
    /// tokens from the prefix cache`), which depends on what ran before:
    /// for comparing the decisions of two policies.
    pub fn decision_reason(&self) -> Option<String> {
        self.reason().map(|reason| {
            reason
                .split("; ")
                .filter(|part| !part.ends_with("prompt tokens from the prefix cache"))
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    /// The body as JSON; panics with the response if it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body_text)
            .unwrap_or_else(|e| panic!("response body is not JSON ({e}): {self:?}"))
    }

    /// `choices[0].message.content` of a non-streaming completion.
    pub fn content(&self) -> Option<String> {
        serde_json::from_str::<Value>(&self.body_text)
            .ok()?
            .pointer("/choices/0/message/content")?
            .as_str()
            .map(str::to_owned)
    }

    /// A parsed OpenAI chat completion stream (panics if a chunk is not JSON).
    pub fn stream(&self) -> StreamSummary {
        let data = self.sse_data();
        let mut summary = StreamSummary {
            events: data.len(),
            done_last: data.last().map(String::as_str) == Some("[DONE]"),
            ..StreamSummary::default()
        };
        for payload in &data {
            if payload == "[DONE]" {
                summary.done_count += 1;
                continue;
            }
            let chunk: Value = serde_json::from_str(payload)
                .unwrap_or_else(|e| panic!("SSE chunk is not JSON ({e}): {payload}\n{self:?}"));
            summary.objects.push(
                chunk
                    .get("object")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
            );
            if chunk.get("error").is_some() {
                summary.errors.push(chunk.clone());
            }
            if let Some(choices) = chunk.get("choices").and_then(Value::as_array) {
                for choice in choices {
                    if let Some(text) = choice.pointer("/delta/content").and_then(Value::as_str)
                        && !text.is_empty()
                    {
                        summary.content_chunks += 1;
                        summary.text.push_str(text);
                    }
                    if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                        summary.finish_reason = Some(reason.to_owned());
                    }
                }
            }
            if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
                summary.usage = Some(usage.clone());
            }
        }
        summary
    }

    /// The `data:` payloads of a server-sent-events body, in order.
    fn sse_data(&self) -> Vec<String> {
        let mut events = Vec::new();
        let mut current: Option<String> = None;
        for line in self.body_text.lines() {
            let line = line.trim_end_matches('\r');
            if line.is_empty() {
                if let Some(data) = current.take() {
                    events.push(data);
                }
            } else if let Some(data) = line.strip_prefix("data:") {
                let data = data.strip_prefix(' ').unwrap_or(data);
                match &mut current {
                    Some(existing) => {
                        existing.push('\n');
                        existing.push_str(data);
                    }
                    None => current = Some(data.to_owned()),
                }
            }
        }
        if let Some(data) = current {
            events.push(data);
        }
        events
    }
}

impl fmt::Debug for Resp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "HTTP {}", self.status)?;
        for (name, value) in &self.headers {
            writeln!(f, "{name}: {value}")?;
        }
        write!(f, "\n{}", truncate(&self.body_text, 4000))
    }
}

/// What a chat completion SSE stream contained.
#[derive(Clone, Debug, Default)]
pub struct StreamSummary {
    /// Number of SSE events (`[DONE]` included).
    pub events: usize,
    /// Chunks whose `delta.content` is non-empty.
    pub content_chunks: usize,
    /// The concatenated content.
    pub text: String,
    /// The last `finish_reason` seen.
    pub finish_reason: Option<String>,
    /// Whether the final event is `[DONE]`.
    pub done_last: bool,
    pub done_count: usize,
    /// The `object` field of each JSON chunk.
    pub objects: Vec<String>,
    pub usage: Option<Value>,
    /// Chunks carrying an `error` object.
    pub errors: Vec<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sse_streams() {
        let resp = Resp {
            status: 200,
            headers: vec![],
            body_text: concat!(
                "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\r\n\r\n",
                ": a comment\n\n",
                "data:{\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
                "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n",
                "data: [DONE]\n\n",
            )
            .to_owned(),
        };
        let stream = resp.stream();
        assert_eq!(stream.events, 4);
        assert_eq!(stream.content_chunks, 2);
        assert_eq!(stream.text, "Hello");
        assert_eq!(stream.finish_reason.as_deref(), Some("stop"));
        assert!(stream.done_last);
        assert_eq!(stream.done_count, 1);
    }
}
