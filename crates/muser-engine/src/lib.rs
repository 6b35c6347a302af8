//! The engine: model configuration (one decoder-layer template; architectures are
//! configuration), weights checked at load, the decode and prefill graphs over a backend, the KV
//! cache, and the session API the CLI and server use.
//!
//! ```ignore
//! let model = Model::load("m.gguf", &LoadOptions::default())?;
//! let mut s = Session::new(&model, 4096)?;
//! let logits = s.prefill(&prompt_tokens)?;   // last position
//! let logits = s.decode(next_token)?;        // one more position
//! group.decode(&mut [&mut s, &mut s2], &[t, t2])?;  // one step of two sequences: s.logits(), s2.logits()
//! ```

pub mod backend;
pub mod batch;
pub mod config;
pub mod error;
pub mod graph;
pub mod session;
pub mod weights;

pub use backend::cpu::CpuBackend;
pub use backend::Backend;
pub use batch::{prefill_runs, DecodeGroup, RowGot, RowNeed};
pub use config::{ModelConfig, RopeStyle, ARCHITECTURES};
pub use error::{EngineError, Result};
pub use session::{LoadOptions, Model, Session, Snapshot, PREFILL_CHUNK};
