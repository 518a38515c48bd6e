//! Work on a text, remembered per scope: a result that is a pure function
//! of the text (and a few flags) is computed once and returned again for
//! the same text in the same scope. The text is compared, not only its
//! hash. Two users:
//!
//! - the tokens of a chat's pieces (`nn::engine`): an agent sends the same
//!   system prompt and tool descriptions on every call, and llama.cpp's BPE
//!   tokenizer takes about 2 µs a token here (300 µs for a 150-token tool
//!   description). A piece is a message's text or the template's text
//!   between messages.
//! - what detection finds in each text alone (`router::features`): an
//!   agent's six tool schemas are about a hundred short strings, each run
//!   through every rule and the classifier (300 µs a request).
//!
//! Entries are kept per scope (a tenant and a level), like the prefix
//! cache: a hit is faster, and one client must not learn from the latency
//! which texts another sent, nor a public request what a restricted one
//! did. (The slots are shared, so one tenant's entries can push out
//! another's: that costs the other the work again, and tells it only
//! that the node is busy.)
//!
//! Why not a crate: a fixed number of slots is all this needs. They are
//! grouped in sets of four by hash, and a miss replaces the set's least
//! recently used entry. (A first version had one slot per hash: two
//! pieces of the same chat that met in a slot pushed each other out on
//! every request, so in about one process in ten the tool description was
//! tokenized every time — seen as a features step of 150 instead of 80 µs
//! in some benchmark runs.)

use edgeroute_core::Sensitivity;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};
use std::sync::Mutex;

/// The scope of a tenant's texts at a level. (Tenant names are letters,
/// digits, `-` and `_`: the separator cannot be part of one.)
pub fn scope(tenant: &str, level: Sensitivity) -> String {
    format!("{tenant}\u{1f}{}", level.name())
}

/// Slots per set: a chat's few pieces rarely meet five to a set.
const WAYS: usize = 4;

struct Entry<F, V> {
    scope: Box<str>,
    text: Box<str>,
    flags: F,
    value: V,
    /// When it was last used, on the `Slots::clock`.
    used: u64,
}

struct Slots<F, V> {
    entries: Vec<Option<Entry<F, V>>>,
    clock: u64,
}

/// Remembered results of type `V` for texts under flags `F`.
pub struct Memo<F, V, S = RandomState> {
    hasher: S,
    /// Texts longer than this are worked on every time: a long one costs
    /// memory, and a long user message rarely comes twice.
    max_text_bytes: usize,
    /// Sets of `WAYS` slots.
    sets: usize,
    slots: Mutex<Slots<F, V>>,
}

impl<F, V> Memo<F, V> {
    /// `slots` entries at most (rounded up to a multiple of four), of texts
    /// up to `max_text_bytes` each.
    pub fn new(slots: usize, max_text_bytes: usize) -> Self {
        Self::with_hasher(RandomState::new(), slots, max_text_bytes)
    }
}

impl<F, V, S> Memo<F, V, S> {
    fn with_hasher(hasher: S, slots: usize, max_text_bytes: usize) -> Self {
        let sets = slots.div_ceil(WAYS).max(1);
        Self {
            hasher,
            max_text_bytes,
            sets,
            slots: Mutex::new(Slots {
                entries: (0..sets * WAYS).map(|_| None).collect(),
                clock: 0,
            }),
        }
    }
}

impl<F: Hash + Eq + Copy, V: Clone, S: BuildHasher> Memo<F, V, S> {
    /// The value for `text` under `flags` in `scope` (a tenant and level):
    /// from `work` the first time, and kept when `keep` says so.
    pub fn get(
        &self,
        scope: &str,
        text: &str,
        flags: F,
        work: impl FnOnce() -> V,
        keep: impl FnOnce(&V) -> bool,
    ) -> V {
        if let Some(value) = self.lookup(scope, text, flags) {
            return value;
        }
        // Worked on outside the lock: a long text must not hold up others.
        let value = work();
        if keep(&value) {
            self.insert(scope, text, flags, value.clone());
        }
        value
    }

    /// The value kept for `text` under `flags` in `scope`, if any.
    pub fn lookup(&self, scope: &str, text: &str, flags: F) -> Option<V> {
        if text.len() > self.max_text_bytes {
            return None;
        }
        let set = self.set(scope, text, flags);
        let mut slots = self.lock();
        let now = slots.tick();
        let entry = slots.entries[set]
            .iter_mut()
            .flatten()
            .find(|e| e.flags == flags && *e.text == *text && *e.scope == *scope)?;
        entry.used = now;
        Some(entry.value.clone())
    }

    /// Keep `value` for `text` under `flags` in `scope` (a text over the
    /// size limit is not kept), in place of what its set used least
    /// recently.
    pub fn insert(&self, scope: &str, text: &str, flags: F, value: V) {
        if text.len() > self.max_text_bytes {
            return;
        }
        let set = self.set(scope, text, flags);
        let mut slots = self.lock();
        let now = slots.tick();
        let set = &mut slots.entries[set];
        // The same key (another request worked on it meanwhile), else an
        // empty slot, else the least recently used.
        let same = set.iter().position(|slot| {
            slot.as_ref()
                .is_some_and(|e| e.flags == flags && *e.text == *text && *e.scope == *scope)
        });
        let victim = match same {
            Some(i) => &mut set[i],
            None => set
                .iter_mut()
                .min_by_key(|slot| slot.as_ref().map_or(0, |e| e.used + 1))
                .expect("a set has slots"),
        };
        *victim = Some(Entry {
            scope: scope.into(),
            text: text.into(),
            flags,
            value,
            used: now,
        });
    }

    fn set(&self, scope: &str, text: &str, flags: F) -> std::ops::Range<usize> {
        let first = self.hasher.hash_one((scope, text, flags)) as usize % self.sets * WAYS;
        first..first + WAYS
    }

    /// Entries held (tests).
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.lock().entries.iter().flatten().count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots<F, V>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<F, V> Slots<F, V> {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memo of texts' lengths, with the number of times it did the work.
    fn counted<S: BuildHasher>(
        memo: &Memo<bool, usize, S>,
        calls: &std::cell::Cell<usize>,
        scope: &str,
        text: &str,
        flag: bool,
    ) -> usize {
        memo.get(
            scope,
            text,
            flag,
            || {
                calls.set(calls.get() + 1);
                text.len()
            },
            |_| true,
        )
    }

    #[test]
    fn a_text_is_worked_on_once_per_scope_and_flags() {
        let memo = Memo::new(256, 1024);
        let calls = std::cell::Cell::new(0);
        let get = |scope: &str, text: &str, flag| counted(&memo, &calls, scope, text, flag);
        assert_eq!(get("tenant-a", "system prompt", true), 13);
        assert_eq!(get("tenant-a", "system prompt", true), 13);
        assert_eq!(calls.get(), 1);
        // Other flags or other text: worked on again, never the kept one.
        assert_eq!(get("tenant-a", "system prompt", false), 13);
        assert_eq!(get("tenant-a", "system prompt!", true), 14);
        assert_eq!(calls.get(), 3);
        // Another tenant's identical text is its own entry.
        get("tenant-b", "system prompt", true);
        assert_eq!(calls.get(), 4);
    }

    #[test]
    fn a_value_keep_refuses_is_worked_on_every_time() {
        let memo: Memo<(), usize> = Memo::new(256, 1024);
        let mut calls = 0;
        for _ in 0..3 {
            memo.get(
                "t",
                "4111 1111 1111 1111",
                (),
                || {
                    calls += 1;
                    1
                },
                |&findings| findings == 0,
            );
        }
        assert_eq!(calls, 3);
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
    fn texts_that_meet_in_a_set_do_not_push_each_other_out() {
        let memo = Memo::with_hasher(std::hash::BuildHasherDefault::<Seven>::default(), 256, 1024);
        let calls = std::cell::Cell::new(0);
        let get = |text: &str| counted(&memo, &calls, "tenant-a", text, true);
        // A chat's pieces, request after request.
        let chat = [
            "<|im_start|>system\n",
            "# Tools ...",
            "<|im_end|>\n",
            "Hello",
        ];
        for _ in 0..10 {
            for text in chat {
                assert_eq!(get(text), text.len());
            }
        }
        assert_eq!(calls.get(), chat.len());
        // A fifth text replaces the least recently used one only.
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
    fn long_texts_are_not_kept() {
        let memo = Memo::new(256, 1024);
        let calls = std::cell::Cell::new(0);
        let long = "x".repeat(1025);
        for _ in 0..2 {
            counted(&memo, &calls, "tenant-a", &long, false);
        }
        assert_eq!(calls.get(), 2);
    }
}
