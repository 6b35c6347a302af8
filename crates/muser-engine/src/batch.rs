//! Decode groups: several resident sequences (each a `Session` with its own KV cache and
//! position) advanced by one token each in one forward pass. The matmuls run over all rows at
//! once, so the weights are read once per step; RoPE, the KV store and attention run per row
//! with that row's cache and position (`graph::Rows::Group`).
//!
//! Batch invariance: every op computes a row from that row alone, with the same arithmetic in
//! the same order whatever the number of rows (the multi-column matmul kernels repeat the
//! one-column kernel's arithmetic per column), so a sequence gets the same logits, bit for bit,
//! decoded alone or beside any others. `tests/batch.rs` holds the engine to that.

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::graph::{self, Scratch};
use crate::session::{Session, PREFILL_CHUNK};

/// Prefills several sequences in one forward pass: `prompts[i]` appended to `sessions[i]`;
/// each session's `logits()` then holds its prompt's last position's logits, as after its own
/// `prefill`. The matmuls run with `Backend::exact_columns`, so each prompt gets the bits it gets
/// alone under `exact_columns` whatever it shares the pass with (and those of its own `prefill`
/// when it is shorter than `Backend::exact_prefill_rows`); RoPE, the KV store and attention run
/// per prompt as in its own pass. Together the prompts hold at most `PREFILL_CHUNK` tokens. All
/// are checked first (ids, room, one model); on an error no session has moved.
pub fn prefill_runs<B: Backend>(
    sessions: &mut [&mut Session<'_, B>],
    prompts: &[&[u32]],
) -> Result<()> {
    let n_runs = sessions.len();
    if n_runs == 0 || prompts.len() != n_runs {
        return Err(EngineError::Invalid(format!(
            "a prefill of {n_runs} sequences got {} prompts",
            prompts.len()
        )));
    }
    let total: usize = prompts.iter().map(|p| p.len()).sum();
    if total > PREFILL_CHUNK {
        return Err(EngineError::Invalid(format!(
            "a prefill of several sequences takes at most {PREFILL_CHUNK} tokens, got {total}"
        )));
    }
    let model = sessions[0].model;
    for (i, (s, p)) in sessions.iter().zip(prompts).enumerate() {
        if !std::ptr::eq(s.model, model) {
            return Err(EngineError::Invalid(format!(
                "sequence {i} of a prefill is on another model"
            )));
        }
        s.check(p)?;
    }
    let be = &model.backend;
    let tokens: Vec<u32> = prompts.iter().flat_map(|p| p.iter().copied()).collect();
    let pos0: Vec<usize> = sessions.iter().map(|s| s.pos).collect();
    let lens: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
    let mut s = Scratch::new(be, &model.config, total, n_runs);
    {
        let mut kvs: Vec<&mut B::Kv> = sessions.iter_mut().map(|s| &mut s.kv).collect();
        let rows = graph::Rows::Runs {
            kvs: &mut kvs,
            pos0: &pos0,
            lens: &lens,
        };
        be.run(|| {
            be.exact_columns(|| {
                graph::forward_rows(be, &model.config, &model.weights, &mut s, rows, &tokens)
            })
        });
    }
    let mut outs: Vec<&mut [f32]> = sessions.iter_mut().map(|s| &mut s.logits[..]).collect();
    be.read_parts(&s.logits, &mut outs);
    for (s, n) in sessions.iter_mut().zip(lens) {
        s.pos += n;
    }
    Ok(())
}

/// What a row of a decode step needs from its logits (`DecodeGroup::decode_rows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowNeed {
    /// The whole row, read into the session's `logits()`.
    Logits,
    /// The index of its first maximum.
    Argmax,
    /// Its k best-ranked (id, logit) pairs (k >= 1).
    TopK(usize),
}

/// What `decode_rows` gives a row.
#[derive(Debug, Clone, PartialEq)]
pub enum RowGot {
    /// The row is in the session's `logits()`.
    Logits,
    Argmax(u32),
    /// Best first.
    TopK(Vec<(u32, f32)>),
}

/// Scratch buffers for decode groups of every size used so far. One per model; reuse it across
/// steps.
pub struct DecodeGroup<B: Backend> {
    /// scratch[n - 1]: buffers for a group of n rows.
    scratch: Vec<Option<Scratch<B>>>,
    /// recs[n - 1]: the recorded step of scratch[n - 1] (see `Backend::decode_step`).
    recs: Vec<Option<B::Recording>>,
}

impl<B: Backend> Default for DecodeGroup<B> {
    fn default() -> Self {
        DecodeGroup {
            scratch: Vec::new(),
            recs: Vec::new(),
        }
    }
}

impl<B: Backend> DecodeGroup<B> {
    pub fn new() -> DecodeGroup<B> {
        DecodeGroup::default()
    }

    /// The forward pass of `decode`: the step's logits left in the group's scratch for n rows
    /// (returned), no session's position moved yet; `read`: the host reads some of them back.
    fn step(
        &mut self,
        sessions: &mut [&mut Session<'_, B>],
        tokens: &[u32],
        read: bool,
    ) -> Result<usize> {
        let n = sessions.len();
        if n == 0 {
            return Err(EngineError::Invalid(
                "a decode group needs a sequence".into(),
            ));
        }
        if tokens.len() != n {
            return Err(EngineError::Invalid(format!(
                "a decode group of {n} sequences got {} tokens",
                tokens.len()
            )));
        }
        let model = sessions[0].model;
        for (i, (s, &t)) in sessions.iter().zip(tokens).enumerate() {
            if !std::ptr::eq(s.model, model) {
                return Err(EngineError::Invalid(format!(
                    "sequence {i} of a decode group is on another model"
                )));
            }
            s.check(&[t])?;
        }

        if self.scratch.len() < n {
            self.scratch.resize_with(n, || None);
            self.recs.resize_with(n, || None);
        }
        let s = self.scratch[n - 1]
            .get_or_insert_with(|| Scratch::new(&model.backend, &model.config, n, n));
        let pos: Vec<usize> = sessions.iter().map(|s| s.pos).collect();
        let mut kvs: Vec<&mut B::Kv> = sessions.iter_mut().map(|s| &mut s.kv).collect();
        let be = &model.backend;
        let rec = &mut self.recs[n - 1];
        be.will_read_logits(read);
        be.run(|| {
            graph::decode_step(
                be,
                &model.config,
                &model.weights,
                s,
                rec,
                &mut kvs,
                &pos,
                tokens,
            )
        });

        Ok(n)
    }

    /// Appends tokens[i] to sessions[i], all in one forward pass; each session's `logits()` then
    /// holds its row of the step's logits. All sessions must be on the same model; token ids and
    /// context room are checked first, and on an error no session has moved.
    pub fn decode(&mut self, sessions: &mut [&mut Session<'_, B>], tokens: &[u32]) -> Result<()> {
        let n = self.step(sessions, tokens, true)?;
        let s = self.scratch[n - 1].as_ref().expect("scratch of the step");
        let model = sessions[0].model;
        let be = &model.backend;
        // Each row straight into its sequence's logits (no copy of the whole group on the host:
        // 26 MB per step at 32 sequences of a 202k vocabulary).
        let mut rows: Vec<&mut [f32]> = sessions.iter_mut().map(|s| &mut s.logits[..]).collect();
        be.read_parts(&s.logits, &mut rows);
        for s in sessions.iter_mut() {
            s.pos += 1;
        }
        Ok(())
    }

    /// `decode`, with each row's logits reduced where they are as `need[i]` asks: `Argmax` (the
    /// first maximum of the row, as `argmax_first`), `TopK(k)` (its k best-ranked (id, logit),
    /// as `muser_sample::top_k_logits`), or `Logits` (read back into the session's `logits()`,
    /// as after `decode`). A GPU then reads back an index or k pairs for those rows instead of
    /// their vocabulary; their sessions' `logits()` are not updated.
    pub fn decode_rows(
        &mut self,
        sessions: &mut [&mut Session<'_, B>],
        tokens: &[u32],
        need: &[RowNeed],
    ) -> Result<Vec<RowGot>> {
        if need.len() != sessions.len() {
            return Err(EngineError::Invalid(format!(
                "a decode group of {} sequences got {} row requests",
                sessions.len(),
                need.len()
            )));
        }
        let n = self.step(sessions, tokens, need.contains(&RowNeed::Logits))?;
        let s = self.scratch[n - 1].as_ref().expect("scratch of the step");
        let model = sessions[0].model;
        let (be, nv) = (&model.backend, model.config.n_vocab);
        let mut ids = vec![0u32; n];
        if need.contains(&RowNeed::Argmax) {
            be.argmax(&s.logits, nv, &mut ids);
        }
        let mut tops: Vec<Vec<(u32, f32)>> = vec![Vec::new(); n];
        let k_most = need
            .iter()
            .filter_map(|r| match r {
                RowNeed::TopK(k) => Some(*k),
                _ => None,
            })
            .max();
        if let Some(k) = k_most {
            be.top_k(&s.logits, nv, k, &mut tops);
        }
        let rows: Vec<usize> = (0..n).filter(|&i| need[i] == RowNeed::Logits).collect();
        if !rows.is_empty() {
            let mut outs: Vec<&mut [f32]> = sessions
                .iter_mut()
                .zip(need)
                .filter(|(_, &r)| r == RowNeed::Logits)
                .map(|(s, _)| &mut s.logits[..])
                .collect();
            be.read_rows(&s.logits, n, &rows, &mut outs);
        }
        for s in sessions.iter_mut() {
            s.pos += 1;
        }
        Ok(need
            .iter()
            .zip(ids)
            .zip(tops)
            .map(|((&r, id), mut top)| match r {
                RowNeed::Logits => RowGot::Logits,
                RowNeed::Argmax => RowGot::Argmax(id),
                RowNeed::TopK(k) => {
                    // Sorted best first: the k best of a longer list are its first k.
                    top.truncate(k);
                    RowGot::TopK(top)
                }
            })
            .collect())
    }
}
