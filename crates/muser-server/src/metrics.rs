//! Counters the engine thread and the handlers update, rendered as Prometheus text at
//! GET /metrics (names after llama-server's, prefixed `muser:`), and the slots' board that
//! GET /slots shows (slots.rs).

use crate::slots::SlotBoard;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Default)]
pub struct Metrics {
    /// Prompt tokens run through the model (cached prefix tokens not counted).
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens served from a slot's cache.
    pub cached_tokens: AtomicU64,
    /// Of those, the ones copied from another slot's cache (its prefix shared with the prompt).
    pub copied_tokens: AtomicU64,
    /// Of those, the ones taken back from the host cache (`--cache-ram`).
    pub restored_tokens: AtomicU64,
    /// The host cache's snapshots: bytes and positions.
    pub host_bytes: AtomicU64,
    pub host_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Nanoseconds spent in prefill chunks and in decode steps.
    pub prefill_ns: AtomicU64,
    pub decode_ns: AtomicU64,
    pub decode_steps: AtomicU64,
    /// Rows (sequences) over all decode steps: `decode_rows / decode_steps` is the mean group.
    pub decode_rows: AtomicU64,
    /// Decode steps replayed from a recording of their shape (a CUDA graph), recorded, and
    /// issued op by op (`Backend::step_counts`; all zero on the CPU).
    pub steps_replayed: AtomicU64,
    pub steps_recorded: AtomicU64,
    pub steps_direct: AtomicU64,
    /// Prefill forward passes (each runs the parts of every prompt that waits, up to the budget).
    pub prefill_passes: AtomicU64,
    pub requests_finished: AtomicU64,
    /// Requests whose client went away before the end.
    pub requests_cancelled: AtomicU64,
    /// Requests refused with 503 because the queue was full.
    pub requests_rejected: AtomicU64,
    /// Requests holding a slot now.
    pub running: AtomicU64,
    /// Requests waiting for a slot now (sent to the engine, not yet in a slot).
    pub queued: AtomicU64,
    /// Positions held in all slots' KV caches, and what they can hold.
    pub kv_tokens: AtomicU64,
    pub kv_capacity: AtomicU64,
    /// Each slot's request and progress, for GET /slots.
    pub slots: SlotBoard,
}

impl Metrics {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    pub fn render(&self) -> String {
        let g = |c: &AtomicU64| c.load(Relaxed);
        let rate = |tokens: u64, ns: u64| {
            if ns == 0 {
                0.0
            } else {
                tokens as f64 / (ns as f64 * 1e-9)
            }
        };
        let kv_cap = g(&self.kv_capacity).max(1);
        let rows: [(&str, &str, &str, String); 23] = [
            (
                "prompt_tokens_total",
                "counter",
                "Prompt tokens processed (cache hits excluded).",
                g(&self.prompt_tokens).to_string(),
            ),
            (
                "prompt_tokens_cached_total",
                "counter",
                "Prompt tokens reused from a slot's cache.",
                g(&self.cached_tokens).to_string(),
            ),
            (
                "prompt_tokens_copied_total",
                "counter",
                "Prompt tokens copied from another slot's cache (counted in the cached ones).",
                g(&self.copied_tokens).to_string(),
            ),
            (
                "prompt_tokens_restored_total",
                "counter",
                "Prompt tokens taken back from the host cache (counted in the cached ones).",
                g(&self.restored_tokens).to_string(),
            ),
            (
                "prompt_cache_bytes",
                "gauge",
                "Host memory of the prefixes the slots gave up (--cache-ram).",
                g(&self.host_bytes).to_string(),
            ),
            (
                "prompt_cache_tokens",
                "gauge",
                "Positions of the prefixes held in the host cache.",
                g(&self.host_tokens).to_string(),
            ),
            (
                "tokens_predicted_total",
                "counter",
                "Tokens generated.",
                g(&self.generated_tokens).to_string(),
            ),
            (
                "prompt_seconds_total",
                "counter",
                "Time spent in prefill.",
                format!("{:.6}", g(&self.prefill_ns) as f64 * 1e-9),
            ),
            (
                "prompt_passes_total",
                "counter",
                "Prefill forward passes (the waiting prompts' parts share one).",
                g(&self.prefill_passes).to_string(),
            ),
            (
                "tokens_predicted_seconds_total",
                "counter",
                "Time spent in decode steps.",
                format!("{:.6}", g(&self.decode_ns) as f64 * 1e-9),
            ),
            (
                "decode_steps_total",
                "counter",
                "Decode steps (each advances every decoding sequence by one token).",
                g(&self.decode_steps).to_string(),
            ),
            (
                "decode_rows_total",
                "counter",
                "Sequences advanced over all decode steps (rows / steps: the mean decode group).",
                g(&self.decode_rows).to_string(),
            ),
            (
                "decode_steps_replayed_total",
                "counter",
                "Decode steps replayed from a recording of their shape (a CUDA graph).",
                g(&self.steps_replayed).to_string(),
            ),
            (
                "decode_steps_recorded_total",
                "counter",
                "Decode steps recorded for replay (the second step of a shape).",
                g(&self.steps_recorded).to_string(),
            ),
            (
                "decode_steps_direct_total",
                "counter",
                "Decode steps issued op by op (the first of a shape, or recording off).",
                g(&self.steps_direct).to_string(),
            ),
            (
                "prompt_tokens_seconds",
                "gauge",
                "Prefill throughput, tokens/s, over the server's life.",
                format!("{:.3}", rate(g(&self.prompt_tokens), g(&self.prefill_ns))),
            ),
            (
                "predicted_tokens_seconds",
                "gauge",
                "Aggregate decode throughput, tokens/s, over the server's life.",
                format!("{:.3}", rate(g(&self.generated_tokens), g(&self.decode_ns))),
            ),
            (
                "requests_finished_total",
                "counter",
                "Requests completed.",
                g(&self.requests_finished).to_string(),
            ),
            (
                "requests_cancelled_total",
                "counter",
                "Requests whose client disconnected first.",
                g(&self.requests_cancelled).to_string(),
            ),
            (
                "requests_rejected_total",
                "counter",
                "Requests refused because the queue was full.",
                g(&self.requests_rejected).to_string(),
            ),
            (
                "requests_processing",
                "gauge",
                "Requests holding a slot.",
                g(&self.running).to_string(),
            ),
            (
                "requests_deferred",
                "gauge",
                "Requests waiting for a slot.",
                g(&self.queued).to_string(),
            ),
            (
                "kv_cache_usage_ratio",
                "gauge",
                "Share of the slots' KV cache positions in use.",
                format!("{:.6}", g(&self.kv_tokens) as f64 / kv_cap as f64),
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, value) in rows {
            out.push_str(&format!(
                "# HELP muser:{name} {help}\n# TYPE muser:{name} {kind}\nmuser:{name} {value}\n"
            ));
        }
        out.push_str(&format!(
            "# HELP muser:kv_cache_tokens KV cache positions in use.\n# TYPE muser:kv_cache_tokens gauge\nmuser:kv_cache_tokens {}\n",
            g(&self.kv_tokens)
        ));
        out
    }
}
