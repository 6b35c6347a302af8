// Shared by every kernel file (prepended by compile.rs): ggml's block layouts, the 6-bit scale
// unpacking of Q4_K/Q5_K, and warp reductions.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// NVRTC ships no <stdint.h>; a typedef may be repeated with the same type, so these are safe
// where a CUDA header already declared them.
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;

#define QK_K 256
#define QK8_0 32
#define WARP 32
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// Weight formats, as the host's matvec::format_code numbers them.
#define FMT_F32 0
#define FMT_F16 1
#define FMT_BF16 2
#define FMT_Q8_0 3
#define FMT_Q4_K 4
#define FMT_Q5_K 5
#define FMT_Q6_K 6

// Q4_K: 144 bytes; d, dmin (f16), scales[12], qs[128]
struct __align__(2) block_q4_k { __half d; __half dmin; uint8_t scales[12]; uint8_t qs[128]; };
// Q5_K: 176 bytes; d, dmin, scales[12], qh[32], qs[128]
struct __align__(2) block_q5_k { __half d; __half dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
// Q6_K: 210 bytes; ql[128], qh[64], scales[16] (int8), d
struct __align__(2) block_q6_k { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; __half d; };
// Q8_0: 34 bytes; d, qs[32]
struct __align__(2) block_q8_0 { __half d; int8_t qs[32]; };

static_assert(sizeof(block_q4_k) == 144, "q4_k size");
static_assert(sizeof(block_q5_k) == 176, "q5_k size");
static_assert(sizeof(block_q6_k) == 210, "q6_k size");
static_assert(sizeof(block_q8_0) == 34, "q8_0 size");

// Sub-block j's 6-bit scale and min of a Q4_K/Q5_K super-block (SPEC section 8).
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* s, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// The 8 six-bit scales (or mins) of a Q4_K/Q5_K super-block, bytes 0-3 in lo, 4-7 in hi
// (SPEC section 8): y, z, w are scales[0..4], [4..8], [8..12].
__device__ __forceinline__ void unpack_scales_k4(uint32_t y, uint32_t z, uint32_t w, uint32_t* sc_lo,
                                                 uint32_t* sc_hi, uint32_t* m_lo, uint32_t* m_hi) {
    *sc_lo = y & 0x3F3F3F3Fu;
    *m_lo = z & 0x3F3F3F3Fu;
    *sc_hi = (w & 0x0F0F0F0Fu) | ((y >> 2) & 0x30303030u);
    *m_hi = ((w >> 4) & 0x0F0F0F0Fu) | ((z >> 2) & 0x30303030u);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// MUSER_STEP_TRACE (steptrace.rs, a measuring build): block 0 of each kernel notes the global
// timer at its start and when its wait returns, at g_step_trace (set by the host in each module):
// [count, then (start, release) per record].
#ifdef MUSER_STEP_TRACE
__device__ unsigned long long* g_step_trace = nullptr;
#define STEP_TRACE_CAP 8192
#endif

// Programmatic dependent launch (Hopper and newer). In a recorded decode step a kernel may be
// launched as the programmatic dependent of the one before it (`graph.rs`): its blocks can be
// scheduled while the previous kernel is still running, and pdl_wait() holds them until that
// kernel has completed and its writes are visible. A kernel that calls it does so first, in
// every block, before reading anything and before any early return (a grid that finished
// without waiting would let the kernel after it run before the one before it ended; the decode
// attention, pdl_wait_attn_rows_mma, says why its reads before the wait are safe); the trigger
// lets the next kernel's blocks be scheduled as soon as this kernel's have all started. Both
// are no-ops when the launch is not programmatic, and compile to nothing before sm_90.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#ifdef MUSER_STEP_TRACE
    unsigned long long* tr = g_step_trace;
    const bool rec = tr != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0 &&
                     threadIdx.y == 0 && threadIdx.z == 0;
    unsigned long long t0 = 0, t1 = 0;
    if (rec) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
#endif
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#ifdef MUSER_STEP_TRACE
    if (rec) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
        const unsigned long long i = atomicAdd(tr, 1ull);
        if (i < STEP_TRACE_CAP) {
            tr[1 + 2 * i] = t0;
            tr[2 + 2 * i] = t1;
        }
    }
#endif
#endif
}

// RoPE of pair i of a head h (n_rot rotated values) at position p: theta = p * base^(-2i / n_rot),
// computed in double as the CPU reference does (positions reach 65536, where an f32 angle would
// be off by ~0.004 rad). Pairs are (2i, 2i + 1) (GPT-J interleaved) or (i, i + n_rot / 2) (NeoX).
// rope_cs: the pair's cosine and sine (they depend on the position only, so a kernel may compute
// them before waiting for the kernel before it); rope_rot: the rotation.
__device__ __forceinline__ void rope_cs(int i, int n_rot, int p, float freq_base, float* cf, float* sf) {
    const double theta = (double)p * pow((double)freq_base, -2.0 * (double)i / (double)n_rot);
    double s, c;
    sincos(theta, &s, &c);
    *cf = (float)c;
    *sf = (float)s;
}
// The rotation's roundings are spelled out (the multiply-adds NVRTC 13.0 chose for rope.cu): left
// to the compiler, a caller's context could change which product it fuses, and qkv_rows' register
// and memory paths differed in the last bit on NeoX pairs (lab run 82).
__device__ __forceinline__ void rope_vals(float x0, float x1, float cf, float sf, float* y0, float* y1) {
    *y0 = __fmaf_rn(x0, cf, -__fmul_rn(x1, sf));
    *y1 = __fmaf_rn(x0, sf, __fmul_rn(x1, cf));
}
__device__ __forceinline__ void rope_rot(float* h, int i, int n_rot, int neox, float cf, float sf) {
    const int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
    rope_vals(h[a], h[b], cf, sf, &h[a], &h[b]);
}
__device__ __forceinline__ void rope_pair(float* h, int i, int n_rot, int p, float freq_base, int neox) {
    float cf, sf;
    rope_cs(i, n_rot, p, freq_base, &cf, &sf);
    rope_rot(h, i, n_rot, neox, cf, sf);
}

// A split's completion count without the sequentially consistent fences of __threadfence:
// atom_add_release adds v to *p at GPU scope after the writes before it (the caller's, and through
// a barrier its warp's or block's) and returns the old value; the thread that finds the count
// complete calls fence_acquire before reading the others' writes (then a barrier for its warp's
// or block's other threads).
__device__ __forceinline__ unsigned atom_add_release(unsigned* p, unsigned v) {
    unsigned old;
    asm volatile("atom.release.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
__device__ __forceinline__ void fence_acquire() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// A weight load of a decode matvec (mvk in matvec.cu, mmk.cu): read once per launch, so marked
// evict-first in L1 and L2 (ld.global.cs), which leaves L2 to what is read again (activations,
// split chunk values) and to the next kernel's weights asked for before its wait. H200,
// llama-glimmer (2026-11-30, one call, plain / evict-first alternately): tg64 157.51 / 158.21 ->
// 164.08 / 164.38 tokens/s, 8 streams 772.24 / 788.19 -> 806.65 / 809.54; gate+up at 8 streams
// read 179.8 MB from DRAM for its 149.5 MB of weights, 152.0 evict-first. The prefill tiles
// (mmt.cu) keep plain copies: their column tiles read the same weights again from L2.
template <class T>
__device__ __forceinline__ T ld_once(const uint8_t* p) {
    return __ldcs((const T*)p);
}

// Asks L2 for the 128-byte line holding p (weights a kernel will read soon).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Little-endian 32-bit load from a 2-byte-aligned address.
__device__ __forceinline__ int load_i32_a2(const uint8_t* p) {
    const uint16_t* h = (const uint16_t*)p;
    return (int)((uint32_t)h[0] | ((uint32_t)h[1] << 16));
}

// ---------------------------------------------------------------------------------------------
// The canonical K-quant dot product (batch invariance). Every kernel that multiplies a Q4_K,
// Q5_K or Q6_K matrix by a Q8_K-quantized activation (matvec_1 and matvec_cols in matvec.cu, the
// tensor-core tiles of mmk.cu) gives output (row r, column c) the bits of this definition,
// whatever the number of columns and however it splits the work:
//   y = 0; for each chunk of KQ_CHUNK = 4 consecutive super-blocks b0 .. b0 + 3 (the last chunk
//   may be shorter), in increasing order: y = y + c, c = (v_b0 + v_b0+1) + (v_b0+2 + v_b0+3)
//   (f32 adds; a missing super-block drops out of the tree: (v + -) = v),
// so a kernel may split K over warps by chunks, and a warp may add a round's super-blocks with
// a butterfly (a + b and b + a have the same bits); super-block b's value v_b is computed from
// exact integers:
//   Q4_K/Q5_K: isc = sum_s sc_s * (sum_{k in s} q_k x_k), im = sum_s m_s * (sum_{k in s} x_k)
//              over the 8 sub-blocks s of 32 values; v_b = dx * (d * isc - dmin * im)
//   Q6_K:      isc = sum_s sc_s * (sum_{k in s} (q_k - 32) x_k) over the 16 sub-blocks of 16;
//              v_b = dx * (d * isc)
// (q the quants, sc / m the sub-block scales / mins, d / dmin the super-block's factors, x the
// int8 activation and dx its scale for these 256 values). The integer sums are exact in any
// order (|isc| < 2^28, |im| < 2^21), so a kernel may split them over lanes, dp4a or MMA tiles
// as it likes; the float steps are written with intrinsics so that no FMA contraction can
// change them from one kernel to another.
__device__ __forceinline__ float kq_value_q45(float d, float dmin, int isc, int im, float dx) {
    return __fmul_rn(dx, __fmaf_rn(d, __int2float_rn(isc), -__fmul_rn(dmin, __int2float_rn(im))));
}
// The same with im already a float (exact: |im| < 2^24, so it equals __int2float_rn(im)).
__device__ __forceinline__ float kq_value_q45f(float d, float dmin, int isc, float im, float dx) {
    return __fmul_rn(dx, __fmaf_rn(d, __int2float_rn(isc), -__fmul_rn(dmin, im)));
}
__device__ __forceinline__ float kq_value_q6(float d, int isc, float dx) {
    return __fmul_rn(dx, __fmul_rn(d, __int2float_rn(isc)));
}
__device__ __forceinline__ float kq_add(float y, float v) { return __fadd_rn(y, v); }
#define KQ_CHUNK 4

// The resident layout of K-quant matrices (Q4_K, Q5_K, Q6_K; matvec.rs `repack`): the rows in
// quads, and in each quad the 4 rows' super-block b side by side, so block b of row r is block
// number kq_blk(r, nb, b) and a chunk of KQ_CHUNK super-blocks of a row quad (the one-column
// kernels' task) is one contiguous run of bytes. A row's blocks follow each other 4 blocks apart.
// The rows are padded with zero blocks to a multiple of 4 (kq_rows); Q6_K's planes (matvec.cu)
// hold kq_rows(rows) x nb blocks each, in this order.
__device__ __forceinline__ size_t kq_blk(int row, int nb, int b) { return ((size_t)(row >> 2) * nb + b) * 4 + (row & 3); }
__device__ __forceinline__ size_t kq_rows(long long rows) { return (size_t)((rows + 3) & ~3LL); }

// Up to four matrices sharing one input (Q/K/V/gate); rows of job j are global rows
// start[j] .. start[j + 1] of the launch (each job's rows padded to the kernel's row block, so
// a warp's or block's rows never straddle two matrices). y[j] is [ncols][rows[j]].
// Kernels read job j's fields through the *_of accessors: they select among the constant
// indices, where an index computed at run time into the parameter (jobs.w_of(j)) made the compiler
// copy the whole struct to local memory first (120 bytes of stack in every kernel taking it).
struct MatvecJobs {
    const uint8_t* w[4];
    float* y[4];
    int rows[4];
    int ty[4];
    int start[5];
    int njobs;

    template <typename T, int N>
    static __device__ __forceinline__ T pick(const T (&a)[N], int j) {
        T v = a[0];
#pragma unroll
        for (int u = 1; u < N; ++u)
            if (j == u) v = a[u];
        return v;
    }
    __device__ __forceinline__ const uint8_t* w_of(int j) const { return pick(w, j); }
    __device__ __forceinline__ float* y_of(int j) const { return pick(y, j); }
    __device__ __forceinline__ int rows_of(int j) const { return pick(rows, j); }
    __device__ __forceinline__ int ty_of(int j) const { return pick(ty, j); }
    __device__ __forceinline__ int start_of(int j) const { return pick(start, j); }
};

// How the one-column kernels (mvk_1 in matvec.cu) and the 6-16-column decode-group kernels
// (mmv_* in mmk.cu) divide a launch among its warps: its work is a list of tasks (a block of
// `unit` rows, a chunk of KQ_CHUNK super-blocks), task (row block, chunk) = row block x chunks +
// chunk, cut into one contiguous range per warp of a grid that fills the GPU once.

// The chunks of a row K values wide (the last may hold fewer than KQ_CHUNK super-blocks).
__device__ __forceinline__ int kq_chunks(int K) { return (K / QK_K + KQ_CHUNK - 1) / KQ_CHUNK; }

// The warp's range of the launch's T tasks: [t0, t1), W = all warps of the grid (32-bit, as
// mvk_span).
__device__ __forceinline__ void mvk_range(unsigned T, int* t0, int* t1) {
    const unsigned W = gridDim.x * (blockDim.x / WARP), w = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    *t0 = (int)(T * w / W);
    *t1 = (int)(T * (w + 1) / W);
}

// The warp's job and tasks: each job gets a share of the grid's W warps in proportion to its
// tasks, and at least one (warp w takes job j when w >= j + (W - njobs) * T_<j / T, T_<j the
// tasks before job j), so a warp's tasks share one format (one loop serving every format would
// need the registers of all of them at once and spill). The jobs' starts are multiples of unit.
struct MvkSpan {
    int j, t0, t1;
};

// In 32-bit arithmetic: the host checks that tasks x warps < 2^32 (64-bit divisions, emulated,
// cost each warp ~1 us at the start of a ~10 us launch).
// The job's share of warp w: job j, its warps [wa, wb) and tasks [ta, tb) (mvk_span).
struct MvkShare {
    unsigned j, wa, wb, ta, tb, w;
};
__device__ __forceinline__ MvkShare mvk_share(const MatvecJobs& jobs, int nch, int unit) {
    const unsigned W = gridDim.x * (blockDim.x / WARP), T = (unsigned)(jobs.start_of(jobs.njobs) / unit) * nch;
    const unsigned w = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, F = W - jobs.njobs;
    unsigned ws[5], ts[5];
#pragma unroll
    for (int u = 0; u < 5; ++u) {
        ts[u] = u <= jobs.njobs ? (unsigned)(jobs.start_of(u) / unit) * nch : T;
        ws[u] = u < jobs.njobs ? u + F * ts[u] / T : W;
    }
    MvkShare s{0, ws[0], ws[1], ts[0], ts[1], w};
#pragma unroll
    for (int u = 1; u < 4; ++u)
        if (u < jobs.njobs && w >= ws[u]) s.j = u;
#pragma unroll
    for (int u = 1; u < 4; ++u)
        if (s.j == u) {
            s.wa = ws[u];
            s.wb = ws[u + 1];
            s.ta = ts[u];
            s.tb = ts[u + 1];
        }
    return s;
}

__device__ __forceinline__ MvkSpan mvk_span(const MatvecJobs& jobs, int nch, int unit) {
    const MvkShare s = mvk_share(jobs, nch, unit);
    MvkSpan sp;
    sp.j = (int)s.j;
    sp.t0 = (int)(s.ta + (s.tb - s.ta) * (s.w - s.wa) / (s.wb - s.wa));
    sp.t1 = (int)(s.ta + (s.tb - s.ta) * (s.w + 1 - s.wa) / (s.wb - s.wa));
    return sp;
}

// mvk_1_spread's span: a one-job launch of Q row quads on a full grid of W > Q warps, one quad per
// warp (quad floor(w Q / W) goes to the last warp w that maps to it), so that the active warps
// spread evenly over the blocks, and so over the SMs (3 or 4 a block for Q >= 3 W / 4), where
// packing Q warps into Q / 4 blocks runs 16 on some SMs and 12 on the others.
__device__ __forceinline__ MvkSpan mvk_span_spread(const MatvecJobs& jobs, int nch) {
    const unsigned W = gridDim.x * (blockDim.x / WARP), w = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const unsigned Q = (unsigned)(jobs.start_of(1) / 4), q = w * Q / W;
    MvkSpan sp{0, 0, 0};
    if ((w + 1) * Q / W != q) {
        sp.t0 = (int)q * nch;
        sp.t1 = sp.t0 + nch;
    }
    return sp;
}

// The whole-quad split of mvk_1_whole (matvec.cu), for launches whose every job has Q row quads on
// W warps with W < Q < 2 W (matvec.rs mvk_whole_fits; Muse Glimmer's q+k+v+gate: 2,176 quads on
// 2,112 warps): each warp takes one whole quad, which no other warp touches, after its share of
// the L = Q - W quads left over. The L quads' tasks, the job's first, are split evenly over the W
// warps (each share at most one quad) and taken first, so the completions of the quads shared
// this way (matvec.cu mvk_warp) happen in the warps' first rounds instead of at the launch's end,
// and the other quads need none. A warp's tasks: [a0, a1), then [b0, b1).
struct MvkSpan2 {
    int j, a0, a1, b0, b1;
};
__device__ __forceinline__ MvkSpan2 mvk_span_whole(const MatvecJobs& jobs, int nch) {
    const MvkShare s = mvk_share(jobs, nch, 4);
    const unsigned nw = s.wb - s.wa, i = s.w - s.wa, nq = (s.tb - s.ta) / (unsigned)nch;
    const unsigned lt = (nq - nw) * (unsigned)nch;
    MvkSpan2 sp;
    sp.j = (int)s.j;
    sp.a0 = (int)(s.ta + lt * i / nw);
    sp.a1 = (int)(s.ta + lt * (i + 1) / nw);
    sp.b0 = (int)(s.ta + lt + i * (unsigned)nch);
    sp.b1 = sp.b0 + nch;
    return sp;
}

// Q8_K quantization of 256-block blk (of rows K wide) held by one warp, lane l with values
// 8l .. 8l + 7 in f (quantize_q8_k in matvec.cu, and residual_norm in norm.cu, which quantizes
// its output for the matmul after it): the bits of the CPU reference's quantizer (see
// quantize_q8_k). Writes q (int8; kmajor: the k-major layout of xq16), ds (d, sum) per 32
// values and bs (the 8 sums split as lo + 64 hi).
// The activation regions of mmt.cu's mmw_* kernels (decode groups of 9 columns or more): per
// tile of 8 nt columns (nt = 2 to 4) and super-block, one region of mmw_xb(nt) bytes: the 8 nt
// columns' 256 int8 values, column c's 16-byte piece p at piece p ^ mmw_swz(c) (so the
// fragment loads are free of bank conflicts), then the columns' Q8_K scales (f32) and split
// sums (bs's 16 values as halves, in the order of an f16 mma.m16n8k16 B fragment: lane t's 8
// bytes at 8t hold lo 2t, lo 2t + 1, hi 2t, hi 2t + 1; mmw_bs_at). Regions [tile][super-block].
// mmw_pack lays a row-major activation out so; the Q8_K producers (q8k_warp with xblob) write it
// as they quantize.
__host__ __device__ constexpr int mmw_xb(int nt) { return 8 * nt * (256 + 4 + 32); }
// The half index (0..15) of split sum j (0..7) of a column's lo (hi false) or hi.
__host__ __device__ __forceinline__ int mmw_bs_at(int j, bool hi) { return 4 * (j >> 1) + 2 * hi + (j & 1); }
__host__ __device__ __forceinline__ int mmw_swz(int c) { return 2 * (c & 3) + ((c >> 2) & 1); }

__device__ __forceinline__ void q8k_warp(const float (&f)[8], int blk, int lane, int8_t* __restrict__ q,
                                         float2* __restrict__ ds, int8_t* __restrict__ bs, int K, int kmajor,
                                         uint8_t* __restrict__ xblob = nullptr, int nt = 0) {
    float amax = 0.0f, max = 0.0f;
    int at = 0x7FFFFFFF;
#pragma unroll
    for (int i = 0; i < 8; ++i)
        if (fabsf(f[i]) > amax) { amax = fabsf(f[i]); max = f[i]; at = 8 * lane + i; }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float oa = __shfl_xor_sync(0xffffffffu, amax, o), om = __shfl_xor_sync(0xffffffffu, max, o);
        const int oi = __shfl_xor_sync(0xffffffffu, at, o);
        if (oa > amax || (oa == amax && oi < at)) { amax = oa; max = om; at = oi; }
    }
    const float iscale = amax == 0.0f ? 0.0f : -127.0f / max;
    const float d = amax == 0.0f ? 0.0f : 1.0f / iscale;
    int qi[8], sum = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        qi[i] = min(127, __float2int_rn(iscale * f[i]));
        sum += qi[i];
    }
    int2 packed;
    packed.x = (qi[0] & 0xFF) | ((qi[1] & 0xFF) << 8) | ((qi[2] & 0xFF) << 16) | ((qi[3] & 0xFF) << 24);
    packed.y = (qi[4] & 0xFF) | ((qi[5] & 0xFF) << 8) | ((qi[6] & 0xFF) << 16) | ((qi[7] & 0xFF) << 24);
    size_t dst = (size_t)blk * 256 + 8 * lane;
    if (kmajor) {
        // Value v of column c goes to chunk ((v / 16) % 4, v / 64) of the column (see xq16).
        const int per = K / QK_K, c = blk / per, v = (blk % per) * QK_K + 8 * lane;
        dst = (size_t)c * K + ((size_t)((v >> 4) & 3) * (K >> 6) + (v >> 6)) * 16 + (v & 15);
    }
    *(int2*)(q + dst) = packed;
    // The same block in mmw's layout too (row-major blocks: column blk / nb, super-block blk % nb).
    uint8_t* r = nullptr;
    int bn = 0, cc = 0;
    if (xblob) {
        const int nb = K / QK_K, c = blk / nb, b = blk % nb;
        bn = 8 * nt;
        cc = c % bn;
        r = xblob + ((size_t)(c / bn) * nb + b) * mmw_xb(nt);
        *(int2*)(r + cc * 256 + (((lane >> 1) ^ mmw_swz(cc)) << 4) + 8 * (lane & 1)) = packed;
        if (lane == 0) *(float*)(r + bn * 256 + 4 * cc) = d;
    }
    // Lanes 4j .. 4j + 3 hold the 32-block j.
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if ((lane & 3) == 0) {
        ds[(size_t)blk * 8 + lane / 4] = make_float2(d, (float)sum);
        // The sum split as lo + 64 hi (lo 0..63, hi -64..63), both int8, for the mins MMA of mmk.cu.
        bs[(size_t)blk * 16 + lane / 4] = (int8_t)(sum & 63);
        bs[(size_t)blk * 16 + 8 + lane / 4] = (int8_t)(sum >> 6);
        if (r) {
            __half* hs = (__half*)(r + bn * 260 + 32 * cc);
            hs[mmw_bs_at(lane / 4, false)] = __int2half_rn(sum & 63);
            hs[mmw_bs_at(lane / 4, true)] = __int2half_rn(sum >> 6);
        }
    }
}

// A block of 256 threads holding one value each (thread t value t of Q8_K block blk): the values
// through shared memory to the first warp, 8 consecutive per lane, and quantized by q8k_warp
// (row-major). Every thread of the block calls it (a barrier inside).
__device__ __forceinline__ void q8k_block256(float v, int blk, int8_t* __restrict__ q, float2* __restrict__ ds,
                                             int8_t* __restrict__ bs, int K, uint8_t* __restrict__ xblob = nullptr,
                                             int nt = 0) {
    __shared__ __align__(16) float so[QK_K];
    so[threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x < WARP) {
        const float4 a = *(const float4*)(so + 8 * threadIdx.x), b = *(const float4*)(so + 8 * threadIdx.x + 4);
        const float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        q8k_warp(f, blk, threadIdx.x, q, ds, bs, K, 0, xblob, nt);
    }
}
