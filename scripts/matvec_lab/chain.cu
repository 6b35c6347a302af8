// Does a persistent decode step pay (issue 5)? The matvec chain of 52 Glimmer-shaped layers
// (Q4_K: q+k+v 4608 x 6656, attn_output 6656 x 4096, gate+up+SiLU 2 x 19968 x 6656, ffn_down
// 6656 x 19968; 257 MB a layer, 8 distinct layers cycled so that L2 serves none of it), with or
// without a one-block "small op" after each matvec (an RMS norm of 6656 values, standing in for
// the norms, qkv_rows and the attention), run over the same device code (mvk_warp of
// crates/muser-cuda/kernels/matvec.cu, or a copy of its round, lab_round; the same warp ranges,
// so the same bits, checked against A at the end of every variant):
//   A: as the engine does: one launch per matvec and per small op, programmatic dependent launches
//      in one CUDA graph (the matvecs ask L2 for their first round before their wait); also each
//      op type alone, 52 chained launches of it;
//   B: one cooperative launch for the whole chain, 4 blocks of 4 warps per SM, a grid-wide
//      counter between ops (mode bits: arrivals per warp or per block, one or eight counters,
//      pollers sleeping or spinning, the op's warps spread over the SMs by %smid), the small op
//      run by block 0 while the other blocks wait on its flag; before waiting, a warp does
//      nothing (B0), asks L2 for its next range's first round (B1), or loads that round's
//      weights into registers (B2, chain_persist<true>); a timeline of each op's end;
//   DF: the same launch without barriers: each round waits (per-warp bitmask, acquire polls)
//      until the previous op's rows that make its input chunk are written (a release count per
//      1024 rows), so an op starts while the one before it ends.
// Results (H200, 2026-12-02, six runs; BENCHMARKS.md has the tables): us per layer, bytes at the
// read bandwidth 56-57; A without small ops 80.2-80.9, with 117.8-118.8; B without small ops
// 86.2-90.8 whatever the barrier (B2 96-99), with 125-128; DF 111-117. No persistent or
// dataflow variant beat the launches.
// Prints ms per 52 layers, GB/s and % of the read bandwidth measured in the same run, and
// whether every variant's outputs equal A's bit for bit. Weights are random bytes (timing only).
// Build and run on the device: bash scripts/matvec_lab/run_chain.sh (~25 s)
#ifndef __CUDACC_RTC__
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#endif

#include "../../crates/muser-cuda/kernels/common.cuh"
#include "../../crates/muser-cuda/kernels/matvec.cu"

#ifndef __CUDACC_RTC__
#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)
#endif

#define KF_MAX 19968

struct Op {
    const uint8_t* w;  // weights (gate for SiLU)
    const uint8_t* wu; // up (SiLU)
    float* y;
    float* small_out;  // the small op's output (its input is y)
    int rows, K, silu, W; // W: the warps that share the op's tasks (the launch's in A)
};

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void red_release(unsigned* p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// The small op: out = in / rms(in), one block of 128 threads (two passes over n values).
__device__ __forceinline__ void small_body(const float* __restrict__ in, float* __restrict__ out, int n) {
    __shared__ float red[4];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += 128) {
        const float v = __ldcg(in + i);
        ss = fmaf(v, v, ss);
    }
    ss = warp_sum(ss);
    if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = ss;
    __syncthreads();
    const float s = rsqrtf((red[0] + red[1] + red[2] + red[3]) / n + 1e-6f);
    for (int i = threadIdx.x; i < n; i += 128) out[i] = __ldcg(in + i) * s;
    __syncthreads();
}

__global__ void __launch_bounds__(128) small_k(const float* in, float* out, int n) {
    pdl_wait();
    small_body(in, out, n);
}

__device__ __forceinline__ void op_range(const Op& op, int gw, int* t0, int* t1, int* nch) {
    *nch = kq_chunks(op.K);
    const unsigned T = (unsigned)((op.rows + 3) / 4) * (op.silu ? 2 : 1) * *nch;
    if (gw >= op.W) {
        *t0 = *t1 = 0;
        return;
    }
    *t0 = (int)(T * (unsigned)gw / (unsigned)op.W);
    *t1 = (int)(T * (unsigned)(gw + 1) / (unsigned)op.W);
}

__device__ __forceinline__ MvkTask op_task(const Op& op, int nch, int gq, int ch) {
    return op.silu ? mvk_silu_task_at(op.w, FMT_Q4_K, op.wu, FMT_Q4_K, op.rows, nch, gq, ch)
                   : mvk_job_task_at(op.w, op.y, FMT_Q4_K, op.rows, 0, gq, ch);
}

// Dataflow (mode & 128): the chunks of an op's input that are ready, as counts of the producing
// op's row quads written (rp: one counter per 1024 rows, pq the producer's row quads), and the
// counters this op bumps as its row quads are written (rc).
#ifndef DF_SLEEP
#define DF_SLEEP 100
#endif
// Counters of one op: 32 (one per 1024 rows), each on its own 128-byte line.
struct Df {
    const unsigned* rp;
    int pq;
    unsigned* rc;
    unsigned known; // chunks seen complete
};

__device__ __forceinline__ void df_wait(Df& df, int ch, bool need) {
    const int lane = threadIdx.x % WARP;
    const unsigned bit = need && df.rp ? 1u << ch : 0u;
    const unsigned want = __reduce_or_sync(0xffffffffu, bit) & ~df.known;
    if (!want) return;
    if (lane < 32 && (want >> lane) & 1u) {
        const unsigned full = (unsigned)min(256, df.pq - 256 * lane);
        while (ld_acquire(df.rp + 32 * lane) < full) __nanosleep(DF_SLEEP);
    }
    __syncwarp();
    df.known |= want;
}

// One round of mvk_warp (two tasks, lanes 0-15 and 16-31) of a Q4_K range, its weights loaded
// here or, PRE, given (pre). A copy of mvk_warp's loop body for the lab's B2 (the first round
// loaded before the wait), the same arithmetic in the same order.
template <bool SILU, bool PRE, bool DF = false, typename TaskFn>
__device__ __forceinline__ void lab_round(TaskFn task, int tb, int t0, int t1, int nch, int per, int& ga, int& ra,
                                          float& ya, float& yb, const int8_t* __restrict__ xq,
                                          const float2* __restrict__ xds, int K, float* __restrict__ cv,
                                          unsigned* __restrict__ cnt, float* __restrict__ ysilu,
                                          const RawQ45 (&pre)[4], Df* df = nullptr) {
    const int lane = threadIdx.x % WARP, j = lane >> 2, q = lane & 3, s4 = j & 3, hf = j >> 2;
    const int nb = K / QK_K;
    const int gb = ga + (ra + 1 == per), rb = ra + 1 == per ? 0 : ra + 1;
    const bool tv = tb + hf < t1;
    const MvkTask k = hf && tv ? task(gb, rb) : task(ga, ra);
    const int sb = KQ_CHUNK * k.ch + s4;
    const bool ok = tv && sb < nb;
    int isc[4] = {0, 0, 0, 0}, im[4] = {0, 0, 0, 0};
    float2 dm[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) dm[r] = make_float2(0.0f, 0.0f);
    float dx = 0.0f;
    if constexpr (DF) df_wait(*df, k.ch, ok);
    if (ok) {
        dx = xds[(size_t)sb * 8].x;
        const Act a{xq, xds, nullptr, K, 1, 0};
        const int item = sb * 4 + q;
        RawQ45 raw[4];
        if constexpr (PRE) {
#pragma unroll
            for (int r = 0; r < 4; ++r) raw[r] = pre[r];
        } else {
            const uint8_t* blk0 = k.w + kq_blk(k.row0, nb, sb) * 144;
#pragma unroll
            for (int r = 0; r < 4; ++r) raw[r] = load_q45<false>(blk0 + r * 144, q);
        }
        const X64 x = load_x64<1>(a, 0, sb * QK_K + 64 * q);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const Q45 u = unpack_q45<false>(raw[r], item);
            q45_ints(u, x, &isc[r], &im[r]);
            dm[r] = u.dm;
        }
    }
    const int s = quad_scatter(isc, q);
    const float2 dq = q == 0 ? dm[0] : q == 1 ? dm[1] : q == 2 ? dm[2] : dm[3];
    float v = kq_value_q45(dq.x, dq.y, s, quad_scatter(im, q), dx);
    const int nsb = nb - KQ_CHUNK * k.ch;
    float o = __shfl_xor_sync(0xffffffffu, v, 4);
    if ((s4 ^ 1) < nsb) v = kq_add(v, o);
    o = __shfl_xor_sync(0xffffffffu, v, 8);
    if (((s4 ^ 2) & ~1) < nsb) v = kq_add(v, o);
    const float cva = __shfl_sync(0xffffffffu, v, q), cvb = __shfl_sync(0xffffffffu, v, 16 + q);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int tt = tb + h;
        if (tt >= t1) break;
        const MvkTask kt = h ? task(gb, rb) : task(ga, ra);
        const float c = h ? cvb : cva;
        const int first = kt.gq * per, idx = kt.m * nch + kt.ch;
        const bool wr = lane < kt.nr;
        if (first >= t0 && first + per <= t1) {
            if (SILU && kt.m) yb = kq_add(kt.ch == 0 ? 0.0f : yb, c);
            else ya = kq_add(kt.ch == 0 ? 0.0f : ya, c);
            if (idx == per - 1 && wr) {
                if (SILU) ysilu[kt.row0 + lane] = ya / (1.0f + expf(-ya)) * yb;
                else kt.y[kt.row0 + lane] = ya;
            }
            if (DF && idx == per - 1) {
                __syncwarp();
                if (lane == 0) red_release(df->rc + 32 * (kt.gq >> 8), 1u);
            }
            continue;
        }
        const size_t row = (size_t)4 * kt.gq + lane;
        if (wr) cv[row * per + idx] = c;
        if (idx == per - 1 || tt == t1 - 1) {
            const int n = min(first + per, t1) - max(first, t0);
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
            if (last && lane == 0) cnt[kt.gq] = 0u;
            if (DF && last) {
                __syncwarp();
                if (lane == 0) red_release(df->rc + 32 * (kt.gq >> 8), 1u);
            }
        }
    }
    ga = gb + (rb + 1 == per);
    ra = rb + 1 == per ? 0 : rb + 1;
}

// The first round's weights of the warp's range (lab_round's `pre`): the loads mvk_ints makes.
template <typename TaskFn>
__device__ __forceinline__ void lab_first_loads(TaskFn task, int t0, int t1, int per, int K, RawQ45 (&pre)[4]) {
    const int lane = threadIdx.x % WARP, j = lane >> 2, q = lane & 3, s4 = j & 3, hf = j >> 2;
    const int nb = K / QK_K;
    const int ga = t0 / per, ra = t0 - ga * per;
    const int gb = ga + (ra + 1 == per), rb = ra + 1 == per ? 0 : ra + 1;
    const bool tv = t0 + hf < t1;
    const MvkTask k = hf && tv ? task(gb, rb) : task(ga, ra);
    const int sb = KQ_CHUNK * k.ch + s4;
    if (tv && sb < nb) {
        const uint8_t* blk0 = k.w + kq_blk(k.row0, nb, sb) * 144;
#pragma unroll
        for (int r = 0; r < 4; ++r) pre[r] = load_q45<false>(blk0 + r * 144, q);
    }
}

// mvk_warp over [t0, t1) of a Q4_K op with the first round's weights given (lab_first_loads).
template <bool SILU, typename TaskFn>
__device__ __forceinline__ void lab_warp(TaskFn task, int t0, int t1, int nch, const int8_t* __restrict__ xq,
                                         const float2* __restrict__ xds, int K, float* __restrict__ cv,
                                         unsigned* __restrict__ cnt, float* __restrict__ ysilu, const RawQ45 (&pre)[4]) {
    const int per = (SILU ? 2 : 1) * nch;
    float ya = 0.0f, yb = 0.0f;
    int ga = t0 / per, ra = t0 - ga * per;
    lab_round<SILU, true>(task, t0, t0, t1, nch, per, ga, ra, ya, yb, xq, xds, K, cv, cnt, ysilu, pre);
#pragma unroll 1
    for (int tb = t0 + 2; tb < t1; tb += 2)
        lab_round<SILU, false>(task, tb, t0, t1, nch, per, ga, ra, ya, yb, xq, xds, K, cv, cnt, ysilu, pre);
}

// mvk_warp over [t0, t1) of a Q4_K op, each round's input chunk waited for (dataflow).
template <bool SILU, typename TaskFn>
__device__ __forceinline__ void lab_warp_df(TaskFn task, int t0, int t1, int nch, const int8_t* __restrict__ xq,
                                            const float2* __restrict__ xds, int K, float* __restrict__ cv,
                                            unsigned* __restrict__ cnt, float* __restrict__ ysilu, Df& df) {
    const int per = (SILU ? 2 : 1) * nch;
    float ya = 0.0f, yb = 0.0f;
    int ga = t0 / per, ra = t0 - ga * per;
    RawQ45 none[4];
#pragma unroll 1
    for (int tb = t0; tb < t1; tb += 2)
        lab_round<SILU, false, true>(task, tb, t0, t1, nch, per, ga, ra, ya, yb, xq, xds, K, cv, cnt, ysilu, none, &df);
}

// Mode bits: 1 = ask L2 for the next range's first round before the wait (B1), 2 = load it into
// registers (B2), 4 = small ops; the grid barrier: 8 = one arrival per block (else per warp),
// 16 = eight arrival counters (else one), 32 = pollers spin without sleeping; 128 = no barrier:
// dataflow (DF kernel), each round waits for its input chunk's rows of the op before.
// tl (if not null): when each op's last warp arrived, as block 0 saw it (%globaltimer, ns).
template <bool REGS, bool DF = false>
__global__ void __launch_bounds__(128, 4) chain_persist(const Op* __restrict__ ops, int nops, const int8_t* xq,
                                                        const float2* xds, float* cv, unsigned* cnt, unsigned* bar,
                                                        int mode, unsigned long long* tl) {
    // mode & 64: the block's place in the ops' warp order is (its slot on its SM) x SMs + SM, so an
    // op that uses fewer warps than the grid has spreads them over every SM (a launch of that many
    // blocks is spread so by the block scheduler); else blockIdx.x.
    __shared__ int vblock;
    if (threadIdx.x == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        vblock = (mode & 64) ? (int)(atomicAdd(&bar[512 + sm], 1u) * (gridDim.x / 4) + sm) : blockIdx.x;
    }
    __syncthreads();
    const int gw = vblock * 4 + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    // The arrival counters: one (bar[0]) or, mode & 16, eight (bar[32 c], blocks c mod 8).
    const int nctr = (mode & 16) ? 8 : 1, ctr = (mode & 16) ? 32 * (blockIdx.x & 7) : 0;
    const unsigned inc = gridDim.x / nctr * ((mode & 8) ? 1 : 4); // arrivals per counter and op
    const auto wait_all = [&](unsigned target, unsigned small_target) {
        __syncthreads();
        if (threadIdx.x < nctr)
            while (ld_acquire(&bar[32 * threadIdx.x]) < target)
                if (!(mode & 32)) __nanosleep(20);
        if (threadIdx.x == 0 && small_target)
            while (ld_acquire(&bar[256]) < small_target)
                if (!(mode & 32)) __nanosleep(20);
        if (tl && blockIdx.x == 0 && threadIdx.x == 0) {
            unsigned long long t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
            tl[target / inc] = t;
        }
        __syncthreads();
    };
    if (tl && blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
        tl[0] = t;
    }
    unsigned arrived = 0, smalls = 0;
    for (int o = 0; o < nops; ++o) {
        const Op op = ops[o];
        int t0, t1, nch;
        op_range(op, gw, &t0, &t1, &nch);
        const int per = (op.silu ? 2 : 1) * nch;
        const auto task = [&](int gq, int ch) { return op_task(op, nch, gq, ch); };
        if ((mode & 1) && t0 + (lane >= 16) < t1) mvk_prefetch(task((t0 + (lane >= 16)) / per, (t0 + (lane >= 16)) % per), op.K);
        RawQ45 pre[4];
        if (REGS && t0 < t1) lab_first_loads(task, t0, t1, per, op.K, pre);
        if constexpr (DF) {
            const int pq = o > 0 ? (ops[o - 1].rows + 3) / 4 : 0;
            Df df{o > 0 ? bar + 1024 + 1024 * (o - 1) : nullptr, pq, bar + 1024 + 1024 * o, 0u};
            float* cvo = cv + (o & 1) * (size_t)KF_MAX * 16;
            unsigned* cnto = cnt + (o & 1) * (KF_MAX / 4);
            if (t0 < t1) {
                if (op.silu) lab_warp_df<true>(task, t0, t1, nch, xq, xds, op.K, cvo, cnto, op.y, df);
                else lab_warp_df<false>(task, t0, t1, nch, xq, xds, op.K, cvo, cnto, nullptr, df);
            }
            continue;
        }
        if (o > 0) wait_all(arrived, (mode & 4) ? smalls : 0u); // the previous op (and its small op) done
        if (t0 < t1) {
            if constexpr (REGS) {
                if (op.silu) lab_warp<true>(task, t0, t1, nch, xq, xds, op.K, cv, cnt, op.y, pre);
                else lab_warp<false>(task, t0, t1, nch, xq, xds, op.K, cv, cnt, nullptr, pre);
            } else if (op.silu) {
                mvk_warp<true, FMT_Q4_K>(task, t0, t1, nch, xq, xds, op.K, cv, cnt, op.y, 0);
            } else {
                mvk_warp<false, FMT_Q4_K>(task, t0, t1, nch, xq, xds, op.K, cv, cnt, nullptr, 0);
            }
        }
        if (mode & 8) { // one arrival per block
            __syncthreads();
            if (threadIdx.x == 0) red_release(&bar[ctr], 1u);
        } else {
            __syncwarp();
            if (lane == 0) red_release(&bar[ctr], 1u);
        }
        arrived += inc;
        if (tl && o == nops - 1) wait_all(arrived, 0u);
        if (mode & 4) {
            if (blockIdx.x == 0) {
                wait_all(arrived, 0u);
                small_body(op.y, op.small_out, op.silu ? 6656 : min(op.rows, 6656));
                if (threadIdx.x == 0) red_release(&bar[256], 1u);
            }
            smalls += 1;
        }
    }
}

// C: one launch per op as in A, the warps' static ranges covering the first spm / 1000 of the
// tasks (mvk_range over them) and the rest claimed a round (2 tasks) at a time from a counter,
// so the warps that stream faster take more of the end: a dynamic tail. A claimed round is a
// range of its own for mvk_warp (its row quads completed through cv and the counts, as shared
// quads are), so the bits stay the canonical ones. The warp that makes the launch's last claim
// (one failing claim per warp) zeroes the counter for the next launch.
template <bool SILU>
__global__ void __launch_bounds__(128, 4) dyn_mv(Op op, const int8_t* __restrict__ xq,
                                                 const float2* __restrict__ xds, float* __restrict__ cv,
                                                 unsigned* __restrict__ cnt, unsigned* __restrict__ claim, int spm) {
    const int lane = threadIdx.x % WARP;
    const unsigned W = gridDim.x * 4, w = blockIdx.x * 4 + threadIdx.x / WARP;
    const int nch = kq_chunks(op.K), per = (SILU ? 2 : 1) * nch;
    const unsigned T = (unsigned)((op.rows + 3) / 4) * per;
    const unsigned Ts = (unsigned)((unsigned long long)T * spm / 1000) & ~1u, units = (T - Ts + 1) / 2;
    int a = (int)(Ts * w / W), b = (int)(Ts * (w + 1) / W);
    const auto task = [&](int gq, int ch) { return op_task(op, nch, gq, ch); };
    if (a + (lane >= 16) < b) mvk_prefetch(task((a + (lane >= 16)) / per, (a + (lane >= 16)) % per), op.K);
    pdl_wait();
#pragma unroll 1
    for (;;) {
        if (a < b) mvk_warp<SILU, FMT_Q4_K>(task, a, b, nch, xq, xds, op.K, cv, cnt, SILU ? op.y : nullptr, 0);
        unsigned u = 0;
        if (lane == 0) u = atomicAdd(claim, 1u);
        u = __shfl_sync(0xffffffffu, u, 0);
        if (u >= units) {
            if (lane == 0 && u == units + W - 1) *claim = 0u;
            break;
        }
        a = (int)(Ts + 2 * u);
        b = min(a + 2, (int)T);
    }
}

#ifndef __CUDACC_RTC__
static int kq_chunks_host(int K) { return (K / 256 + 3) / 4; }

__global__ void read_bw(const uint4* __restrict__ p, size_t n, unsigned* sink) {
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldcs(p + i);
        acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) *sink = 1;
}

static void fill_q4k(std::vector<unsigned char>& b, unsigned long long seed) {
    unsigned long long x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t o = 0; o + 8 <= b.size(); o += 8) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        memcpy(&b[o], &x, 8);
    }
    for (size_t o = 0; o + 144 <= b.size(); o += 144) {
        b[o] = 0x00; b[o + 1] = 0x20;
        b[o + 2] = 0x00; b[o + 3] = 0x1C;
    }
}

static int mvk_blocks(long quads, long per, int sms) {
    const long most = sms * 4L, warps = sms * 16L;
    if (quads <= warps && 4 * quads >= 3 * warps) return (int)((quads + 3) / 4);
    long b = ((quads * per + 1) / 2 + 3) / 4;
    return (int)std::max(1L, std::min(b, most));
}

template <typename... Args, typename... Real>
static void launch_pdl(void (*k)(Args...), int grid, int block, cudaStream_t s, Real... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, k, args...));
}

int main() {
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int NL = 8, LAYERS = 52, KD = 6656, KF = 19968, KO = 4096, RQKV = 4608;
    const size_t bq = (size_t)RQKV * (KD / 256) * 144, bo = (size_t)KD * (KO / 256) * 144,
                 bg = (size_t)KF * (KD / 256) * 144, bd = (size_t)KD * (KF / 256) * 144;
    const double layer_bytes = (double)(bq + bo + 2 * bg + bd);
    printf("%d SMs; a layer reads %.1f MB (q+k+v %.1f, attn_output %.1f, gate+up %.1f, ffn_down %.1f)\n", sms,
           layer_bytes / 1e6, bq / 1e6, bo / 1e6, 2 * bg / 1e6, bd / 1e6);
    struct LayerW {
        unsigned char *q, *o, *g, *u, *d;
    };
    std::vector<LayerW> lw(NL);
    {
        std::vector<unsigned char> h(bg);
        int seed = 1;
        auto up = [&](unsigned char** p, size_t n) {
            h.resize(n);
            fill_q4k(h, seed++);
            CK(cudaMalloc(p, n));
            CK(cudaMemcpy(*p, h.data(), n, cudaMemcpyHostToDevice));
        };
        for (auto& l : lw) {
            up(&l.q, bq);
            up(&l.o, bo);
            up(&l.g, bg);
            up(&l.u, bg);
            up(&l.d, bd);
        }
    }
    int8_t* xq;
    float2* xds;
    CK(cudaMalloc(&xq, KF));
    CK(cudaMalloc(&xds, KF / 32 * sizeof(float2)));
    {
        std::vector<int8_t> h(KF);
        for (auto& x : h) x = (int8_t)(rand() % 255 - 127);
        CK(cudaMemcpy(xq, h.data(), KF, cudaMemcpyHostToDevice));
        std::vector<float2> d(KF / 32);
        for (auto& x : d) x = make_float2(0.01f, (float)(rand() % 2000 - 1000));
        CK(cudaMemcpy(xds, d.data(), d.size() * sizeof(float2), cudaMemcpyHostToDevice));
    }
    // Outputs: one set per variant (compared at the end), the small ops' outputs shared.
    const int NV = 5;
    float *ys[NV][4], *sout;
    for (int v = 0; v < NV; ++v)
        for (int i = 0; i < 4; ++i) {
            CK(cudaMalloc(&ys[v][i], KF * sizeof(float)));
            CK(cudaMemset(ys[v][i], 0, KF * sizeof(float)));
        }
    CK(cudaMalloc(&sout, KF * sizeof(float)));
    float* cv;
    unsigned *cnt, *bar;
    CK(cudaMalloc(&cv, (size_t)2 * KF * 16 * sizeof(float))); // two sets: the dataflow kernel alternates
    CK(cudaMalloc(&cnt, 2 * KF / 4 * sizeof(unsigned)));
    CK(cudaMemset(cnt, 0, 2 * KF / 4 * sizeof(unsigned)));
    CK(cudaMalloc(&bar, 1 << 20));

    const int gq = mvk_blocks(RQKV / 4, kq_chunks_host(KD), sms), go = mvk_blocks(KD / 4, kq_chunks_host(KO), sms),
              gg = mvk_blocks(KF / 4, 2 * kq_chunks_host(KD), sms), gd = mvk_blocks(KD / 4, kq_chunks_host(KF), sms);
    printf("launch grids (blocks of 4 warps): q+k+v %d, attn_output %d, gate+up %d, ffn_down %d\n", gq, go, gg, gd);
    auto ops_for = [&](int v) {
        std::vector<Op> ops;
        for (int l = 0; l < LAYERS; ++l) {
            const LayerW& w = lw[l % NL];
            ops.push_back(Op{w.q, nullptr, ys[v][0], sout, RQKV, KD, 0, gq * 4});
            ops.push_back(Op{w.o, nullptr, ys[v][1], sout, KD, KO, 0, go * 4});
            ops.push_back(Op{w.g, w.u, ys[v][2], sout, KF, KD, 1, gg * 4});
            ops.push_back(Op{w.d, nullptr, ys[v][3], sout, KD, KF, 0, gd * 4});
        }
        return ops;
    };

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto time_it = [&](auto&& run, int reps) {
        run();
        run();
        CK(cudaStreamSynchronize(st));
        CK(cudaEventRecord(e0, st));
        for (int r = 0; r < reps; ++r) run();
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        return ms / reps;
    };

    // Read bandwidth: 4 GiB in one pass.
    double bw;
    {
        const size_t n = (size_t)4 << 30;
        uint4* p;
        unsigned* sink;
        CK(cudaMalloc(&p, n));
        CK(cudaMemset(p, 1, n));
        CK(cudaMalloc(&sink, 4));
        const float ms = time_it([&] { read_bw<<<sms * 8, 512, 0, st>>>(p, n / 16, sink); }, 5);
        bw = n / (ms * 1e-3) / 1e9;
        CK(cudaFree(p));
        printf("read bandwidth: %.1f GB/s; the chain's bytes at that rate: %.3f ms per %d layers\n", bw,
               layer_bytes * LAYERS / bw / 1e6, LAYERS);
    }
    auto report = [&](const char* name, float ms) {
        const double gbs = layer_bytes * LAYERS / (ms * 1e-3) / 1e9;
        printf("%-62s %8.3f ms  %7.1f GB/s  %5.1f%%  (%.2f us a layer)\n", name, ms, gbs, 100.0 * gbs / bw,
               ms * 1000.0 / LAYERS);
    };

    // A: launches with programmatic dependencies, in one graph; with and without the small ops;
    // then each op type alone (52 launches of it chained).
    const char* tyname[4] = {"q+k+v", "attn_output", "gate+up", "ffn_down"};
    auto graph_ms = [&](const std::vector<Op>& ops, bool small) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (const Op& op : ops) {
            if (op.silu) {
                launch_pdl(mvk_silu_1, gg, 128, st, op.w, (int)FMT_Q4_K, op.wu, (int)FMT_Q4_K, op.y, op.rows,
                           (const int8_t*)xq, (const float2*)xds, op.K, cv, cnt, 0);
            } else {
                MatvecJobs j{};
                j.w[0] = op.w;
                j.y[0] = op.y;
                j.rows[0] = op.rows;
                j.ty[0] = FMT_Q4_K;
                j.start[1] = (op.rows + 3) / 4 * 4;
                j.njobs = 1;
                launch_pdl(mvk_1, op.W / 4, 128, st, j, (const int8_t*)xq, (const float2*)xds, op.K, cv, cnt, 0);
            }
            if (small) launch_pdl(small_k, 1, 128, st, (const float*)op.y, op.small_out, op.silu ? 6656 : std::min(op.rows, 6656));
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        const float ms = time_it([&] { CK(cudaGraphLaunch(ge, st)); }, 10);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        return ms;
    };
    unsigned* claim;
    CK(cudaMalloc(&claim, 4));
    CK(cudaMemset(claim, 0, 4));
    auto graph_dyn_ms = [&](const std::vector<Op>& ops, bool small, int spm) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (const Op& op : ops) {
            if (op.silu) launch_pdl(dyn_mv<true>, op.W / 4, 128, st, op, (const int8_t*)xq, (const float2*)xds, cv, cnt, claim, spm);
            else launch_pdl(dyn_mv<false>, op.W / 4, 128, st, op, (const int8_t*)xq, (const float2*)xds, cv, cnt, claim, spm);
            if (small) launch_pdl(small_k, 1, 128, st, (const float*)op.y, op.small_out, op.silu ? 6656 : std::min(op.rows, 6656));
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        const float ms = time_it([&] { CK(cudaGraphLaunch(ge, st)); }, 10);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        return ms;
    };
    auto same_as_a = [&](int slot) {
        int same = 1;
        for (int i = 0; i < 4; ++i) {
            std::vector<float> a(KF), b(KF);
            CK(cudaMemcpy(a.data(), ys[0][i], KF * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(b.data(), ys[slot][i], KF * 4, cudaMemcpyDeviceToHost));
            const int n = i == 2 ? KF : i == 0 ? RQKV : KD;
            if (memcmp(a.data(), b.data(), n * 4) != 0) same = 0;
        }
        return same;
    };
    report("A- launches + PDL, graph, no small ops", graph_ms(ops_for(0), false));
    {
        const std::vector<Op> all = ops_for(0);
        auto per_type = [&](int spm) {
            printf("   each op type alone (52 chained launches), us a launch:");
            for (int t = 0; t < 4; ++t) {
                std::vector<Op> one;
                for (size_t i = t; i < all.size(); i += 4) one.push_back(all[i]);
                printf(" %s %.2f", tyname[t], (spm ? graph_dyn_ms(one, false, spm) : graph_ms(one, false)) * 1000.0 / LAYERS);
            }
            printf("\n");
        };
        per_type(0);
        const int spms[] = {1000, 950, 900, 850, 800, 700};
        for (int spm : spms) {
            char name[96];
            snprintf(name, sizeof name, "C- dynamic tail, static %d/1000, no small ops", spm);
            report(name, graph_dyn_ms(ops_for(1), false, spm));
            printf("   outputs %s A's\n", same_as_a(1) ? "bit-identical to" : "DIFFER from");
            per_type(spm);
        }
        for (int spm : {1000, 850}) {
            char name[96];
            snprintf(name, sizeof name, "C  dynamic tail, static %d/1000, small ops", spm);
            report(name, graph_dyn_ms(ops_for(1), true, spm));
        }
        unsigned h = 1;
        CK(cudaMemcpy(&h, claim, 4, cudaMemcpyDeviceToHost));
        printf("   claim counter after the runs: %u (0 expected)\n", h);
    }
    report("A  launches + PDL, graph, small ops", graph_ms(ops_for(0), true));
    // B: one cooperative launch.
    int occ = 0;
    for (int r = 0; r < 3; ++r) {
        const void* f = r == 2 ? (const void*)chain_persist<false, true>
                        : r ? (const void*)chain_persist<true> : (const void*)chain_persist<false>;
        int o = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, f, 128, 0));
        cudaFuncAttributes fa;
        CK(cudaFuncGetAttributes(&fa, f));
        printf("chain_persist<%d>: %d registers, %zu bytes local, %d blocks per SM\n", r, fa.numRegs, fa.localSizeBytes, o);
        occ = r ? std::min(occ, o) : o;
    }
    if (occ < 4) {
        printf("not 4 blocks per SM: B skipped\n");
        return 0;
    }
    Op* dops;
    CK(cudaMalloc(&dops, sizeof(Op) * 4 * LAYERS));
    unsigned long long* dtl;
    CK(cudaMalloc(&dtl, sizeof(unsigned long long) * (4 * LAYERS + 1)));
    struct Var {
        const char* name;
        int mode;
    } vars[] = {{"B1- persistent, first round asked of L2 before the wait", 9}};
    int vi = 1;
    for (const Var& v : vars) {
        const int slot = std::min(vi, NV - 1);
        const std::vector<Op> ops = ops_for(slot);
        CK(cudaMemcpy(dops, ops.data(), sizeof(Op) * ops.size(), cudaMemcpyHostToDevice));
        int nops = (int)ops.size(), mode = v.mode;
        const int8_t* xq_ = xq;
        const float2* xds_ = xds;
        unsigned long long* tl = nullptr;
        const void* f = (mode & 128) ? (const void*)chain_persist<false, true>
                        : (mode & 2) ? (const void*)chain_persist<true> : (const void*)chain_persist<false>;
        auto run = [&] {
            CK(cudaMemsetAsync(bar, 0, 1 << 20, st));
            void* args[] = {(void*)&dops, (void*)&nops, (void*)&xq_, (void*)&xds_, (void*)&cv, (void*)&cnt,
                            (void*)&bar, (void*)&mode, (void*)&tl};
            CK(cudaLaunchCooperativeKernel(f, dim3(sms * 4), dim3(128), args, 0, st));
        };
        const float ms = time_it(run, 10);
        report(v.name, ms);
        if (!(mode & (4 | 128))) { // the timeline: each op type's mean time from the last arrival before it
            tl = dtl;
            run();
            CK(cudaStreamSynchronize(st));
            tl = nullptr;
            std::vector<unsigned long long> h(4 * LAYERS + 1);
            CK(cudaMemcpy(h.data(), dtl, h.size() * 8, cudaMemcpyDeviceToHost));
            double sum[4] = {0, 0, 0, 0};
            for (int o = 0; o < 4 * LAYERS; ++o) sum[o % 4] += (h[o + 1] - h[o]) / 1e3;
            printf("   us per op:");
            for (int t = 0; t < 4; ++t) printf(" %s %.2f", tyname[t], sum[t] / LAYERS);
            printf("\n");
        }
        CK(cudaStreamSynchronize(st));
        // Bits against A's outputs (the last layer's four matvecs).
        int same = 1;
        for (int i = 0; i < 4; ++i) {
            std::vector<float> a(KF), b(KF);
            CK(cudaMemcpy(a.data(), ys[0][i], KF * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(b.data(), ys[slot][i], KF * 4, cudaMemcpyDeviceToHost));
            const int n = i == 2 ? KF : i == 0 ? RQKV : KD;
            if (memcmp(a.data(), b.data(), n * 4) != 0) same = 0;
        }
        printf("   outputs %s A's\n", same ? "bit-identical to" : "DIFFER from");
        ++vi;
    }
    return 0;
}
#endif
