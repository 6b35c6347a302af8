//! Embeddings (`muser serve --embeddings`): `POST /v1/embeddings` (OpenAI's shape) and
//! llama-server's own `POST /embedding` / `/embeddings`.
//!
//! A decoder model's embedding of a text is made from its tokens' last hidden states with the
//! output norm applied (the LM head's input, `Session::embed`), pooled over the text as the
//! model's GGUF says (`{arch}.pooling_type`, as llama.cpp reads it) or as `--pooling` asks:
//! the mean of the tokens' states, the first token's (`cls`), the last token's, or every token's
//! own (`none`, llama-server's endpoint only: OpenAI's shape has one vector a text). A pooled
//! vector is then normalized as the request's `embd_normalize` asks (llama-server's values; 2,
//! the Euclidean norm, by default).
//!
//! Each text runs whole on a session of its own on the engine thread, so no slot's cache is
//! touched; decoding requests wait while it runs.

use crate::api::{self, Fields};
use crate::error::ApiError;
use base64::Engine as _;
use muser_tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

/// How a text's token states make its embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Every token's state, unpooled and unnormalized (llama-server's `/embedding` only).
    None,
    /// The mean of the tokens' states.
    Mean,
    /// The first token's state.
    Cls,
    /// The last token's state.
    Last,
}

impl Pooling {
    /// The pooling a GGUF names in `{arch}.pooling_type` (llama.cpp's numbers: 0 none, 1 mean,
    /// 2 cls, 3 last, 4 rank); absent: none, as llama.cpp takes it. Rank (a reranker's head)
    /// is refused by name.
    pub fn of_model(gguf: &muser_gguf::GgufFile) -> Result<Pooling, String> {
        let Ok(arch) = gguf.get_str("general.architecture") else {
            return Ok(Pooling::None);
        };
        let key = format!("{arch}.pooling_type");
        if gguf.get(&key).is_none() {
            return Ok(Pooling::None);
        }
        match gguf.get_u32(&key) {
            Ok(0) => Ok(Pooling::None),
            Ok(1) => Ok(Pooling::Mean),
            Ok(2) => Ok(Pooling::Cls),
            Ok(3) => Ok(Pooling::Last),
            Ok(4) => Err(format!(
                "{key} is 4 (rank): a reranker's pooling, which Muser does not run; choose \
                 --pooling mean, cls or last"
            )),
            Ok(n) => Err(format!("{key} is {n}, which is no pooling type (0 to 4)")),
            Err(e) => Err(format!("{key}: {e}")),
        }
    }

    pub const NAMES: [&'static str; 4] = ["none", "mean", "cls", "last"];

    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    /// The vectors of one text from its tokens' states (`[n, n_embd]`, n >= 1): one pooled
    /// vector, or (`None`) one a token.
    pub fn pool(self, states: &[f32], n_embd: usize) -> Vec<Vec<f32>> {
        let mut rows = states.chunks_exact(n_embd);
        match self {
            Pooling::None => rows.map(<[f32]>::to_vec).collect(),
            Pooling::Cls => vec![rows.next().unwrap_or_default().to_vec()],
            Pooling::Last => vec![rows.next_back().unwrap_or_default().to_vec()],
            Pooling::Mean => {
                let n = states.len() / n_embd;
                let mut sum = vec![0f64; n_embd];
                for row in rows {
                    for (s, &x) in sum.iter_mut().zip(row) {
                        *s += f64::from(x);
                    }
                }
                vec![sum.iter().map(|&s| (s / n as f64) as f32).collect()]
            }
        }
    }
}

impl std::str::FromStr for Pooling {
    type Err = String;
    fn from_str(s: &str) -> Result<Pooling, String> {
        match s {
            "none" => Ok(Pooling::None),
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            "rank" => Err("rank (a reranker's pooling) is not supported".into()),
            other => Err(format!(
                "{other:?} is no pooling: choose one of {}",
                Pooling::NAMES.join(", ")
            )),
        }
    }
}

/// `v` normalized as llama-server's `embd_normalize` asks: -1 not at all, 0 scaled so its
/// largest magnitude is 32760 (int16's range), 1 by the sum of magnitudes, 2 by the Euclidean
/// norm, p > 2 by the p-norm. A zero vector stays zero.
pub fn normalize(v: &[f32], p: i64) -> Vec<f32> {
    let norm = match p {
        -1 => return v.to_vec(),
        0 => v.iter().fold(0f64, |m, &x| m.max(f64::from(x).abs())) / 32760.0,
        1 => v.iter().map(|&x| f64::from(x).abs()).sum(),
        2 => v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt(),
        p => v
            .iter()
            .map(|&x| f64::from(x).abs().powi(p as i32))
            .sum::<f64>()
            .powf(1.0 / p as f64),
    };
    let scale = if norm > 0.0 { 1.0 / norm } else { 0.0 };
    v.iter().map(|&x| (f64::from(x) * scale) as f32).collect()
}

/// A checked embeddings request: its texts' tokens and the normalization.
pub struct EmbedJob {
    pub inputs: Vec<Vec<u32>>,
    pub normalize: i64,
    pub pooling: Pooling,
}

/// One text's answer: its vectors (one, or one a token without pooling) and its token count.
pub struct Embedded {
    pub vectors: Vec<Vec<f32>>,
    pub n_tokens: usize,
}

/// What the engine thread is sent for an embeddings request.
pub struct EmbedRequest {
    pub job: EmbedJob,
    pub reply: tokio::sync::oneshot::Sender<Result<Vec<Embedded>, ApiError>>,
}

/// The texts of a request: `input` (OpenAI's: a string, an array of strings, an array of token
/// ids or an array of such arrays) or llama-server's `content` (the same forms). Strings are
/// tokenized as completions prompts are (BOS and EOS where the model asks for them, control
/// tokens parsed). Each must have a token and fit the context (`n_ctx`).
pub fn parse_inputs(
    obj: &Map<String, Value>,
    tok: &Tokenizer,
    n_vocab: usize,
    n_ctx: usize,
) -> Result<(Vec<Vec<u32>>, &'static str), ApiError> {
    let (field, v) = match (obj.get("input"), obj.get("content")) {
        (Some(v), _) => ("input", v),
        (None, Some(v)) => ("content", v),
        (None, None) => {
            return Err(ApiError::param(
                "input",
                "input is required (a string, an array of strings or of token ids)",
            ))
        }
    };
    let err = |m: String| ApiError::param(field, m);
    let one = |i: Option<usize>, v: &Value| -> Result<Vec<u32>, ApiError> {
        let name = i.map_or(field.to_string(), |i| format!("{field}[{i}]"));
        let tokens = match v {
            Value::String(s) => tok.encode(s, true, true),
            Value::Array(a) if a.iter().all(Value::is_number) => {
                api::token_ids(a, n_vocab).map_err(|m| err(format!("{name}{m}")))?
            }
            other => {
                return Err(err(format!(
                    "{name} must be a string or an array of token ids, got {}",
                    api::type_name(other)
                )))
            }
        };
        if tokens.is_empty() {
            return Err(err(format!("{name} has no tokens")));
        }
        if tokens.len() > n_ctx {
            return Err(ApiError::bad_request(format!(
                "{name} has {} tokens, more than the context of {n_ctx} tokens",
                tokens.len()
            ))
            .with_code("context_length_exceeded")
            .with_param(field)
            .with("n_prompt_tokens", tokens.len())
            .with("n_ctx", n_ctx));
        }
        Ok(tokens)
    };
    let inputs = match v {
        Value::Array(a) if a.is_empty() => return Err(err(format!("{field} is empty"))),
        Value::Array(a) if a.iter().all(Value::is_number) => vec![one(None, v)?],
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, x)| one(Some(i), x))
            .collect::<Result<_, _>>()?,
        _ => vec![one(None, v)?],
    };
    Ok((inputs, field))
}

/// `embd_normalize` (llama-server's field; default 2) and OpenAI's `encoding_format` (float or
/// base64: the little-endian f32 bytes in base64).
pub fn parse_options(f: &Fields) -> Result<(i64, bool), ApiError> {
    let p = f.integer("embd_normalize", -1, 64)?.unwrap_or(2);
    let base64 = match f.string("encoding_format")? {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::param(
                "encoding_format",
                format!("encoding_format must be float or base64, got {other:?}"),
            ))
        }
    };
    if let Some(d) = f.get("dimensions") {
        return Err(ApiError::param(
            "dimensions",
            format!(
                "dimensions ({}) is not supported: the model's embeddings have their own size",
                api::show(d)
            ),
        ));
    }
    Ok((p, base64))
}

/// OpenAI's answer: a list of `embedding` objects, with the prompt tokens as usage.
pub fn openai_json(model: &str, got: &[Embedded], base64: bool) -> Value {
    let data: Vec<Value> = got
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let v = &e.vectors[0];
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let n: usize = got.iter().map(|e| e.n_tokens).sum();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": n, "total_tokens": n},
    })
}

/// llama-server's answer: each text's vectors (one pooled vector, or one a token), by index.
pub fn native_json(got: &[Embedded]) -> Value {
    json!(got
        .iter()
        .enumerate()
        .map(|(i, e)| json!({"index": i, "embedding": e.vectors}))
        .collect::<Vec<_>>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n).map(|_| r.gen_range(-3.0f32..3.0)).collect()
    }

    #[test]
    fn pooling_takes_the_rows_it_names() {
        let (n, ne) = (7, 24);
        let s = random(n * ne, 1);
        assert_eq!(Pooling::Cls.pool(&s, ne), vec![s[..ne].to_vec()]);
        assert_eq!(Pooling::Last.pool(&s, ne), vec![s[(n - 1) * ne..].to_vec()]);
        let none = Pooling::None.pool(&s, ne);
        assert_eq!(none.len(), n);
        assert_eq!(none.concat(), s);
        let mean = &Pooling::Mean.pool(&s, ne)[0];
        for (j, &m) in mean.iter().enumerate() {
            let want = (0..n).map(|i| s[i * ne + j]).sum::<f32>() / n as f32;
            assert!((m - want).abs() < 1e-5, "{j}: {m} {want}");
        }
    }

    #[test]
    fn normalized_vectors_have_unit_norm_and_keep_their_direction() {
        let v = random(64, 2);
        for p in [1i64, 2, 3, 7] {
            let u = normalize(&v, p);
            let norm: f64 = u
                .iter()
                .map(|&x| f64::from(x).abs().powi(p as i32))
                .sum::<f64>()
                .powf(1.0 / p as f64);
            assert!((norm - 1.0).abs() < 1e-5, "p {p}: {norm}");
            let ratio = f64::from(v[5]) / f64::from(u[5]);
            for (a, b) in v.iter().zip(&u) {
                assert!((f64::from(*a) / f64::from(*b) - ratio).abs() < 1e-3 * ratio.abs());
            }
        }
        let u = normalize(&v, 0);
        let top = u.iter().fold(0f32, |m, &x| m.max(x.abs()));
        assert!((top - 32760.0).abs() < 1e-2, "{top}");
        assert_eq!(normalize(&v, -1), v);
        assert_eq!(normalize(&[0.0; 8], 2), vec![0.0; 8]);
    }

    #[test]
    fn base64_is_the_little_endian_floats() {
        let v = random(16, 3);
        let got = openai_json(
            "m",
            &[Embedded {
                vectors: vec![v.clone()],
                n_tokens: 5,
            }],
            true,
        );
        let b = got["data"][0]["embedding"].as_str().unwrap();
        let bytes = base64::engine::general_purpose::STANDARD.decode(b).unwrap();
        let back: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(back, v);
        assert_eq!(got["usage"]["prompt_tokens"], 5);
    }
}
