//! Decode groups and the serving helpers: a sequence gets the same logits, bit for bit, decoded
//! alone or in a group of any size and composition; chunked prefill and a rewound prefix give
//! the logits of one whole prefill; a bad group is refused with no sequence moved.

mod common;
use common::*;
use muser_engine::{
    prefill_runs, CpuBackend, DecodeGroup, LoadOptions, Model, RowGot, RowNeed, Session, Snapshot,
};
use muser_sample::{greedy, top_k_logits};

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Greedy continuation of `prompt` alone: the logits of every decode step.
fn solo(m: &Model, n_ctx: usize, prompt: &[u32], steps: usize) -> Vec<Vec<u32>> {
    let mut s = Session::new(m, n_ctx).unwrap();
    let mut logits = s.prefill(prompt).unwrap().to_vec();
    let mut out = Vec::new();
    for _ in 0..steps {
        let next = greedy(&logits).unwrap();
        logits = s.decode(next).unwrap().to_vec();
        out.push(bits(&logits));
    }
    out
}

/// 16 sequences with prompts of different lengths advance in decode groups whose size and
/// members change every step (sequence i runs steps + i steps, so groups shrink at the end);
/// each sequence's logits equal its solo run's bit for bit.
fn group_equals_solo(m: &Model, n_ctx: usize, lens: &[usize], steps: usize) {
    let steps_of = |i: usize| steps + i;
    let nv = m.config.n_vocab;
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| random_tokens(n, nv, 100 + i as u64))
        .collect();
    let want: Vec<Vec<Vec<u32>>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| solo(m, n_ctx, p, steps_of(i)))
        .collect();

    let mut sessions: Vec<Session> = prompts
        .iter()
        .map(|_| Session::new(m, n_ctx).unwrap())
        .collect();
    let mut next: Vec<u32> = sessions
        .iter_mut()
        .zip(&prompts)
        .map(|(s, p)| greedy(s.prefill(p).unwrap()).unwrap())
        .collect();
    let mut done = vec![0usize; prompts.len()];
    let mut group = DecodeGroup::new();
    let mut step = 0;
    let mut sizes = Vec::new();
    while (0..prompts.len()).any(|i| done[i] < steps_of(i)) {
        // Members this step: every unfinished sequence on every fourth step; else a third of
        // them sit out, a different third each step (sequence 0 never does).
        let members: Vec<usize> = (0..prompts.len())
            .filter(|&i| done[i] < steps_of(i) && (step % 4 == 0 || i == 0 || (i + step) % 3 != 0))
            .collect();
        step += 1;
        if members.is_empty() {
            continue;
        }
        sizes.push(members.len());
        let tokens: Vec<u32> = members.iter().map(|&i| next[i]).collect();
        let mut refs: Vec<&mut Session> = sessions
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| members.contains(i))
            .map(|(_, s)| s)
            .collect();
        group.decode(&mut refs, &tokens).unwrap();
        for &i in &members {
            let row = sessions[i].logits();
            assert_eq!(
                bits(row),
                want[i][done[i]],
                "sequence {i} (prompt {}) step {}: group of {} differs from solo",
                lens[i],
                done[i],
                members.len()
            );
            next[i] = greedy(row).unwrap();
            done[i] += 1;
        }
    }
    assert!(sizes.contains(&16), "sizes {sizes:?}");
    assert!(sizes.contains(&1), "sizes {sizes:?}");
}

const LENS: [usize; 16] = [1, 2, 3, 5, 7, 9, 12, 15, 16, 17, 20, 24, 29, 31, 33, 38];

#[test]
fn group_equals_solo_muse() {
    // Window 16 < positions: the sliding rings wrap during the run.
    group_equals_solo(&Tiny::new("muse").model(), 80, &LENS, 12);
}

#[test]
fn group_equals_solo_llama() {
    group_equals_solo(&Tiny::new("llama").model(), 80, &LENS, 12);
}

#[test]
fn group_equals_solo_qwen3() {
    group_equals_solo(&Tiny::new("qwen3").model(), 80, &LENS, 12);
}

fn default_model() -> Option<Model<CpuBackend>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../models/muse-default.gguf"
    );
    std::path::Path::new(path).is_file().then(|| {
        Model::load(
            path,
            &LoadOptions {
                threads: Some(2),
                ..Default::default()
            },
        )
        .unwrap()
    })
}

#[test]
fn group_equals_solo_default_model() {
    // The shipped Q4_K_M model: 16 greedy requests alone and beside each other.
    let Some(m) = default_model() else {
        eprintln!("models/muse-default.gguf not found; skipped");
        return;
    };
    let lens: Vec<usize> = LENS.iter().map(|n| n * 5).collect();
    group_equals_solo(&m, 512, &lens, 16);
}

#[test]
fn decode_greedy_picks_the_first_maximum_of_decode_logits() {
    let t = Tiny::new("muse");
    let m = t.model();
    let prompt = random_tokens(9, t.n_vocab, 21);
    let mut a = Session::new(&m, 64).unwrap();
    let mut b = Session::new(&m, 64).unwrap();
    let mut next = greedy(a.prefill(&prompt).unwrap()).unwrap();
    b.prefill(&prompt).unwrap();
    for _ in 0..12 {
        let want = greedy(a.decode(next).unwrap()).unwrap();
        let got = b.decode_greedy(next).unwrap();
        assert_eq!(got, want);
        assert_eq!(a.pos(), b.pos());
        next = got;
    }
}

#[test]
fn decode_rows_equal_decode_and_what_its_logits_give() {
    // 6 sequences in groups whose rows' needs change every step: an argmax row's pick is the
    // first maximum of the logits `decode` gives it, a top-k row's candidates are
    // `top_k_logits` of them, and every other row's logits are `decode`'s bit for bit.
    let t = Tiny::new("llama");
    let m = t.model();
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|i| random_tokens(3 + 2 * i, t.n_vocab, 40 + i as u64))
        .collect();
    let new_sessions = || -> Vec<Session> {
        prompts
            .iter()
            .map(|p| {
                let mut s = Session::new(&m, 64).unwrap();
                s.prefill(p).unwrap();
                s
            })
            .collect()
    };
    let (mut a, mut b) = (new_sessions(), new_sessions());
    let mut next: Vec<u32> = a.iter().map(|s| greedy(s.logits()).unwrap()).collect();
    let (mut ga, mut gb) = (DecodeGroup::new(), DecodeGroup::new());
    let mut reduced = 0;
    for step in 0..10 {
        let need: Vec<RowNeed> = (0..6)
            .map(|i| match (i + step) % 4 {
                0 => RowNeed::Logits,
                1 => RowNeed::Argmax,
                2 => RowNeed::TopK(1 + i + step),
                _ => RowNeed::TopK(7),
            })
            .collect();
        let mut ra: Vec<&mut Session> = a.iter_mut().collect();
        ga.decode(&mut ra, &next).unwrap();
        let mut rb: Vec<&mut Session> = b.iter_mut().collect();
        let got = gb.decode_rows(&mut rb, &next, &need).unwrap();
        for i in 0..6 {
            let want = greedy(a[i].logits()).unwrap();
            assert_eq!(a[i].pos(), b[i].pos());
            match (&got[i], need[i]) {
                (RowGot::Argmax(p), RowNeed::Argmax) => {
                    assert_eq!(*p, want, "step {step} row {i}");
                    reduced += 1;
                }
                (RowGot::TopK(top), RowNeed::TopK(k)) => {
                    let host: Vec<(u32, u32)> = top_k_logits(a[i].logits(), k)
                        .iter()
                        .map(|c| (c.id, c.logit.to_bits()))
                        .collect();
                    let got: Vec<(u32, u32)> =
                        top.iter().map(|&(id, l)| (id, l.to_bits())).collect();
                    assert_eq!(got, host, "step {step} row {i}");
                    assert_eq!(got.len(), k);
                    reduced += 1;
                }
                (RowGot::Logits, RowNeed::Logits) => {
                    assert_eq!(
                        bits(b[i].logits()),
                        bits(a[i].logits()),
                        "step {step} row {i}"
                    );
                }
                (g, n) => panic!("step {step} row {i}: {n:?} got {g:?}"),
            }
            // Not always the greedy token, so the rows wander apart.
            next[i] = if step % 2 == 0 {
                want
            } else {
                (want + 1 + i as u32) % t.n_vocab as u32
            };
        }
    }
    assert!(reduced > 30);
    let mut rb: Vec<&mut Session> = b.iter_mut().collect();
    assert!(gb
        .decode_rows(&mut rb, &next, &[RowNeed::Argmax; 5])
        .is_err());
}

#[test]
fn decode_top_k_gives_the_top_k_of_decode_logits() {
    let t = Tiny::new("qwen3");
    let m = t.model();
    let prompt = random_tokens(7, t.n_vocab, 23);
    let mut a = Session::new(&m, 64).unwrap();
    let mut b = Session::new(&m, 64).unwrap();
    let mut next = greedy(a.prefill(&prompt).unwrap()).unwrap();
    b.prefill(&prompt).unwrap();
    for step in 0..10 {
        let k = 1 + 5 * step;
        let want: Vec<(u32, u32)> = top_k_logits(a.decode(next).unwrap(), k)
            .iter()
            .map(|c| (c.id, c.logit.to_bits()))
            .collect();
        let got: Vec<(u32, u32)> = b
            .decode_top_k(next, k)
            .unwrap()
            .iter()
            .map(|&(id, l)| (id, l.to_bits()))
            .collect();
        assert_eq!(got, want, "step {step}");
        assert_eq!(a.pos(), b.pos());
        next = want[want.len() - 1].0;
    }
}

#[test]
fn prefill_runs_equal_each_prompts_own_prefill() {
    // Five sequences, two of them with a cached prefix already, prefilled in one pass: each gets
    // its own prefill's logits and cache (the decode after it matches too), on every
    // architecture switch of the tiny presets (sliding rings, gates, QK norms).
    for arch in ["muse", "llama", "qwen3"] {
        let t = Tiny::new(arch);
        let m = t.model();
        let lens = [7usize, 1, 19, 3, 12];
        let prompts: Vec<Vec<u32>> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| random_tokens(n, t.n_vocab, 70 + i as u64))
            .collect();
        let prefix = random_tokens(9, t.n_vocab, 99);
        let start = |i: usize| -> Session {
            let mut s = Session::new(&m, 80).unwrap();
            if i % 2 == 1 {
                s.prefill(&prefix).unwrap();
            }
            s
        };
        let mut alone: Vec<Session> = (0..5).map(start).collect();
        let want: Vec<Vec<u32>> = alone
            .iter_mut()
            .zip(&prompts)
            .map(|(s, p)| bits(s.prefill(p).unwrap()))
            .collect();
        let mut batched: Vec<Session> = (0..5).map(start).collect();
        {
            let mut refs: Vec<&mut Session> = batched.iter_mut().collect();
            let ps: Vec<&[u32]> = prompts.iter().map(|p| p.as_slice()).collect();
            prefill_runs(&mut refs, &ps).unwrap();
        }
        for i in 0..5 {
            assert_eq!(bits(batched[i].logits()), want[i], "{arch} sequence {i}");
            assert_eq!(batched[i].pos(), alone[i].pos());
            let next = greedy(alone[i].logits()).unwrap();
            assert_eq!(
                bits(batched[i].decode(next).unwrap()),
                bits(alone[i].decode(next).unwrap()),
                "{arch} sequence {i}: the decode after it"
            );
        }
    }
}

#[test]
fn prefill_runs_do_not_depend_on_the_cut() {
    // Two prompts (one past the ring of the sliding layers) cut into parts two ways, in company
    // or alone: the same logits and the same decode after them.
    let t = Tiny::new("muse");
    let m = t.model();
    let a = random_tokens(150, t.n_vocab, 5);
    let b = random_tokens(40, t.n_vocab, 6);
    let cuts: [&[(usize, usize, usize, usize)]; 2] = [
        &[(0, 100, 0, 20), (100, 150, 20, 40)],
        &[(0, 30, 0, 0), (30, 129, 0, 0), (129, 150, 0, 40)],
    ];
    let mut got = Vec::new();
    for cut in cuts {
        let mut sa = Session::new(&m, 200).unwrap();
        let mut sb = Session::new(&m, 200).unwrap();
        for &(a0, a1, b0, b1) in cut {
            if b1 > b0 {
                prefill_runs(&mut [&mut sa, &mut sb], &[&a[a0..a1], &b[b0..b1]]).unwrap();
            } else {
                prefill_runs(&mut [&mut sa], &[&a[a0..a1]]).unwrap();
            }
        }
        let mut v = Vec::new();
        for s in [&mut sa, &mut sb] {
            let l = bits(s.logits());
            let next = greedy(s.logits()).unwrap();
            v.push((l, bits(s.decode(next).unwrap())));
        }
        got.push(v);
    }
    assert_eq!(got[0], got[1]);
}

#[test]
fn bad_prefill_runs_are_refused_and_move_nothing() {
    let t = Tiny::new("llama");
    let m = t.model();
    let mut a = Session::new(&m, 16).unwrap();
    let mut b = Session::new(&m, 16).unwrap();
    b.prefill(&[1, 2, 3]).unwrap();
    let long = vec![1u32; 600];
    assert!(prefill_runs(&mut [&mut a], &[&long[..]]).is_err());
    assert!(prefill_runs(&mut [&mut a, &mut b], &[&[1u32][..]]).is_err());
    assert!(prefill_runs(&mut [&mut a, &mut b], &[&[1u32][..], &[]]).is_err());
    let bad = [t.n_vocab as u32];
    assert!(prefill_runs(&mut [&mut a, &mut b], &[&[1u32][..], &bad[..]]).is_err());
    let e = prefill_runs(&mut [&mut a, &mut b], &[&[1u32][..], &[5u32; 14][..]]).unwrap_err();
    assert!(e.to_string().contains("n_ctx = 16"), "{e}");
    assert_eq!((a.pos(), b.pos()), (0, 3));
    prefill_runs(&mut [&mut a, &mut b], &[&[1u32, 2][..], &[4u32][..]]).unwrap();
    assert_eq!((a.pos(), b.pos()), (2, 4));
}

#[test]
fn chunked_prefill_equals_one_prefill() {
    let t = Tiny::new("muse");
    let m = t.model();
    let toks = random_tokens(300, t.n_vocab, 11);
    let mut whole = Session::new(&m, 400).unwrap();
    let want = bits(whole.prefill(&toks).unwrap());
    let mut chunked = Session::new(&m, 400).unwrap();
    for c in toks[..256].chunks(64) {
        chunked.extend(c).unwrap();
    }
    assert_eq!(chunked.pos(), 256);
    assert_eq!(bits(chunked.prefill(&toks[256..]).unwrap()), want);
    assert_eq!(
        bits(chunked.decode(5).unwrap()),
        bits(whole.decode(5).unwrap())
    );
}

#[test]
fn rewind_keeps_the_shared_prefix() {
    let t = Tiny::new("muse"); // window 16, n_ctx 64: rings of 64 slots
    let m = t.model();
    let a = random_tokens(40, t.n_vocab, 1);
    let mut b = a[..30].to_vec();
    b.extend(random_tokens(8, t.n_vocab, 2));
    let mut fresh = Session::new(&m, 64).unwrap();
    let want = bits(fresh.prefill(&b).unwrap());

    let mut s = Session::new(&m, 64).unwrap();
    s.prefill(&a).unwrap();
    assert!(s.rewind(30));
    assert_eq!(s.pos(), 30);
    assert_eq!(bits(s.prefill(&b[30..]).unwrap()), want);
}

#[test]
fn rewind_refuses_positions_a_ring_overwrote() {
    // n_ctx 600 > window 16 + 511: rings of 527 slots; at position 590, positions below 63
    // are gone, so rewinding to 20 (which sees 5..19) is refused.
    let mut t = Tiny::new("muse");
    t.n_layer = 2;
    let m = t.model();
    let toks = random_tokens(590, t.n_vocab, 4);
    let mut s = Session::new(&m, 600).unwrap();
    s.extend(&toks).unwrap();
    assert!(!s.rewind(20));
    assert_eq!(s.pos(), 0);
    s.extend(&toks).unwrap();
    assert!(s.rewind(100));
    assert_eq!(s.pos(), 100);
}

/// A session that takes another's prefix (`copy_prefix_from`: a random cut, the other
/// session having gone on past it with other tokens, prompt and decoded) and goes on from
/// there gives the logits of a session that computed it all, bit for bit, on sliding (muse)
/// and full (llama) layers, prefill and decode alike; a ring that overwrote what the cut
/// sees, another model's session or positions the source lacks are refused, moving nothing.
#[test]
fn a_copied_prefix_goes_on_as_the_computed_one() {
    let mut rng_seed = 0x5EED_C0B7u64;
    for arch in ["muse", "llama"] {
        let t = Tiny::new(arch);
        let m = t.model();
        for round in 0..6 {
            rng_seed += 1;
            let a = random_tokens(50, t.n_vocab, rng_seed);
            let cut = 1 + (rng_seed as usize * 7 + round * 5) % 45;
            let mut b = a[..cut].to_vec();
            b.extend(random_tokens(9, t.n_vocab, rng_seed + 100));
            let mut fresh = Session::new(&m, 64).unwrap();
            let want = bits(fresh.prefill(&b).unwrap());
            let want_next = bits(fresh.decode(b[0]).unwrap());

            let mut src = Session::new(&m, 64).unwrap();
            src.prefill(&a).unwrap();
            src.decode(a[1]).unwrap();
            let mut dst = Session::new(&m, 64).unwrap();
            dst.prefill(&random_tokens(20, t.n_vocab, rng_seed + 200))
                .unwrap();
            assert!(dst.copy_prefix_from(&src, cut), "{arch} cut {cut}");
            assert_eq!(dst.pos(), cut);
            assert_eq!(
                bits(dst.prefill(&b[cut..]).unwrap()),
                want,
                "{arch} cut {cut}"
            );
            assert_eq!(
                bits(dst.decode(b[0]).unwrap()),
                want_next,
                "{arch} cut {cut}"
            );
        }
        // more positions than the source holds
        let mut src = Session::new(&m, 64).unwrap();
        src.prefill(&random_tokens(10, t.n_vocab, 5)).unwrap();
        let mut dst = Session::new(&m, 64).unwrap();
        dst.prefill(&random_tokens(3, t.n_vocab, 6)).unwrap();
        assert!(!dst.copy_prefix_from(&src, 11));
        assert_eq!(dst.pos(), 3);
        // another context size (other ring slots)
        let mut other = Session::new(&m, 32).unwrap();
        assert!(!other.copy_prefix_from(&src, 5));
    }
    // a ring that overwrote positions the cut sees (as `rewind_refuses_positions_a_ring_overwrote`)
    let mut t = Tiny::new("muse");
    t.n_layer = 2;
    let m = t.model();
    let toks = random_tokens(590, t.n_vocab, 4);
    let mut src = Session::new(&m, 600).unwrap();
    src.extend(&toks).unwrap();
    let mut dst = Session::new(&m, 600).unwrap();
    assert!(!dst.copy_prefix_from(&src, 20));
    assert_eq!(dst.pos(), 0);
    assert!(dst.copy_prefix_from(&src, 100));
    // another model's session, even of the same shape
    let m2 = t.model();
    let mut foreign = Session::new(&m2, 600).unwrap();
    foreign.extend(&toks[..50]).unwrap();
    let mut dst = Session::new(&m, 600).unwrap();
    assert!(!dst.copy_prefix_from(&foreign, 10));
    assert_eq!(dst.pos(), 0);
}

#[test]
fn bad_groups_are_refused_and_move_nothing() {
    let t = Tiny::new("llama");
    let m = t.model();
    let mut a = Session::new(&m, 8).unwrap();
    let mut b = Session::new(&m, 8).unwrap();
    a.prefill(&[1, 2, 3]).unwrap();
    b.prefill(&[1; 8]).unwrap(); // full
    let mut g = DecodeGroup::new();
    assert!(g.decode(&mut [], &[]).is_err());
    assert!(g.decode(&mut [&mut a], &[1, 2]).is_err());
    assert!(g.decode(&mut [&mut a], &[t.n_vocab as u32]).is_err());
    let e = g.decode(&mut [&mut a, &mut b], &[1, 2]).unwrap_err();
    assert!(e.to_string().contains("n_ctx = 8"), "{e}");
    assert_eq!((a.pos(), b.pos()), (3, 8));
    let other = t.model();
    let mut c = Session::new(&other, 8).unwrap();
    c.prefill(&[1]).unwrap();
    assert!(g.decode(&mut [&mut a, &mut c], &[1, 2]).is_err());
    assert_eq!(a.pos(), 3);
    g.decode(&mut [&mut a], &[1]).unwrap();
    assert_eq!(a.pos(), 4);
}

/// The CPU backend without its decode-group overrides: the trait's default `*_rows` ops (row by
/// row through host copies), as a backend gets them before it overrides them. Its `host_buf`s
/// are memory of its own (`Lent`), as the CUDA backend's page-locked ones are; it keeps what
/// `will_read_logits` was told, call by call.
struct RowByRow(
    CpuBackend,
    std::sync::Arc<Lent>,
    std::sync::Mutex<Vec<bool>>,
);

/// The address ranges of the `host_buf`s a `RowByRow` has lent and that are still alive.
#[derive(Default)]
struct Lent(std::sync::Mutex<Vec<(usize, usize)>>);

impl Lent {
    fn covers(&self, s: &[f32]) -> bool {
        let (a, b) = (s.as_ptr() as usize, s.as_ptr() as usize + 4 * s.len());
        self.0
            .lock()
            .unwrap()
            .iter()
            .any(|&(x, y)| x <= a && b <= y)
    }
}

struct LentMem(Vec<f32>, std::sync::Arc<Lent>);

impl muser_engine::backend::HostMem for LentMem {
    fn values(&self) -> &[f32] {
        &self.0
    }
    fn values_mut(&mut self) -> &mut [f32] {
        &mut self.0
    }
}

impl Drop for LentMem {
    fn drop(&mut self) {
        let a = self.0.as_ptr() as usize;
        self.1 .0.lock().unwrap().retain(|&(x, _)| x != a);
    }
}

impl muser_engine::Backend for RowByRow {
    type Weight = <CpuBackend as muser_engine::Backend>::Weight;
    type Buf = <CpuBackend as muser_engine::Backend>::Buf;
    type Kv = <CpuBackend as muser_engine::Backend>::Kv;
    type Recording = ();
    fn name(&self) -> &'static str {
        "row-by-row"
    }
    fn threads(&self) -> usize {
        self.0.threads()
    }
    fn weight(&self, t: &muser_engine::weights::TensorView) -> muser_engine::Result<Self::Weight> {
        self.0.weight(t)
    }
    fn buf(&self, rows: usize, cols: usize) -> Self::Buf {
        self.0.buf(rows, cols)
    }
    fn write(&self, buf: &mut Self::Buf, data: &[f32]) {
        self.0.write(buf, data)
    }
    fn host_buf(&self, n: usize) -> muser_engine::backend::HostBuf {
        let v = vec![0.0; n];
        let a = v.as_ptr() as usize;
        self.1 .0.lock().unwrap().push((a, a + 4 * n));
        muser_engine::backend::HostBuf::from_mem(Box::new(LentMem(v, self.1.clone())))
    }
    fn read(&self, buf: &Self::Buf, out: &mut [f32]) {
        self.0.read(buf, out)
    }
    fn copy_rows(
        &self,
        src: &Self::Buf,
        src_row: usize,
        dst: &mut Self::Buf,
        dst_row: usize,
        n: usize,
    ) {
        self.0.copy_rows(src, src_row, dst, dst_row, n)
    }
    fn kv_cache(
        &self,
        layers: &[muser_engine::backend::KvLayerSpec],
    ) -> muser_engine::Result<Self::Kv> {
        self.0.kv_cache(layers)
    }
    fn kv_copy_prefix(&self, src: &Self::Kv, dst: &mut Self::Kv, n: usize) {
        self.0.kv_copy_prefix(src, dst, n)
    }
    fn kv_save(&self, kv: &Self::Kv, n: usize) -> muser_engine::backend::KvHost {
        self.0.kv_save(kv, n)
    }
    fn kv_load(&self, host: &muser_engine::backend::KvHost, kv: &mut Self::Kv) {
        self.0.kv_load(host, kv)
    }
    fn embed(&self, table: &Self::Weight, tokens: &[u32], out: &mut Self::Buf) {
        self.0.embed(table, tokens, out)
    }
    fn rmsnorm(&self, x: &Self::Buf, w: Option<&Self::Weight>, eps: f32, out: &mut Self::Buf) {
        self.0.rmsnorm(x, w, eps, out)
    }
    fn rmsnorm_heads(&self, x: &mut Self::Buf, w: &Self::Weight, head_dim: usize, eps: f32) {
        self.0.rmsnorm_heads(x, w, head_dim, eps)
    }
    fn matmul(&self, x: &Self::Buf, outs: &mut [(&Self::Weight, &mut Self::Buf)]) {
        self.0.matmul(x, outs)
    }
    fn ffn_gate_up_silu(
        &self,
        x: &Self::Buf,
        gate: &Self::Weight,
        up: &Self::Weight,
        out: &mut Self::Buf,
    ) {
        self.0.ffn_gate_up_silu(x, gate, up, out)
    }
    fn rope(
        &self,
        x: &mut Self::Buf,
        head_dim: usize,
        rope: &muser_engine::config::RopeParams,
        pos0: usize,
    ) {
        self.0.rope(x, head_dim, rope, pos0)
    }
    fn kv_store(&self, kv: &mut Self::Kv, layer: usize, k: &Self::Buf, v: &Self::Buf, pos0: usize) {
        self.0.kv_store(kv, layer, k, v, pos0)
    }
    fn attention(
        &self,
        q: &Self::Buf,
        kv: &Self::Kv,
        layer: usize,
        pos0: usize,
        scale: f32,
        out: &mut Self::Buf,
    ) {
        self.0.attention(q, kv, layer, pos0, scale, out)
    }
    fn sigmoid_gate(&self, a: &mut Self::Buf, g: &Self::Buf) {
        self.0.sigmoid_gate(a, g)
    }
    fn residual_norm(
        &self,
        h: &mut Self::Buf,
        x: &Self::Buf,
        post: Option<muser_engine::backend::NormArgs<'_, Self::Weight>>,
        next: muser_engine::backend::NormArgs<'_, Self::Weight>,
        out: &mut Self::Buf,
    ) {
        self.0.residual_norm(h, x, post, next, out)
    }
    fn lm_head(
        &self,
        x: &Self::Buf,
        first_row: usize,
        w: &Self::Weight,
        scale: f32,
        softcap: Option<f32>,
        out: &mut Self::Buf,
    ) {
        self.0.lm_head(x, first_row, w, scale, softcap, out)
    }
    fn will_read_logits(&self, read: bool) {
        self.2.lock().unwrap().push(read);
    }
}

#[test]
fn default_row_ops_equal_the_cpu_overrides() {
    let t = Tiny::new("muse");
    let file = std::sync::Arc::new(muser_gguf::GgufFile::from_bytes(t.bytes()).unwrap());
    let fast = Model::from_gguf(file.clone(), CpuBackend::new(Some(2)).unwrap()).unwrap();
    let lent = std::sync::Arc::new(Lent::default());
    let slow = Model::from_gguf(
        file,
        RowByRow(
            CpuBackend::new(Some(2)).unwrap(),
            lent.clone(),
            Default::default(),
        ),
    )
    .unwrap();
    let prompts: Vec<Vec<u32>> = (0..5)
        .map(|i| random_tokens(3 + 7 * i, t.n_vocab, i as u64))
        .collect();
    let mut a: Vec<Session> = prompts
        .iter()
        .map(|_| Session::new(&fast, 80).unwrap())
        .collect();
    let mut b: Vec<Session<RowByRow>> = prompts
        .iter()
        .map(|_| Session::new(&slow, 80).unwrap())
        .collect();
    // Each session's logits live in the memory its backend lent (`Backend::host_buf`), through
    // prefill (which takes them out and puts them back) and every group step.
    assert_eq!(lent.0.lock().unwrap().len(), prompts.len());
    let mut next = Vec::new();
    for ((sa, sb), p) in a.iter_mut().zip(&mut b).zip(&prompts) {
        let la = sa.prefill(p).unwrap().to_vec();
        assert_eq!(bits(&la), bits(sb.prefill(p).unwrap()));
        assert!(lent.covers(sb.logits()) && !sb.logits().is_empty());
        next.push(greedy(&la).unwrap());
    }
    let (mut ga, mut gb) = (DecodeGroup::new(), DecodeGroup::new());
    for _ in 0..20 {
        ga.decode(&mut a.iter_mut().collect::<Vec<_>>(), &next)
            .unwrap();
        gb.decode(&mut b.iter_mut().collect::<Vec<_>>(), &next)
            .unwrap();
        // RowByRow reads the group's logits through the trait's default read_parts.
        for (sa, sb) in a.iter().zip(&b) {
            assert_eq!(bits(sa.logits()), bits(sb.logits()));
            assert!(lent.covers(sb.logits()));
        }
        next = a.iter().map(|s| greedy(s.logits()).unwrap()).collect();
    }
    // One session's own decode steps too; then every lent buffer is given back once.
    let la = a[0].decode(next[0]).unwrap().to_vec();
    assert_eq!(bits(&la), bits(b[0].decode(next[0]).unwrap()));
    assert!(lent.covers(b[0].logits()));
    drop(b);
    assert!(lent.0.lock().unwrap().is_empty());
}

#[test]
fn a_group_step_says_whether_its_logits_are_read() {
    // `decode` reads every row back; `decode_rows` reads only when a row asks for its logits
    // (a backend may overlap that read with the LM head). One announcement a step, before it.
    let t = Tiny::new("llama");
    let file = std::sync::Arc::new(muser_gguf::GgufFile::from_bytes(t.bytes()).unwrap());
    let be = RowByRow(
        CpuBackend::new(Some(2)).unwrap(),
        Default::default(),
        Default::default(),
    );
    let m = Model::from_gguf(file, be).unwrap();
    let mut ss: Vec<Session<RowByRow>> = (0..3)
        .map(|i| {
            let mut s = Session::new(&m, 64).unwrap();
            s.prefill(&random_tokens(4 + i, t.n_vocab, 70 + i as u64))
                .unwrap();
            s
        })
        .collect();
    let mut g = DecodeGroup::new();
    let toks = random_tokens(3, t.n_vocab, 71);
    let steps: [(Option<[RowNeed; 3]>, bool); 5] = [
        (None, true),
        (Some([RowNeed::Argmax; 3]), false),
        (
            Some([RowNeed::Argmax, RowNeed::Logits, RowNeed::TopK(4)]),
            true,
        ),
        (Some([RowNeed::TopK(2); 3]), false),
        (
            Some([RowNeed::TopK(3), RowNeed::Argmax, RowNeed::Logits]),
            true,
        ),
    ];
    for (i, (need, read)) in steps.iter().enumerate() {
        m.backend().2.lock().unwrap().clear();
        let mut rows: Vec<&mut Session<RowByRow>> = ss.iter_mut().collect();
        match need {
            None => g.decode(&mut rows, &toks).unwrap(),
            Some(need) => {
                g.decode_rows(&mut rows, &toks, need).unwrap();
            }
        }
        assert_eq!(*m.backend().2.lock().unwrap(), vec![*read], "step {i}");
    }
    // A session's own steps say the same: `decode` reads its logits back, `decode_greedy` and
    // `decode_top_k` reduce them on the backend.
    let s = &mut ss[1];
    for (i, kind) in [0, 1, 0, 2, 2, 0].into_iter().enumerate() {
        m.backend().2.lock().unwrap().clear();
        let tok = toks[i % toks.len()];
        match kind {
            0 => assert_eq!(s.decode(tok).unwrap().len(), t.n_vocab),
            1 => assert!((s.decode_greedy(tok).unwrap() as usize) < t.n_vocab),
            _ => assert_eq!(s.decode_top_k(tok, 3).unwrap().len(), 3),
        }
        assert_eq!(
            *m.backend().2.lock().unwrap(),
            vec![kind == 0],
            "session step {i}"
        );
    }
}

#[test]
fn a_saved_prefix_restored_goes_on_as_the_computed_one() {
    // A session's first positions saved to host memory and taken back, into a session that
    // held another sequence, continue as that prefix computed there: the same bits.
    let mut seed = 0x5A7E_D00Du64;
    for arch in ["muse", "llama"] {
        let t = Tiny::new(arch);
        let m = t.model();
        for round in 0..6 {
            seed += 1;
            let a = random_tokens(50, t.n_vocab, seed);
            let cut = 1 + (seed as usize * 11 + round * 7) % 45;
            let mut b = a[..cut].to_vec();
            b.extend(random_tokens(9, t.n_vocab, seed + 100));
            let mut fresh = Session::new(&m, 64).unwrap();
            let want = bits(fresh.prefill(&b).unwrap());
            let want_next = bits(fresh.decode(b[1]).unwrap());

            let mut src = Session::new(&m, 64).unwrap();
            src.prefill(&a).unwrap();
            let snap = src.save(cut).expect("a prefix the session holds");
            assert_eq!(snap.len(), cut);
            assert!(snap.bytes() > 0);
            // the source goes on to other positions: the snapshot is a copy
            src.decode(a[2]).unwrap();
            let mut dst = Session::new(&m, 64).unwrap();
            dst.prefill(&random_tokens(30, t.n_vocab, seed + 200))
                .unwrap();
            assert!(dst.restore(&snap), "{arch} cut {cut}");
            assert_eq!(dst.pos(), cut);
            let got = bits(dst.prefill(&b[cut..]).unwrap());
            assert_eq!(got, want, "{arch} cut {cut}");
            assert_eq!(
                bits(dst.decode(b[1]).unwrap()),
                want_next,
                "{arch} cut {cut}"
            );
            // made again from its parts (as read from a file), into a fresh session (llama's
            // of a longer context: larger full layers; muse's rings take the context's size)
            let parts =
                Snapshot::from_parts(snap.specs().to_vec(), snap.len(), snap.host().clone());
            let mut wide = Session::new(&m, if arch == "llama" { 128 } else { 64 }).unwrap();
            assert!(wide.restore(&parts), "{arch} cut {cut}");
            assert_eq!(
                bits(wide.prefill(&b[cut..]).unwrap()),
                want,
                "{arch} cut {cut}"
            );
        }
        let mut src = Session::new(&m, 64).unwrap();
        src.prefill(&random_tokens(10, t.n_vocab, 5)).unwrap();
        // more positions than the session holds
        assert!(src.save(11).is_none());
        // another context size (other ring slots), another model of the same shape
        let snap = src.save(8).unwrap();
        assert!(!Session::new(&m, 32).unwrap().restore(&snap));
        let m2 = t.model();
        let mut foreign = Session::new(&m2, 64).unwrap();
        assert!(!foreign.restore(&snap));
        assert_eq!(foreign.pos(), 0);
        // from parts: more positions than a session holds, or other layers, are refused
        let parts = Snapshot::from_parts(snap.specs().to_vec(), 8, snap.host().clone());
        assert!(!Session::new(&m, 4).unwrap().restore(&parts));
        let mut other = snap.specs().to_vec();
        other[0].head_dim *= 2;
        assert!(!src.restore(&Snapshot::from_parts(other, 8, snap.host().clone())));
    }
    // a ring that overwrote positions the cut sees
    let mut t = Tiny::new("muse");
    t.n_layer = 2;
    let m = t.model();
    let mut src = Session::new(&m, 600).unwrap();
    src.extend(&random_tokens(590, t.n_vocab, 4)).unwrap();
    assert!(src.save(20).is_none());
    assert!(src.save(100).is_some());
}

#[test]
fn embeddings_are_the_lm_heads_normed_input() {
    // `Session::embed` gives every position's hidden state after the output norm: each row
    // divided by the norm's weight has an RMS of 1, and (llama: no logit scale or softcap) the
    // rows times the tied output matrix give the logits `prefill_all` gives, up to the LM
    // head's Q8_K rounding of its input.
    for (arch, seed) in [("muse", 31u64), ("llama", 32)] {
        let t = Tiny::new(arch);
        let m = t.model();
        let ne = t.n_embd;
        let tokens = random_tokens(700, t.n_vocab, seed); // two chunks
        let mut s = Session::new(&m, 1024).unwrap();
        let e = s.embed(&tokens).unwrap();
        assert_eq!(e.len(), tokens.len() * ne);
        assert_eq!(s.pos(), tokens.len());
        let f = m.gguf();
        let norm_t = f.tensor("output_norm.weight").unwrap();
        let mut norm = vec![0f32; ne];
        muser_quant::dequantize_row(norm_t.ggml_type, f.tensor_data(norm_t), &mut norm).unwrap();
        for (i, row) in e.chunks_exact(ne).enumerate() {
            let ms = row
                .iter()
                .zip(&norm)
                .map(|(x, w)| ((x / w) as f64).powi(2))
                .sum::<f64>()
                / ne as f64;
            assert!(
                (ms.sqrt() - 1.0).abs() < 1e-3,
                "{arch} row {i}: rms {}",
                ms.sqrt()
            );
        }
        if arch != "llama" {
            continue;
        }
        let mut fresh = Session::new(&m, 1024).unwrap();
        let logits = fresh.prefill_all(&tokens).unwrap();
        let w_t = f.tensor("token_embd.weight").unwrap();
        let mut w = vec![0f32; t.n_vocab * ne];
        muser_quant::dequantize_row(w_t.ggml_type, f.tensor_data(w_t), &mut w).unwrap();
        let mut want = vec![0f32; tokens.len() * t.n_vocab];
        for (i, row) in e.chunks_exact(ne).enumerate() {
            for (j, wr) in w.chunks_exact(ne).enumerate() {
                want[i * t.n_vocab + j] = row.iter().zip(wr).map(|(a, b)| a * b).sum();
            }
        }
        let err = nmse(&logits, &want);
        assert!(err < 1e-4, "{arch}: logits from the embeddings, NMSE {err}");
        // the same tokens embedded again: the same bits (nothing of the first pass lingers)
        let mut again = Session::new(&m, 1024).unwrap();
        assert_eq!(bits(&again.embed(&tokens).unwrap()), bits(&e));
    }
}
