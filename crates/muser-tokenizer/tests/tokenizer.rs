//! Properties of both tokenizers on vocabularies built here: round trips on random bytes and
//! text, merge order against a naive reference, pre-tokenizer choices, special tokens, the
//! streaming decoder, SentencePiece byte fallback, and refusals of bad metadata.

use muser_gguf::{GgufFile, GgufWriter, MetaType, MetaValue};
use muser_tokenizer::{
    ByteUnicode, StreamDecoder, TokenType, Tokenizer, TokenizerData, TokenizerError, TokenizerModel,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

// ---------------------------------------------------------------- helpers

/// Text made of the character classes the pre-tokenizers care about.
fn random_text(rng: &mut StdRng, n_chars: usize) -> String {
    const POOLS: &[&str] = &[
        "abcdefghijklmnopqrstuvwxyz",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        "     \n\t\r",
        ".,;:!?'\"()[]{}-_+=*/\\<>|@#$%^&~`",
        "éèàüößçñøåÆŒ",
        "日本語中文字한국어",
        "😀🎉🦀👍🏽",
        "\u{0}\u{7f}\u{85}\u{a0}\u{200b}\u{2028}\u{3000}\u{feff}",
        "'s 't 're 've 'm 'll 'd 'S 'LL",
    ];
    let mut s = String::new();
    while s.chars().count() < n_chars {
        let pool: Vec<char> = POOLS[rng.gen_range(0..POOLS.len())].chars().collect();
        for _ in 0..rng.gen_range(1..6) {
            s.push(pool[rng.gen_range(0..pool.len())]);
        }
    }
    s
}

/// A deliberately small BPE trainer: words are byte-level letter and non-letter runs with a
/// leading space kept, pairs are counted by frequency, ties broken by the pair's text.
fn train_merges(corpus: &str, n_merges: usize) -> (Vec<String>, Vec<String>) {
    let bu = ByteUnicode::new();
    let mut tokens: Vec<String> = (0..=255u8).map(|b| bu.char_of(b).to_string()).collect();
    let mut words: Vec<Vec<String>> = Vec::new();
    let mut current = String::new();
    for c in corpus.chars() {
        if c == ' ' && !current.is_empty() {
            words.push(current.bytes().map(|b| bu.char_of(b).to_string()).collect());
            current.clear();
        }
        current.push(c);
    }
    words.push(current.bytes().map(|b| bu.char_of(b).to_string()).collect());
    let mut merges = Vec::new();
    for _ in 0..n_merges {
        let mut counts: HashMap<(String, String), usize> = HashMap::new();
        for w in &words {
            for p in w.windows(2) {
                *counts.entry((p[0].clone(), p[1].clone())).or_default() += 1;
            }
        }
        let Some(((l, r), _)) = counts
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        else {
            break;
        };
        let merged = format!("{l}{r}");
        for w in &mut words {
            let mut i = 0;
            while i + 1 < w.len() {
                if w[i] == l && w[i + 1] == r {
                    w[i] = merged.clone();
                    w.remove(i + 1);
                }
                i += 1;
            }
        }
        merges.push(format!("{l} {r}"));
        if !tokens.contains(&merged) {
            tokens.push(merged);
        }
    }
    (tokens, merges)
}

const CORPUS: &str = "The quick brown fox jumps over the lazy dog. It's the dog's day, isn't it? \
    They'll say we've done 1234567 things in 2024; the other 89 were 'done' too. Naïve café \
    résumé: the cafés were naïve. 日本語のテキストと中文文本。 Emoji 🎉🎉 party! The the the. \
    Then there were three thousand three hundred and thirty-three thin thinkers thinking.";

fn gpt2_data(pre: &str, n_merges: usize) -> TokenizerData {
    let (mut tokens, merges) = train_merges(CORPUS, n_merges);
    let n_normal = tokens.len();
    tokens.push("<|endoftext|>".into());
    tokens.push("<|eot|>".into());
    tokens.push("<tool>".into());
    let mut types = vec![TokenType::Normal; n_normal];
    types.extend([
        TokenType::Control,
        TokenType::Control,
        TokenType::UserDefined,
    ]);
    let mut data = TokenizerData::new(TokenizerModel::Gpt2, tokens);
    data.pre = Some(pre.into());
    data.merges = merges;
    data.token_types = types;
    data.bos = Some(n_normal as u32);
    data.eos = Some(n_normal as u32);
    data.eot = Some(n_normal as u32 + 1);
    data
}

/// A tiny hand-made vocabulary: the 256 byte tokens plus the given texts (in the byte-level
/// alphabet) and merges.
fn byte_vocab(extra: &[&str], merges: &[&str]) -> TokenizerData {
    let bu = ByteUnicode::new();
    let mut tokens: Vec<String> = (0..=255u8).map(|b| bu.char_of(b).to_string()).collect();
    tokens.extend(extra.iter().map(|s| s.to_string()));
    let mut data = TokenizerData::new(TokenizerModel::Gpt2, tokens);
    data.merges = merges.iter().map(|s| s.to_string()).collect();
    data
}

fn ids_to_texts(tok: &Tokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter()
        .map(|&id| tok.token_text(id).unwrap().to_string())
        .collect()
}

/// Naive BPE: repeatedly merge the adjacent pair of lowest rank (leftmost among equals).
fn naive_bpe(word: &str, merges: &[String]) -> Vec<String> {
    let bu = ByteUnicode::new();
    let rank: HashMap<(&str, &str), usize> = merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let (l, r) = m.split_once(' ').unwrap();
            ((l, r), i)
        })
        .collect();
    let mut syms: Vec<String> = word.bytes().map(|b| bu.char_of(b).to_string()).collect();
    loop {
        let best = (0..syms.len().saturating_sub(1))
            .filter_map(|i| {
                rank.get(&(syms[i].as_str(), syms[i + 1].as_str()))
                    .map(|&r| (r, i))
            })
            .min();
        let Some((_, i)) = best else { return syms };
        let right = syms.remove(i + 1);
        syms[i].push_str(&right);
    }
}

// ---------------------------------------------------------------- byte-level BPE

#[test]
fn gpt2_round_trips_random_bytes() {
    for pre in ["default", "llama-bpe", "qwen2"] {
        let tok = Tokenizer::new(gpt2_data(pre, 200)).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..300 {
            let len = rng.gen_range(0..200);
            let bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            let ids = tok.encode_bytes(&bytes, false, false);
            assert_eq!(tok.decode(&ids).unwrap(), bytes, "pre {pre}");
        }
    }
}

#[test]
fn gpt2_round_trips_random_text_and_merges() {
    for pre in PRE_NAMES {
        let tok = Tokenizer::new(gpt2_data(pre, 200)).unwrap();
        let mut rng = StdRng::seed_from_u64(11);
        let mut n_tokens = 0;
        let mut n_bytes = 0;
        for _ in 0..300 {
            let n = rng.gen_range(0..120);
            let text = random_text(&mut rng, n);
            let ids = tok.encode(&text, false, false);
            assert_eq!(
                tok.decode(&ids).unwrap(),
                text.as_bytes(),
                "pre {pre}: {text:?}"
            );
            n_tokens += ids.len();
            n_bytes += text.len();
        }
        // The trained merges do apply: fewer tokens than bytes.
        assert!(
            n_tokens < n_bytes,
            "pre {pre}: {n_tokens} tokens for {n_bytes} bytes"
        );
        let ids = tok.encode("the dog", false, false);
        assert!(ids.len() < 7, "{:?}", ids_to_texts(&tok, &ids));
    }
}

#[test]
fn merge_order_matches_naive_reference() {
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..40 {
        // Random merges over the letters a..e, each merging two existing tokens.
        let mut toks: Vec<String> = "abcde".chars().map(String::from).collect();
        let mut merges = Vec::new();
        for _ in 0..30 {
            let l = toks[rng.gen_range(0..toks.len())].clone();
            let r = toks[rng.gen_range(0..toks.len())].clone();
            let m = format!("{l} {r}");
            if merges.contains(&m) {
                continue;
            }
            merges.push(m);
            let merged = format!("{l}{r}");
            if !toks.contains(&merged) {
                toks.push(merged);
            }
        }
        let extra: Vec<&str> = toks[5..].iter().map(String::as_str).collect();
        let merge_refs: Vec<&str> = merges.iter().map(String::as_str).collect();
        let tok = Tokenizer::new(byte_vocab(&extra, &merge_refs)).unwrap();
        for _ in 0..50 {
            let word: String = (0..rng.gen_range(1..40))
                .map(|_| rng.gen_range(b'a'..=b'e') as char)
                .collect();
            let ids = tok.encode(&word, false, false);
            assert_eq!(
                ids_to_texts(&tok, &ids),
                naive_bpe(&word, &merges),
                "{word}"
            );
        }
    }
}

#[test]
fn merge_rank_decides_and_ties_go_left() {
    let t = Tokenizer::new(byte_vocab(&["ab", "bc"], &["a b", "b c"])).unwrap();
    assert_eq!(
        ids_to_texts(&t, &t.encode("abc", false, false)),
        ["ab", "c"]
    );
    let t = Tokenizer::new(byte_vocab(&["ab", "bc"], &["b c", "a b"])).unwrap();
    assert_eq!(
        ids_to_texts(&t, &t.encode("abc", false, false)),
        ["a", "bc"]
    );
    let t = Tokenizer::new(byte_vocab(&["aa"], &["a a"])).unwrap();
    assert_eq!(
        ids_to_texts(&t, &t.encode("aaa", false, false)),
        ["aa", "a"]
    );
    assert_eq!(
        ids_to_texts(&t, &t.encode("aaaaa", false, false)),
        ["aa", "aa", "a"]
    );
    // Merges never cross a pre-token boundary: " b" is its own word.
    let t = Tokenizer::new(byte_vocab(&["aĠ"], &["a Ġ"])).unwrap();
    assert_eq!(
        ids_to_texts(&t, &t.encode("a b", false, false)),
        ["a", "Ġ", "b"]
    );
}

#[test]
fn pre_tokenizer_is_chosen_by_name() {
    let digits = |pre: &str| {
        let mut d = byte_vocab(&["11", "111", "'S", "Ġ'"], &["1 1", "11 1", "' S", "Ġ '"]);
        d.pre = Some(pre.into());
        let t = Tokenizer::new(d).unwrap();
        (
            ids_to_texts(&t, &t.encode("1111", false, false)),
            ids_to_texts(&t, &t.encode("IT'S", false, false)),
        )
    };
    // GPT-2: digits are one run; "'S" is not a contraction (case-sensitive).
    assert_eq!(
        digits("default"),
        (
            vec!["11".into(), "11".into()],
            vec!["I".into(), "T".into(), "'".into(), "S".into()]
        )
    );
    // Llama 3: digits in groups of three; contractions case-insensitive.
    assert_eq!(
        digits("llama-bpe"),
        (
            vec!["111".into(), "1".into()],
            vec!["I".into(), "T".into(), "'S".into()]
        )
    );
    // Qwen 2: single digits.
    assert_eq!(
        digits("qwen2"),
        (
            vec!["1".into(); 4],
            vec!["I".into(), "T".into(), "'S".into()]
        )
    );
}

/// One `tokenizer.ggml.pre` name for each set of patterns llama.cpp maps names to.
const PRE_NAMES: &[&str] = &[
    "default",
    "llama-bpe",
    "qwen2",
    "qwen35",
    "jais-2",
    "laguna",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "spark2_5",
    "youtu",
    "falcon",
    "smollm",
    "bloom",
    "viking",
    "tekken",
    "chameleon",
    "gpt-4o",
    "granite-embed-multi-97m",
    "tiny_aya",
    "superbpe",
    "bailingmoe",
    "seed-coder",
    "ufakzeka",
    "exaone-moe",
    "minicpm5",
];

/// The texts of `s`'s tokens with the pre-tokenizer `pre` over a vocabulary of bytes only: the
/// pre-tokenizer's words show as the texts of the whole-word tokens listed in `words`.
fn words_of(pre: &str, s: &str, words: &[&str]) -> Result<Vec<String>, TokenizerError> {
    let bu = ByteUnicode::new();
    let alpha = |w: &str| -> String { w.bytes().map(|b| bu.char_of(b)).collect() };
    let extra: Vec<String> = words.iter().map(|w| alpha(w)).collect();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut d = byte_vocab(&extra, &[]);
    d.pre = Some(pre.into());
    // Whole-word tokens are taken only by ignore_merges; build every word by merges instead.
    let mut merges = Vec::new();
    for w in &extra {
        let chars: Vec<char> = w.chars().collect();
        let mut left = chars[0].to_string();
        for c in &chars[1..] {
            merges.push(format!("{left} {c}"));
            left.push(*c);
            if !d.tokens.contains(&left) {
                d.tokens.push(left.clone());
            }
        }
    }
    d.merges = merges;
    let t = Tokenizer::new(d)?;
    let ids = t.encode(s, false, false);
    Ok(ids
        .iter()
        .map(|&id| String::from_utf8_lossy(t.token_to_piece_bytes(id).unwrap()).into_owned())
        .collect())
}

#[test]
fn pre_tokenizer_names_map_as_in_llama_cpp() {
    // The reviewer's case: DeepSeek-R1's Qwen distills are tokenized as Qwen 2 (single digits,
    // case-insensitive contractions), not as GPT-2.
    let words = ["IT", "'S", "'s", " 2024", "2024", "202", "2", "0", "4"];
    let qwen = words_of("qwen2", "IT'S 2024", &words).unwrap();
    assert_eq!(qwen, ["IT", "'S", " ", "2", "0", "2", "4"]);
    assert_eq!(
        words_of("deepseek-r1-qwen", "IT'S 2024", &words).unwrap(),
        qwen
    );
    assert_ne!(words_of("default", "IT'S 2024", &words).unwrap(), qwen);
    // Llama 3's split under other names (digits in threes).
    for pre in ["smaug-bpe", "falcon3", "pixtral", "dbrx", "glm4"] {
        assert_eq!(
            words_of(pre, "IT'S 2024", &words).unwrap(),
            ["IT", "'S", " ", "202", "4"],
            "{pre}"
        );
    }
    // Several patterns in turn: StarCoder's digits first, then GPT-2's (" 2024" is no word).
    assert_eq!(
        words_of("smollm", "x 2024", &words).unwrap(),
        ["x", " ", "2", "0", "2", "4"]
    );
    // DeepSeek V3: digits in threes, then CJK runs, then words.
    assert_eq!(
        words_of(
            "deepseek-v3",
            "1234567日本語ab",
            &["123", "456", "日本語", "ab"]
        )
        .unwrap(),
        ["123", "456", "7", "日本語", "ab"]
    );
    // SuperBPE and Tiny Aya: digit runs cut in threes from the right.
    for pre in ["superbpe", "tiny_aya"] {
        assert_eq!(
            words_of(pre, "1234567", &["1", "234", "567", "123", "456"]).unwrap(),
            ["1", "234", "567"],
            "{pre}"
        );
    }
    // Tekken and GPT-4o cut words at case changes.
    for pre in ["tekken", "gpt-4o", "llama4"] {
        assert_eq!(
            words_of(pre, "HelloWorld", &["Hello", "World", "HelloWorld"]).unwrap(),
            ["Hello", "World"],
            "{pre}"
        );
    }
}

#[test]
fn unknown_pre_tokenizer_is_refused_by_name() {
    for (pre, why) in [
        ("totally-unknown", "neither llama.cpp nor Muser knows"),
        ("kimi-k2", "Muser does not implement"),
        ("gemma4", "Muser does not implement"),
    ] {
        let err = Tokenizer::new(gpt2_data(pre, 10)).err().expect(pre);
        assert!(
            matches!(
                err,
                TokenizerError::WrongType {
                    key: "tokenizer.ggml.pre",
                    ..
                }
            ),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("{pre:?}")) && msg.contains(why),
            "{msg}"
        );
    }
    // A file without the key, or with an empty name, is GPT-2's (llama.cpp's "default" is a list
    // of its own; Muser keeps GPT-2's pattern there, as before).
    for pre in [None, Some(""), Some("gpt2")] {
        let mut d = gpt2_data("default", 10);
        d.pre = pre.map(str::to_string);
        assert!(Tokenizer::new(d).is_ok());
    }
    // A SentencePiece vocabulary has no pre-tokenizer: the name is not looked at.
    let mut d = spm_data(&[("▁a", 0.0)]);
    d.pre = Some("totally-unknown".into());
    assert!(Tokenizer::new(d).is_ok());
}

#[test]
fn llama_bpe_ignore_merges_takes_whole_word_tokens() {
    // "abc" is a token, but no merge chain builds it.
    let mut d = byte_vocab(&["abc", "ab"], &["a b"]);
    d.pre = Some("llama-bpe".into());
    let t = Tokenizer::new(d.clone()).unwrap();
    assert_eq!(ids_to_texts(&t, &t.encode("abc", false, false)), ["abc"]);
    d.pre = Some("default".into());
    let t = Tokenizer::new(d).unwrap();
    assert_eq!(
        ids_to_texts(&t, &t.encode("abc", false, false)),
        ["ab", "c"]
    );
}

#[test]
fn special_tokens_split_before_bpe() {
    let tok = Tokenizer::new(gpt2_data("llama-bpe", 50)).unwrap();
    let eot = tok.token_id("<|eot|>").unwrap();
    let tool = tok.token_id("<tool>").unwrap();
    let text = "hi<|eot|>there<tool>x<|eot|>";
    let parsed = tok.encode(text, false, true);
    assert_eq!(parsed.iter().filter(|&&i| i == eot).count(), 2);
    assert_eq!(*parsed.last().unwrap(), eot);
    assert!(parsed.contains(&tool));
    // Without parse_special control tokens stay text; user-defined tokens are still matched.
    let plain = tok.encode(text, false, false);
    assert!(!plain.contains(&eot));
    assert!(plain.contains(&tool));
    for ids in [&parsed, &plain] {
        assert_eq!(tok.decode(ids).unwrap(), text.as_bytes());
    }
    // The text around a special token is tokenized as if the token were not there.
    let before = tok.encode("hi", false, false);
    assert_eq!(&parsed[..before.len()], &before[..]);
    assert_eq!(parsed[before.len()], eot);
}

#[test]
fn longest_special_token_wins() {
    let mut d = byte_vocab(&["<|e", "<|eot|>"], &[]);
    d.token_types = vec![TokenType::Normal; 256];
    d.token_types
        .extend([TokenType::Control, TokenType::Control]);
    let t = Tokenizer::new(d).unwrap();
    assert_eq!(t.encode("<|eot|><|e", false, true), [257, 256]);
}

#[test]
fn bos_eos_follow_the_file_and_defaults() {
    let mut d = gpt2_data("default", 10);
    let bos = d.bos.unwrap();
    let t = Tokenizer::new(d.clone()).unwrap();
    assert_eq!(t.encode("a", true, false), t.encode("a", false, false)); // gpt2: no BOS by default
    d.pre = Some("llama-bpe".into());
    let t = Tokenizer::new(d.clone()).unwrap();
    assert_eq!(t.encode("a", true, false)[0], bos); // llama-bpe: BOS by default
    d.add_bos = Some(false);
    d.add_eos = Some(true);
    let t = Tokenizer::new(d).unwrap();
    let ids = t.encode("a", true, false);
    assert_ne!(ids[0], bos);
    assert_eq!(*ids.last().unwrap(), t.eos().unwrap());
    assert!(t.is_eog(t.eos().unwrap()) && t.is_eog(t.eot().unwrap()) && !t.is_eog(ids[0]));
}

/// A byte vocabulary with `specials` appended (ids 256..), each of the given type.
fn with_specials(specials: &[(&str, TokenType)]) -> TokenizerData {
    let texts: Vec<&str> = specials.iter().map(|s| s.0).collect();
    let mut d = byte_vocab(&texts, &[]);
    d.token_types = vec![TokenType::Normal; 256];
    d.token_types.extend(specials.iter().map(|s| s.1));
    d
}

#[test]
fn end_of_turn_tokens_are_found_by_text_as_llama_cpp_does() {
    // A ChatML file that names only EOS, with <|im_end|> mistyped as a normal token.
    let mut d = with_specials(&[
        ("<|im_start|>", TokenType::Control),
        ("<|im_end|>", TokenType::Normal),
        ("<|endoftext|>", TokenType::Control),
    ]);
    d.pre = Some("qwen2".into());
    d.eos = Some(258);
    let t = Tokenizer::new(d.clone()).unwrap();
    let (start, end, eos) = (256, 257, 258);
    assert_eq!(t.eot(), Some(end));
    assert!(t.is_eog(end) && t.is_eog(eos) && !t.is_eog(start));
    assert_eq!(t.eog_ids(), [end, eos]);
    // It is a control token now: parsed only when asked, and no text when generated.
    assert_eq!(t.token_type(end).unwrap(), TokenType::Control);
    let a = t.encode("a", false, false)[0];
    assert_eq!(t.encode("a<|im_end|>", false, true), [a, end]);
    assert!(!t.encode("a<|im_end|>", false, false).contains(&end));
    // A file that names its EOT keeps it; the texts still end generation.
    d.eot = Some(start);
    let t = Tokenizer::new(d).unwrap();
    assert_eq!(t.eot(), Some(start));
    assert!(t.is_eog(start) && t.is_eog(end));

    // Phi-3 (SentencePiece): <|end|> ends a turn, <|user|> and <|assistant|> do not.
    let mut d = spm_data(&[("▁a", 0.0)]);
    let n = d.tokens.len() as u32;
    for text in ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>"] {
        d.tokens.push(text.into());
        d.token_types.push(TokenType::UserDefined);
        d.scores.push(0.0);
    }
    d.eos = Some(n);
    let t = Tokenizer::new(d).unwrap();
    let (assistant, end, user) = (n + 1, n + 2, n + 3);
    assert_eq!(t.eot(), Some(end));
    assert!(t.is_eog(end) && t.is_eog(n) && !t.is_eog(user) && !t.is_eog(assistant));
    assert!(t.is_eog(2)); // </s> too, as in llama.cpp
    assert_eq!(t.token_type(user).unwrap(), TokenType::UserDefined);
    // Llama 3.1's <|eom_id|> is EOM; FIM pad / repo / file separator end generation, the
    // FIM prefix is control but does not.
    let t = Tokenizer::new(with_specials(&[
        ("<|eot_id|>", TokenType::Control),
        ("<|eom_id|>", TokenType::Control),
        ("<|fim_prefix|>", TokenType::Normal),
        ("<|fim_pad|>", TokenType::Control),
        ("<|repo_name|>", TokenType::Control),
        ("<|file_sep|>", TokenType::Control),
    ]))
    .unwrap();
    assert_eq!((t.eot(), t.eom()), (Some(256), Some(257)));
    assert_eq!(t.eog_ids(), [256, 257, 259, 260, 261]);
    assert_eq!(t.token_type(258).unwrap(), TokenType::Control);
    let fim = t.fim();
    assert_eq!(
        (fim.pre, fim.pad, fim.rep, fim.sep),
        (Some(258), Some(259), Some(260), Some(261))
    );
    assert_eq!((fim.suf, fim.mid), (None, None));
    // A vocabulary with none of the texts ends generation at EOS alone.
    let mut d = with_specials(&[("<|stop|>", TokenType::Control)]);
    d.eos = Some(256);
    let t = Tokenizer::new(d).unwrap();
    assert_eq!((t.eot(), t.eog_ids()), (None, &[256][..]));
}

#[test]
fn harmony_end_and_gemma4_eos_marker_exceptions() {
    // gpt-oss: <|return|> and <|call|> end the answer; <|end|> only ends a message.
    let t = Tokenizer::new(with_specials(&[
        ("<|end|>", TokenType::Control),
        ("<|return|>", TokenType::Control),
        ("<|call|>", TokenType::Control),
    ]))
    .unwrap();
    assert_eq!(t.eog_ids(), [257, 258]);
    assert_eq!(t.token_type(256).unwrap(), TokenType::UserDefined);
    // Without <|call|>, <|end|> ends generation.
    let t = Tokenizer::new(with_specials(&[
        ("<|end|>", TokenType::Control),
        ("<|return|>", TokenType::Control),
    ]))
    .unwrap();
    assert_eq!(t.eog_ids(), [256, 257]);
    // Gemma 4: </s> is an ordinary token where <|tool_response> ends turns.
    let t = Tokenizer::new(with_specials(&[
        ("</s>", TokenType::Control),
        ("<|tool_response>", TokenType::Control),
    ]))
    .unwrap();
    assert_eq!(t.eog_ids(), [257]);
    assert_eq!(t.token_type(256).unwrap(), TokenType::Normal);
}

// ---------------------------------------------------------------- streaming

#[test]
fn stream_decoder_holds_partial_characters() {
    let tok = Tokenizer::new(byte_vocab(&[], &[])).unwrap(); // one token per byte
    let mut rng = StdRng::seed_from_u64(5);
    for _ in 0..100 {
        let text = random_text(&mut rng, 40);
        let ids = tok.encode(&text, false, false);
        let mut dec = StreamDecoder::new();
        let mut out = String::new();
        for &id in &ids {
            let piece = dec.push(&tok, id).unwrap();
            // A partial character is never handed out.
            assert!(!piece.contains(char::REPLACEMENT_CHARACTER));
            out.push_str(&piece);
            assert!(dec.pending().len() < 4);
        }
        assert!(dec.pending().is_empty());
        assert_eq!(dec.flush(), "");
        assert_eq!(out, text);
    }
    // "é" is two tokens; the first gives nothing, the second the character.
    let mut dec = StreamDecoder::new();
    let ids = tok.encode("é", false, false);
    assert_eq!(ids.len(), 2);
    assert_eq!(dec.push(&tok, ids[0]).unwrap(), "");
    assert_eq!(dec.push(&tok, ids[1]).unwrap(), "é");
    // A dangling lead byte comes out lossily on flush; a bad id is an error.
    let lead = tok.encode_bytes(&[0xE6], false, false);
    assert_eq!(dec.push(&tok, lead[0]).unwrap(), "");
    assert!(matches!(
        dec.push(&tok, 1_000_000),
        Err(TokenizerError::IdOutOfRange { id: 1_000_000, .. })
    ));
    assert_eq!(dec.flush(), "\u{FFFD}");
    // An impossible byte does not block what follows.
    let ids = tok.encode_bytes(&[0xFF, b'o', b'k'], false, false);
    let s: String = ids.iter().map(|&i| dec.push(&tok, i).unwrap()).collect();
    assert_eq!(s, "\u{FFFD}ok");
}

/// Generated text leaves control and unknown tokens out (llama.cpp's pieces without special
/// tokens); user-defined tokens are text and stay. `decode` still writes every token's text.
#[test]
fn stream_decoder_leaves_control_tokens_out() {
    let mut data = byte_vocab(&["<|ctl|>", "<|user|>", "<unk>"], &[]);
    data.token_types = vec![TokenType::Normal; 256];
    data.token_types.extend([
        TokenType::Control,
        TokenType::UserDefined,
        TokenType::Unknown,
    ]);
    let tok = Tokenizer::new(data).unwrap();
    let (ctl, user, unk) = (256u32, 257u32, 258u32);
    let mut rng = StdRng::seed_from_u64(11);
    for _ in 0..50 {
        // Random text with the three special tokens sprinkled in, some inside a character.
        let text = random_text(&mut rng, 20);
        let mut ids = Vec::new();
        let mut want = String::new();
        for &b in text.as_bytes() {
            ids.extend(tok.encode_bytes(&[b], false, false));
            match rng.gen_range(0..6) {
                0 => ids.push(ctl),
                1 => ids.push(unk),
                2 => ids.push(user),
                _ => {}
            }
        }
        let mut dec = StreamDecoder::new();
        let got: String = ids.iter().map(|&i| dec.push(&tok, i).unwrap()).collect();
        // The user-defined token's text lands between the bytes where it came; compare with
        // the control and unknown tokens dropped from the ids.
        let kept: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&i| i != ctl && i != unk)
            .collect();
        want.push_str(&String::from_utf8_lossy(&tok.decode(&kept).unwrap()));
        assert_eq!(got + &dec.flush(), want);
    }
    assert_eq!(tok.decode(&[ctl, user]).unwrap(), b"<|ctl|><|user|>");
}

// ---------------------------------------------------------------- SentencePiece

/// `<unk>`, `<s>`, `</s>`, the 256 byte tokens, then scored pieces.
fn spm_data(pieces: &[(&str, f32)]) -> TokenizerData {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![TokenType::Unknown, TokenType::Control, TokenType::Control];
    let mut scores = vec![0.0; 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(TokenType::Byte);
        scores.push(0.0);
    }
    for &(p, s) in pieces {
        tokens.push(p.into());
        types.push(TokenType::Normal);
        scores.push(s);
    }
    let mut d = TokenizerData::new(TokenizerModel::Llama, tokens);
    d.scores = scores;
    d.token_types = types;
    d
}

#[test]
fn spm_merges_by_score_with_space_prefix() {
    let pieces = [
        ("▁", -1.0),
        ("a", -1.0),
        ("b", -1.0),
        ("▁a", -3.0),
        ("ab", -2.0),
        ("▁ab", -4.0),
    ];
    let t = Tokenizer::new(spm_data(&pieces)).unwrap();
    // "ab" (-2) beats "▁a" (-3); then "▁ab" is a token.
    assert_eq!(ids_to_texts(&t, &t.encode("ab", false, false)), ["▁ab"]);
    assert_eq!(t.encode("ab", true, false)[0], 1); // llama adds BOS by default
    let mut d = spm_data(&pieces[..5]);
    d.add_space_prefix = Some(false);
    let t = Tokenizer::new(d).unwrap();
    assert_eq!(
        ids_to_texts(&t, &t.encode("ab a", false, false)),
        ["ab", "▁a"]
    );
    let t = Tokenizer::new(spm_data(&[
        ("▁", -1.0),
        ("a", -1.0),
        ("b", -1.0),
        ("▁a", -1.0),
        ("ab", -2.0),
    ]))
    .unwrap();
    assert_eq!(ids_to_texts(&t, &t.encode("ab", false, false)), ["▁a", "b"]);
}

#[test]
fn spm_byte_fallback_and_round_trip() {
    let t = Tokenizer::new(spm_data(&[
        ("▁", -1.0),
        ("h", -1.0),
        ("i", -1.0),
        ("▁hi", -1.5),
        ("hi", -1.2),
    ]))
    .unwrap();
    assert_eq!(
        ids_to_texts(&t, &t.encode("hi é", false, false)),
        ["▁hi", "▁", "<0xC3>", "<0xA9>"]
    );
    let mut rng = StdRng::seed_from_u64(9);
    for _ in 0..200 {
        let text = random_text(&mut rng, 50);
        let ids = t.encode(&text, false, false);
        assert_eq!(t.decode(&ids).unwrap(), format!(" {text}").as_bytes());
        let bytes: Vec<u8> = (0..rng.gen_range(0..60)).map(|_| rng.gen()).collect();
        let ids = t.encode_bytes(&bytes, false, false);
        // The space prefix belongs to a text fragment; empty input has none.
        let mut expect = if bytes.is_empty() {
            vec![]
        } else {
            b" ".to_vec()
        };
        expect.extend_from_slice(&bytes);
        assert_eq!(t.decode(&ids).unwrap(), expect);
    }
    // No byte tokens and no file unk: falls back to id 0, the conventional <unk>.
    let mut d = TokenizerData::new(
        TokenizerModel::Llama,
        vec!["<unk>".into(), "▁".into(), "a".into()],
    );
    d.token_types = vec![TokenType::Unknown, TokenType::Normal, TokenType::Normal];
    let t = Tokenizer::new(d).unwrap();
    assert_eq!(t.encode("aé", false, false), [1, 2, 0, 0]);
    assert_eq!(t.unk(), Some(0));
}

#[test]
fn tokenizer_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<StreamDecoder>();
}

// ---------------------------------------------------------------- bad metadata

#[test]
fn bad_metadata_is_a_typed_error() {
    let err = |d: TokenizerData| Tokenizer::new(d).err().unwrap();
    assert!(matches!(
        err(byte_vocab(&["ab"], &["a x"])),
        TokenizerError::BadMerge { index: 0, .. }
    ));
    assert!(matches!(
        err(byte_vocab(&["ab"], &["a b", "ab"])),
        TokenizerError::BadMerge { index: 1, .. }
    ));
    // "b c" is a pair of tokens, but "bc" is not.
    assert!(matches!(
        err(byte_vocab(&["ab"], &["b c"])),
        TokenizerError::BadMerge { index: 0, .. }
    ));
    let mut d = byte_vocab(&[], &[]);
    d.bos = Some(256);
    match err(d) {
        TokenizerError::SpecialIdOutOfRange {
            key,
            id: 256,
            n_vocab: 256,
        } => {
            assert_eq!(key, "tokenizer.ggml.bos_token_id")
        }
        e => panic!("{e}"),
    }
    let mut d = byte_vocab(&[], &[]);
    d.scores = vec![0.0; 10];
    assert!(matches!(
        err(d),
        TokenizerError::LengthMismatch {
            found: 10,
            n_vocab: 256,
            ..
        }
    ));
    let mut d = byte_vocab(&[], &[]);
    d.tokens.remove(b'x' as usize);
    assert!(matches!(
        err(d),
        TokenizerError::MissingByteToken { byte: b'x', .. }
    ));
    assert!(matches!(
        err(TokenizerData::new(TokenizerModel::Llama, vec![])),
        TokenizerError::EmptyVocab
    ));
    let t = Tokenizer::new(byte_vocab(&[], &[])).unwrap();
    let e = t.decode(&[1, 2, 999]).unwrap_err();
    assert_eq!(
        e,
        TokenizerError::IdOutOfRange {
            id: 999,
            n_vocab: 256
        }
    );
    assert!(e.to_string().contains("999"));
}

// ---------------------------------------------------------------- from GGUF metadata

fn gguf_with(meta: Vec<(&str, MetaValue)>) -> GgufFile {
    let meta: Vec<(String, MetaValue)> =
        meta.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let bytes = GgufWriter::new(Vec::new(), &meta, &[])
        .unwrap()
        .finish()
        .unwrap();
    GgufFile::from_bytes(bytes).unwrap()
}

fn str_array(items: &[String]) -> MetaValue {
    MetaValue::Array(
        MetaType::String,
        items.iter().map(|s| MetaValue::String(s.clone())).collect(),
    )
}

#[test]
fn from_gguf_reads_metadata() {
    let d = gpt2_data("qwen2", 100);
    let types = MetaValue::Array(
        MetaType::I32,
        d.token_types
            .iter()
            .map(|&t| MetaValue::I32(t as i32))
            .collect(),
    );
    let file = gguf_with(vec![
        ("tokenizer.ggml.model", MetaValue::String("gpt2".into())),
        ("tokenizer.ggml.pre", MetaValue::String("qwen2".into())),
        ("tokenizer.ggml.tokens", str_array(&d.tokens)),
        ("tokenizer.ggml.token_type", types),
        ("tokenizer.ggml.merges", str_array(&d.merges)),
        (
            "tokenizer.ggml.bos_token_id",
            MetaValue::U32(d.bos.unwrap()),
        ),
        (
            "tokenizer.ggml.eos_token_id",
            MetaValue::U32(d.eos.unwrap()),
        ),
        (
            "tokenizer.ggml.eot_token_id",
            MetaValue::U32(d.eot.unwrap()),
        ),
        ("tokenizer.ggml.padding_token_id", MetaValue::I32(-1)),
        ("tokenizer.ggml.add_bos_token", MetaValue::Bool(true)),
        ("tokenizer.ggml.fim_sep_token_id", MetaValue::U32(7)),
    ]);
    let read = TokenizerData::from_gguf(&file).unwrap();
    let mut expect = d.clone();
    expect.add_bos = Some(true);
    expect.fim_sep = Some(7);
    assert_eq!(read, expect);
    let t = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(t.encode("x", true, false)[0], d.bos.unwrap());
    assert_eq!(t.pad(), None);
    // The FIM file separator ends generation.
    assert!(t.is_eog(7) && !t.is_eog(8));

    let missing = gguf_with(vec![(
        "tokenizer.ggml.model",
        MetaValue::String("gpt2".into()),
    )]);
    assert_eq!(
        Tokenizer::from_gguf(&missing).err().unwrap(),
        TokenizerError::MissingKey {
            key: "tokenizer.ggml.tokens"
        }
    );
    let bert = gguf_with(vec![(
        "tokenizer.ggml.model",
        MetaValue::String("bert".into()),
    )]);
    assert!(
        matches!(Tokenizer::from_gguf(&bert), Err(TokenizerError::UnsupportedModel(m)) if m == "bert")
    );
    let wrong = gguf_with(vec![
        ("tokenizer.ggml.model", MetaValue::String("llama".into())),
        ("tokenizer.ggml.tokens", MetaValue::U32(3)),
    ]);
    assert!(matches!(
        Tokenizer::from_gguf(&wrong),
        Err(TokenizerError::WrongType {
            key: "tokenizer.ggml.tokens",
            ..
        })
    ));
    let bad_type = gguf_with(vec![
        ("tokenizer.ggml.model", MetaValue::String("llama".into())),
        (
            "tokenizer.ggml.tokens",
            str_array(&["a".into(), "b".into()]),
        ),
        (
            "tokenizer.ggml.token_type",
            MetaValue::Array(MetaType::I32, vec![MetaValue::I32(1), MetaValue::I32(9)]),
        ),
    ]);
    assert_eq!(
        Tokenizer::from_gguf(&bad_type).err().unwrap(),
        TokenizerError::BadTokenType { id: 1, value: 9 }
    );
}
