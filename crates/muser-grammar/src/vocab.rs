//! The vocabulary as the grammar sees it: UTF-8 decoding with llama.cpp's rules and a trie of
//! every token's code points, built once, over which `mask_logits` rejects tokens in groups.

/// A UTF-8 sequence cut at the end of a token: the bits so far and the bytes still due.
/// `remain` is -1 for an invalid sequence, 0 when nothing is pending.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Partial {
    pub value: u32,
    pub remain: i32,
}

impl Partial {
    pub const NONE: Partial = Partial {
        value: 0,
        remain: 0,
    };
    pub const INVALID: Partial = Partial {
        value: 0,
        remain: -1,
    };
}

/// Decodes `bytes` (already cut at a NUL) after the pending sequence `start`, pushing whole code
/// points to `out`; returns what is pending at the end. llama.cpp's rules: the bytes completing
/// a sequence begun in an earlier token must be continuation bytes, or the whole token is
/// invalid (no code points); a continuation byte where a sequence should start is invalid too;
/// within one token the bytes after a lead byte are taken as continuations unchecked, and lead
/// bytes 0xF8-0xFF count as 4-byte leads.
pub(crate) fn decode(bytes: &[u8], start: Partial, out: &mut Vec<u32>) -> Partial {
    out.clear();
    let mut i = 0;
    let mut value = start.value;
    let mut remain = start.remain;
    if start.remain > 0 {
        while i < bytes.len() && remain > 0 {
            let b = bytes[i];
            if b >> 6 != 2 {
                return Partial::INVALID;
            }
            value = (value << 6) | (b & 0x3f) as u32;
            i += 1;
            remain -= 1;
        }
        if remain > 0 {
            return Partial { value, remain };
        }
        out.push(value);
    }
    remain = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let len: i32 = match b >> 4 {
            0..=7 => 1,
            8..=11 => 0,
            12 | 13 => 2,
            14 => 3,
            _ => 4,
        };
        if len == 0 {
            out.clear();
            return Partial::INVALID;
        }
        remain = len - 1;
        value = (b & ((1u8 << (7 - remain)) - 1)) as u32;
        i += 1;
        while i < bytes.len() && remain > 0 {
            value = (value << 6) | (bytes[i] & 0x3f) as u32;
            i += 1;
            remain -= 1;
        }
        if remain == 0 {
            out.push(value);
        }
    }
    if remain == 0 {
        Partial::NONE
    } else {
        Partial { value, remain }
    }
}

/// The bytes of a piece as the grammar reads them: up to the first NUL.
#[inline]
pub(crate) fn cut_at_nul(piece: &[u8]) -> &[u8] {
    &piece[..piece.iter().position(|&b| b == 0).unwrap_or(piece.len())]
}

/// How a token stands regardless of the grammar.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// Decodes from a clean start; lives in the trie.
    Normal,
    /// Ends generation.
    Eog,
    /// Empty piece or first byte NUL: never allowed.
    Never,
    /// Invalid UTF-8 from a clean start (it may still continue a pending sequence).
    Invalid,
}

/// The trie of code point sequences, nodes in preorder. Node 0 is the root (the empty prefix).
/// Tokens are numbered by rank in preorder too, so a node's tokens form a range: those ending at
/// the node first, then those below it.
pub(crate) struct Trie {
    pub cp: Vec<u32>,
    pub depth: Vec<u32>,
    /// One past the last node of the subtree.
    pub end: Vec<u32>,
    /// Rank of the first token at or below the node.
    pub tok_start: Vec<u32>,
    /// How many tokens end exactly at the node.
    pub own: Vec<u32>,
    /// Summary of what lies strictly below a node with a large subtree (index into `below`),
    /// u32::MAX for small subtrees.
    pub below_idx: Vec<u32>,
    pub below: Vec<Below>,
    /// Token id by rank, and the pending UTF-8 sequence each ends with.
    pub order: Vec<u32>,
    pub end_partial: Vec<Partial>,
    pub max_depth: usize,
}

/// What the edges and token ends strictly below a node hold.
#[derive(Clone, Copy, Default)]
pub(crate) struct Below {
    pub ascii: u128,
    pub non_ascii: bool,
    pub partial_end: bool,
}

impl Trie {
    #[inline]
    pub fn tok_end(&self, node: usize) -> u32 {
        let e = self.end[node] as usize;
        if e < self.cp.len() {
            self.tok_start[e]
        } else {
            self.order.len() as u32
        }
    }
}

/// Subtrees at least this large get a summary for the whole-subtree shortcut.
const BELOW_MIN: u32 = 16;

/// A token vocabulary as the grammar sees it: each id's bytes (what the token detokenizes to,
/// special tokens rendered as their text) and whether it ends generation (EOG).
///
/// Building one decodes every token and builds a trie of their code points (a few hundred
/// milliseconds and some tens of MB for a 200k vocabulary): build it once per model and share
/// it (`Vocab` is `Send + Sync`).
pub struct Vocab {
    pub(crate) bytes: Vec<u8>,
    pub(crate) offs: Vec<u32>,
    pub(crate) eog: Vec<bool>,
    pub(crate) kind: Vec<Kind>,
    pub(crate) eog_ids: Vec<u32>,
    /// Tokens (not EOG, not Never) whose first byte is a continuation byte: the only ones that
    /// can follow a token ending inside a UTF-8 sequence.
    pub(crate) cont_start: Vec<u32>,
    /// Rank in the trie by id (u32::MAX when not in the trie).
    pub(crate) rank: Vec<u32>,
    pub(crate) trie: Trie,
}

impl Vocab {
    /// `pieces[i]` is token i's bytes, `eog[i]` whether it ends generation (missing entries of
    /// `eog` count as false, extra ones are ignored).
    pub fn new(pieces: Vec<Vec<u8>>, eog: Vec<bool>) -> Vocab {
        let n = pieces.len();
        let mut eog_flags = eog;
        eog_flags.resize(n, false);
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        let mut bytes = Vec::with_capacity(total);
        let mut offs = Vec::with_capacity(n + 1);
        offs.push(0u32);
        for p in &pieces {
            bytes.extend_from_slice(p);
            offs.push(bytes.len() as u32);
        }
        drop(pieces);
        let mut kind = Vec::with_capacity(n);
        let mut eog_ids = Vec::new();
        let mut cont_start = Vec::new();
        let mut flat: Vec<u32> = Vec::with_capacity(total);
        let mut spans: Vec<(u32, u32, Partial, u32)> = Vec::with_capacity(n);
        let mut cps = Vec::new();
        for id in 0..n {
            let piece = &bytes[offs[id] as usize..offs[id + 1] as usize];
            if eog_flags[id] {
                kind.push(Kind::Eog);
                eog_ids.push(id as u32);
                continue;
            }
            if piece.first().is_none_or(|&b| b == 0) {
                kind.push(Kind::Never);
                continue;
            }
            let piece = cut_at_nul(piece);
            if piece[0] >> 6 == 2 {
                cont_start.push(id as u32);
            }
            let end = decode(piece, Partial::NONE, &mut cps);
            if end.remain < 0 {
                kind.push(Kind::Invalid);
                continue;
            }
            kind.push(Kind::Normal);
            let start = flat.len() as u32;
            flat.extend_from_slice(&cps);
            spans.push((start, flat.len() as u32, end, id as u32));
        }
        let seq = |s: &(u32, u32, Partial, u32)| &flat[s.0 as usize..s.1 as usize];
        spans.sort_unstable_by(|a, b| seq(a).cmp(seq(b)).then(a.3.cmp(&b.3)));

        let mut trie = Trie {
            cp: vec![0],
            depth: vec![0],
            end: vec![0],
            tok_start: vec![0],
            own: vec![0],
            below_idx: Vec::new(),
            below: Vec::new(),
            order: Vec::with_capacity(spans.len()),
            end_partial: Vec::with_capacity(spans.len()),
            max_depth: 0,
        };
        let mut path: Vec<u32> = vec![0];
        let mut prev: &[u32] = &[];
        for (r, s) in spans.iter().enumerate() {
            let c = seq(s);
            let lcp = prev.iter().zip(c).take_while(|(a, b)| a == b).count();
            while path.len() - 1 > lcp {
                let node = path.pop().expect("path") as usize;
                trie.end[node] = trie.cp.len() as u32;
            }
            for (k, &cp) in c.iter().enumerate().skip(lcp) {
                let node = trie.cp.len() as u32;
                trie.cp.push(cp);
                trie.depth.push(k as u32 + 1);
                trie.end.push(0);
                trie.tok_start.push(r as u32);
                trie.own.push(0);
                path.push(node);
            }
            trie.max_depth = trie.max_depth.max(c.len());
            trie.own[*path.last().expect("path") as usize] += 1;
            trie.order.push(s.3);
            trie.end_partial.push(s.2);
            prev = c;
        }
        for &node in &path {
            trie.end[node as usize] = trie.cp.len() as u32;
        }
        // Summaries of large subtrees, children before parents (reverse preorder).
        let nodes = trie.cp.len();
        trie.below_idx = vec![u32::MAX; nodes];
        let mut acc: Vec<Below> = vec![Below::default(); nodes];
        for node in (0..nodes).rev() {
            // Add the node's own tokens' partial ends and its edge into its parent's summary:
            // done by walking children, below.
            let mut b = Below::default();
            let mut child = node + 1;
            let end = trie.end[node] as usize;
            while child < end {
                let c = trie.cp[child];
                if c < 128 {
                    b.ascii |= 1u128 << c;
                } else {
                    b.non_ascii = true;
                }
                let own_start = trie.tok_start[child] as usize;
                let own_end = own_start + trie.own[child] as usize;
                if trie.end_partial[own_start..own_end]
                    .iter()
                    .any(|p| p.remain != 0)
                {
                    b.partial_end = true;
                }
                let cb = acc[child];
                b.ascii |= cb.ascii;
                b.non_ascii |= cb.non_ascii;
                b.partial_end |= cb.partial_end;
                child = trie.end[child] as usize;
            }
            acc[node] = b;
            if trie.end[node] - node as u32 >= BELOW_MIN {
                trie.below_idx[node] = trie.below.len() as u32;
                trie.below.push(b);
            }
        }
        let mut rank = vec![u32::MAX; n];
        for (r, &id) in trie.order.iter().enumerate() {
            rank[id as usize] = r as u32;
        }
        Vocab {
            bytes,
            offs,
            eog: eog_flags,
            kind,
            eog_ids,
            cont_start,
            rank,
            trie,
        }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.kind.len()
    }

    /// Whether there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.kind.is_empty()
    }

    /// Token `id`'s bytes.
    pub fn piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i >= self.len() {
            return &[];
        }
        &self.bytes[self.offs[i] as usize..self.offs[i + 1] as usize]
    }

    /// Whether token `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.get(id as usize).copied().unwrap_or(false)
    }

    /// Number of nodes of the code point trie (for sizing and benchmarks).
    pub fn trie_nodes(&self) -> usize {
        self.trie.cp.len()
    }
}
