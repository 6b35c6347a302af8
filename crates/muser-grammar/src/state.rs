//! The runtime: parse stacks, sets of them, and the steps llama.cpp takes on them.
//!
//! A parse stack is a list of element positions (top last); every stack of a state has at its
//! top a terminal (a character class or a token element) or is empty (the grammar is complete
//! along it). Stacks are hash-consed into a tree (`Cache::nodes`: position + parent), so a
//! stack is one id and sharing tails costs nothing; sets of stacks are interned too, and the
//! step "consume code point c from set S" is memoized per (S, c). Masking a vocabulary walks the
//! vocabulary's code point trie once, carrying the set reached by each prefix, and drops a whole
//! subtree as soon as its set is empty: llama.cpp's recursive candidate rejection, done on sets
//! and shared prefixes.

use crate::parse::Elem;
use crate::vocab::{Partial, Vocab};
use crate::Grammar;
use crate::Limits;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A small fast hasher for integer keys.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.hash = (self.hash.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(b));
        }
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        self.hash
    }
}

pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;

/// The empty stack's id.
pub(crate) const EMPTY: u32 = 0;
/// "No set": every stack died.
pub(crate) const DEAD: u32 = u32::MAX;
const UNKNOWN: u32 = u32::MAX - 1;

/// Work one public call may do, in units of roughly 10-25 ns each (a rule expansion plus
/// one per alternative pushed, 2 per stack node created, 2 per stack of a new set, one per 4
/// class tests, one per 8 stacks of a memoized closure reused, one per token element tested
/// or stack element interned or copied): a call that runs out stops after some tens of
/// milliseconds, having grown the cache by some tens of MB at most. Ordinary grammars need far
/// less: about 20k units for a first mask over a 202k vocabulary with a JSON grammar, at
/// most about 500k for the random grammars of llama.cpp's comparison test (4k vocabulary).
pub(crate) const WORK_BUDGET: u64 = 1 << 21;
/// Sizes past which the cache is dropped between calls.
const MAX_NODES: usize = 1 << 20;
const MAX_SETS: usize = 1 << 15;
const MAX_SET_ELEMS: usize = 1 << 20;
const MAX_MEMO: usize = 1 << 20;
const MAX_CLOSURE_ELEMS: usize = 1 << 22;
/// Uncached ASCII steps from one set before it gets its own table.
const ASCII_TABLE_AFTER: u32 = 8;

pub(crate) struct High {
    /// Interval k is [starts[k], starts[k+1]); starts[0] = 128.
    starts: Box<[u32]>,
    results: Box<[u32]>,
}

pub(crate) struct SetInfo {
    pub stacks: Box<[u32]>,
    pub has_empty: bool,
    /// Stacks whose top is a character class: (class, stack).
    pub char_tops: Box<[(u32, u32)]>,
    /// Token elements on top: (negated, token id).
    pub tok_tops: Box<[(bool, u32)]>,
    /// Memo of ASCII steps, made once the set has been stepped from often enough (sets met
    /// once in a walk use the shared map instead).
    ascii: Option<Box<[u32; 128]>>,
    ascii_misses: u32,
    /// Steps from 128 up: the classes on top split that range into intervals within which
    /// every class answers the same, so the step is one per interval.
    high: Option<Box<High>>,
    /// Which ASCII chars are known to lead back to this same set (`loop_yes`) or not, and
    /// whether every char from 128 up does (0 unknown, 1 no, 2 yes).
    loop_known: u128,
    loop_yes: u128,
    loop_non_ascii: u8,
}

/// Interned stacks and sets, and the memo of steps. Valid for one grammar.
pub(crate) struct Cache {
    nodes: Vec<(u32, u32)>,
    node_ids: HashMap<(u32, u32), u32, FxBuild>,
    pub sets: Vec<SetInfo>,
    set_ids: HashMap<Box<[u32]>, u32, FxBuild>,
    memo: HashMap<(u32, u32), u32, FxBuild>,
    seen: HashSet<u32, FxBuild>,
    todo: Vec<u32>,
    out: Vec<u32>,
    /// Stacks held by the interned sets, all together.
    set_elems: usize,
    /// Memo of closures: start stack -> its range in `closure_store`.
    closures: HashMap<u32, (u32, u32), FxBuild>,
    closure_store: Vec<u32>,
    /// `marks[s] == stamp` when stack s is in `out` already.
    marks: Vec<u32>,
    stamp: u32,
    /// Work done in the current call (reset by `begin`).
    work: u64,
    /// The work budget of one call and the most stacks one step may make.
    limits: Limits,
    /// Why the current call gave up (budget or stack limit); the results computed since are
    /// incomplete, and the cache must be reset (`end`) before being used again.
    pub failure: Option<String>,
    // Scratch for masking.
    pub allowed: Vec<u64>,
    pub depth_sets: Vec<u32>,
}

impl Cache {
    pub fn new(limits: Limits) -> Cache {
        Cache {
            nodes: vec![(u32::MAX, u32::MAX)],
            node_ids: HashMap::default(),
            sets: Vec::new(),
            set_ids: HashMap::default(),
            memo: HashMap::default(),
            seen: HashSet::default(),
            todo: Vec::new(),
            out: Vec::new(),
            set_elems: 0,
            closures: HashMap::default(),
            closure_store: Vec::new(),
            marks: Vec::new(),
            stamp: 0,
            work: 0,
            limits,
            failure: None,
            allowed: Vec::new(),
            depth_sets: Vec::new(),
        }
    }

    /// Drops everything interned if the cache grew too large (call between operations: ids
    /// from before are invalid afterwards).
    pub fn trim(&mut self) {
        if self.nodes.len() > MAX_NODES
            || self.sets.len() > MAX_SETS
            || self.set_elems > MAX_SET_ELEMS
            || self.memo.len() > MAX_MEMO
            || self.closure_store.len() > MAX_CLOSURE_ELEMS
        {
            self.reset();
        }
    }

    /// Drops everything interned and memoized (the scratch buffers stay).
    fn reset(&mut self) {
        // Fresh tables: clearing keeps their (possibly huge) capacity.
        self.nodes = vec![(u32::MAX, u32::MAX)];
        self.node_ids = HashMap::default();
        self.sets = Vec::new();
        self.set_ids = HashMap::default();
        self.memo = HashMap::default();
        self.seen = HashSet::default();
        self.todo = Vec::new();
        self.out = Vec::new();
        self.set_elems = 0;
        self.closures = HashMap::default();
        self.closure_store = Vec::new();
        self.marks = Vec::new();
    }

    /// Starts a call: a fresh work budget.
    pub fn begin(&mut self) {
        self.work = 0;
        self.failure = None;
    }

    /// A fresh work budget within a call (a failure stays).
    pub fn new_budget(&mut self) {
        self.work = 0;
    }

    /// Ends a call: why it failed, if it did (the cache is then reset, since steps computed
    /// after the failure may have been memoized incomplete).
    pub fn end(&mut self) -> Option<String> {
        let failure = self.failure.take()?;
        self.reset();
        Some(failure)
    }

    /// Counts `n` units of work; false (and the call failed) once past the budget.
    #[inline]
    pub fn charge(&mut self, n: usize) -> bool {
        self.work += n as u64;
        if self.work > self.limits.work {
            self.fail_budget();
        }
        self.failure.is_none()
    }

    #[cold]
    fn fail_budget(&mut self) {
        if self.failure.is_none() {
            self.failure = Some(format!(
                "one step needs more than {} units of work (the grammar is too ambiguous here)",
                self.limits.work
            ));
        }
    }

    #[cold]
    fn fail_stacks(&mut self, n: usize) {
        if self.failure.is_none() {
            self.failure = Some(format!(
                "one step makes {n} parse stacks, more than the limit of {} (the grammar is too ambiguous here)",
                self.limits.stacks
            ));
        }
    }

    /// The limits this cache enforces.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    #[inline]
    pub fn failed(&self) -> bool {
        self.failure.is_some()
    }

    #[inline]
    fn node(&mut self, pos: u32, parent: u32) -> u32 {
        let next = self.nodes.len() as u32;
        let id = *self.node_ids.entry((pos, parent)).or_insert(next);
        if id == next {
            self.nodes.push((pos, parent));
            // A new node is memory and a table insert: it costs more than a lookup.
            self.charge(2);
        }
        id
    }

    /// The stack `parent` with `pos` pushed, unless `pos` ends its alternative.
    #[inline]
    fn push(&mut self, g: &Grammar, pos: u32, parent: u32) -> u32 {
        if g.elems[pos as usize] == Elem::End {
            parent
        } else {
            self.node(pos, parent)
        }
    }

    fn intern_stack(&mut self, stack: &[u32]) -> u32 {
        self.charge(1 + stack.len());
        let mut id = EMPTY;
        for &p in stack {
            id = self.node(p, id);
        }
        id
    }

    fn stack_of(&self, mut id: u32) -> Vec<u32> {
        let mut out = Vec::new();
        while id != EMPTY {
            let (pos, parent) = self.nodes[id as usize];
            out.push(pos);
            id = parent;
        }
        out.reverse();
        out
    }

    /// Empties `self.out` for a new result.
    fn out_begin(&mut self) {
        self.out.clear();
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.marks.iter_mut().for_each(|m| *m = 0);
            self.stamp = 1;
        }
    }

    /// Adds stack `s` to `self.out` unless it is there already.
    #[inline]
    fn out_push(&mut self, s: u32) {
        let i = s as usize;
        if i >= self.marks.len() {
            self.marks.resize(self.nodes.len().max(i + 1), 0);
        }
        if self.marks[i] != self.stamp {
            self.marks[i] = self.stamp;
            self.out.push(s);
        }
    }

    /// Expands rule references on top of `start` until every stack has a terminal on top or is
    /// empty, adding those stacks to `self.out`.
    fn closure(&mut self, g: &Grammar, start: u32) {
        if start == EMPTY || !matches!(g.elems[self.nodes[start as usize].0 as usize], Elem::Ref(_))
        {
            self.out_push(start);
            return;
        }
        let (at, len) = match self.closures.get(&start) {
            // Sets share stacks, so the same stack is closed again and again: once is enough.
            Some(&(at, len)) => {
                if !self.charge(1 + len as usize / 8) {
                    return;
                }
                (at as usize, len as usize)
            }
            None => {
                let at = self.closure_store.len();
                if !self.closure_uncached(g, start) {
                    self.closure_store.truncate(at);
                    return;
                }
                let len = self.closure_store.len() - at;
                self.closures.insert(start, (at as u32, len as u32));
                (at, len)
            }
        };
        for k in at..at + len {
            let s = self.closure_store[k];
            self.out_push(s);
        }
    }

    /// The closure of `start`, appended to `closure_store`; false if the call failed.
    fn closure_uncached(&mut self, g: &Grammar, start: u32) -> bool {
        if self.seen.capacity() > 1 << 12 {
            // Clearing a large table costs its capacity: start small again.
            self.seen = HashSet::default();
        }
        self.seen.clear();
        self.todo.clear();
        self.todo.push(start);
        while let Some(s) = self.todo.pop() {
            if !self.seen.insert(s) {
                continue;
            }
            if s == EMPTY {
                self.closure_store.push(s);
                continue;
            }
            let (pos, parent) = self.nodes[s as usize];
            match g.elems[pos as usize] {
                Elem::Ref(r) => {
                    if !self.charge(1 + g.rule_alts[r as usize].len()) {
                        self.todo.clear();
                        return false;
                    }
                    let cont = self.push(g, pos + 1, parent);
                    for &alt in &g.rule_alts[r as usize] {
                        let next = self.push(g, alt, cont);
                        self.todo.push(next);
                    }
                }
                _ => self.closure_store.push(s),
            }
        }
        true
    }

    /// The set of the stacks in `self.out` (sorted and deduplicated), DEAD if none.
    fn take_set(&mut self, g: &Grammar) -> u32 {
        let mut out = std::mem::take(&mut self.out);
        out.sort_unstable();
        let id = if self.failed() {
            DEAD
        } else if out.len() > self.limits.stacks {
            self.fail_stacks(out.len());
            DEAD
        } else {
            self.set_of(g, &out)
        };
        out.clear();
        self.out = out;
        id
    }

    /// Interns the sorted, deduplicated list of stacks `stacks`.
    pub fn set_of(&mut self, g: &Grammar, stacks: &[u32]) -> u32 {
        if stacks.is_empty() {
            return DEAD;
        }
        if let Some(&id) = self.set_ids.get(stacks) {
            return id;
        }
        if !self.charge(2 * stacks.len()) {
            return DEAD;
        }
        self.set_elems += stacks.len();
        let mut char_tops = Vec::new();
        let mut tok_tops = Vec::new();
        let mut has_empty = false;
        for &s in stacks {
            if s == EMPTY {
                has_empty = true;
                continue;
            }
            match g.elems[self.nodes[s as usize].0 as usize] {
                Elem::Class(c) => char_tops.push((c, s)),
                Elem::Token(t) => tok_tops.push((false, t)),
                Elem::TokenNot(t) => tok_tops.push((true, t)),
                Elem::End | Elem::Ref(_) => unreachable!("stacks are closed before interning"),
            }
        }
        tok_tops.sort_unstable();
        tok_tops.dedup();
        let id = self.sets.len() as u32;
        self.sets.push(SetInfo {
            stacks: stacks.into(),
            has_empty,
            char_tops: char_tops.into(),
            tok_tops: tok_tops.into(),
            ascii: None,
            ascii_misses: 0,
            high: None,
            loop_known: 0,
            loop_yes: 0,
            loop_non_ascii: 0,
        });
        self.set_ids.insert(stacks.into(), id);
        id
    }

    /// The set of the closures of explicit stacks (a state's or the initial ones).
    pub fn closed_set(&mut self, g: &Grammar, stacks: &[Vec<u32>]) -> u32 {
        self.out_begin();
        for st in stacks {
            let id = self.intern_stack(st);
            self.closure(g, id);
            if self.failed() {
                break;
            }
        }
        self.take_set(g)
    }

    /// The set of explicit stacks that are already closed (a state's).
    pub fn state_set(&mut self, g: &Grammar, stacks: &[Vec<u32>]) -> u32 {
        let mut ids: Vec<u32> = stacks.iter().map(|s| self.intern_stack(s)).collect();
        if self.failed() {
            return DEAD;
        }
        ids.sort_unstable();
        ids.dedup();
        if ids.len() > self.limits.stacks {
            self.fail_stacks(ids.len());
            return DEAD;
        }
        self.set_of(g, &ids)
    }

    pub fn stacks_of(&mut self, set: u32) -> Vec<Vec<u32>> {
        if set == DEAD {
            return Vec::new();
        }
        let out: Vec<Vec<u32>> = self.sets[set as usize]
            .stacks
            .iter()
            .map(|&s| self.stack_of(s))
            .collect();
        self.charge(out.iter().map(|s| 1 + s.len()).sum());
        out
    }

    /// Consumes code point `c` from every stack of `set` whose top class matches it.
    #[inline]
    pub fn step(&mut self, g: &Grammar, set: u32, c: u32) -> u32 {
        if c < 128 {
            if let Some(t) = &self.sets[set as usize].ascii {
                let v = t[c as usize];
                if v != UNKNOWN {
                    return v;
                }
            }
        }
        if c >= 128 {
            return self.step_high(g, set, c);
        }
        if let Some(&v) = self.memo.get(&(set, c)) {
            return v;
        }
        let v = self.step_uncached(g, set, c);
        if self.failed() {
            return DEAD;
        }
        if c < 128 {
            let info = &mut self.sets[set as usize];
            if let Some(t) = &mut info.ascii {
                t[c as usize] = v;
                return v;
            }
            info.ascii_misses += 1;
            if info.ascii_misses >= ASCII_TABLE_AFTER {
                // A table is 512 bytes: charge it as the memo entries it stands for.
                if !self.charge(64) {
                    return DEAD;
                }
                let info = &mut self.sets[set as usize];
                let mut t = Box::new([UNKNOWN; 128]);
                t[c as usize] = v;
                info.ascii = Some(t);
                return v;
            }
        }
        self.memo.insert((set, c), v);
        v
    }

    fn step_high(&mut self, g: &Grammar, set: u32, c: u32) -> u32 {
        if self.sets[set as usize].high.is_none() {
            let cost: usize = self.sets[set as usize]
                .char_tops
                .iter()
                .map(|&(class, _)| 1 + g.classes[class as usize].norm.len())
                .sum();
            if !self.charge(cost) {
                return DEAD;
            }
            let mut starts = vec![128u32];
            for &(class, _) in self.sets[set as usize].char_tops.iter() {
                let class = &g.classes[class as usize];
                if class.any {
                    continue;
                }
                for &(a, b) in &class.norm {
                    if b >= 128 {
                        starts.push(a.max(128));
                        if b < u32::MAX {
                            starts.push(b + 1);
                        }
                    }
                }
            }
            starts.sort_unstable();
            starts.dedup();
            let results = vec![UNKNOWN; starts.len()].into_boxed_slice();
            self.sets[set as usize].high = Some(Box::new(High {
                starts: starts.into(),
                results,
            }));
        }
        let high = self.sets[set as usize].high.as_ref().expect("made above");
        let k = high.starts.partition_point(|&s| s <= c) - 1;
        let v = high.results[k];
        if v != UNKNOWN {
            return v;
        }
        let v = self.step_uncached(g, set, c);
        if self.failed() {
            return DEAD;
        }
        self.sets[set as usize]
            .high
            .as_mut()
            .expect("made above")
            .results[k] = v;
        v
    }

    fn step_uncached(&mut self, g: &Grammar, set: u32, c: u32) -> u32 {
        self.out_begin();
        let n = self.sets[set as usize].char_tops.len();
        // Testing a class is a few ns: four to a unit.
        if !self.charge(1 + n / 4) {
            return DEAD;
        }
        for i in 0..n {
            let (class, s) = self.sets[set as usize].char_tops[i];
            if g.classes[class as usize].matches(c) {
                let (pos, parent) = self.nodes[s as usize];
                let next = self.push(g, pos + 1, parent);
                self.closure(g, next);
                if self.failed() {
                    break;
                }
            }
        }
        self.take_set(g)
    }

    /// The stacks of `set` with a token element on top that matches `token`, advanced past it.
    pub fn token_step(&mut self, g: &Grammar, set: u32, token: u32) -> Vec<u32> {
        self.out_begin();
        let stacks = self.sets[set as usize].stacks.clone();
        let mut res = Vec::new();
        if !self.charge(stacks.len()) {
            return res;
        }
        for s in stacks.iter().copied() {
            if s == EMPTY {
                continue;
            }
            let (pos, parent) = self.nodes[s as usize];
            let hit = match g.elems[pos as usize] {
                Elem::Token(t) => t == token,
                Elem::TokenNot(t) => t != token,
                _ => false,
            };
            if hit {
                let next = self.push(g, pos + 1, parent);
                self.closure(g, next);
                if self.failed() {
                    break;
                }
            }
        }
        std::mem::swap(&mut res, &mut self.out);
        res
    }

    /// The stacks of `set` with a character class on top.
    pub fn char_top_stacks(&mut self, set: u32) -> Vec<u32> {
        let out: Vec<u32> = self.sets[set as usize]
            .char_tops
            .iter()
            .map(|&(_, s)| s)
            .collect();
        self.charge(out.len());
        out
    }

    /// Whether a stack of `set` with a class on top accepts the pending sequence `p`.
    pub fn partial_ok(&mut self, g: &Grammar, set: u32, p: Partial) -> bool {
        let mut cost = 0;
        let ok = self.sets[set as usize].char_tops.iter().any(|&(c, _)| {
            let class = &g.classes[c as usize];
            cost += 1 + class.raw.len() / 16;
            class.matches_partial(p)
        });
        // As in a step, four class tests to a unit.
        self.charge(1 + cost / 4) && ok
    }

    /// Whether every char in `ascii` (and, with `non_ascii`, every char from 128 up) leads from
    /// `set` back to `set`.
    fn loops_over(&mut self, g: &Grammar, set: u32, ascii: u128, non_ascii: bool) -> bool {
        let info = &self.sets[set as usize];
        if ascii & info.loop_known & !info.loop_yes != 0 || (non_ascii && info.loop_non_ascii == 1)
        {
            return false;
        }
        let mut todo = ascii & !info.loop_known;
        while todo != 0 {
            let c = todo.trailing_zeros();
            todo &= todo - 1;
            let back = self.step(g, set, c) == set;
            let info = &mut self.sets[set as usize];
            info.loop_known |= 1u128 << c;
            if back {
                info.loop_yes |= 1u128 << c;
            } else {
                return false;
            }
        }
        if non_ascii && self.sets[set as usize].loop_non_ascii == 0 {
            let uniform = self.sets[set as usize]
                .char_tops
                .iter()
                .all(|&(c, _)| g.classes[c as usize].uniform_above_ascii().is_some());
            let back = uniform && self.step(g, set, 0x80) == set;
            self.sets[set as usize].loop_non_ascii = if back { 2 } else { 1 };
        }
        !non_ascii || self.sets[set as usize].loop_non_ascii == 2
    }
}

/// Whether the token with code points `cps`, ending with pending sequence `end`, may come from
/// `set` (llama.cpp's per-token rule, on sets: a token element on top while code points remain
/// decides by the token's id; an empty stack accepts only at the very end; at the end a pending
/// sequence needs a class on top that some completion of it matches).
pub(crate) fn token_allowed(
    cache: &mut Cache,
    g: &Grammar,
    mut set: u32,
    cps: &[u32],
    end: Partial,
    id: u32,
) -> bool {
    if end.remain < 0 || set == DEAD {
        return false;
    }
    for &c in cps {
        let tops = cache.sets[set as usize].tok_tops.len();
        if tops > 0 {
            if !cache.charge(tops) {
                return false;
            }
            if tok_tops_allow(&cache.sets[set as usize].tok_tops, id) {
                return true;
            }
        }
        set = cache.step(g, set, c);
        if set == DEAD {
            return false;
        }
    }
    end.remain == 0 || cache.partial_ok(g, set, end)
}

#[inline]
fn tok_tops_allow(tops: &[(bool, u32)], id: u32) -> bool {
    tops.iter().any(|&(neg, t)| (t == id) != neg)
}

#[inline]
fn mark(allowed: &mut [u64], id: u32) {
    allowed[(id >> 6) as usize] |= 1u64 << (id & 63);
}

/// Marks in `cache.allowed` (one bit per token id, cleared by the caller) every token of the
/// trie that may come from `root` (no pending UTF-8 sequence).
pub(crate) fn mask_trie(cache: &mut Cache, g: &Grammar, vocab: &Vocab, root: u32) {
    let trie = &vocab.trie;
    let n = trie.cp.len();
    let mut allowed = std::mem::take(&mut cache.allowed);
    let mut sets = std::mem::take(&mut cache.depth_sets);
    sets.clear();
    sets.resize(trie.max_depth + 1, DEAD);
    sets[0] = root;
    let mut i = 0usize;
    while i < n {
        if cache.failed() {
            break;
        }
        let set = if i == 0 {
            root
        } else {
            let d = trie.depth[i] as usize;
            let s = cache.step(g, sets[d - 1], trie.cp[i]);
            if s == DEAD {
                i = trie.end[i] as usize;
                continue;
            }
            sets[d] = s;
            s
        };
        // Tokens ending here.
        let own_start = trie.tok_start[i] as usize;
        let own_end = own_start + trie.own[i] as usize;
        for r in own_start..own_end {
            let p = trie.end_partial[r];
            if p.remain == 0 || cache.partial_ok(g, set, p) {
                mark(&mut allowed, trie.order[r]);
            }
        }
        let below_end = trie.tok_end(i) as usize;
        if own_end == below_end {
            i = trie.end[i] as usize;
            continue;
        }
        // Token elements on top: they decide for every token with code points left.
        let n_tops = cache.sets[set as usize].tok_tops.len();
        if n_tops > 0 && !cache.charge(n_tops) {
            break;
        }
        let info = &cache.sets[set as usize];
        if n_tops > 0 {
            let mut not_value: Option<u32> = None;
            let mut all = false;
            for &(neg, t) in info.tok_tops.iter() {
                if neg {
                    match not_value {
                        Some(v) if v != t => all = true,
                        _ => not_value = Some(t),
                    }
                } else {
                    let r = vocab.rank.get(t as usize).copied().unwrap_or(u32::MAX) as usize;
                    if (own_end..below_end).contains(&r) {
                        mark(&mut allowed, t);
                    }
                }
            }
            if let Some(v) = not_value {
                let r = vocab.rank.get(v as usize).copied().unwrap_or(u32::MAX) as usize;
                let v_below = (own_end..below_end).contains(&r);
                for &t in &trie.order[own_end..below_end] {
                    if t != v || all {
                        mark(&mut allowed, t);
                    }
                }
                if all || !v_below {
                    i = trie.end[i] as usize;
                    continue;
                }
            }
        }
        // Whole subtree in a loop of this set: every token below is allowed, unless it ends
        // inside a UTF-8 sequence that no class on top takes.
        let bi = trie.below_idx[i];
        if bi != u32::MAX {
            let b = trie.below[bi as usize];
            if cache.loops_over(g, set, b.ascii, b.non_ascii) {
                for r in own_end..below_end {
                    let p = trie.end_partial[r];
                    if p.remain == 0 || (b.partial_end && cache.partial_ok(g, set, p)) {
                        mark(&mut allowed, trie.order[r]);
                    }
                }
                i = trie.end[i] as usize;
                continue;
            }
        }
        i += 1;
    }
    cache.allowed = allowed;
    cache.depth_sets = sets;
}
