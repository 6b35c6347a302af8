//! Prompts the slots had to give up, kept in host memory (`muser serve --cache-ram`, as
//! llama-server's): when a slot takes a request whose prompt shares little with what its cache
//! holds, the cache's computed prefix is saved here first (`Session::save`); a later request
//! whose prompt shares a longer prefix with an entry than with any slot's cache takes it back
//! (`Session::restore`) instead of computing it again. A conversation that comes back after
//! more conversations than slots came between keeps its prefix.
//!
//! Entries are whole token sequences with their cache entries; one that another holds as its
//! prefix is dropped, and past the byte limit the least recently used go first.

use muser_engine::Snapshot;

struct Entry {
    tokens: Vec<u32>,
    snap: Snapshot,
    /// The engine's clock when it was stored or last taken back.
    used: u64,
}

pub struct HostCache {
    entries: Vec<Entry>,
    bytes: usize,
    limit: usize,
}

impl HostCache {
    /// A cache of at most `limit` bytes of snapshots (0: none kept).
    pub fn new(limit: usize) -> HostCache {
        HostCache {
            entries: Vec::new(),
            bytes: 0,
            limit,
        }
    }

    pub fn is_on(&self) -> bool {
        self.limit > 0
    }
    pub fn bytes(&self) -> usize {
        self.bytes
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Positions held over all entries.
    pub fn tokens(&self) -> usize {
        self.entries.iter().map(|e| e.tokens.len()).sum()
    }

    /// Whether an entry holds `tokens` (as all or the start of its sequence).
    pub fn holds(&self, tokens: &[u32]) -> bool {
        self.entries.iter().any(|e| e.tokens.starts_with(tokens))
    }

    /// The entry sharing the longest prefix with `prompt`, at most `most` positions: its index
    /// and that length (the first such entry; None while the cache is empty).
    pub fn best(&self, prompt: &[u32], most: usize) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, crate::scheduler::shared_len(&e.tokens, prompt).min(most)))
            .rev()
            .max_by_key(|&(_, n)| n)
    }

    /// Entry i's tokens and snapshot, marked used at `clock`.
    pub fn take(&mut self, i: usize, clock: u64) -> (&[u32], &Snapshot) {
        let e = &mut self.entries[i];
        e.used = clock;
        (&e.tokens, &e.snap)
    }

    /// Keeps the snapshot of `tokens` (its positions 0..tokens.len()). Entries it holds (a
    /// prefix of `tokens`) are dropped, then the least recently used others while past the
    /// limit. False, with nothing changed, for a snapshot larger than the limit.
    pub fn insert(&mut self, tokens: Vec<u32>, snap: Snapshot, clock: u64) -> bool {
        let size = snap.bytes();
        if size > self.limit {
            return false;
        }
        self.entries.retain(|e| !tokens.starts_with(&e.tokens));
        self.entries.push(Entry {
            tokens,
            snap,
            used: clock,
        });
        self.bytes = self.entries.iter().map(|e| e.snap.bytes()).sum();
        while self.bytes > self.limit {
            let (oldest, _) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.used)
                .expect("an entry while past the limit");
            let e = self.entries.remove(oldest);
            self.bytes -= e.snap.bytes();
        }
        true
    }
}
