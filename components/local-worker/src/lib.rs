//! The local worker: runs one chat completion on a model the host preloaded,
//! through wasi:nn; and embeds texts on an encoder the host preloaded
//! (`embed`).
//!
//! It follows the streaming convention documented on the `local-worker` world
//! in wit/routing.wit: the first `compute` takes `messages` and `metadata`
//! and samples the first token; each further `compute` with no inputs decodes
//! one more; outputs are `token`, and at the end `finish` and `metadata`.

use serde::{Deserialize, Serialize};

mod embed;

wit_bindgen::generate!({
    world: "local-worker",
    path: "../../wit",
    // wasi:nn comes from wit/deps; nobody publishes bindings for it.
    generate_all,
});

use edgeroute::routing::completion_types::{Message, Usage};
use edgeroute::routing::sink;
use exports::edgeroute::routing::generator::{ChatRequest, Completion, Guest, TargetError};
use wasi::nn::errors::{Error as NnError, ErrorCode};
use wasi::nn::graph;
use wasi::nn::inference::GraphExecutionContext;
use wasi::nn::tensor::{Tensor, TensorType};

/// The `messages` input: what the backend's chat template expects.
#[derive(Serialize)]
struct ChatMessage<'a> {
    role: &'a str,
    content: &'a str,
}

/// The `metadata` input. f32 fields so JSON says 0.7, not 0.699999988.
#[derive(Serialize)]
struct Sampling {
    #[serde(rename = "max-tokens")]
    max_tokens: u32,
    temperature: f32,
    #[serde(rename = "top-p")]
    top_p: f32,
    seed: u32,
}

/// The `metadata` output, present with `finish`.
#[derive(Deserialize)]
struct Counts {
    #[serde(rename = "input-tokens", default)]
    input_tokens: u32,
    #[serde(rename = "output-tokens", default)]
    output_tokens: u32,
}

/// What one `compute` call produced.
#[derive(Default)]
struct Step {
    token: Vec<u8>,
    finish: Option<String>,
    counts: Option<Counts>,
}

/// How many decode steps past `max-tokens` we allow before deciding the
/// backend is not following the convention (it should answer `finish`).
const STEP_SLACK: u32 = 64;

struct LocalWorker;

impl Guest for LocalWorker {
    fn generate(request: ChatRequest) -> Result<Completion, TargetError> {
        let graph = graph::load_by_name(&request.model).map_err(|e| match e.code() {
            ErrorCode::NotFound => {
                TargetError::Unavailable(format!("local model '{}' is not loaded", request.model))
            }
            _ => nn_error("loading the model", e),
        })?;
        let context = graph
            .init_execution_context()
            .map_err(|e| nn_error("starting a generation", e))?;

        let messages: Vec<ChatMessage> = request
            .messages
            .iter()
            .map(|Message { role, content }| ChatMessage { role, content })
            .collect();
        let sampling = Sampling {
            max_tokens: request.max_tokens,
            temperature: request.temperature,
            top_p: request.top_p,
            seed: request.seed,
        };
        let inputs = vec![
            json_tensor("messages", &messages)?,
            json_tensor("metadata", &sampling)?,
        ];

        let mut text = String::new();
        let mut pending = Utf8Pending::default();
        let mut steps: u32 = 0;
        let mut step = compute(&context, inputs)?;
        loop {
            steps += 1;
            let piece = pending.push(&step.token);
            if !piece.is_empty() {
                text.push_str(&piece);
                // Called for a whole answer too: the host answers whether
                // anyone still waits for it.
                if !sink::emit(&piece) {
                    // The client went away. Dropping the context (on return)
                    // ends the generation in the backend.
                    return Ok(completion(&request, text, "cancelled", None, steps));
                }
            }
            if let Some(finish) = step.finish {
                // Bytes still pending are a character cut off by max-tokens:
                // dropped, rather than shown as U+FFFD.
                return Ok(completion(&request, text, &finish, step.counts, steps));
            }
            if request.max_tokens > 0 && steps > request.max_tokens.saturating_add(STEP_SLACK) {
                return Err(TargetError::Internal(format!(
                    "the backend produced {steps} tokens without finishing (max-tokens {})",
                    request.max_tokens
                )));
            }
            step = compute(&context, Vec::new())?;
        }
    }
}

fn completion(
    request: &ChatRequest,
    text: String,
    finish: &str,
    counts: Option<Counts>,
    steps: u32,
) -> Completion {
    // Without the backend's counts (a cancelled run) the steps taken are the
    // best estimate of output tokens; the host counts the prompt itself.
    let usage = match counts {
        Some(c) => Usage {
            prompt_tokens: c.input_tokens,
            completion_tokens: c.output_tokens,
        },
        None => Usage {
            prompt_tokens: 0,
            completion_tokens: steps,
        },
    };
    Completion {
        text,
        finish_reason: finish.to_string(),
        usage,
        model: request.model.clone(),
        message: None,
    }
}

fn json_tensor<T: Serialize>(name: &str, value: &T) -> Result<(String, Tensor), TargetError> {
    let bytes = serde_json::to_vec(value)
        .map_err(|e| TargetError::Internal(format!("encoding {name}: {e}")))?;
    Ok((name.to_string(), u8_tensor(&bytes)))
}

fn u8_tensor(bytes: &[u8]) -> Tensor {
    Tensor::new(&[bytes.len() as u32], TensorType::U8, bytes)
}

fn compute(
    context: &GraphExecutionContext,
    inputs: Vec<(String, Tensor)>,
) -> Result<Step, TargetError> {
    let outputs = context
        .compute(inputs)
        .map_err(|e| nn_error("generating", e))?;
    let mut step = Step::default();
    for (name, tensor) in outputs {
        match name.as_str() {
            "token" => step.token = tensor.data(),
            "finish" => step.finish = Some(String::from_utf8_lossy(&tensor.data()).into_owned()),
            "metadata" => {
                let counts = serde_json::from_slice(&tensor.data()).map_err(|e| {
                    TargetError::Internal(format!(
                        "the backend's metadata output is not valid: {e}"
                    ))
                })?;
                step.counts = Some(counts);
            }
            // Outputs from a newer backend are not our business.
            _ => {}
        }
    }
    Ok(step)
}

/// Maps a wasi-nn error to the target error the host understands, keeping
/// the backend's own message.
fn nn_error(doing: &str, error: NnError) -> TargetError {
    let code = error.code();
    let data = error.data();
    let message = if data.is_empty() {
        format!("{doing}: {code:?}")
    } else {
        format!("{doing}: {data}")
    };
    match code {
        ErrorCode::InvalidArgument | ErrorCode::TooLarge => TargetError::BadRequest(message),
        ErrorCode::NotFound | ErrorCode::Timeout => TargetError::Unavailable(message),
        _ => TargetError::Internal(message),
    }
}

/// Holds back the tail of a multi-byte character split across tokens. The
/// convention says the backend already does this; a backend that does not
/// should still not garble text.
#[derive(Default)]
struct Utf8Pending(Vec<u8>);

impl Utf8Pending {
    /// Adds a token's bytes; returns the text that is complete so far.
    fn push(&mut self, bytes: &[u8]) -> String {
        self.0.extend_from_slice(bytes);
        let mut piece = String::new();
        let mut keep = Vec::new();
        let mut chunks = self.0.utf8_chunks().peekable();
        while let Some(chunk) = chunks.next() {
            piece.push_str(chunk.valid());
            let bad = chunk.invalid();
            let at_end = chunks.peek().is_none();
            if at_end && std::str::from_utf8(bad).is_err_and(|e| e.error_len().is_none()) {
                // The start of a character whose rest is in the next token.
                keep = bad.to_vec();
            } else if !bad.is_empty() {
                // Bytes nothing later can fix.
                piece.push(char::REPLACEMENT_CHARACTER);
            }
        }
        self.0 = keep;
        piece
    }
}

export!(LocalWorker);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_characters_are_held_back() {
        let mut p = Utf8Pending::default();
        let e = "é".as_bytes();
        assert_eq!(p.push(b"caf"), "caf");
        assert_eq!(p.push(&e[..1]), "");
        assert_eq!(p.push(&e[1..]), "é");
        assert_eq!(p.push(&[0xff, b'a', e[0]]), "\u{fffd}a");
        assert_eq!(p.push(&e[1..]), "é");
    }

    #[test]
    fn sampling_json_keeps_short_floats() {
        let s = Sampling {
            max_tokens: 8,
            temperature: 0.7,
            top_p: 0.9,
            seed: 1,
        };
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"max-tokens":8,"temperature":0.7,"top-p":0.9,"seed":1}"#
        );
    }
}
