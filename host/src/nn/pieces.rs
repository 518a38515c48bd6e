//! Tokens of the pieces of a chat, remembered. An agent sends the same
//! system prompt and tool descriptions on every call, and llama.cpp's BPE
//! tokenizer takes about 2 µs a token here: 300 µs of every request for a
//! 150-token tool description, which is most of the node's own time on a
//! cloud call. A piece is a message's text or the template's text between
//! messages; a hit returns exactly the tokens the tokenizer gave for the
//! same text and flags (the text is compared, not only its hash).
//!
//! Pieces are kept per tenant and sensitivity level, like the prefix
//! cache: a hit is faster, and one client must not learn from the latency
//! which texts another sent, nor a public request what a restricted one
//! did. (The slots are shared, so one tenant's pieces can push out
//! another's: that costs the other a tokenization, and tells it only
//! that the node is busy.)
//!
//! Why not a crate: a fixed number of slots by hash, replaced on
//! collision, is all this needs (no recency order); an LRU crate would
//! add a dependency for the same bound.

use llama_cpp_2::token::LlamaToken;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Mutex;

/// Pieces longer than this are tokenized every time: a long one costs
/// memory, and a long user message rarely comes twice.
const MAX_PIECE_BYTES: usize = 16 * 1024;
/// Slots: at most 256 × 16 KiB of text (and its tokens) held.
const SLOTS: usize = 256;

struct Piece {
    scope: Box<str>,
    text: Box<str>,
    flags: (bool, bool),
    tokens: Vec<LlamaToken>,
}

pub struct Pieces {
    hasher: RandomState,
    slots: Mutex<Vec<Option<Piece>>>,
}

impl Pieces {
    pub fn new() -> Self {
        Self {
            hasher: RandomState::new(),
            slots: Mutex::new((0..SLOTS).map(|_| None).collect()),
        }
    }

    /// `text`'s tokens under these flags (`add_special`, `parse_special`)
    /// for this scope (a tenant and level), from `tokenize` the first time.
    pub fn tokens(
        &self,
        scope: &str,
        text: &str,
        flags: (bool, bool),
        tokenize: impl FnOnce() -> Vec<LlamaToken>,
    ) -> Vec<LlamaToken> {
        if text.len() > MAX_PIECE_BYTES {
            return tokenize();
        }
        let slot = self.hasher.hash_one((scope, text, flags)) as usize % SLOTS;
        {
            let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(piece) = &slots[slot]
                && piece.flags == flags
                && *piece.text == *text
                && *piece.scope == *scope
            {
                return piece.tokens.clone();
            }
        }
        // Tokenized outside the lock: a long piece must not hold up others.
        let tokens = tokenize();
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots[slot] = Some(Piece {
            scope: scope.into(),
            text: text.into(),
            flags,
            tokens: tokens.clone(),
        });
        tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(text: &str) -> Vec<LlamaToken> {
        text.bytes().map(|b| LlamaToken(b as i32)).collect()
    }

    #[test]
    fn a_piece_is_tokenized_once_per_text_and_flags() {
        let pieces = Pieces::new();
        let calls = std::cell::Cell::new(0);
        let get = |text: &str, flags| {
            pieces.tokens("tenant-a", text, flags, || {
                calls.set(calls.get() + 1);
                fake(text)
            })
        };
        assert_eq!(get("system prompt", (false, true)), fake("system prompt"));
        assert_eq!(get("system prompt", (false, true)), fake("system prompt"));
        assert_eq!(calls.get(), 1);
        // Other flags or other text: tokenized again, never the cached one.
        assert_eq!(get("system prompt", (false, false)), fake("system prompt"));
        assert_eq!(get("system prompt!", (false, true)), fake("system prompt!"));
        assert_eq!(calls.get(), 3);
        // Another tenant's identical text is its own entry.
        pieces.tokens("tenant-b", "system prompt", (false, true), || {
            calls.set(calls.get() + 1);
            fake("system prompt")
        });
        assert_eq!(calls.get(), 4);
    }

    #[test]
    fn long_pieces_are_not_kept() {
        let pieces = Pieces::new();
        let long = "x".repeat(MAX_PIECE_BYTES + 1);
        let mut calls = 0;
        for _ in 0..2 {
            pieces.tokens("tenant-a", &long, (false, false), || {
                calls += 1;
                Vec::new()
            });
        }
        assert_eq!(calls, 2);
    }
}
