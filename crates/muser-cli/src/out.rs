//! Printing to stdout without a panic when it fails (shared with the tokenizer's `tokenize`
//! example, which includes `cmd/tokenize.rs`).

/// `println!` that returns the write's `io::Result` instead of panicking when stdout fails (a
/// closed pipe: `muser synth --list | head -c 10`). Every command prints its results through
/// this (or a locked stdout it writes to with `?`), so such an error ends the command
/// as any other: `error: Broken pipe`, exit status 1.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}
