// Matrix-vector products for decode: y[c][r] = sum_k W[r][k] * x[c][k] for one activation column
// (mvk_1 / mvk_silu_1 for the K-quants, at the end of this file; matvec_1 for every format, kept
// for the others and for A/B runs) and for 2..64 columns of the formats that have no
// tensor-core kernel (matvec_cols: Q8_0, F16, BF16, F32 decode groups and prefill chunks; the
// K-quants run 2 or more columns on mmk.cu).
//
// Shapes served: every matrix of the decode chain (Muse Glimmer: 4096x6656 attn_q/attn_gate,
// 256x6656 attn_k/attn_v, 6656x4096 attn_output, 19968x6656 ffn_gate/ffn_up, 6656x19968
// ffn_down, 202048x6656 output), any K that is a multiple of the format's block.
//
// Formats (kernel argument `ty`, see FMT_*): Q4_K and Q5_K in their GGUF blocks (144 and 176
// bytes: 16-byte aligned, so the block header is one 16-byte load); Q6_K and Q8_0 repacked at
// upload into aligned planes (see matvec.rs: quants, then scales, then d); F16, BF16, F32.
// The activation of the quantized formats is quantized once per call by `quantize_q8_k` (or
// `quantize_q8_0`) to int8 with the CPU reference's scales (and the sums per 32 values, for the
// Q4_K/Q5_K mins); the dots run on dp4a. Float formats read the f32 activation. The K-quants
// follow the canonical order of common.cuh (integer sums per super-block, then f32 chunk trees),
// which mmk.cu's tensor-core tiles reproduce, so a column gets the same bits from both.
//
// One launch serves up to four matrices sharing one input (Q/K/V/gate): `MatvecJobs` lists
// them, blocks take consecutive rows of the concatenation, so the small attn_k/attn_v ride
// along with the large ones instead of running alone on a few SMs.
//
// Launch: matvec_1 (one column) 128 threads (4 warps) per block, 4 rows per warp (MATVEC_R),
// grid = ceil(rows / 16). matvec_cols (2..64 columns, decode groups): one warp per group of 8
// columns, the ncg = ceil(ncols / 8) warps of the same 4 rows in one block (4 to 8 warps per
// block), so the rows' weights come from DRAM once per launch. The lanes of a warp take the work
// items (64 values of Q4_K/Q5_K, 128 of Q6_K, 16 bytes of the others) of its rows in a fixed
// order (`rows_dot`), and every warp of every width runs the same per-column arithmetic, so each
// row's reduction order depends only on the format and K, never on the number of columns: a
// sequence gets the same bits alone or in any decode group (batch invariance; `muser check`
// compares the bits).
// Q8_0 decode groups sharing a Q8_K activation with a K-quant read it in a k-major layout (see
// Act) so a warp's activation loads are contiguous.
//
// Versions: v1 (2026-11-29) one kernel per (format, columns), unaligned Q6_K loads.
// v2 (2026-11-30) one kernel per column count with the format a warp-uniform switch, several
// matrices per launch, the Q4_K/Q5_K header as one 16-byte load and its 6-bit scales unpacked
// four at a time, Q6_K/Q8_0 repacked into 16-byte aligned planes, two items in flight per lane.
// v3 (2026-11-29) items of 64 (Q4_K/Q5_K) and 128 (Q6_K) values per lane. H200, 1 column:
// Q4_K 19968x6656 1.69 TB/s, 6656x19968 1.90 TB/s, Q6_K 6656x19968 1.47 TB/s, Q5_K 202048x6656
// 2.36 TB/s (v2: 1.69, 1.62, 1.32, 2.23). Lanes idled at the end of rows of 104 items.
// v4 (2026-11-29) 4 rows per warp with one item list, so no lane idles at a row's end. H200,
// 1 column, host-timed per call including the activation quantizer's launch: Q4_K q+k+v+gate
// (33 MB) 22 us = 1.50 TB/s, 4096x6656 1.36, 6656x4096 1.28, 19968x6656 1.89, 6656x19968
// 1.84; Q6_K 6656x19968 1.52; Q5_K 202048x6656 3.06; F16 4096x6656 1.49; Q8_0 1.35 (ncu on
// the first: 72 registers, 34% occupancy, DRAM 50% busy, issue gaps 72% waits on weight loads;
// capping at 64 registers changed nothing; loading the next item's weights before the current
// item's arithmetic changed nothing either, so that version was dropped).
// v5 (2026-11-29) decode groups of up to 64 columns in one launch (matvec_cols, column groups
// of 8 per warp, k-major activation) instead of mmq past 8 columns (whose sums differ from the
// one-column kernel's), in v4's item order. v6 (2026-11-29) the row-aligned order (rows_dot):
// lane l takes items l, l + 32, .. of each of its warp's 4 rows, the 4 rows' items at one
// position together. H200, llama-glimmer, aggregate decode tokens/s at 1 / 8 / 16 / 32 / 64
// streams (`muser bench -s`, one decode group per step): v5 98.4 / 232 / 266 / 240 / 227, v6
// 110.4 / 281 / 346 / 383 / 391, so v6 replaced the list order (v4, v5). ptxas (sm_90): v6
// matvec_1 128 registers, matvec_cols 255 (v5: 72, 175). Per-op time of a v5 step of 32
// streams (each op synchronized): gate+up 68 ms and ffn_down 36 ms of 134 ms, ~40x the time
// the weights take to read: the group kernel is limited by its instructions and L1 traffic
// (per item and column 16 dp4a and, in v5, 80 activation bytes), not by DRAM (inferred from
// these times; not yet profiled with ncu). Next: integer MMA for the group sums.
// v7 (2026-11-29, tried, not adopted; scripts/matvec_lab/ has the code, the lab and the logs):
// one-column kernels with persistent warps streaming each round's weights through shared memory
// with cp.async, 2 to 6 rounds ahead, in v6's order (bits equal to v6's, checked; parity and
// invariance passed). H200, cudaEvent-timed, weights rotated past L2, 1 column, GB/s, v6 / v7:
// Q4_K 19968x6656 2473 / 2076, 6656x19968 2782 / 2346, 4096x6656 1582 / 1243, 6656x4096
// 1688 / 1326; Q6_K 6656x19968 1534 / 1663; Q5_K 202048x6656 3323 / 2826; Q6_K 202048x6656
// 2018 / 1874; gate+up+SiLU 19968x6656 3371 / 2411. A plain read of the same bytes (the roof
// at each size): 3.8 TB/s at 75 MB, 2.3 at 15 MB, 4.5 at 1 GB, so a lone 15 MB matvec cannot
// reach 80% of 4.5 TB/s (launch ramp and tail); v6 is at 65-73% of the roof at 75 MB, 74% at
// 0.9 GB. Per-lane copies (each a half sector) held v7 at 1.4 TB/s whatever the depth; coalesced
// copies reached the numbers above, best at 2 stages and 20 warps per SM.
// v8 (2026-11-29) decode groups of Q4_K/Q5_K matrices on the integer tensor cores (matvec_mma,
// matvec_silu_mma, at the end of this file; matvec_cols keeps Q6_K, Q8_0 and the float formats):
// mma.sync m16n8k32 s8 per sub-block, the float expression of every item shared with matvec_1
// (q45_tail) and matvec_1's per-lane order and warp_sum tree replayed, so every column keeps
// matvec_1's bits. H200, scripts/matvec_lab/lab_mma.cu (cudaEvent-timed, weights rotated past
// L2), matvec_cols / matvec_mma in us at 8 / 32 / 64 columns: Q4_K ffn_gate 19968x6656 98.8 /
// 77.7, 354 / 221, 729 / 415; ffn_down 6656x19968 132 / 80.5, 295 / 239, 568 / 390; q+k+gate
// 4096+256+4096 x6656 43.0 / 32.3, 153 / 94.2, 313 / 181; attn_output 6656x4096 24.1 / 22.1,
// 70.3 / 63.8, 146 / 109; gate+up+SiLU 19968x6656 195 / 143, 702 / 413, 1445 / 776; Q5_K output
// 202048x6656 1037 / 659, 3925 / 2154, 8051 / 4245 (matvec_1 at 1 column: 33.2, 32.5, 17.2, 10.2,
// 57.2, 296). Every column bit-identical to matvec_1 (2..64 columns, odd shapes, multi-matrix
// launches, mixed Q5_K/Q4_K SiLU); `muser check --quick --invariance` passed (213 checks, groups
// of 1/2/8/16 bit-identical to solo on muse-tiny and llama-glimmer). llama-glimmer aggregate
// decode tokens/s at 1 / 8 / 32 streams (`muser bench -s`, graphs+PDL, same call): v8 120.7 /
// 304.9 / 489.7, matvec_cols (MUSER_CUDA_MMA=0) - / 256.9 / 371.0; llama.cpp batched-bench on the
// same file: 100 / 332 / 1279. Still far from the weights' read time: the time grows with the
// columns (0.26 TB/s at 32 columns), so the per-column work limits it, not the weights: each
// block of 16 rows re-reads the whole activation of its columns (at 32 columns 266 KB for 60 KB of
// weights; k-major 16-byte pieces, half of each 32-byte sector unused) and the epilogue costs
// ~10 float operations per (row, column, item). Tried in run 5 (lab-run5.log), not adopted: the
// next item's weights loaded before the current item's arithmetic (slower: 92.7 against 77.7 us
// at 8 columns, equal at 32; the SiLU kernel spilled 1 KB). Measured there: the row-major
// activation (32 contiguous bytes per lane quad) made that kernel 10-20% faster than the k-major
// one at 8-64 columns with the same bits; not yet routed (the layout is chosen per activation in
// matvec.rs and k-major also serves matvec_cols). Next: more rows per block sharing each
// activation load (the 32 per-lane accumulators per output are what limits the rows: replaying
// the warp_sum tree leaf by leaf, in its bit-reversed order, would need 6), then the activation
// and its scales staged in shared memory.
// Q6_K rows in pairs (2026-11-29, tried, reverted): a pair's items loaded together, the activation
// once per pair, sum (q - 32) x as sum q x - sum 32 x (same bits as v6), capped at 128 registers.
// H200 (`muser check --bench`, same call): Q6_K ffn_down 6656x19968 132 us = 826 GB/s, against
// v6's ~71 us = 1.5 TB/s (half the weight loads in flight per lane); v6's Q6_K code is back.
// v9 (2026-11-29) the canonical K-quant order (common.cuh): per super-block exact integer sums,
// then f32 chunk trees, so that integer tensor-core tiles (mmk.cu) can give decode groups and
// prefill the bits of matvec_1 (v8 replayed matvec_1's per-item float order on the tensor cores
// and paid ~10 float operations per row, column and 64 values). matvec_1 reduce-scatters a
// super-block's integers over its 4 (Q6_K: 2) lanes and adds each round's chunks by butterfly.
// H200, `muser check --bench` (host-timed, 1 column, same binary as below): Q4_K ffn_gate
// 19968x6656 36.9 us (v6 36.3), ffn_down 34.7 (34.0), Q6_K ffn_down 80.9 (83.4), Q5_K output
// 301.5 (298.7). A first version that gathered each super-block's value lane by lane and added
// them in sequence cost ~30% (ffn_gate 46-49 us, llama-glimmer tg128 87-90 against 112 t/s).
// llama-glimmer decode groups (`muser bench -s`, aggregate t/s at 1 / 8 / 32 streams): v8
// 111 / 342 / 516, v9 with sequential chunk sums in mmk 86.5 / 460 / 919 (pp512 1966 against
// 1591), v9 with trees 108 / 451 / 745 (the tree slot then a runtime branch, since unrolled).
// Programmatic dependent launch (kept): the one-column kernels prefetch their weight rows into L2
// before waiting for the kernel before them (pdl_wait_prefetch_*).


// Activation quantizers, bit-identical to the CPU reference's (muser-quant, after ggml), so
// that a GPU dot and a CPU dot sum the same integers: quantize_q8_k for the K-quants (one f32
// scale per 256 values: iscale = -127 / (the value of largest magnitude, first on ties),
// q = min(127, round-half-even(iscale * x)), d = 1 / iscale), quantize_q8_0 for Q8_0 (one scale
// per 32: d = amax / 127 rounded to f16, q = roundf(x / d)). Both write q: int8 [n][32];
// quantize_q8_k also ds: (d, sum(q)) per 32 values (the sum exact as a float, for the Q4_K/Q5_K
// mins) and bs: the 8 sums of each 256 values split as lo + 64 hi, int8 [n / 256][lo 8, hi 8];
// quantize_q8_0 ds: (d, d * sum(q)).

// One warp per 256 values (lane l takes values 8l .. 8l + 7); n_blocks counts 256-blocks of
// columns K wide. kmajor: each column's K bytes in the k-major layout of `xq16` (decode groups).
// xblob (row-major only; null: none): the blocks in mmw's layout of nt-tile columns as well.
extern "C" __global__ void quantize_q8_k(const float* __restrict__ x, int8_t* __restrict__ q,
                                         float2* __restrict__ ds, int8_t* __restrict__ bs, int n_blocks, int K,
                                         int kmajor, uint8_t* __restrict__ xblob, int nt) { pdl_wait();
    const int blk = blockIdx.x * 4 + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (blk >= n_blocks) return;
    const float4* xv = (const float4*)(x + (size_t)blk * 256 + 8 * lane);
    const float4 u = xv[0], v = xv[1];
    const float f[8] = {u.x, u.y, u.z, u.w, v.x, v.y, v.z, v.w};
    q8k_warp(f, blk, lane, q, ds, bs, K, kmajor, xblob, nt);
}

// One warp per 32 values; n_blocks counts 32-blocks.
extern "C" __global__ void quantize_q8_0(const float* __restrict__ x, int8_t* __restrict__ q,
                                         float2* __restrict__ ds, int n_blocks) { pdl_wait();
    const int blk = blockIdx.x * 4 + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (blk >= n_blocks) return;
    const float v = x[(size_t)blk * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int qi = max(-128, min(127, (int)roundf(v * id)));
    q[(size_t)blk * 32 + lane] = (int8_t)qi;
    const float s = warp_sum((float)qi);
    const float d16 = __half2float(__float2half_rn(d));
    if (lane == 0) ds[blk] = make_float2(d16, d16 * s);
}

// The activation of one call: int8 + scales for the quantized formats, f32 for the others.
// xq: [ncols][K] int8; xds: [ncols][K/32]; xf: [ncols][K].
// kmajor (decode groups, from quantize_q8_k): within a column, the 16-byte chunk of values
// 64i + 16j .. 64i + 16j + 15 lives at chunk index j * (K / 64) + i, so the lanes of a warp, which
// take consecutive 64-value items, load consecutive 16-byte chunks (one 512-byte piece per load
// instead of 32 pieces 64 bytes apart). The layout changes addresses only, never arithmetic.
struct Act {
    const int8_t* __restrict__ xq;
    const float2* __restrict__ xds;
    const float* __restrict__ xf;
    int K;
    int ncols;
    int kmajor;
};

// The 16 int8 activation values v0 .. v0 + 15 (v0 a multiple of 16) of column c. The one-column
// kernels (NC == 1) always read the row-major layout.
template <int NC>
__device__ __forceinline__ int4 xq16(const Act& a, int c, int v0) {
    const int8_t* col = a.xq + (size_t)c * a.K;
    if (NC > 1 && a.kmajor) return *(const int4*)(col + ((size_t)((v0 >> 4) & 3) * (a.K >> 6) + (v0 >> 6)) * 16);
    return *(const int4*)(col + v0);
}

// Bytes 2g and 2g+1 of the 8 packed values (lo: 0-3, hi: 4-7).
__device__ __forceinline__ void pick_pair(uint32_t lo, uint32_t hi, int g, int* a, int* b) {
    const uint32_t word = g < 2 ? lo : hi;
    const int sh = (g & 1) * 16;
    *a = (word >> sh) & 0xFF;
    *b = (word >> (sh + 8)) & 0xFF;
}

// Q8_0, repacked: plane A [rows][nb][32] int8; plane B [rows][nb] d (f16). Item = 16 values.
template <int NC>
__device__ __forceinline__ void item_q8_0(const int8_t* __restrict__ qa, const __half* __restrict__ dc,
                                          int item, const Act& a, float (&acc)[NC]) {
    const int b = item >> 1;
    const int4 wv = *(const int4*)(qa + (size_t)item * 16);
    const int w[4] = {wv.x, wv.y, wv.z, wv.w};
    const float d = __half2float(dc[b]);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        if (c >= a.ncols) break;
        const int4 x0 = xq16<NC>(a, c, item * 16);
        const int xa[4] = {x0.x, x0.y, x0.z, x0.w};
        int s = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) s = __dp4a(w[j], xa[j], s);
        acc[c] += d * a.xds[(size_t)c * (a.K / 32) + b].x * (float)s;
    }
}

// Q4_K/Q5_K item = (super-block b, group g): 64 values, sub-blocks 2g (low nibbles of the 32 qs
// bytes 32g..) and 2g + 1 (high nibbles); Q5_K's fifth bits are bits 2g / 2g + 1 of qh[l]. One
// item per lane pays the header, the scale unpacking and the activation-scale loads once per
// 32 weight bytes.
// The weight bytes of one Q4_K/Q5_K item.
struct RawQ45 {
    uint4 hdr, qa, qb, ha, hb; // header, 32 qs bytes, (Q5_K) the 32 qh bytes
};

// blk: the item's super-block (kq_blk), g: the item's quarter.
template <bool Q5>
__device__ __forceinline__ RawQ45 load_q45(const uint8_t* __restrict__ blk, int g) {
    const uint8_t* qs = blk + (Q5 ? 48 : 16) + 32 * g;
    RawQ45 r;
    r.hdr = ld_once<uint4>(blk);
    r.qa = ld_once<uint4>(qs);
    r.qb = ld_once<uint4>(qs + 16);
    if (Q5) {
        r.ha = ld_once<uint4>(blk + 16);
        r.hb = ld_once<uint4>(blk + 32);
    }
    return r;
}

// A Q4_K/Q5_K item unpacked: its 64 values (lo: sub-block 2g, hi: sub-block 2g + 1, four per
// int), the two sub-blocks' scales and mins, the super-block's d and dmin, its first value i0.
struct Q45 {
    int lo[8], hi[8];
    int sc0, sc1, m0, m1;
    float2 dm;
    int i0;
};

template <bool Q5>
__device__ __forceinline__ Q45 unpack_q45(const RawQ45& r, int item) {
    const int b = item >> 2, g = item & 3;
    const uint32_t qw[8] = {r.qa.x, r.qa.y, r.qa.z, r.qa.w, r.qb.x, r.qb.y, r.qb.z, r.qb.w};
    Q45 u;
    if (Q5) {
        const uint32_t hw[8] = {r.ha.x, r.ha.y, r.ha.z, r.ha.w, r.hb.x, r.hb.y, r.hb.z, r.hb.w};
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            u.lo[k] = (qw[k] & 0x0F0F0F0F) | (((hw[k] >> (2 * g)) & 0x01010101) << 4);
            u.hi[k] = ((qw[k] >> 4) & 0x0F0F0F0F) | (((hw[k] >> (2 * g + 1)) & 0x01010101) << 4);
        }
    } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            u.lo[k] = qw[k] & 0x0F0F0F0F;
            u.hi[k] = (qw[k] >> 4) & 0x0F0F0F0F;
        }
    }
    uint32_t sc_lo, sc_hi, m_lo, m_hi;
    unpack_scales_k4(r.hdr.y, r.hdr.z, r.hdr.w, &sc_lo, &sc_hi, &m_lo, &m_hi);
    pick_pair(sc_lo, sc_hi, g, &u.sc0, &u.sc1);
    pick_pair(m_lo, m_hi, g, &u.m0, &u.m1);
    u.dm = __half22float2(*(const __half2*)&r.hdr.x);
    u.i0 = b * QK_K + 64 * g;
    return u;
}

// Column c's 64 int8 activation values at i0 and their (d, sum) pairs.
struct X64 {
    int4 x0, x1, x2, x3;
    float4 dd;
};

template <int NC>
__device__ __forceinline__ X64 load_x64(const Act& a, int c, int i0) {
    X64 x;
    x.x0 = xq16<NC>(a, c, i0);
    x.x1 = xq16<NC>(a, c, i0 + 16);
    x.x2 = xq16<NC>(a, c, i0 + 32);
    x.x3 = xq16<NC>(a, c, i0 + 48);
    x.dd = *(const float4*)(a.xds + (size_t)c * (a.K / 32) + i0 / 32);
    return x;
}

// Q6_K, repacked: plane A [rows][nb][192] = ql[128] qh[64]; plane B [rows][nb][16] scales;
// plane C [rows][nb] d (f16). Item = (super-block b, half): 128 values from 64 ql and 32 qh
// bytes (SPEC section 8's layout), 8 scales of 16 values.
struct RawQ6 {
    uint4 l0, l1, l2, l3, h0, h1; // 64 ql bytes, 32 qh bytes of the half
    uint2 sc;                     // its 8 scales
    float d;
};

// Item `item` of row `row` of a Q6_K matrix of `rows` rows and nb super-blocks per row.
__device__ __forceinline__ RawQ6 load_q6(const uint8_t* __restrict__ w, int rows, int nb, int row, int item) {
    const size_t b = kq_blk(row, nb, item >> 1), n = kq_rows(rows) * nb;
    const int half = item & 1;
    const uint8_t* blk = w + b * 192;
    const int8_t* sb = (const int8_t*)(w + n * 192);
    const __half* dc = (const __half*)(w + n * 208);
    RawQ6 r;
    r.l0 = *(const uint4*)(blk + half * 64);
    r.l1 = *(const uint4*)(blk + half * 64 + 16);
    r.l2 = *(const uint4*)(blk + half * 64 + 32);
    r.l3 = *(const uint4*)(blk + half * 64 + 48);
    r.h0 = *(const uint4*)(blk + 128 + half * 32);
    r.h1 = *(const uint4*)(blk + 128 + half * 32 + 16);
    r.sc = *(const uint2*)(sb + b * 16 + half * 8);
    r.d = __half2float(dc[b]);
    return r;
}

// The canonical integer sum of a Q6_K item (half a super-block: 8 sub-blocks of 16) with column
// c: isc = sum_s sc_s * sum_{k in s} (q_k - 32) x_k.
template <int NC>
__device__ __forceinline__ int q6_isc(const RawQ6& r, int item, const Act& a, int c) {
    const int b = item >> 1, half = item & 1;
    const uint32_t lw[16] = {r.l0.x, r.l0.y, r.l0.z, r.l0.w, r.l1.x, r.l1.y, r.l1.z, r.l1.w,
                             r.l2.x, r.l2.y, r.l2.z, r.l2.w, r.l3.x, r.l3.y, r.l3.z, r.l3.w};
    const uint32_t hw[8] = {r.h0.x, r.h0.y, r.h0.z, r.h0.w, r.h1.x, r.h1.y, r.h1.z, r.h1.w};
    const int8_t* sc = (const int8_t*)&r.sc;
    const int i0 = b * QK_K + half * 128;
    int isc = 0;
#pragma unroll
    for (int qq = 0; qq < 4; ++qq) {
        // Values 32qq .. 32qq + 31 of the half: low (qq < 2) or high nibbles of ql words
        // 8 (qq & 1) .., high bits from bit pair qq of the qh words.
        const int4 x0 = xq16<NC>(a, c, i0 + 32 * qq), x1 = xq16<NC>(a, c, i0 + 32 * qq + 16);
        const int xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        int s_lo = 0, s_hi = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int q = __vsub4(((lw[8 * (qq & 1) + k] >> (4 * (qq >> 1))) & 0x0F0F0F0F) |
                                      (((hw[k] >> (2 * qq)) & 0x03030303) << 4),
                                  0x20202020);
            if (k < 4) s_lo = __dp4a(q, xv[k], s_lo);
            else s_hi = __dp4a(q, xv[k], s_hi);
        }
        isc += sc[2 * qq] * s_lo + sc[2 * qq + 1] * s_hi;
    }
    return isc;
}

// Float formats: item = 16 weight bytes (4 f32 or 8 f16/bf16 values).
template <int NC, int FMT>
__device__ __forceinline__ void item_float(const uint8_t* __restrict__ row, int item, const Act& a,
                                           float (&acc)[NC]) {
    const uint4 raw = *(const uint4*)(row + (size_t)item * 16);
    constexpr int PER = FMT == FMT_F32 ? 4 : 8;
    float wf[PER];
    if (FMT == FMT_F32) {
        wf[0] = __uint_as_float(raw.x);
        wf[1] = __uint_as_float(raw.y);
        wf[2] = __uint_as_float(raw.z);
        wf[3] = __uint_as_float(raw.w);
    } else {
        const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (FMT == FMT_F16) {
                const float2 f = __half22float2(*(const __half2*)&u[j]);
                wf[2 * j] = f.x;
                wf[2 * j + 1] = f.y;
            } else {
                wf[2 * j] = __uint_as_float(u[j] << 16);
                wf[2 * j + 1] = __uint_as_float(u[j] & 0xFFFF0000u);
            }
        }
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        if (c >= a.ncols) break;
        const float4* xc = (const float4*)(a.xf + (size_t)c * a.K + (size_t)item * PER);
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < PER / 4; ++j) {
            const float4 p = xc[j];
            s += wf[4 * j] * p.x + wf[4 * j + 1] * p.y + wf[4 * j + 2] * p.z + wf[4 * j + 3] * p.w;
        }
        acc[c] += s;
    }
}

// Work items in a row of K values.
__device__ __forceinline__ int items_per_row(int ty, int K) {
    switch (ty) {
    case FMT_F32: return K / 4;
    case FMT_F16:
    case FMT_BF16: return K / 8;
    case FMT_Q8_0: return K / 16;
    case FMT_Q6_K: return K / 128;
    default: return K / 64;
    }
}

// The K-quant raw item of row `row`.
template <int FMT>
__device__ __forceinline__ auto raw_load(const uint8_t* __restrict__ w, int row, int rows, int it, const Act& a) {
    const int nb = a.K / QK_K;
    if constexpr (FMT == FMT_Q6_K) {
        return load_q6(w, rows, nb, row, it);
    } else {
        return load_q45<FMT == FMT_Q5_K>(w + kq_blk(row, nb, it >> 2) * (FMT == FMT_Q5_K ? 176 : 144), it & 3);
    }
}

// v[c] += item `it` of row `row` of matrix w (format FMT) dotted with column c.
template <int NC, int FMT>
__device__ __forceinline__ void item_fmt(const uint8_t* __restrict__ w, int row, int rows, int it, const Act& a,
                                         float (&v)[NC]) {
    if constexpr (FMT == FMT_Q8_0) {
        const int8_t* qa = (const int8_t*)w + (size_t)row * a.K;
        const __half* dc = (const __half*)(w + (size_t)rows * a.K) + (size_t)row * (a.K / QK8_0);
        item_q8_0<NC>(qa, dc, it, a, v);
    } else {
        item_float<NC, FMT>(w + (size_t)row * a.K * (FMT == FMT_F32 ? 4 : 2), it, a, v);
    }
}

// The K-quant integer sums of one item (a Q4_K/Q5_K quarter super-block) with one column:
// isc = sc0 * s0 + sc1 * s1 and im = m0 * xsum0 + m1 * xsum1 (the canonical order's integers,
// common.cuh; the activation's sub-block sums arrive as exact floats in dd.y, dd.w).
__device__ __forceinline__ void q45_ints(const Q45& u, const X64& x, int* isc, int* im) {
    const int xa[8] = {x.x0.x, x.x0.y, x.x0.z, x.x0.w, x.x1.x, x.x1.y, x.x1.z, x.x1.w};
    const int xb[8] = {x.x2.x, x.x2.y, x.x2.z, x.x2.w, x.x3.x, x.x3.y, x.x3.z, x.x3.w};
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        s0 = __dp4a(u.lo[k], xa[k], s0);
        s1 = __dp4a(u.hi[k], xb[k], s1);
    }
    *isc = u.sc0 * s0 + u.sc1 * s1;
    *im = u.m0 * __float2int_rn(x.dd.y) + u.m1 * __float2int_rn(x.dd.w);
}

// Sum of the lanes' integers over the `per` lanes (2 or 4, aligned) of one super-block: exact.
template <int PER>
__device__ __forceinline__ int sb_reduce(int v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    if (PER == 4) v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

// K-quant rows in the canonical order (common.cuh): lane l takes items l, l + 32, .. of each of
// the warp's R = 4 rows (an item is a quarter super-block of Q4_K/Q5_K, a half of Q6_K), the
// rows' items at one position together, so a column's activation is loaded once for the 4 rows
// and 4 weight loads are in flight per lane. Per round of 32 items, the PER = 4 (2) lanes of a
// super-block reduce-scatter their integer sums (exact): Q4_K/Q5_K lane 4j + q ends with row q's
// sums of super-block j, Q6_K lane 2j + p with rows p and p + 2; each computes v_b of its rows,
// a butterfly over the super-blocks makes each chunk's tree, and the chunks are added to the
// row's total in order. Row r's total ends in lane r & 3 (r & 1 for Q6_K) and is broadcast.

// Q4_K/Q5_K: lane 4j + q gets the sum over its super-block's 4 lanes of m[q] (integers, exact).
__device__ __forceinline__ int quad_scatter(const int (&m)[4], int q) {
    const int p = q & 1, h = (q >> 1) & 1;
    const int ka = (p ? m[1] : m[0]) + __shfl_xor_sync(0xffffffffu, p ? m[0] : m[1], 1); // row p
    const int kb = (p ? m[3] : m[2]) + __shfl_xor_sync(0xffffffffu, p ? m[2] : m[3], 1); // row p + 2
    return (h ? kb : ka) + __shfl_xor_sync(0xffffffffu, h ? ka : kb, 2);                // row q
}

// y += the round's chunks of this lane's row(s): v is the value of super-block j = lane / PER of
// the round (nsb present), the chunk trees by butterfly, then the chunks in order from the lanes
// that hold them (lane PER * 4k + lane % PER). Correct in lanes 0 .. PER - 1.
template <int PER>
__device__ __forceinline__ void kq_round(float v, int nsb, float& y) {
    const int lane = threadIdx.x % WARP, j = lane / PER;
    float o = __shfl_xor_sync(0xffffffffu, v, PER);
    if ((j ^ 1) < nsb) v = kq_add(v, o);
    o = __shfl_xor_sync(0xffffffffu, v, 2 * PER);
    if (((j ^ 2) & ~1) < nsb) v = kq_add(v, o);
    y = kq_add(y, v);
#pragma unroll
    for (int k = 1; k < WARP / PER / KQ_CHUNK; ++k) {
        o = __shfl_sync(0xffffffffu, v, KQ_CHUNK * PER * k + lane % PER);
        if (KQ_CHUNK * k < nsb) y = kq_add(y, o);
    }
}

template <int NC, int R, int FMT>
__device__ __forceinline__ void rows_kq(const uint8_t* __restrict__ w, int row0, int nr, int rows, const Act& a,
                                        float (&acc)[R][NC]) {
    static_assert(R == 4, "the reduce-scatter takes 4 rows");
    constexpr bool Q6 = FMT == FMT_Q6_K;
    constexpr int PER = Q6 ? 2 : 4, SB = WARP / PER;
    static_assert(SB % KQ_CHUNK == 0, "a round holds whole chunks");
    const int n = items_per_row(FMT, a.K), lane = threadIdx.x % WARP;
    float y[2][NC]; // this lane's rows: lane & 3 (Q4_K/Q5_K), or lane & 1 and (lane & 1) + 2 (Q6_K)
#pragma unroll
    for (int c = 0; c < NC; ++c) y[0][c] = y[1][c] = 0.0f;
#pragma unroll 1
    for (int base = 0; base < n; base += WARP) {
        const int it = min(base + lane, n - 1); // lanes past the row's end drop out of the trees
        const int nsb = min(SB, (n - base) / PER);
        if constexpr (Q6) {
            int isc[R][NC];
            float d[R];
            // One row at a time (a Q6_K item is 27 registers; four at once spill).
#pragma unroll
            for (int r = 0; r < R; ++r) {
                d[r] = 0.0f;
#pragma unroll
                for (int c = 0; c < NC; ++c) isc[r][c] = 0;
                if (r < nr) {
                    const RawQ6 raw = raw_load<FMT>(w, row0 + r, rows, it, a);
                    d[r] = raw.d;
#pragma unroll
                    for (int c = 0; c < NC; ++c) {
                        if (c >= a.ncols) break;
                        isc[r][c] = q6_isc<NC>(raw, it, a, c);
                    }
                }
            }
            const int p = lane & 1;
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                if (c >= a.ncols) break;
                const float dx = a.xds[(size_t)c * (a.K / 32) + (it >> 1) * 8].x;
                const int ka = (p ? isc[1][c] : isc[0][c]) + __shfl_xor_sync(0xffffffffu, p ? isc[0][c] : isc[1][c], 1);
                const int kb = (p ? isc[3][c] : isc[2][c]) + __shfl_xor_sync(0xffffffffu, p ? isc[2][c] : isc[3][c], 1);
                kq_round<PER>(kq_value_q6(p ? d[1] : d[0], ka, dx), nsb, y[0][c]);
                kq_round<PER>(kq_value_q6(p ? d[3] : d[2], kb, dx), nsb, y[1][c]);
            }
        } else {
            RawQ45 raw[R];
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (r < nr) raw[r] = raw_load<FMT>(w, row0 + r, rows, it, a);
            const int i0 = (it >> 2) * QK_K + 64 * (it & 3), q = lane & 3;
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                if (c >= a.ncols) break;
                const X64 x = load_x64<NC>(a, c, i0);
                int isc[R], im[R];
                float2 dm[R];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    isc[r] = im[r] = 0;
                    dm[r] = make_float2(0.0f, 0.0f);
                    if (r < nr) {
                        const Q45 u = unpack_q45<FMT == FMT_Q5_K>(raw[r], it);
                        q45_ints(u, x, &isc[r], &im[r]);
                        dm[r] = u.dm;
                    }
                }
                const float2 dq = q == 0 ? dm[0] : q == 1 ? dm[1] : q == 2 ? dm[2] : dm[3];
                kq_round<PER>(kq_value_q45(dq.x, dq.y, quad_scatter(isc, q), quad_scatter(im, q), x.dd.x), nsb,
                              y[0][c]);
            }
        }
    }
    // Row r's total from its lane, to every lane.
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < NC; ++c)
            acc[r][c] = Q6 ? __shfl_sync(0xffffffffu, y[r >> 1][c], r & 1) : __shfl_sync(0xffffffffu, y[0][c], r);
}

// acc[r][c] = rows row0 .. row0 + nr - 1 (nr <= R) dotted with column c, in every lane.
// K-quants: rows_kq. Other formats (v6's row-aligned order): lane l takes items l, l + 32, ..
// of each row, sums them in increasing order, and the warp sum follows. Either way a row's
// reduction order depends only on the format and K, never on NC, so the 1-column and the group
// kernels agree bit for bit.
template <int NC, int R, int FMT>
__device__ __forceinline__ void rows_fmt(const uint8_t* __restrict__ w, int row0, int nr, int rows, const Act& a,
                                         float (&acc)[R][NC]) {
    if constexpr (FMT == FMT_Q4_K || FMT == FMT_Q5_K || FMT == FMT_Q6_K) {
        rows_kq<NC, R, FMT>(w, row0, nr, rows, a, acc);
    } else {
        const int n = items_per_row(FMT, a.K);
#pragma unroll 1
        for (int it = threadIdx.x % WARP; it < n; it += WARP) {
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (r < nr) {
                    float v[NC];
#pragma unroll
                    for (int c = 0; c < NC; ++c) v[c] = 0.0f;
                    item_fmt<NC, FMT>(w, row0 + r, rows, it, a, v);
#pragma unroll
                    for (int c = 0; c < NC; ++c) acc[r][c] += v[c];
                }
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int c = 0; c < NC; ++c) acc[r][c] = warp_sum(acc[r][c]);
    }
}

template <int NC, int R>
__device__ __forceinline__ void rows_dot(int ty, const uint8_t* __restrict__ w, int row0, int nr, int rows, const Act& a,
                                         float (&acc)[R][NC]) {
    switch (ty) {
    case FMT_Q4_K: rows_fmt<NC, R, FMT_Q4_K>(w, row0, nr, rows, a, acc); break;
    case FMT_Q5_K: rows_fmt<NC, R, FMT_Q5_K>(w, row0, nr, rows, a, acc); break;
    case FMT_Q6_K: rows_fmt<NC, R, FMT_Q6_K>(w, row0, nr, rows, a, acc); break;
    case FMT_Q8_0: rows_fmt<NC, R, FMT_Q8_0>(w, row0, nr, rows, a, acc); break;
    case FMT_F16: rows_fmt<NC, R, FMT_F16>(w, row0, nr, rows, a, acc); break;
    case FMT_BF16: rows_fmt<NC, R, FMT_BF16>(w, row0, nr, rows, a, acc); break;
    default: rows_fmt<NC, R, FMT_F32>(w, row0, nr, rows, a, acc); break;
    }
}

// MatvecJobs (common.cuh): starts are multiples of MATVEC_R here.

// Warp-level work: rows grow .. grow + R - 1 of the jobs' concatenated rows (R consecutive rows of
// one matrix) for the a.ncols columns of `a`, which start at column c0 of the call.
template <int NC, int R>
__device__ __forceinline__ void matvec_warp(const MatvecJobs& jobs, int grow, const Act& a, int c0) {
    if (grow >= jobs.start_of(jobs.njobs)) return;
    int j = 0;
#pragma unroll
    for (int t = 1; t < 4; ++t)
        if (t < jobs.njobs && grow >= jobs.start_of(t)) j = t;
    const int rows = jobs.rows_of(j), row0 = grow - jobs.start_of(j);
    const int nr = min(R, rows - row0);
    if (nr <= 0) return; // padding after the matrix's last row
    float acc[R][NC];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < NC; ++c) acc[r][c] = 0.0f;
    rows_dot<NC, R>(jobs.ty_of(j), jobs.w_of(j), row0, nr, rows, a, acc);
    float* y = jobs.y_of(j);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            if (r < nr && c < a.ncols && threadIdx.x % WARP == 0) y[(size_t)(c0 + c) * rows + row0 + r] = acc[r][c];
        }
}

// y[c][r] = silu(G[r] . x[c]) * (U[r] . x[c]) for rows row0 .. row0 + R - 1: gate and up rows in
// the same warp, one pass over the activation; `a` starts at column c0 of the call.
template <int NC, int R>
__device__ __forceinline__ void silu_warp(const uint8_t* wg, int tyg, const uint8_t* wu, int tyu, float* y, int rows,
                                          int row0, const Act& a, int c0) {
    if (row0 >= rows) return;
    const int nr = min(R, rows - row0), lane = threadIdx.x % WARP;
    // Lane r * NC + c keeps the gate's sum of (row r, column c) while the up rows run, so only one
    // accumulator array is live at a time (every lane ends a warp sum with the same bits).
    static_assert(R * NC <= WARP, "one lane per output");
    float acc[R][NC], g = 0.0f, u = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < NC; ++c) acc[r][c] = 0.0f;
    rows_dot<NC, R>(tyg, wg, row0, nr, rows, a, acc);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            if (lane == r * NC + c) g = acc[r][c];
            acc[r][c] = 0.0f;
        }
    rows_dot<NC, R>(tyu, wu, row0, nr, rows, a, acc);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < NC; ++c)
            if (lane == r * NC + c) u = acc[r][c];
    const int r = lane / NC, c = lane % NC;
    if (lane < R * NC && r < nr && c < a.ncols) y[(size_t)(c0 + c) * rows + row0 + r] = g / (1.0f + expf(-g)) * u;
}

// Decode groups (2 to 64 columns): the columns go in groups of 8, one group per warp, and the
// ncg = ceil(ncols / 8) warps of a group of rows sit in one block, so the rows' weights come from
// DRAM once and from L1/L2 for the other groups. Each warp runs the 8-column instantiation of
// the one-column arithmetic (same items per lane, same order, same warp sum), so every column
// gets the bits it would get alone: decode groups are batch-invariant.
// Block: ncg * rwpb warps, rwpb = blockDim.x / 32 / ncg groups of R rows each.
__device__ __forceinline__ Act column_group(const Act& a, int cg) {
    const int c0 = cg * 8;
    return Act{a.xq + (size_t)c0 * a.K, a.xds + (size_t)c0 * (a.K / 32), a.xf + (size_t)c0 * a.K, a.K,
               min(8, a.ncols - c0), a.kmajor};
}

#define ACT_ARGS const int8_t* __restrict__ xq, const float2* __restrict__ xds, const float* __restrict__ xf, int K, \
    int ncols, int kmajor
#define ACT Act{xq, xds, xf, K, ncols, kmajor}
#define SILU_ARGS const uint8_t* __restrict__ wg, int tyg, const uint8_t* __restrict__ wu, int tyu, float* __restrict__ y, int rows

// A warp takes MATVEC_R rows. matvec_1: 4 warps per block, one column. matvec_cols: up to 8 column
// groups (64 columns), 4 to 8 warps per block.
#define MATVEC_R 4
__device__ __forceinline__ void matvec_groups(const MatvecJobs& jobs, const Act& a) {
    const int ncg = (a.ncols + 7) / 8, warp = threadIdx.x / WARP, cg = warp % ncg;
    const int grow = (blockIdx.x * (blockDim.x / WARP / ncg) + warp / ncg) * MATVEC_R;
    matvec_warp<8, MATVEC_R>(jobs, grow, column_group(a, cg), cg * 8);
}
__device__ __forceinline__ void silu_groups(const uint8_t* wg, int tyg, const uint8_t* wu, int tyu, float* y, int rows,
                                            const Act& a) {
    const int ncg = (a.ncols + 7) / 8, warp = threadIdx.x / WARP, cg = warp % ncg;
    const int row0 = (blockIdx.x * (blockDim.x / WARP / ncg) + warp / ncg) * MATVEC_R;
    silu_warp<8, MATVEC_R>(wg, tyg, wu, tyu, y, rows, row0, column_group(a, cg), cg * 8);
}
// In a recorded decode step every kernel here is a programmatic dependent of the one before it
// (graph.rs): the one-column kernels first ask L2 for their warp's weight rows, which do not
// depend on that kernel, and only then wait for it (pdl_wait_prefetch_*), so the weight stream
// of a matvec starts while the small kernels before it (the activation quantizer, the norms)
// still run.

// Rows row0 .. row0 + nr - 1 of a matrix of format ty: the bytes of the plane that holds most of
// them (the whole rows of Q4_K/Q5_K and the float formats, the quants of repacked Q6_K/Q8_0),
// one 128-byte line per lane and step.
__device__ __forceinline__ void prefetch_rows(int ty, const uint8_t* w, int row0, int nr, int K) {
    size_t rb;
    switch (ty) {
    case FMT_Q4_K: rb = (size_t)K / QK_K * 144; break;
    case FMT_Q5_K: rb = (size_t)K / QK_K * 176; break;
    case FMT_Q6_K: rb = (size_t)K / QK_K * 192; break;
    case FMT_Q8_0: rb = (size_t)K; break;
    case FMT_F16:
    case FMT_BF16: rb = (size_t)K * 2; break;
    default: rb = (size_t)K * 4; break;
    }
    const uint8_t* base = w + (size_t)row0 * rb;
    for (size_t off = (size_t)(threadIdx.x % WARP) * 128; off < (size_t)nr * rb; off += WARP * 128)
        prefetch_l2(base + off);
}

__device__ __forceinline__ void pdl_wait_prefetch_jobs(const MatvecJobs& jobs, int grow, int K) {
    if (grow < jobs.start_of(jobs.njobs)) {
        int j = 0;
#pragma unroll
        for (int t = 1; t < 4; ++t)
            if (t < jobs.njobs && grow >= jobs.start_of(t)) j = t;
        const int row0 = grow - jobs.start_of(j), nr = min(MATVEC_R, jobs.rows_of(j) - row0);
        if (nr > 0) prefetch_rows(jobs.ty_of(j), jobs.w_of(j), row0, nr, K);
    }
    pdl_wait();
}

__device__ __forceinline__ void pdl_wait_prefetch_silu(const uint8_t* wg, int tyg, const uint8_t* wu, int tyu,
                                                       int rows, int row0, int K) {
    if (row0 < rows) {
        const int nr = min(MATVEC_R, rows - row0);
        prefetch_rows(tyg, wg, row0, nr, K);
        prefetch_rows(tyu, wu, row0, nr, K);
    }
    pdl_wait();
}

extern "C" __global__ void __launch_bounds__(128, 4) matvec_1(MatvecJobs jobs, ACT_ARGS) {
    pdl_wait_prefetch_jobs(jobs, (blockIdx.x * 4 + threadIdx.x / WARP) * MATVEC_R, K);
    matvec_warp<1, MATVEC_R>(jobs, (blockIdx.x * 4 + threadIdx.x / WARP) * MATVEC_R, ACT, 0);
}
extern "C" __global__ void __launch_bounds__(256) matvec_cols(MatvecJobs jobs, ACT_ARGS) {
    pdl_wait();
    matvec_groups(jobs, ACT);
}
extern "C" __global__ void __launch_bounds__(128, 4) matvec_silu_1(SILU_ARGS, ACT_ARGS) {
    pdl_wait_prefetch_silu(wg, tyg, wu, tyu, rows, (blockIdx.x * 4 + threadIdx.x / WARP) * MATVEC_R, K);
    silu_warp<1, MATVEC_R>(wg, tyg, wu, tyu, y, rows, (blockIdx.x * 4 + threadIdx.x / WARP) * MATVEC_R, ACT, 0);
}
extern "C" __global__ void __launch_bounds__(256) matvec_silu_cols(SILU_ARGS, ACT_ARGS) {
    pdl_wait();
    silu_groups(wg, tyg, wu, tyu, y, rows, ACT);
}

// ---------------------------------------------------------------------------------------------
// mvk_1 / mvk_silu_1 (v10): one column of K-quant matrices, the work split by chunks. matvec_1
// gives each warp 4 whole rows, so at the Glimmer shapes a launch runs 0.8 to 2.4 waves of
// blocks (the last one partly empty) and, at K = 6656 (26 super-blocks), a quarter of the lanes
// idle in a row's last round; its Q6_K path loads one row at a time (a 128-value Q6_K item is
// 27 registers). Here a launch's work is a list of tasks (row quad, chunk of KQ_CHUNK
// super-blocks), cut into one contiguous range per warp of a grid that fills the GPU once, so
// every warp streams the same number of bytes and every lane works in every round. A round
// takes 2 tasks: quad j = lane / 4 takes super-block j & 3 of task j >> 2, lane q = lane & 3 its
// quarter q (64 values; Q6_K too: quarter (h, p) = values 128h + 32p .. + 31 and 128h + 64 + 32p
// .. + 31, whose quants are 32 contiguous ql bytes and the 32 qh bytes of half h) of the task's
// 4 rows, so 4 rows' loads are in flight per lane whatever the format. The quad reduce-scatters
// its integers (quad_scatter), each lane makes its row's super-block value, and a butterfly over
// the 4 quads makes the chunk's tree. A row quad whose tasks all lie in the warp's range is
// summed in registers, its chunks in order from 0 (the canonical order of common.cuh, so the
// bits are matvec_1's and mmk's); only the row quads a warp shares with its neighbours (at most
// the first and the last of its range) send chunk values through `cv`, where a counter per row
// quad finds the warp that completes it (threadfence, atomicAdd): that warp adds the row's
// chunks in order from 0, writes y and zeroes the counter for the next launch.
// cv: [padded rows][chunks] (silu: [rows][2][chunks]); cnt: one u32 per row quad.
// Measured (H200, 2026-11-29, llama-glimmer, Nsight Compute per kernel, matvec_1 -> mvk_1):
// q+k+v 16.5 -> 17.8 us, attn_output 9.9 -> 12.8, ffn_down Q4_K 32.0 -> 33.9, Q6_K 77.5 ->
// 47.0, gate+up+SiLU 61.6 -> 54.7, Q5_K LM head 296 -> 282; tg128 108.7 -> 126.4 tokens/s
// (`MUSER_CUDA_MVK=0` in the same call: 109.3). Tried and dropped: the counter and fence after
// every round (the fence stalls the warp an L2 round trip: gate+up 66.8 us, attn_output 15.1);
// the shared row quads counted once at the end of the warp's range (no faster: the fence then
// lands in the kernel's tail); asking L2 for the next round's weights each round (slower
// everywhere: the LM head 417 against 279 us, tg128 108.8 against 115.9); one warp per row
// quad for the q+k+v launch (55% of the warps: 23.8 us; kept for attn_output, see mvk_blocks).
// v10b: the warps' spans in 32-bit arithmetic, once per warp (the 64-bit divisions, emulated,
// had each warp spend ~1-3 us before its first load): attn_output 12.8 -> 9.9 us, q+k+v 17.8 ->
// 16.7, ffn_down Q4_K 33.9 -> 29.2, Q6_K 47.0 -> 47.6, gate+up+SiLU 54.7 -> 54.7, LM head 282
// -> 275; tg128 126.4 -> 132.1 tokens/s.
// Tried and dropped after v10b (H200, llama-glimmer, 2026-11-30, one binary per variant in one
// call, tg128 against 132.8-133.0 for this kernel): each warp's rounds streamed into shared memory
// by bulk copies (cp.async.bulk, one per task row, mbarrier per stage, the first rounds asked for
// before pdl_wait; same bits, checked): 2 stages 114.1-120.7, 4 stages (2 blocks per SM) 93.9; one
// launch each: ffn_down Q6_K 50.0 -> 68.3 us, LM head 282 -> 387; the warp's tasks stepped instead
// of divided (two tasks live per round: spills, 126.5); a bulk L2 prefetch of the round 1 or 2
// ahead (115.1, 110.0). Nsight Compute on the q+k+v launch: 20% of issue slots busy, 21% achieved
// occupancy (128 registers), 11.4 cycles between a warp's instructions, 41% of them waiting on
// L1TEX; a round's loads reach ~16 lines per instruction by their addresses (4 rows x 8 super-
// blocks per warp), so the next lever is likely the layout (a task's bytes contiguous: coalesced
// 512-byte loads), not more bytes in flight.
// Also dropped (H200, 2026-11-30, same call, same bits): twins loading the quad's rows 2 or 1 at a
// time (96 / 80 registers, no spills, 5 / 6 blocks per SM instead of 4): tg128 96.0 / 96.2
// against 131.3 tokens/s; per launch (check --bench, us, mvk / 2 / 1 rows) ffn_gate 35.7 / 51.1 /
// 50.8, Q6_K ffn_down 50.8 / 54.3 / 55.5, LM head 281 / 458 / 433. More warps do not make up
// for fewer loads in flight per warp.
// v11 (2026-11-30): the K-quant blocks interleaved by row quads at upload (kq_blk, common.cuh), so
// a task is one contiguous run and a warp's range one run per matrix; the quad's loads one base
// plus constants, no branch per row (the padding rows exist as zero blocks). H200, same call:
// tg128 130.65 -> 140.48 tokens/s; check --bench q+k+v+gate 24.9 -> 20.7 us, ffn_gate 35.7 ->
// 34.1, Q6_K ffn_down 50.8 -> 44.1, LM head 281 -> 253 (3.66 TB/s); pp512 3463 -> 3407.
// Tried after v11 and dropped: one bulk L2 request per warp and matrix (cp.async.bulk.prefetch)
// for the first 8 or 16 KB of its run instead of the first round's lines: tg128 138.06 / 134.28
// against 140.59 / 140.65.
// v11b: a round's two tasks stepped from the last (row quad, index) instead of divided out of the
// task number (three integer divisions per round): tg128 143.65 / 144.01 against 141.59 / 140.86;
// Nsight Compute gate+up+SiLU 51.2 us (v11: 53.3).
// v11c (2026-11-30): the shared row quads counted with a release atomic and completed after one
// acquire fence (atom_add_release, common.cuh) instead of two sequentially consistent fences
// (__threadfence), the chunk values loaded 8 at a time: tg128 150.09 / 149.77 -> 157.43 /
// 157.11. scripts/matvec_lab/trace.cu (per-warp timestamps, MVK_TRACE) shows this kernel's
// rounds at the read bandwidth once running (~2.2 us per 4.6 KB round for all 2,112 warps) and
// each large launch losing 10-14 us to the first round, the warps' spread of end times and the
// shared quads. Tried after it and dropped (BENCHMARKS.md, 2026-11-30 06:35): a whole
// super-block per lane (tg128 120 against 143), both shared counts at the range's end (no
// change), one 16-warp block per SM taking rounds from a shared counter (ends tightened, rounds
// 14% slower: 145 against 157.5), the next Q4_K round's loads before this round's reductions
// (150.5 against 156.2).
// v11d (2026-12-03): fewer instructions per round (q45_quarter_ints, q6q_isc_u; same integers):
// tg128 177.03 / 177.01 -> 180.84 / 180.39. Nsight Compute then: 58% of gate+up's warp samples
// wait on the round's weight loads, yet loading them a round ahead (registers) loses (170.6), a
// shared-memory stage loses (102), whole-sector Q4_K loads lose (177.4; matvec lab runs 49-53).

// c + the dot product of a's 4 unsigned bytes with b's 4 signed bytes.
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
// The sum of the 16 int8 values of v.
__device__ __forceinline__ int sum16_i8(const int4& v) {
    const int one = 0x01010101;
    return __dp4a(v.w, one, __dp4a(v.z, one, __dp4a(v.y, one, __dp4a(v.x, one, 0))));
}
// c + a's low 16-bit half (signed) x b's byte 2 + a's high half x b's byte 3 (bytes unsigned).
__device__ __forceinline__ int dp2a_hi_su(int a, uint32_t b, int c) {
    int d;
    asm("dp2a.hi.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// Q6_K quarter (h, p) of super-block sb of a row (repacked planes, see RawQ6).
struct RawQ6Q {
    uint4 l0, l1, h0, h1; // 32 ql bytes 64h + 32p .., the 32 qh bytes 32h ..
    uint2 sc;             // scales 8h .. 8h + 7
    float d;
};

// at: the block's number (kq_blk), n: the blocks of each plane.
__device__ __forceinline__ RawQ6Q load_q6q(const uint8_t* __restrict__ w, size_t at, size_t n, int q) {
    const int h = q >> 1, p = q & 1;
    const uint8_t* blk = w + at * 192;
    RawQ6Q r;
    r.l0 = ld_once<uint4>(blk + 64 * h + 32 * p);
    r.l1 = ld_once<uint4>(blk + 64 * h + 32 * p + 16);
    r.h0 = ld_once<uint4>(blk + 128 + 32 * h);
    r.h1 = ld_once<uint4>(blk + 128 + 32 * h + 16);
    r.sc = *(const uint2*)(w + n * 192 + at * 16 + 8 * h);
    r.d = __half2float(((const __half*)(w + n * 208))[at]);
    return r;
}

// isc of a Q6_K quarter: values A + l (low nibbles, qh bits 2p) and A + 64 + l (high nibbles, qh
// bits 4 + 2p), l < 32, A = 128h + 32p; sub-blocks 8h + 2p, + 1 (A) and 8h + 4 + 2p, + 1 (A + 64).
// The quants are dotted as unsigned bytes (q, not q - 32) and each sub-block's dp4a chain starts
// at ca0 .. cb1 = -32 x its activation sum: the canonical integers (common.cuh).
__device__ __forceinline__ int q6q_isc_u(const RawQ6Q& r, int p, const int4& xa0, const int4& xa1, const int4& xb0,
                                         const int4& xb1, int ca0, int ca1, int cb0, int cb1) {
    const uint32_t lw[8] = {r.l0.x, r.l0.y, r.l0.z, r.l0.w, r.l1.x, r.l1.y, r.l1.z, r.l1.w};
    const uint32_t hw[8] = {r.h0.x, r.h0.y, r.h0.z, r.h0.w, r.h1.x, r.h1.y, r.h1.z, r.h1.w};
    const int xa[8] = {xa0.x, xa0.y, xa0.z, xa0.w, xa1.x, xa1.y, xa1.z, xa1.w};
    const int xb[8] = {xb0.x, xb0.y, xb0.z, xb0.w, xb1.x, xb1.y, xb1.z, xb1.w};
    int sa0 = ca0, sa1 = ca1, sb0 = cb0, sb1 = cb1;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        // Bits 2p, 2p + 1 (a) and 4 + 2p, 5 + 2p (b) of each qh byte moved to bits 4, 5.
        const uint32_t qa = (lw[k] & 0x0F0F0F0Fu) | ((hw[k] << (4 - 2 * p)) & 0x30303030u);
        const uint32_t qb = ((lw[k] >> 4) & 0x0F0F0F0Fu) | ((hw[k] >> (2 * p)) & 0x30303030u);
        if (k < 4) {
            sa0 = dp4a_us(qa, xa[k], sa0);
            sb0 = dp4a_us(qb, xb[k], sb0);
        } else {
            sa1 = dp4a_us(qa, xa[k], sa1);
            sb1 = dp4a_us(qb, xb[k], sb1);
        }
    }
    const int sh = 16 * p;
    return (int)(int8_t)(r.sc.x >> sh) * sa0 + (int)(int8_t)(r.sc.x >> (sh + 8)) * sa1 +
           (int)(int8_t)(r.sc.y >> sh) * sb0 + (int)(int8_t)(r.sc.y >> (sh + 8)) * sb1;
}

// One task of a launch: rows row0 .. row0 + nr - 1 of matrix w (format ty), chunk ch; gq the row
// quad's index in the launch (its counter; its rows' cv entries start at row 4 gq).
struct MvkTask {
    const uint8_t* w;
    float* y;
    int ty, rows, row0, nr, gq, ch, m;
};

// Task t of a matvec launch inside job (w, y, ty, rows) whose rows start at row st of the launch.
// Task (row quad gq of the launch, chunk ch) = task gq * nch + ch.
__device__ __forceinline__ MvkTask mvk_job_task_at(const uint8_t* w, float* y, int ty, int rows, int st, int gq,
                                                   int ch) {
    MvkTask k;
    k.gq = gq;
    k.ch = ch;
    k.w = w;
    k.y = y;
    k.ty = ty;
    k.rows = rows;
    k.row0 = 4 * k.gq - st;
    k.nr = min(4, rows - k.row0);
    k.m = 0;
    return k;
}
__device__ __forceinline__ MvkTask mvk_job_task(const uint8_t* w, float* y, int ty, int rows, int st, int nch, int t) {
    const int gq = t / nch;
    return mvk_job_task_at(w, y, ty, rows, st, gq, t - gq * nch);
}

// Task t of a gate+up launch: row quads, then gate (m = 0) or up (m = 1), then chunks.
// Task (row quad gq, rem: gate chunks 0 .. nch - 1, then up chunks) = task gq * 2 nch + rem.
__device__ __forceinline__ MvkTask mvk_silu_task_at(const uint8_t* wg, int tyg, const uint8_t* wu, int tyu, int rows,
                                                    int nch, int gq, int rem) {
    MvkTask k;
    k.gq = gq;
    k.m = rem >= nch;
    k.ch = rem - k.m * nch;
    k.w = k.m ? wu : wg;
    k.ty = k.m ? tyu : tyg;
    k.y = nullptr;
    k.rows = rows;
    k.row0 = 4 * k.gq;
    k.nr = min(4, rows - k.row0);
    return k;
}
__device__ __forceinline__ MvkTask mvk_silu_task(const uint8_t* wg, int tyg, const uint8_t* wu, int tyu, int rows,
                                                 int nch, int t) {
    const int gq = t / (2 * nch);
    return mvk_silu_task_at(wg, tyg, wu, tyu, rows, nch, gq, t - gq * 2 * nch);
}

// The scales and mins of quarter g of a Q4_K/Q5_K super-block (scale words y, z, w as in
// unpack_scales_k4), one per byte: sc(2g), sc(2g + 1), m(2g), m(2g + 1).
__device__ __forceinline__ uint32_t k4_quarter_scales(uint32_t y, uint32_t z, uint32_t w, int g) {
    const uint32_t j = 2 * (g & 1), sel = j | (j + 1) << 4 | (j + 4) << 8 | (j + 5) << 12;
    const uint32_t h = __byte_perm(y, z, sel); // g < 2: the 6-bit values; else their top 2 bits
    if (g < 2) return h & 0x3F3F3F3Fu;
    return (__byte_perm(w, w >> 4, sel) & 0x0F0F0F0Fu) | ((h >> 2) & 0x30303030u);
}

// One Q4_K/Q5_K row's integers of quarter g (q45_ints' isc and im, exactly), in fewer
// instructions than unpack_q45 + q45_ints: Q4_K's high nibbles are multiplied in place (16 x
// their value, as unsigned bytes) and that sum divided by 16 after; the scales and mins come
// by byte permutes (k4_quarter_scales), the mins applied by one dp2a over the activation's two
// sub-block sums (xs: two 16-bit halves; |sum| <= 32 x 127).
template <bool Q5>
__device__ __forceinline__ void q45_quarter_ints(const RawQ45& r, const X64& x, int xs, int g, int* isc, int* im,
                                                 float2* dm) {
    const uint32_t qw[8] = {r.qa.x, r.qa.y, r.qa.z, r.qa.w, r.qb.x, r.qb.y, r.qb.z, r.qb.w};
    const int xa[8] = {x.x0.x, x.x0.y, x.x0.z, x.x0.w, x.x1.x, x.x1.y, x.x1.z, x.x1.w};
    const int xb[8] = {x.x2.x, x.x2.y, x.x2.z, x.x2.w, x.x3.x, x.x3.y, x.x3.z, x.x3.w};
    int s0 = 0, s1 = 0;
    if (Q5) {
        const uint32_t hw[8] = {r.ha.x, r.ha.y, r.ha.z, r.ha.w, r.hb.x, r.hb.y, r.hb.z, r.hb.w};
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint32_t h = hw[k] >> (2 * g);
            s0 = dp4a_us((qw[k] & 0x0F0F0F0Fu) | ((h << 4) & 0x10101010u), xa[k], s0);
            s1 = dp4a_us(((qw[k] >> 4) & 0x0F0F0F0Fu) | ((h << 3) & 0x10101010u), xb[k], s1);
        }
    } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            s0 = dp4a_us(qw[k] & 0x0F0F0F0Fu, xa[k], s0);
            s1 = dp4a_us(qw[k] & 0xF0F0F0F0u, xb[k], s1);
        }
        s1 >>= 4; // exact: a multiple of 16
    }
    const uint32_t sm = k4_quarter_scales(r.hdr.y, r.hdr.z, r.hdr.w, g);
    *isc = (int)(sm & 0xFF) * s0 + (int)((sm >> 8) & 0xFF) * s1;
    *im = dp2a_hi_su(xs, sm, 0);
    *dm = __half22float2(*(const __half2*)&r.hdr.x);
}

// This lane's integers of quarter q of super-block sb for the task's rows (format FMT): isc, im
// and (d, dmin) per row. The quad's 4 rows' block sb lie side by side (kq_blk; row0 is a
// multiple of 4, and the padding rows of the last quad exist, as zero blocks), so the 4 loads
// per field are one base plus constants, and no row is skipped.
template <int FMT>
__device__ __forceinline__ void mvk_ints(const MvkTask& k, int sb, int q, const int8_t* __restrict__ xq,
                                         const float2* __restrict__ xds, int K, int (&isc)[4], int (&im)[4],
                                         float2 (&dm)[4]) {
    const int nb = K / QK_K;
    const Act a{xq, xds, nullptr, K, 1, 0};
    if constexpr (FMT == FMT_Q6_K) {
        const size_t at0 = kq_blk(k.row0, nb, sb), n = kq_rows(k.rows) * nb;
        const int A = sb * QK_K + 128 * (q >> 1) + 32 * (q & 1);
        RawQ6Q raw[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) raw[r] = load_q6q(k.w, at0 + r, n, q);
        const int4 xa0 = xq16<1>(a, 0, A), xa1 = xq16<1>(a, 0, A + 16);
        const int4 xb0 = xq16<1>(a, 0, A + 64), xb1 = xq16<1>(a, 0, A + 80);
        // -32 x each 16-value sub-block's activation sum: the start of its dp4a chain, so the
        // quants are dotted as unsigned bytes (0 .. 63) with no per-byte offset.
        const int ca0 = -32 * sum16_i8(xa0), ca1 = -32 * sum16_i8(xa1);
        const int cb0 = -32 * sum16_i8(xb0), cb1 = -32 * sum16_i8(xb1);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            isc[r] = q6q_isc_u(raw[r], q & 1, xa0, xa1, xb0, xb1, ca0, ca1, cb0, cb1);
            dm[r].x = raw[r].d;
        }
    } else {
        constexpr bool Q5 = FMT == FMT_Q5_K;
        constexpr int BS = Q5 ? 176 : 144;
        const uint8_t* blk0 = k.w + kq_blk(k.row0, nb, sb) * BS;
        RawQ45 raw[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) raw[r] = load_q45<Q5>(blk0 + r * BS, q);
        const X64 x = load_x64<1>(a, 0, sb * QK_K + 64 * q);
        const int xs = (int)__byte_perm(__float2int_rn(x.dd.y), __float2int_rn(x.dd.w), 0x5410);
#pragma unroll
        for (int r = 0; r < 4; ++r) q45_quarter_ints<Q5>(raw[r], x, xs, q, &isc[r], &im[r], &dm[r]);
    }
}

// The value of super-block sb for row q of the task's quad (in lane q of each quad), from this
// lane's quarter q of the 4 rows: the integers summed over the quad (exact), then the canonical
// f32 value. Lanes whose super-block is absent (ok false) load nothing and their value is unused.
template <int FMT>
__device__ __forceinline__ float mvk_value(const MvkTask& k, int sb, bool ok, int q, const int8_t* __restrict__ xq,
                                           const float2* __restrict__ xds, int K) {
    int isc[4] = {0, 0, 0, 0}, im[4] = {0, 0, 0, 0};
    float2 dm[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) dm[r] = make_float2(0.0f, 0.0f);
    float dx = 0.0f;
    if (ok) {
        dx = xds[(size_t)sb * 8].x;
        mvk_ints<FMT>(k, sb, q, xq, xds, K, isc, im, dm);
    }
    const int s = quad_scatter(isc, q);
    const float2 dq = q == 0 ? dm[0] : q == 1 ? dm[1] : q == 2 ? dm[2] : dm[3];
    if constexpr (FMT == FMT_Q6_K) return kq_value_q6(dq.x, s, dx);
    else return kq_value_q45(dq.x, dq.y, s, quad_scatter(im, q), dx);
}

// Asks L2 for the first round of the warp's range: each half-warp its task, one contiguous run of
// 4 x nsb blocks (kq_blk; the quants plane of Q6_K), two 128-byte lines per lane.
__device__ __forceinline__ void mvk_prefetch(const MvkTask& k, int K) {
    const int l = threadIdx.x % 16, nb = K / QK_K;
    const int bsz = k.ty == FMT_Q6_K ? 192 : k.ty == FMT_Q5_K ? 176 : 144;
    const int span = 4 * min(KQ_CHUNK, nb - KQ_CHUNK * k.ch) * bsz;
    const uint8_t* p = k.w + kq_blk(k.row0, nb, KQ_CHUNK * k.ch) * bsz;
    prefetch_l2(p + 128 * l);
    if (128 * (l + 16) < span) prefetch_l2(p + 128 * (l + 16));
}

// g = the n chunk values at a added in order from 0 (and, TWO, u = those at b): the canonical
// sum of a row's chunks. The loads of 8 chunks (of both rows) go out together, so the completing
// warp waits one L2 round trip per 8 chunks instead of one per chunk.
template <bool TWO>
__device__ __forceinline__ void kq_sum_chunks(const float* a, const float* b, int n, float* g, float* u) {
    float sa = 0.0f, sb = 0.0f;
#pragma unroll 1
    for (int i0 = 0; i0 < n; i0 += 8) {
        float ca[8], cb[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            ca[i] = i0 + i < n ? __ldcg(a + i0 + i) : 0.0f;
            cb[i] = TWO && i0 + i < n ? __ldcg(b + i0 + i) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 8; ++i)
            if (i0 + i < n) {
                sa = kq_add(sa, ca[i]);
                if (TWO) sb = kq_add(sb, cb[i]);
            }
    }
    *g = sa;
    *u = sb;
}

// Timing hook of scripts/matvec_lab/trace.cu (per-warp timestamps of a launch); nothing here.
#ifndef MVK_TRACE
#define MVK_TRACE(point, dep)
#endif


// The rounds of one warp over tasks [t0, t1), all of format FMT; task(gq, i) decodes task i of row
// quad gq (task gq * per + i). A row
// quad whose tasks all lie in [t0, t1) is summed here, its chunks in order from 0 as they come
// (its tasks come in order), and written; the chunk values of a row quad shared with other
// warps (at most the first and the last of the range) go to cv, and the warp's part ends with
// one fence and one atomicAdd of its task count: the warp that completes the count adds the
// row's chunks in order and writes it. Either way a row's chunks are added in one order, so the
// bits do not depend on how a launch splits its tasks.
// TWO (mvk_1's whole-quad split, mvk_span_whole): the warp's tasks are [a0, a1), then
// [b0, t1) with b0 = t0 + a1 - a0: the loop walks [t0, t1), its first a1 - a0 places standing
// for the tasks of [a0, a1), and a row quad counts as the warp's own when it lies in one of the
// two ranges. Without TWO the loop is the one-range loop it was before the split (the steps TWO
// adds to each round cost the other launches ~0.5-1% of a token when compiled into them; H100,
// 2026-12-05). SILU: gate and up sums of the row quad, then
// silu(gate) * up.
// flags & MVK_SKIP_SHARED (a measuring switch, MUSER_CUDA_ABLATE=shared_quads; the output is
// wrong by design): the shared row quads' chunk values are written but never counted or summed,
// so a launch costs what it would if their completion were free.
#define MVK_SKIP_SHARED 1
// flags & MVK_DEFER_SHARED (mvk_silu_1 before silu_finish_q8k): the shared row quads' chunk
// values are written and left for silu_finish_q8k, which sums them in the same order.
#define MVK_DEFER_SHARED 2
template <bool SILU, int FMT, bool TWO, typename TaskFn>
__device__ __forceinline__ void mvk_warp(TaskFn task, int t0, int t1, int a0, int a1, int nch,
                                         const int8_t* __restrict__ xq,
                                         const float2* __restrict__ xds, int K, float* __restrict__ cv,
                                         unsigned* __restrict__ cnt, float* __restrict__ ysilu, int flags) {
    const int lane = threadIdx.x % WARP, j = lane >> 2, q = lane & 3, s4 = j & 3, hf = j >> 2;
    const int nb = K / QK_K, per = (SILU ? 2 : 1) * nch; // tasks per row quad
    float ya = 0.0f, yb = 0.0f;                            // row q's running sums (gate / up)
    // The round's two tasks tb and tb + 1 as (row quad, index in it), stepped without divisions.
    // TWO: the second range's start b0, its (row quad, index), and the shift d of the first
    // range's tasks from their places.
    const int b0 = TWO ? t0 + a1 - a0 : t0, gB = TWO ? b0 / per : 0, rB = TWO ? b0 - gB * per : 0, d = b0 - a1;
    int ga = (TWO && a1 > a0 ? a0 : t0) / per, ra = (TWO && a1 > a0 ? a0 : t0) - ga * per;
#pragma unroll 1
    for (int tb = t0; tb < t1; tb += 2) {
        int gb = ga + (ra + 1 == per), rb = ra + 1 == per ? 0 : ra + 1;
        if (TWO && tb + 1 == b0) gb = gB, rb = rB;
        const bool tv = tb + hf < t1;
        const MvkTask k = hf && tv ? task(gb, rb) : task(ga, ra);
        const int sb = KQ_CHUNK * k.ch + s4;
        float v = mvk_value<FMT>(k, sb, tv && sb < nb, q, xq, xds, K);
        // The chunk's tree over the 4 quads of this half (kq_round's, per chunk).
        const int nsb = nb - KQ_CHUNK * k.ch;
        float o = __shfl_xor_sync(0xffffffffu, v, 4);
        if ((s4 ^ 1) < nsb) v = kq_add(v, o);
        o = __shfl_xor_sync(0xffffffffu, v, 8);
        if (((s4 ^ 2) & ~1) < nsb) v = kq_add(v, o);
        // Row q's chunk values of both tasks, in every lane (lanes 16 h + q hold task h's).
        const float cva = __shfl_sync(0xffffffffu, v, q), cvb = __shfl_sync(0xffffffffu, v, 16 + q);
        MVK_TRACE(2 + (tb - t0) / 2, cva + cvb);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int tt = tb + h;
            if (tt >= t1) break;
            const MvkTask kt = h ? task(gb, rb) : task(ga, ra);
            const float c = h ? cvb : cva;
            const int first = kt.gq * per, idx = kt.m * nch + kt.ch;
            int lo = t0, hi = t1, at = tt; // the task's range and its number in it
            if (TWO) {
                if (tt < b0) lo = a0, hi = a1, at = tt - d;
                else lo = b0;
            }
            const bool wr = lane < kt.nr; // lanes 0 .. 3 write row `lane`
            if (first >= lo && first + per <= hi) {
                if (SILU && kt.m) yb = kq_add(kt.ch == 0 ? 0.0f : yb, c);
                else ya = kq_add(kt.ch == 0 ? 0.0f : ya, c);
                if (idx == per - 1 && wr) {
                    if (SILU) ysilu[kt.row0 + lane] = ya / (1.0f + expf(-ya)) * yb;
                    else kt.y[kt.row0 + lane] = ya;
                }
                continue;
            }
            const size_t row = (size_t)4 * kt.gq + lane;
            if (wr) cv[row * per + idx] = c;
            if ((idx == per - 1 || at == hi - 1) && !(flags & (MVK_SKIP_SHARED | MVK_DEFER_SHARED))) { // its part's end
                const int n = min(first + per, hi) - max(first, lo);
                // The lanes' chunk values ordered before lane 0's count (release, cumulative over
                // the warp barrier); the completing warp's reads after it (acquire, then the
                // barrier for lanes 1 .. 3).
                __syncwarp();
                int last = 0;
                if (lane == 0) {
                    last = atom_add_release(&cnt[kt.gq], (unsigned)n) == (unsigned)(per - n);
                    if (last) fence_acquire();
                }
                last = __shfl_sync(0xffffffffu, last, 0);
                if (last) {
                    __syncwarp();
                    if (wr) {
                        const float* cr = cv + row * per;
                        float g, u;
                        kq_sum_chunks<SILU>(cr, cr + nch, nch, &g, &u);
                        if (SILU) ysilu[kt.row0 + lane] = g / (1.0f + expf(-g)) * u;
                        else kt.y[kt.row0 + lane] = g;
                    }
                }
                if (last && lane == 0) cnt[kt.gq] = 0u; // zero again for the next launch
            }
        }
        ga = gb + (rb + 1 == per);
        ra = rb + 1 == per ? 0 : rb + 1;
        if (TWO && tb + 2 == b0) ga = gB, ra = rB;
    }
    MVK_TRACE(30, ya + yb);
}

#define MVK_ACT const int8_t* __restrict__ xq, const float2* __restrict__ xds, int K, float* __restrict__ cv, \
    unsigned* __restrict__ cnt, int flags


// The warp's tasks [t0, t1) (TWO: as in mvk_warp) of one format: a loop per format (one loop
// serving every format would need the registers of all of them at once and spill).
template <bool SILU, bool TWO, typename TaskFn>
__device__ __forceinline__ void mvk_fmt(int ty, TaskFn task, int t0, int t1, int a0, int a1, int nch,
                                        const int8_t* __restrict__ xq, const float2* __restrict__ xds, int K,
                                        float* __restrict__ cv, unsigned* __restrict__ cnt,
                                        float* __restrict__ ysilu, int flags) {
    switch (ty) {
    case FMT_Q4_K: mvk_warp<SILU, FMT_Q4_K, TWO>(task, t0, t1, a0, a1, nch, xq, xds, K, cv, cnt, ysilu, flags); break;
    case FMT_Q5_K: mvk_warp<SILU, FMT_Q5_K, TWO>(task, t0, t1, a0, a1, nch, xq, xds, K, cv, cnt, ysilu, flags); break;
    default: mvk_warp<SILU, FMT_Q6_K, TWO>(task, t0, t1, a0, a1, nch, xq, xds, K, cv, cnt, ysilu, flags); break;
    }
}


// A request to L2 for the half-warp's first task t of job j (when below end), then the wait for
// the kernel before (common.cuh).
__device__ __forceinline__ void mvk_prefetch_wait(const MatvecJobs& jobs, int j, int nch, int t, int end, int K) {
    if (t < end)
        mvk_prefetch(mvk_job_task(jobs.w_of(j), jobs.y_of(j), jobs.ty_of(j), jobs.rows_of(j), jobs.start_of(j), nch, t), K);
    pdl_wait();
    MVK_TRACE(1, 0.0f);
}
// The warp's span (computed once: mvk_span, or SPREAD mvk_span_spread), a request to L2 for its
// first round, then the wait.
template <bool SPREAD = false>
__device__ __forceinline__ MvkSpan pdl_wait_prefetch_mvk(const MatvecJobs& jobs, int K) {
    MVK_TRACE(0, 0.0f);
    const int nch = kq_chunks(K);
    const MvkSpan sp = SPREAD ? mvk_span_spread(jobs, nch) : mvk_span(jobs, nch, 4);
    mvk_prefetch_wait(jobs, sp.j, nch, sp.t0 + (threadIdx.x % WARP >= 16), sp.t1, K);
    return sp;
}

// The warp's tasks [t0, t1) of job j (TWO: as in mvk_warp).
template <bool TWO>
__device__ __forceinline__ void mvk_job(const MatvecJobs& jobs, int j, int t0, int t1, int a0, int a1, MVK_ACT) {
    const int nch = kq_chunks(K);
    const uint8_t* w = jobs.w_of(j);
    float* yj = jobs.y_of(j);
    const int ty = jobs.ty_of(j), rows = jobs.rows_of(j), st = jobs.start_of(j);
    mvk_fmt<false, TWO>(ty, [=](int gq, int ch) { return mvk_job_task_at(w, yj, ty, rows, st, gq, ch); }, t0, t1, a0,
                        a1, nch, xq, xds, K, cv, cnt, nullptr, flags);
}

// The grid must have at least njobs warps (matvec.rs: mvk_blocks).
extern "C" __global__ void __launch_bounds__(128, 4) mvk_1(MatvecJobs jobs, MVK_ACT) {
    const MvkSpan sp = pdl_wait_prefetch_mvk(jobs, K);
    mvk_job<false>(jobs, sp.j, sp.t0, sp.t1, 0, 0, xq, xds, K, cv, cnt, flags);
}

// mvk_1 with one row quad per warp spread over a full grid (mvk_span_spread): one-job launches of
// 3 W / 4 to W row quads (matvec.rs mvk_spread_fits; attn_output and ffn_down at the Glimmer
// shapes). The same bits as mvk_1.
extern "C" __global__ void __launch_bounds__(128, 4) mvk_1_spread(MatvecJobs jobs, MVK_ACT) {
    const MvkSpan sp = pdl_wait_prefetch_mvk<true>(jobs, K);
    mvk_job<false>(jobs, sp.j, sp.t0, sp.t1, 0, 0, xq, xds, K, cv, cnt, flags);
}

// The warp's whole-quad span (mvk_span_whole), a request to L2 for its first round, then the wait
// for the kernel before.
__device__ __forceinline__ MvkSpan2 pdl_wait_prefetch_mvk_whole(const MatvecJobs& jobs, int K) {
    MVK_TRACE(0, 0.0f);
    const int nch = kq_chunks(K);
    const MvkSpan2 sp = mvk_span_whole(jobs, nch);
    const int v = threadIdx.x % WARP >= 16, n1 = sp.a1 - sp.a0;
    mvk_prefetch_wait(jobs, sp.j, nch, v < n1 ? sp.a0 + v : sp.b0 + v - n1, sp.b1, K);
    return sp;
}

// mvk_1 on the whole-quad split (mvk_span_whole): for launches whose every job has Q row quads on
// W warps with W < Q < 2 W (matvec.rs mvk_whole_fits; Muse Glimmer's q+k+v+gate). The same bits
// as mvk_1. A kernel of its own, so that mvk_1's machine code stays as it was.
extern "C" __global__ void __launch_bounds__(128, 4) mvk_1_whole(MatvecJobs jobs, MVK_ACT) {
    const MvkSpan2 sp = pdl_wait_prefetch_mvk_whole(jobs, K);
    mvk_job<true>(jobs, sp.j, sp.b0 - (sp.a1 - sp.a0), sp.b1, sp.a0, sp.a1, xq, xds, K, cv, cnt, flags);
}

// The warp's range (t0, t1) as in pdl_wait_prefetch_mvk.
__device__ __forceinline__ int2 pdl_wait_prefetch_mvk_silu(const uint8_t* wg, int tyg, const uint8_t* wu, int tyu,
                                                           int rows, int K) {
    MVK_TRACE(0, 0.0f);
    const int nch = kq_chunks(K);
    int t0, t1;
    mvk_range((unsigned)((rows + 3) / 4) * 2 * nch, &t0, &t1);
    const int t = t0 + (threadIdx.x % WARP >= 16);
    if (t < t1) mvk_prefetch(mvk_silu_task(wg, tyg, wu, tyu, rows, nch, t), K);
    pdl_wait();
    MVK_TRACE(1, 0.0f);
    return make_int2(t0, t1);
}

// Gate and up of one format (tyg == tyu; the host sends other pairs to matvec_silu_1).
extern "C" __global__ void __launch_bounds__(128, 4) mvk_silu_1(SILU_ARGS, MVK_ACT) {
    const int2 range = pdl_wait_prefetch_mvk_silu(wg, tyg, wu, tyu, rows, K);
    const int nch = kq_chunks(K);
    mvk_fmt<true, false>(tyg, [&](int gq, int rem) { return mvk_silu_task_at(wg, tyg, wu, tyu, rows, nch, gq, rem); }, range.x,
                  range.y, 0, 0, nch,
                  xq, xds, K,
                  cv, cnt, y, flags);
}

// After mvk_silu_1 with MVK_DEFER_SHARED: the outputs of the row quads its warps shared (their
// chunk values in cv, [rows][2][nch]) summed in chunk order from 0 (kq_sum_chunks' order, so
// the bits a completing warp would give) and written to y, then y's Q8_K quantization (q8k_warp:
// quantize_q8_k's bits, row-major) for the ffn_down matmul, which then skips its quantizer. A row
// quad was shared when its first and last tasks fell in different warps' ranges of the gate+up
// launch (mvk_range over T tasks and W warps: task t is warp ceil((t + 1) W / T) - 1's). One block
// of 256 threads per 256 rows (rows a multiple of 256), a row per thread, quantized by
// q8k_block256. Replaces the gate+up warps'
// release atomic, acquire fence and chunk loads at the end of their ranges.
extern "C" __global__ void __launch_bounds__(256) silu_finish_q8k(const float* __restrict__ cv, float* __restrict__ y,
                                                                  int rows, int nch, unsigned T, unsigned W,
                                                                  int8_t* __restrict__ q, float2* __restrict__ ds,
                                                                  int8_t* __restrict__ bs) {
    pdl_wait();
    const int blk = blockIdx.x, row = blk * QK_K + threadIdx.x, per = 2 * nch;
    const auto warp_of = [&](unsigned t) {
        return ((t + 1) * W + T - 1) / T - 1u; // below 2^32: the host checks tasks x (warps + 1)
    };
    const unsigned first = (unsigned)(row / 4) * per;
    float v;
    if (warp_of(first) != warp_of(first + per - 1)) {
        const float* cr = cv + (size_t)row * per;
        float g, u;
        kq_sum_chunks<true>(cr, cr + nch, nch, &g, &u);
        v = g / (1.0f + expf(-g)) * u;
        y[row] = v;
    } else {
        v = y[row];
    }
    q8k_block256(v, blk, q, ds, bs, rows);
}
