//! Prefix reuse: a finished generation's sequence stays in the batch
//! scheduler's KV cache, with the tokens whose state it holds, and a later
//! request whose prompt starts with those tokens continues from them
//! instead of prefilling again. An agent's 9th call then prefills only what
//! the 8th did not.
//!
//! Idle sequences are bounded in number here and in tokens by the
//! scheduler's KV budget; the least recently used goes first. A cached context is reused only by a request at the same
//! or a more restrictive sensitivity level: a public request must not be
//! able to learn, even from its own latency, that a restricted prompt
//! started the way its own does.

use edgeroute_core::Sensitivity;
use llama_cpp_2::token::LlamaToken;

/// Who may reuse what a generation leaves in the cache.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheScope {
    /// The request's sensitivity: the level its cache entry is tagged with.
    pub level: Sensitivity,
    /// `x-edgeroute-session`: prefer this session's own entry.
    pub session: Option<String>,
    /// The client's tenant: an entry is reused only within its tenant, so
    /// one client cannot learn (from the reused-token count, or the
    /// latency) how another's prompt begins, nor evict its session.
    pub tenant: String,
}

/// A finished sequence between generations (`C` is its llama.cpp
/// sequence id; the selection logic does not need one, so its tests use
/// `()`).
pub(super) struct Idle<C> {
    pub context: C,
    /// The tokens whose KV state the sequence holds, in order from position 0.
    pub tokens: Vec<LlamaToken>,
    pub scope: CacheScope,
    last_used: u64,
}

impl<C> Idle<C> {
    pub fn new(context: C, tokens: Vec<LlamaToken>, scope: CacheScope) -> Self {
        Idle {
            context,
            tokens,
            scope,
            last_used: 0,
        }
    }
}

pub(super) struct PrefixCache<C> {
    entries: Vec<Idle<C>>,
    capacity: usize,
    clock: u64,
}

/// How many leading tokens two sequences share.
pub fn common_prefix(a: &[LlamaToken], b: &[LlamaToken]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<C> PrefixCache<C> {
    pub fn new(capacity: usize) -> Self {
        PrefixCache {
            entries: Vec::new(),
            capacity,
            clock: 0,
        }
    }

    /// The entry `scope` may reuse that shares the most leading tokens
    /// with `tokens` (its own session's entry first), and how many.
    fn best(&self, tokens: &[LlamaToken], scope: &CacheScope) -> Option<(usize, usize)> {
        let allowed = |e: &Idle<C>| e.scope.level <= scope.level && e.scope.tenant == scope.tenant;
        let matching = |i: usize| (i, common_prefix(&self.entries[i].tokens, tokens));
        if let Some(session) = &scope.session
            && let Some(i) = self
                .entries
                .iter()
                .position(|e| allowed(e) && e.scope.session.as_ref() == Some(session))
        {
            return Some(matching(i)).filter(|(_, n)| *n > 0);
        }
        (0..self.entries.len())
            .filter(|&i| allowed(&self.entries[i]))
            .map(matching)
            .filter(|(_, n)| *n > 0)
            .max_by_key(|&(i, n)| (n, self.entries[i].last_used))
    }

    /// Tokens a request would reuse now (for the policy's features).
    pub fn peek(&self, tokens: &[LlamaToken], scope: &CacheScope) -> usize {
        self.best(tokens, scope).map_or(0, |(_, n)| n)
    }

    /// Take the best entry out for a generation, with its shared prefix.
    pub fn take(&mut self, tokens: &[LlamaToken], scope: &CacheScope) -> Option<(Idle<C>, usize)> {
        let (i, n) = self.best(tokens, scope)?;
        Some((self.entries.swap_remove(i), n))
    }

    /// Keep a finished sequence; beyond the capacity the least recently
    /// used entry goes. Returns the entries dropped, whose state the caller
    /// frees.
    pub fn put(&mut self, mut idle: Idle<C>) -> Vec<Idle<C>> {
        if self.capacity == 0 {
            return vec![idle];
        }
        self.clock += 1;
        idle.last_used = self.clock;
        let mut dropped = Vec::new();
        // One entry per session: the newer one holds the longer history.
        if let Some(session) = &idle.scope.session {
            let tenant = &idle.scope.tenant;
            let older = |e: &Idle<C>| {
                e.scope.session.as_ref() == Some(session) && &e.scope.tenant == tenant
            };
            while let Some(i) = self.entries.iter().position(older) {
                dropped.push(self.entries.swap_remove(i));
            }
        }
        self.entries.push(idle);
        while self.entries.len() > self.capacity {
            dropped.extend(self.evict_oldest());
        }
        dropped
    }

    /// Drop the least recently used entry, to make room.
    pub fn evict_oldest(&mut self) -> Option<Idle<C>> {
        let oldest = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used)?;
        Some(self.entries.swap_remove(oldest))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// KV cells the entries hold.
    pub fn tokens(&self) -> usize {
        self.entries.iter().map(|e| e.tokens.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ids: &[i32]) -> Vec<LlamaToken> {
        ids.iter().map(|&i| LlamaToken(i)).collect()
    }

    fn scope(level: Sensitivity, session: Option<&str>) -> CacheScope {
        CacheScope {
            level,
            session: session.map(str::to_string),
            tenant: "a".into(),
        }
    }

    #[test]
    fn another_tenant_neither_reuses_nor_evicts_an_entry() {
        let mut cache = PrefixCache::new(4);
        let a = scope(Sensitivity::Public, Some("s"));
        let b = CacheScope {
            tenant: "b".into(),
            ..a.clone()
        };
        cache.put(Idle::new((), t(&[1, 2, 3, 4]), a.clone()));
        assert_eq!(cache.peek(&t(&[1, 2, 3, 4, 5]), &b), 0);
        // B's own session of the same name leaves A's entry in place.
        cache.put(Idle::new((), t(&[7, 8]), b.clone()));
        assert_eq!(cache.peek(&t(&[1, 2, 3, 4, 5]), &a), 4);
        assert_eq!(cache.peek(&t(&[7, 8, 9]), &b), 2);
    }

    #[test]
    fn the_longest_shared_prefix_wins() {
        let mut cache = PrefixCache::new(4);
        let public = scope(Sensitivity::Public, None);
        cache.put(Idle::new((), t(&[1, 2, 3]), public.clone()));
        cache.put(Idle::new((), t(&[1, 2, 3, 4, 5]), public.clone()));
        cache.put(Idle::new((), t(&[9]), public.clone()));
        assert_eq!(cache.peek(&t(&[1, 2, 3, 4, 6]), &public), 4);
        assert_eq!(cache.peek(&t(&[7]), &public), 0);
        let (idle, n) = cache.take(&t(&[1, 2, 3, 4, 6]), &public).unwrap();
        assert_eq!((idle.tokens.len(), n), (5, 4));
        assert_eq!(cache.len(), 2);
        assert!(cache.take(&t(&[7]), &public).is_none());
    }

    #[test]
    fn a_restricted_prefix_is_never_reused_below_its_level() {
        let mut cache = PrefixCache::new(4);
        cache.put(Idle::new(
            (),
            t(&[1, 2, 3]),
            scope(Sensitivity::Restricted, None),
        ));
        assert_eq!(
            cache.peek(&t(&[1, 2, 3]), &scope(Sensitivity::Public, None)),
            0
        );
        assert_eq!(
            cache.peek(&t(&[1, 2, 3]), &scope(Sensitivity::Internal, None)),
            0
        );
        assert!(
            cache
                .take(&t(&[1, 2, 3]), &scope(Sensitivity::Public, None))
                .is_none()
        );
        // A public prefix may serve a restricted request.
        cache.put(Idle::new((), t(&[5, 6]), scope(Sensitivity::Public, None)));
        assert_eq!(
            cache.peek(&t(&[5, 6, 7]), &scope(Sensitivity::Restricted, None)),
            2
        );
    }

    #[test]
    fn sessions_are_pinned_and_the_least_recently_used_goes() {
        let mut cache = PrefixCache::new(2);
        let a = scope(Sensitivity::Public, Some("a"));
        cache.put(Idle::new((), t(&[1, 2]), a.clone()));
        cache.put(Idle::new(
            (),
            t(&[1, 2, 3, 4]),
            scope(Sensitivity::Public, None),
        ));
        // Session a gets its own entry although another shares more.
        assert_eq!(cache.peek(&t(&[1, 2, 3, 4]), &a), 2);
        // A session keeps one entry: the newer replaces the older.
        cache.put(Idle::new((), t(&[1, 2, 8]), a.clone()));
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.peek(&t(&[1, 2, 8, 9]), &a), 3);
        // Full: the least recently used (the sessionless one) is evicted
        // and handed back, so its KV state can be freed.
        let dropped = cache.put(Idle::new((), t(&[7]), scope(Sensitivity::Public, None)));
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].tokens, t(&[1, 2, 3, 4]));
        assert_eq!((cache.len(), cache.tokens()), (2, 4));
        assert_eq!(
            cache.peek(&t(&[1, 2, 3, 4]), &scope(Sensitivity::Public, None)),
            2
        );
        // Capacity 0 keeps nothing, and hands the entry back to be freed.
        let mut off = PrefixCache::new(0);
        assert_eq!(off.put(Idle::new((), t(&[1]), a)).len(), 1);
        assert_eq!(off.len(), 0);
    }

    #[test]
    fn common_prefix_counts_leading_equal_tokens() {
        assert_eq!(common_prefix(&t(&[1, 2, 3]), &t(&[1, 2, 4, 5])), 2);
        assert_eq!(common_prefix(&t(&[1, 2]), &t(&[1, 2, 3])), 2);
        assert_eq!(common_prefix(&t(&[]), &t(&[1])), 0);
    }
}
