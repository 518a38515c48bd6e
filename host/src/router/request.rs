//! Parse + validate, the pipeline's first step (`edgeroute_request`), with
//! llama.cpp's JSON-schema converter for the grammars of `response_format`
//! and of tool calls.

use crate::config::Limits;
pub use edgeroute_request::tools;
pub use edgeroute_request::{Invalid, InvalidKind, Prepared, strict_json};

/// Parse a chat-completions body under the node's limits.
pub fn parse(body: &[u8], limits: &Limits, id: String, created: u64) -> Result<Prepared, Invalid> {
    edgeroute_request::parse(
        body,
        limits.max_completion_tokens,
        id,
        created,
        &schema_grammar,
    )
}

/// llama.cpp's own converter from a JSON schema to a GBNF grammar.
pub fn schema_grammar(schema: &str) -> Result<String, String> {
    llama_cpp_2::json_schema_to_grammar(schema).map_err(|e| {
        tracing::info!("a JSON schema has no local grammar: {e}");
        e.to_string()
    })
}
