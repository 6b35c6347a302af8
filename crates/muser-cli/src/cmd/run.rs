//! `muser run`: generate text from a prompt, streaming it, then print load time and prompt and
//! decode speeds to stderr.

use super::backend::{CliBackend, ModelJob};
use anyhow::{bail, Context};
use muser_engine::{Model, Session};
use muser_sample::{Sampler, SamplerParams, DEFAULT_SEED};
use muser_tokenizer::{StreamDecoder, Tokenizer};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model (default: models/muse-default.gguf next to the repository or the cwd).
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// The prompt.
    #[arg(
        short = 'p',
        long,
        required_unless_present = "file",
        conflicts_with = "file"
    )]
    pub prompt: Option<String>,
    /// A file holding the prompt (one trailing newline dropped, as llama-cli does).
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Context length (default: prompt + n-predict, at most the model's training context, or
    /// the prompt's length, with a warning, when the prompt alone is longer than that).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Temperature (0 = greedy).
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    #[arg(long = "top-p", default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    #[arg(
        long = "repeat-penalty",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub repeat_penalty: f32,
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Locally typical sampling, parameter p (1 = off).
    #[arg(
        long = "typical",
        visible_alias = "typical-p",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub typical: f32,
    /// Top-n-sigma: keeps the logits within N standard deviations of the best (<= 0 = off).
    #[arg(
        long = "top-nsigma",
        visible_alias = "top-n-sigma",
        default_value_t = -1.0,
        allow_negative_numbers = true
    )]
    pub top_nsigma: f32,
    /// XTC: the chance of removing the likeliest tokens (0 = off).
    #[arg(
        long = "xtc-probability",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub xtc_probability: f32,
    /// XTC: the probability from which a token is one of the likeliest (> 0.5 = off).
    #[arg(
        long = "xtc-threshold",
        default_value_t = 0.1,
        allow_negative_numbers = true
    )]
    pub xtc_threshold: f32,
    /// Dynamic temperature: the temperature ranges over --temp +- this, by the entropy (0 = off).
    #[arg(
        long = "dynatemp-range",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub dynatemp_range: f32,
    /// Dynamic temperature: the exponent that maps the entropy to the range.
    #[arg(
        long = "dynatemp-exp",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub dynatemp_exp: f32,
    /// Mirostat: 0 = off, 1 = Mirostat, 2 = Mirostat 2.0 (as in llama.cpp, only the logit
    /// biases and --temp then come before it: the other samplers and the penalties are not used).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub mirostat: u32,
    /// Mirostat's learning rate, eta.
    #[arg(
        long = "mirostat-lr",
        default_value_t = 0.1,
        allow_negative_numbers = true
    )]
    pub mirostat_lr: f32,
    /// Mirostat's target entropy, tau.
    #[arg(
        long = "mirostat-ent",
        default_value_t = 5.0,
        allow_negative_numbers = true
    )]
    pub mirostat_ent: f32,
    /// DRY: the penalty for extending a repeat of --dry-allowed-length tokens (0 = off).
    #[arg(
        long = "dry-multiplier",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub dry_multiplier: f32,
    /// DRY: the penalty grows by this factor per token of repeat (a value below 1 is ignored,
    /// as llama-cli ignores it).
    #[arg(
        long = "dry-base",
        default_value_t = 1.75,
        allow_negative_numbers = true
    )]
    pub dry_base: f32,
    /// DRY: repeats of this many tokens or fewer go unpenalised.
    #[arg(
        long = "dry-allowed-length",
        default_value_t = 2,
        allow_negative_numbers = true
    )]
    pub dry_allowed_length: usize,
    /// DRY: how many recent tokens it scans for repeats (0 = off).
    #[arg(
        long = "dry-penalty-last-n",
        default_value_t = 64,
        allow_negative_numbers = true
    )]
    pub dry_penalty_last_n: usize,
    /// DRY: a sequence breaker (repeatable; the first one given replaces the defaults "\n",
    /// ":", "\"" and "*"; "none" clears the list). Escapes as llama-cli's: \n, \t, \\, ...
    #[arg(long = "dry-sequence-breaker")]
    pub dry_sequence_breaker: Vec<String>,
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Adds BIAS to a token's logit, as llama.cpp's: TOKEN_ID+BIAS, TOKEN_ID-BIAS, or
    /// TOKEN_ID-inf to ban the token (repeatable).
    #[arg(short = 'l', long = "logit-bias", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Constrains the output to a GBNF grammar (llama.cpp's format; start rule `root`).
    #[arg(long, group = "constraint")]
    pub grammar: Option<String>,
    /// As --grammar, read from a file.
    #[arg(long = "grammar-file", value_name = "FILE", group = "constraint")]
    pub grammar_file: Option<PathBuf>,
    /// Constrains the output to JSON that follows this JSON schema (`{}`: any JSON object).
    #[arg(
        short = 'j',
        long = "json-schema",
        value_name = "SCHEMA",
        group = "constraint"
    )]
    pub json_schema: Option<String>,
    /// As --json-schema, read from a file.
    #[arg(long = "json-schema-file", value_name = "FILE", group = "constraint")]
    pub json_schema_file: Option<PathBuf>,
    /// Backend: auto (CUDA when a GPU is usable), cpu or cuda.
    #[arg(long, value_enum, default_value_t = super::backend::BackendKind::Auto)]
    pub backend: super::backend::BackendKind,
    /// CPU threads (default: one per core).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
}

/// One `--logit-bias` value: TOKEN_ID followed by a signed bias (`+1.5`, `-3`, `-inf`).
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let at = s
        .find(['+', '-'])
        .ok_or_else(|| format!("'{s}': expected TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043+1"))?;
    let id = s[..at]
        .parse::<u32>()
        .map_err(|_| format!("'{s}': '{}' is not a token id", &s[..at]))?;
    let bias = s[at..]
        .parse::<f32>()
        .ok()
        .filter(|b| !b.is_nan() && *b != f32::INFINITY)
        .ok_or_else(|| format!("'{s}': '{}' is not a bias (a number, or -inf)", &s[at..]))?;
    Ok((id, bias))
}

/// `--dry-sequence-breaker`s as llama-cli takes them: none given, the defaults; else the given
/// ones with their escapes processed, each "none" clearing those before it.
fn dry_breakers_of(given: &[String]) -> Vec<String> {
    if given.is_empty() {
        return SamplerParams::default().dry_sequence_breakers;
    }
    let mut out = Vec::new();
    for b in given {
        if b == "none" {
            out.clear();
        } else {
            out.push(process_escapes(b));
        }
    }
    out
}

/// llama.cpp's `string_process_escapes`: \n \r \t \' \" \\ and \xHH; other escapes kept as
/// written.
fn process_escapes(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 == b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let hex = s
            .get(i + 2..i + 4)
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i + 1], hex) {
            (b'n', _) => out.push(b'\n'),
            (b'r', _) => out.push(b'\r'),
            (b't', _) => out.push(b'\t'),
            (c @ (b'\'' | b'"' | b'\\'), _) => out.push(c),
            (b'x', Some(h)) => {
                out.push(h);
                i += 2;
            }
            (c, _) => out.extend([b'\\', c]),
        }
        i += 2;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The flag that sets a `SamplerParams` field (llama-cli's names).
fn flag_of(field: &str) -> &str {
    match field {
        "temperature" => "--temp",
        "top_p" => "--top-p",
        "min_p" => "--min-p",
        "repeat_penalty" => "--repeat-penalty",
        "typical_p" => "--typical",
        "top_n_sigma" => "--top-nsigma",
        "xtc_probability" => "--xtc-probability",
        "xtc_threshold" => "--xtc-threshold",
        "dynatemp_range" => "--dynatemp-range",
        "dynatemp_exponent" => "--dynatemp-exp",
        "mirostat" => "--mirostat",
        "mirostat_tau" => "--mirostat-ent",
        "mirostat_eta" => "--mirostat-lr",
        "logit_bias" => "--logit-bias",
        "dry_multiplier" => "--dry-multiplier",
        "dry_base" => "--dry-base",
        other => other,
    }
}

/// The default model's path relative to the repository root or the cwd.
pub const DEFAULT_MODEL: &str = "models/muse-default.gguf";

/// `-m` if given; else the default model in the cwd or in a folder above the executable.
pub fn resolve_model(model: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(m) = model {
        return Ok(m.to_path_buf());
    }
    let mut places = vec![PathBuf::from(DEFAULT_MODEL)];
    if let Ok(exe) = std::env::current_exe() {
        places.extend(exe.ancestors().skip(1).map(|d| d.join(DEFAULT_MODEL)));
    }
    if let Some(p) = places.into_iter().find(|p| p.is_file()) {
        return Ok(p);
    }
    bail!(
        "no model given (-m) and no default model at {DEFAULT_MODEL}; make one with \
         `muser synth muse-tiny m.gguf` and run with `-m m.gguf`"
    )
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let path = resolve_model(args.model.as_deref())?;
    // The prompt file is read before the model loads, so a wrong path fails fast.
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            let mut text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the prompt file {}", f.display()))?;
            if text.ends_with('\n') {
                text.pop();
            }
            text
        }
        (None, None) => bail!("give a prompt with -p TEXT or -f FILE"),
    };
    let t0 = Instant::now();
    super::backend::with_model(
        &path,
        args.backend,
        args.threads,
        Job {
            args,
            prompt,
            path: path.clone(),
            t0,
        },
    )
}

/// The GBNF text of `--grammar`, `--grammar-file`, `--json-schema` or `--json-schema-file`
/// (at most one: clap's group), a schema turned into GBNF as llama-cli does.
fn constraint_gbnf(args: &Args) -> anyhow::Result<Option<String>> {
    let read = |p: &Path, flag: &str| {
        std::fs::read_to_string(p).with_context(|| format!("{flag}: reading {}", p.display()))
    };
    let schema = |text: &str, flag: &str| -> anyhow::Result<String> {
        let v: serde_json::Value = serde_json::from_str(text)
            .with_context(|| format!("{flag}: the schema is not valid JSON"))?;
        muser_server::constrain::schema_gbnf(&v)
            .map_err(|e| anyhow::anyhow!("{flag}: the JSON schema cannot be used: {e}"))
    };
    Ok(if let Some(g) = &args.grammar {
        Some(g.clone())
    } else if let Some(p) = &args.grammar_file {
        Some(read(p, "--grammar-file")?)
    } else if let Some(s) = &args.json_schema {
        Some(schema(s, "--json-schema")?)
    } else if let Some(p) = &args.json_schema_file {
        Some(schema(
            &read(p, "--json-schema-file")?,
            "--json-schema-file",
        )?)
    } else {
        None
    }
    .filter(|g| !g.is_empty()))
}

/// A sampler's pick, or the error of a row no token can be picked from (`grammar`: the sampler
/// holds to one).
fn pick(token: Option<u32>, grammar: bool) -> anyhow::Result<u32> {
    token.ok_or_else(|| {
        if grammar {
            return anyhow::anyhow!(
                "no token can be sampled: no token the grammar allows next has a finite, \
                 non-zero probability (check the grammar or schema against the model's \
                 vocabulary, and --logit-bias)"
            );
        }
        anyhow::anyhow!(
            "no token can be sampled: every candidate is banned (-inf, e.g. by --logit-bias) or \
             not a number (the model computed NaN)"
        )
    })
}

struct Job {
    args: Args,
    prompt: String,
    path: PathBuf,
    t0: Instant,
}

impl ModelJob for Job {
    fn run<B: CliBackend>(self, model: Model<B>) -> anyhow::Result<()> {
        let Job {
            args,
            prompt: text,
            path,
            t0,
        } = self;
        let tok = Tokenizer::from_gguf(model.gguf()).context("reading the tokenizer")?;
        let load_s = t0.elapsed().as_secs_f64();
        let grammar = match constraint_gbnf(&args)? {
            Some(text) => Some(std::sync::Arc::new(
                muser_server::constrain::parse_gbnf(&text, &tok)
                    .map_err(|e| anyhow::anyhow!("the grammar does not parse: {e}"))?,
            )),
            None => None,
        };

        let prompt = tok.encode(&text, true, true);
        if prompt.is_empty() {
            bail!("the prompt is empty after tokenization");
        }
        let nv = model.config.n_vocab;
        if let Some((id, _)) = args.logit_bias.iter().find(|(id, _)| *id as usize >= nv) {
            bail!("--logit-bias: token {id} is past the vocabulary of {nv} tokens");
        }
        let unit = |x: f32| (0.0..=1.0).contains(&x);
        for (name, v, ok) in [
            ("--temp", args.temp, args.temp >= 0.0),
            ("--top-p", args.top_p, unit(args.top_p)),
            ("--min-p", args.min_p, unit(args.min_p)),
            (
                "--repeat-penalty",
                args.repeat_penalty,
                args.repeat_penalty > 0.0,
            ),
            (
                "--xtc-probability",
                args.xtc_probability,
                unit(args.xtc_probability),
            ),
            (
                "--xtc-threshold",
                args.xtc_threshold,
                unit(args.xtc_threshold),
            ),
        ] {
            if !ok || !v.is_finite() {
                bail!(
                    "{name} {v} is out of range (finite numbers: --temp >= 0, --top-p, --min-p, \
                     --xtc-probability and --xtc-threshold from 0 to 1, --repeat-penalty > 0)"
                );
            }
        }
        let params = SamplerParams {
            temperature: args.temp,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repeat_penalty: args.repeat_penalty,
            repeat_last_n: args.repeat_last_n,
            seed: args.seed,
            logit_bias: args.logit_bias.clone(),
            typical_p: args.typical,
            top_n_sigma: args.top_nsigma,
            xtc_probability: args.xtc_probability,
            xtc_threshold: args.xtc_threshold,
            dynatemp_range: args.dynatemp_range,
            dynatemp_exponent: args.dynatemp_exp,
            mirostat: args.mirostat,
            mirostat_tau: args.mirostat_ent,
            mirostat_eta: args.mirostat_lr,
            dry_multiplier: args.dry_multiplier,
            dry_base: if args.dry_base >= 1.0 {
                args.dry_base
            } else {
                SamplerParams::default().dry_base
            },
            dry_allowed_length: args.dry_allowed_length,
            dry_penalty_last_n: args.dry_penalty_last_n,
            dry_sequence_breakers: dry_breakers_of(&args.dry_sequence_breaker),
            ..Default::default()
        };
        // The rest (a NaN or infinite --typical, --mirostat 3, ...): the sampler's own check,
        // whose message starts with the field, named here by its flag.
        params.check().map_err(|m| {
            let (field, rest) = m.split_once(' ').unwrap_or((&m, ""));
            anyhow::anyhow!("{} {rest}", flag_of(field))
        })?;
        let n_train = model.config.n_ctx_train;
        let n_ctx = match args.ctx_size {
            Some(c) => c,
            None => {
                if prompt.len() > n_train {
                    eprintln!(
                        "warning: the prompt's {} tokens are more than the model's training \
                         context of {n_train}: running with a context of {} tokens, past what \
                         the model was trained on (-c / --ctx-size sets it)",
                        prompt.len(),
                        prompt.len()
                    );
                }
                prompt
                    .len()
                    .saturating_add(args.n_predict)
                    .min(n_train.max(prompt.len()))
            }
        };
        // Before the prompt is echoed: a prompt that cannot run prints nothing.
        if prompt.len() > n_ctx {
            bail!(
                "the prompt's {} tokens do not fit the context of {n_ctx} tokens (-c / --ctx-size)",
                prompt.len()
            );
        }
        let mut session = Session::new(&model, n_ctx)?;
        let dry = params
            .dry_on()
            .then(|| muser_server::scheduler::dry_breakers(&tok, &params.dry_sequence_breakers));
        let mut sampler = Sampler::new(params);
        if let Some(dry) = dry {
            sampler.set_dry_breakers(std::sync::Arc::new(dry));
        }
        if let Some(g) = grammar {
            let vocab = muser_server::constrain::grammar_vocab(&tok);
            sampler.set_grammar(g, std::sync::Arc::new(vocab));
        }
        for &t in &prompt {
            sampler.accept(t);
        }

        let mut out = std::io::stdout().lock();
        write!(out, "{text}")?;
        out.flush()?;

        let t1 = Instant::now();
        // The pick after the last position (None: no token can be picked, an error once one is
        // needed).
        let mut next = sampler.try_sample(session.prefill(&prompt)?);
        let prompt_s = t1.elapsed().as_secs_f64();

        // Greedy with no penalty: the backend's argmax (a GPU reads back one index per token);
        // sampling from the top k with no penalty: the backend's top k (k pairs per token).
        let argmax = sampler.is_argmax();
        let top_k = sampler
            .top_k_of(model.config.n_vocab)
            .filter(|&k| k <= model.backend().top_k_max());
        let t2 = Instant::now();
        let mut stream = StreamDecoder::new();
        let mut n_gen = 0;
        let mut n_decoded = 0;
        let mut context_full = false;
        while n_gen < args.n_predict {
            if let (None, Some(why)) = (next, sampler.grammar_failure()) {
                bail!("the grammar cannot be followed: {why}");
            }
            let token = pick(next, sampler.has_grammar())?;
            sampler
                .accept_generated(token)
                .map_err(|e| anyhow::anyhow!("the grammar cannot follow the sampled token: {e}"))?;
            n_gen += 1;
            if tok.is_eog(token) {
                break;
            }
            write!(out, "{}", stream.push(&tok, token)?)?;
            out.flush()?;
            if n_gen == args.n_predict {
                break;
            }
            // The token just written has no room to be decoded: generation ends here, as
            // llama.cpp's does when its context is full and not shifted.
            if session.pos() >= session.n_ctx() {
                context_full = true;
                break;
            }
            next = if argmax {
                Some(session.decode_greedy(token)?)
            } else if let Some(k) = top_k {
                let top = session.decode_top_k(token, k)?;
                sampler.try_sample_top_k(
                    top.into_iter()
                        .map(|(id, logit)| muser_sample::Candidate { id, logit, p: 0.0 })
                        .collect(),
                )
            } else {
                sampler.try_sample(session.decode(token)?)
            };
            n_decoded += 1;
        }
        writeln!(out, "{}", stream.flush())?;
        let decode_s = t2.elapsed().as_secs_f64();

        eprintln!();
        if context_full {
            eprintln!(
                "stopped: the context of {} tokens is full (-c / --ctx-size sets it)",
                session.n_ctx()
            );
        }
        eprintln!(
            "load:    {:.0} ms ({}, {}, {} threads)",
            load_s * 1e3,
            path.display(),
            model.backend().label(),
            model.backend().threads()
        );
        eprintln!(
            "prompt:  {} tokens in {:.1} ms, {:.2} tokens/s",
            prompt.len(),
            prompt_s * 1e3,
            prompt.len() as f64 / prompt_s
        );
        eprintln!(
            "decode:  {} tokens in {:.1} ms, {:.2} tokens/s",
            n_decoded,
            decode_s * 1e3,
            if n_decoded > 0 {
                n_decoded as f64 / decode_s
            } else {
                0.0
            }
        );
        Ok(())
    }
}
