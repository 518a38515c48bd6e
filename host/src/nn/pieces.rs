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
//! Why not a crate: a fixed number of slots is all this needs. They are
//! grouped in sets of four by hash, and a miss replaces the set's least
//! recently used piece. (A first version had one slot per hash: two
//! pieces of the same chat that met in a slot pushed each other out on
//! every request, so in about one process in ten the tool description was
//! tokenized every time — seen as a features step of 150 instead of 80 µs
//! in some benchmark runs.)

use llama_cpp_2::token::LlamaToken;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Mutex;

/// Pieces longer than this are tokenized every time: a long one costs
/// memory, and a long user message rarely comes twice.
const MAX_PIECE_BYTES: usize = 16 * 1024;
/// Slots: at most 256 × 16 KiB of text (and its tokens) held.
const SLOTS: usize = 256;
/// Slots per set: a chat's few pieces rarely meet five to a set.
const WAYS: usize = 4;

struct Piece {
    scope: Box<str>,
    text: Box<str>,
    flags: (bool, bool),
    tokens: Vec<LlamaToken>,
    /// When it was last used, on the `Slots::clock`.
    used: u64,
}

struct Slots {
    pieces: Vec<Option<Piece>>,
    clock: u64,
}

pub struct Pieces<S = RandomState> {
    hasher: S,
    slots: Mutex<Slots>,
}

impl Pieces {
    pub fn new() -> Self {
        Self::with_hasher(RandomState::new())
    }
}

impl<S: BuildHasher> Pieces<S> {
    fn with_hasher(hasher: S) -> Self {
        Self {
            hasher,
            slots: Mutex::new(Slots {
                pieces: (0..SLOTS).map(|_| None).collect(),
                clock: 0,
            }),
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
        let set = self.hasher.hash_one((scope, text, flags)) as usize % (SLOTS / WAYS) * WAYS;
        let set = set..set + WAYS;
        {
            let mut slots = self.lock();
            let now = slots.tick();
            let hit = slots.pieces[set.clone()]
                .iter_mut()
                .flatten()
                .find(|piece| {
                    piece.flags == flags && *piece.text == *text && *piece.scope == *scope
                });
            if let Some(piece) = hit {
                piece.used = now;
                return piece.tokens.clone();
            }
        }
        // Tokenized outside the lock: a long piece must not hold up others.
        let tokens = tokenize();
        let mut slots = self.lock();
        let now = slots.tick();
        // An empty slot, else the least recently used.
        let victim = slots.pieces[set]
            .iter_mut()
            .min_by_key(|slot| slot.as_ref().map_or(0, |piece| piece.used + 1))
            .expect("a set has slots");
        *victim = Some(Piece {
            scope: scope.into(),
            text: text.into(),
            flags,
            tokens: tokens.clone(),
            used: now,
        });
        tokens
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Slots {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
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

    /// Every text hashes alike: one set holds them all.
    #[derive(Default)]
    struct Seven;

    impl std::hash::Hasher for Seven {
        fn finish(&self) -> u64 {
            7
        }
        fn write(&mut self, _: &[u8]) {}
    }

    #[test]
    fn pieces_that_meet_in_a_set_do_not_push_each_other_out() {
        let pieces = Pieces::with_hasher(std::hash::BuildHasherDefault::<Seven>::default());
        let calls = std::cell::Cell::new(0);
        let get = |text: &str| {
            pieces.tokens("tenant-a", text, (false, true), || {
                calls.set(calls.get() + 1);
                fake(text)
            })
        };
        // A chat's pieces, request after request.
        let chat = [
            "<|im_start|>system\n",
            "# Tools ...",
            "<|im_end|>\n",
            "Hello",
        ];
        for _ in 0..10 {
            for text in chat {
                assert_eq!(get(text), fake(text));
            }
        }
        assert_eq!(calls.get(), chat.len());
        // A fifth piece replaces the least recently used one only.
        get("<|im_start|>system\n");
        get("# Tools ...");
        get("Hello");
        get("a fifth piece");
        assert_eq!(calls.get(), chat.len() + 1);
        get("<|im_start|>system\n");
        get("# Tools ...");
        get("Hello");
        assert_eq!(calls.get(), chat.len() + 1, "the recently used stay");
        get("<|im_end|>\n");
        assert_eq!(calls.get(), chat.len() + 2, "the least recently used went");
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
