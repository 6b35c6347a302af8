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
use crate::session::Session;

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
    /// (returned), no session's position moved yet.
    fn step(&mut self, sessions: &mut [&mut Session<'_, B>], tokens: &[u32]) -> Result<usize> {
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
        let n = self.step(sessions, tokens)?;
        let s = self.scratch[n - 1].as_ref().expect("scratch of the step");
        let model = sessions[0].model;
        let be = &model.backend;
        // Each row straight into its sequence's logits (no copy of the whole group on the host:
        // 26 MB per step at 32 sequences of a 202k vocabulary).
        let mut rows: Vec<&mut [f32]> = sessions
            .iter_mut()
            .map(|s| s.logits.as_mut_slice())
            .collect();
        be.read_parts(&s.logits, &mut rows);
        for s in sessions.iter_mut() {
            s.pos += 1;
        }
        Ok(())
    }

    /// `decode`, with the next token of each row where `greedy[i]` picked where the logits are
    /// (the first maximum of the row, as `argmax_first`): a GPU reads back one index for those
    /// rows instead of their vocabulary. Returns `Some(pick)` for those rows and `None` for the
    /// others, whose sessions' `logits()` hold their row as after `decode`; the greedy rows'
    /// `logits()` are not updated.
    pub fn decode_picks(
        &mut self,
        sessions: &mut [&mut Session<'_, B>],
        tokens: &[u32],
        greedy: &[bool],
    ) -> Result<Vec<Option<u32>>> {
        if greedy.len() != sessions.len() {
            return Err(EngineError::Invalid(format!(
                "a decode group of {} sequences got {} greedy flags",
                sessions.len(),
                greedy.len()
            )));
        }
        let n = self.step(sessions, tokens)?;
        let s = self.scratch[n - 1].as_ref().expect("scratch of the step");
        let model = sessions[0].model;
        let be = &model.backend;
        let mut ids = vec![0u32; n];
        if greedy.iter().any(|&g| g) {
            be.argmax(&s.logits, model.config.n_vocab, &mut ids);
        }
        let rows: Vec<usize> = (0..n).filter(|&i| !greedy[i]).collect();
        if !rows.is_empty() {
            let mut outs: Vec<&mut [f32]> = sessions
                .iter_mut()
                .zip(greedy)
                .filter(|(_, &g)| !g)
                .map(|(s, _)| s.logits.as_mut_slice())
                .collect();
            be.read_rows(&s.logits, n, &rows, &mut outs);
        }
        for s in sessions.iter_mut() {
            s.pos += 1;
        }
        Ok(ids
            .into_iter()
            .zip(greedy)
            .map(|(id, &g)| g.then_some(id))
            .collect())
    }
}
