//! The engine: model configuration (one decoder-layer template; architectures are
//! configuration), weights checked at load, the decode and prefill graphs over a backend, the KV
//! cache, and the session API the CLI and server use.
