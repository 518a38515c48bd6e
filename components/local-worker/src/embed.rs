//! Sentence embeddings through wasi:nn, following the embedding-graph
//! convention on the `local-worker` world: one `compute` per text with
//! `text` (+ `metadata` {"cut-to"}) in, `embedding` (FP32) and `metadata`
//! out.

use super::{nn_error, u8_tensor};
use crate::exports::edgeroute::routing::embedder::{Embedding, Guest};
use crate::exports::edgeroute::routing::generator::TargetError;
use crate::wasi::nn::errors::ErrorCode;
use crate::wasi::nn::graph;
use crate::wasi::nn::inference::GraphExecutionContext;
use crate::wasi::nn::tensor::TensorType;
use serde::Deserialize;

/// The `metadata` output of an embedding graph.
#[derive(Deserialize)]
struct Said {
    tokens: u32,
    #[serde(default)]
    truncated: bool,
    /// Present, without an `embedding`, when the text did not fit.
    window: Option<u32>,
}

impl Guest for super::LocalWorker {
    fn embed(
        model: String,
        texts: Vec<String>,
        cut_to: Option<u32>,
    ) -> Result<Vec<Embedding>, TargetError> {
        let graph = graph::load_by_name(&model).map_err(|e| match e.code() {
            ErrorCode::NotFound => {
                TargetError::Unavailable(format!("embedding model '{model}' is not loaded"))
            }
            _ => nn_error("loading the embedding model", e),
        })?;
        // An encoder keeps nothing between texts: one context serves all.
        let context = graph
            .init_execution_context()
            .map_err(|e| nn_error("starting an embedding", e))?;
        texts
            .iter()
            .map(|text| embed_one(&context, text, cut_to))
            .collect()
    }
}

fn embed_one(
    context: &GraphExecutionContext,
    text: &str,
    cut_to: Option<u32>,
) -> Result<Embedding, TargetError> {
    let mut inputs = vec![("text".to_string(), u8_tensor(text.as_bytes()))];
    if let Some(n) = cut_to {
        let metadata = format!(r#"{{"cut-to":{n}}}"#);
        inputs.push(("metadata".to_string(), u8_tensor(metadata.as_bytes())));
    }
    let outputs = context
        .compute(inputs)
        .map_err(|e| nn_error("embedding", e))?;
    let mut vector = None;
    let mut said = None;
    for (name, tensor) in outputs {
        match name.as_str() {
            "embedding" => {
                if tensor.ty() != TensorType::Fp32 {
                    return Err(TargetError::Internal(format!(
                        "the backend's embedding is {:?}, not FP32",
                        tensor.ty()
                    )));
                }
                vector = Some(floats(&tensor.data())?);
            }
            "metadata" => {
                said = Some(serde_json::from_slice::<Said>(&tensor.data()).map_err(|e| {
                    TargetError::Internal(format!(
                        "the backend's metadata output is not valid: {e}"
                    ))
                })?);
            }
            // Outputs from a newer backend are not our business.
            _ => {}
        }
    }
    let said = said
        .ok_or_else(|| TargetError::Internal("the backend gave an embedding no metadata".into()))?;
    match (vector, said.window) {
        (Some(vector), _) => Ok(Embedding {
            vector,
            tokens: said.tokens,
            truncated: said.truncated,
        }),
        (None, Some(window)) => Err(TargetError::BadRequest(format!(
            "the input is {} tokens; the embedding model takes at most {window}",
            said.tokens
        ))),
        (None, None) => Err(TargetError::Internal(
            "the backend gave no embedding and no reason".into(),
        )),
    }
}

/// FP32 tensor data is little-endian bytes.
fn floats(bytes: &[u8]) -> Result<Vec<f32>, TargetError> {
    if !bytes.len().is_multiple_of(4) {
        return Err(TargetError::Internal(format!(
            "an FP32 tensor of {} bytes",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_little_endian_and_whole() {
        let bytes: Vec<u8> = [1.5f32, -0.25]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        assert_eq!(floats(&bytes).unwrap(), vec![1.5, -0.25]);
        assert!(floats(&bytes[..7]).is_err());
    }
}
