//! What GET /slots shows of each slot, in llama-server's fields: a board the engine thread
//! writes and the handlers copy. The engine writes a slot's entry when a request takes it and
//! when the request ends (before its client hears the end), and the running slots' counters at
//! the end of every step; a handler holds the lock only to copy the entries, so it never waits
//! on a step and a step never waits on it.

use crate::api::Generation;
use crate::native::generation_settings;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex, PoisonError};

/// One slot as GET /slots shows it.
#[derive(Debug, Clone, Default)]
pub struct SlotInfo {
    /// A request holds the slot.
    pub processing: bool,
    /// The request running, or the last one that ran (as llama-server keeps its `task_prev`);
    /// None: the slot has run none.
    pub task: Option<SlotTask>,
}

/// A request in a slot: its settings and how far it has come.
#[derive(Debug, Clone)]
pub struct SlotTask {
    /// The engine's number of the request (llama-server's `id_task`), in order of arrival.
    pub id: u64,
    pub gen: Arc<Generation>,
    /// Prompt tokens; those computed so far (the rest come from the slot's cache, or wait for
    /// their prefill part); those reused from the cache.
    pub n_prompt: usize,
    pub n_prompt_processed: usize,
    pub n_cached: usize,
    /// Tokens generated so far, and how many more it may generate at most.
    pub n_decoded: usize,
    pub n_remain: usize,
    /// Its generated text has a newline.
    pub has_new_line: bool,
    /// It will generate more (false once it has ended).
    pub has_next_token: bool,
}

#[derive(Default)]
pub struct SlotBoard(Mutex<Vec<SlotInfo>>);

impl SlotBoard {
    /// `n` slots that have run nothing.
    pub fn reset(&self, n: usize) {
        *self.lock() = vec![SlotInfo::default(); n];
    }

    /// Writes slot `i`'s entry.
    pub fn set(&self, i: usize, info: SlotInfo) {
        if let Some(s) = self.lock().get_mut(i) {
            *s = info;
        }
    }

    /// Writes several slots' entries under one lock.
    pub fn set_all(&self, entries: impl IntoIterator<Item = (usize, SlotInfo)>) {
        let mut board = self.lock();
        for (i, info) in entries {
            if let Some(s) = board.get_mut(i) {
                *s = info;
            }
        }
    }

    /// A copy of every slot's entry (the settings are shared, not copied).
    pub fn snapshot(&self) -> Vec<SlotInfo> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SlotInfo>> {
        // Entries are whole values written in one assignment: a panic elsewhere cannot leave
        // one half written, so a poisoned lock's data is still good.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// llama-server's GET /slots answer: per slot `id`, `n_ctx`, `speculative` (Muser never
/// drafts), `is_processing` and, once the slot has run a request, that request's `id_task`,
/// prompt counts, `params` and `next_token`.
pub fn slots_json(slots: &[SlotInfo], n_ctx: usize) -> Value {
    slots
        .iter()
        .enumerate()
        .map(|(id, s)| {
            let mut v = json!({
                "id": id,
                "n_ctx": n_ctx,
                "speculative": false,
                "is_processing": s.processing,
            });
            if let Some(t) = &s.task {
                v["id_task"] = json!(t.id);
                v["n_prompt_tokens"] = json!(t.n_prompt);
                v["n_prompt_tokens_processed"] = json!(t.n_prompt_processed);
                v["n_prompt_tokens_cache"] = json!(t.n_cached);
                v["params"] = generation_settings(&t.gen);
                v["next_token"] = json!([{
                    "has_next_token": t.has_next_token,
                    "has_new_line": t.has_new_line,
                    "n_remain": t.n_remain,
                    "n_decoded": t.n_decoded,
                }]);
            }
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use muser_sample::SamplerParams;

    fn task(n_decoded: usize, running: bool) -> SlotTask {
        SlotTask {
            id: 7,
            gen: Arc::new(Generation {
                params: SamplerParams::greedy(),
                max_tokens: Some(10),
                stop: vec!["\n\n".into()],
                logprobs: Some(2),
                echo: false,
                stream: true,
                include_usage: false,
                ignore_eos: true,
                grammar: None,
                preserved: Vec::new(),
            }),
            n_prompt: 12,
            n_prompt_processed: 8,
            n_cached: 4,
            n_decoded,
            n_remain: 10 - n_decoded,
            has_new_line: false,
            has_next_token: running,
        }
    }

    #[test]
    fn a_slot_shows_its_request_or_the_last_one() {
        let board = SlotBoard::default();
        board.reset(3);
        board.set(
            1,
            SlotInfo {
                processing: true,
                task: Some(task(3, true)),
            },
        );
        board.set(
            2,
            SlotInfo {
                processing: false,
                task: Some(task(10, false)),
            },
        );
        board.set(3, SlotInfo::default()); // past the slots: ignored
        let v = slots_json(&board.snapshot(), 256);
        let slots = v.as_array().unwrap();
        assert_eq!(slots.len(), 3);
        // Never used: llama-server's four fields only.
        assert_eq!(
            slots[0],
            json!({"id": 0, "n_ctx": 256, "speculative": false, "is_processing": false})
        );
        let running = &slots[1];
        assert_eq!(running["is_processing"], true);
        assert_eq!(running["id_task"], 7);
        assert_eq!(
            (
                &running["n_prompt_tokens"],
                &running["n_prompt_tokens_processed"],
                &running["n_prompt_tokens_cache"]
            ),
            (&json!(12), &json!(8), &json!(4))
        );
        assert_eq!(
            running["next_token"],
            json!([{"has_next_token": true, "has_new_line": false, "n_remain": 7,
                    "n_decoded": 3}])
        );
        let p = &running["params"];
        assert_eq!(
            (&p["n_predict"], &p["ignore_eos"]),
            (&json!(10), &json!(true))
        );
        assert_eq!((&p["n_probs"], &p["temperature"]), (&json!(2), &json!(0.0)));
        // Ended: no longer processing, its final counts kept.
        let ended = &slots[2];
        assert_eq!(ended["is_processing"], false);
        assert_eq!(ended["next_token"][0]["has_next_token"], false);
        assert_eq!(ended["next_token"][0]["n_decoded"], 10);
    }
}
