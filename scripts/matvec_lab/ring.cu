// Issue 5: does a decode chain whose weights never stop streaming beat the launches? (run 57)
//
// Runs 22-56 found every one-column launch streaming at ~95% of the read bandwidth once running
// and losing its edges (ramp, the warps' spread of end times, shared quads) at every op boundary:
// ~24 us a layer of chain.cu's 80 us. Every design tried kept the loads tied to the op being
// computed (a warp loads its own rounds), so the DRAM idles whenever the warps wait for the op
// before. Here the loads are not the warps': one persistent block per SM, warp-specialized.
//   - A producer lane walks the SM's whole schedule (its share of op 0, op 1, ... of the 52
//     layers) and fills a ring of shared-memory stages (ns x 18 KB: 4 tiles of 32 rows x one
//     Q4_K super-block) by bulk copies (cp.async.bulk, evict-first). It waits only for a free
//     stage, never for an op boundary, so the DRAM keeps streaming the next op's weights while
//     the consumers wait.
//   - CW consumer warps wait for op o's input (a grid-wide count of finished blocks; with block
//     0's small op, its flag), load it into shared memory, then take the stages as they land:
//     one row per lane and one super-block per tile, the engine's integer recipe (dp4a over
//     nibbles, 6-bit scales and mins), a running sum per lane while its row stays the same.
//     At the op's end the block adds its rows to y and counts itself done.
//   - An op's work is chunks of one stage, handed to the blocks in contiguous ranges, claimed at
//     run time or interleaved (mode bits below).
// Bits: not the engine's canonical order (a timing lab); the outputs of a one-layer run are
// checked against a reference kernel with a relative tolerance.
//
// Weights: chain.cu's (8 distinct Glimmer-shaped Q4_K layers cycled over 52 layers, random
// bytes). Compared in the same run with chain.cu's variant A (the engine's mvk_1 / mvk_silu_1,
// one launch per op, programmatic dependencies, one CUDA graph), with and without the one-block
// small op after each matvec.
//
// Build and run on the device: bash scripts/matvec_lab/run_ring.sh (~40 s)
#ifndef __CUDACC_RTC__
#include "lab_host.h"
#endif

#include "../../crates/muser-cuda/kernels/common.cuh"
#include "../../crates/muser-cuda/kernels/kq_mma.cuh"
#include "../../crates/muser-cuda/kernels/matvec.cu"
#include "../../crates/muser-cuda/kernels/mmt.cu"
#include "lab_chain.cuh"

constexpr int RSB = 144;                       // bytes of a Q4_K super-block
constexpr int TILE = 32;                       // rows of a tile (one super-block column)
constexpr int STAGE_T = 4;                     // tiles a stage
constexpr int STAGE_BYTES = STAGE_T * TILE * RSB; // 18,432
constexpr int XMAX = 19968;                    // the largest K

struct ROp {
    const uint8_t* w[2]; // the matrix; gate and up for gate+up
    float* y;            // rows outputs (gate+up: gate's then up's)
    int rows, K, nm;     // rows a multiple of 32; nm: 1, or 2 for gate+up (the same tiles of each)
};

// Mode bits:
//   R_NO_AHEAD     the producer waits for op o's input before copying op o (no running ahead);
//   R_SMALL        small ops by block 0 (it normalizes each op's output; op o + 1 waits for its flag);
//   R_NOCOMP       the consumers skip the arithmetic (the stream alone; a diagnostic);
//   R_DYN          chunks claimed at run time, two at a time (else contiguous ranges);
//   R_INTERLEAVE   chunks b, b + G, ... to block b;
//   R_SMALL_LOCAL  small ops run by every block on its own at the start of the op after (as a norm
//                  would be: each block reduces the previous op's output), without a grid step;
//   R_ACC          contiguous ranges whose row sums stay in shared memory (each warp its own)
//                  until the op's end, when the block adds them to y (else each running sum goes
//                  to y by a global reduction);
//   R_SPIN         the waits for an op's input spin without sleeping;
//   R_PERM         contiguous ranges taken in each matrix of the op (gate+up: the same range of
//                  both, as 57c's tiles were), else one range of the op's chunks (half the blocks
//                  gate, half up);
//   R_LIGHT        the op boundary without sequentially consistent fences: the block's release and
//                  the waiters' acquire alone (bar.sync orders the block's other threads);
//   R_OWN          each stage owned by one consumer warp (stage number mod CW), which takes its 4
//                  tiles in order; the others neither wait for it nor release it, and no end-of-op
//                  stage is needed (contiguous ranges only). ns must be a multiple of CW, so that
//                  each ring slot has one owner: a warp waiting for a slot's round r + 1 while
//                  round r is pending would see round r - 1's parity completed and read a stale
//                  stage (run 57m hung so).
enum {
    R_NO_AHEAD = 1, R_SMALL = 2, R_NOCOMP = 4, R_DYN = 32, R_INTERLEAVE = 64, R_SMALL_LOCAL = 128, R_ACC = 256,
    R_SPIN = 512, R_PERM = 1024, R_LIGHT = 2048, R_OWN = 4096
};
constexpr int ACCR = 448; // rows of the outputs (gate's and up's one after the other) a block may touch

// The weights are tiles: tile t = (row group rg, super-block sb), t = rg x K/256 + sb, holds the
// 32 Q4_K blocks of rows 32 rg .. 32 rg + 31 at super-block sb, one after the other (a layout made
// at load, like the engine's 4-row interleave).

__device__ __forceinline__ void r_wait_at_least(const unsigned* p, unsigned v, bool spin = false) {
    while (ld_acquire(p) < v)
        if (!spin) __nanosleep(32);
}
__device__ __forceinline__ void red_add_f32(float* p, float v) {
    asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}

// One Q4_K super-block (blk) against the activation (xp: its 256 values, s2: their 8 sums of 32,
// xd: its scale), by one lane: d xd isc - dmin xd im. The high nibbles are dotted in place (x 16,
// the sum then shifted back: exact).
__device__ __forceinline__ float q4k_block(const uint8_t* blk, const int8_t* xp, const int* s2, float xd) {
    const uint4 hd = *(const uint4*)blk; // d, dmin, scales[0..12]
    uint32_t sc_lo, sc_hi, m_lo, m_hi;
    unpack_scales_k4(hd.y, hd.z, hd.w, &sc_lo, &sc_hi, &m_lo, &m_hi);
    const int isc = lab_q4k_isc(blk, xp, sc_lo, sc_hi);
    const int4 sa = *(const int4*)s2, sb = *(const int4*)(s2 + 4);
    const int im = (int)(m_lo & 0xFF) * sa.x + (int)((m_lo >> 8) & 0xFF) * sa.y + (int)((m_lo >> 16) & 0xFF) * sa.z +
                   (int)(m_lo >> 24) * sa.w + (int)(m_hi & 0xFF) * sb.x + (int)((m_hi >> 8) & 0xFF) * sb.y +
                   (int)((m_hi >> 16) & 0xFF) * sb.z + (int)(m_hi >> 24) * sb.w;
    const __half2 dm = *(const __half2*)blk;
    return __low2float(dm) * xd * (float)isc - __high2float(dm) * xd * (float)im;
}

// The small op by a block's CW consumer warps: out = in / rms(in) over n values (out written only
// when `write`); red: CW floats of shared memory.
template <int CW>
__device__ __forceinline__ void ring_small(const float* in, float* out, int n, bool write, float* red) {
    const int ct = threadIdx.x, warp = ct / 32, lane = ct % 32;
    float ss = 0.0f;
    for (int i = ct; i < n; i += CW * 32) {
        const float v = __ldcg(in + i);
        ss = fmaf(v, v, ss);
    }
    ss = warp_sum(ss);
    if (lane == 0) red[warp] = ss;
    consumers_sync(CW);
    float t = 0.0f;
    for (int w = 0; w < CW; ++w) t += red[w];
    if (write) {
        const float sc = rsqrtf(t / n + 1e-6f);
        for (int i = ct; i < n; i += CW * 32) out[i] = __ldcg(in + i) * sc;
    }
    consumers_sync(CW);
}

// An op's work is chunks of one stage (4 tiles): chunk c of matrix c / nch. R_DYN claims two at
// a time, the next claim in flight while the current pair is copied. After its last chunk of an
// op the producer marks an empty stage (-1) as the op's end (not with R_OWN).
template <int CW>
__global__ void __launch_bounds__((CW + 1) * 32, 1)
    ring_chain(const ROp* __restrict__ ops, int nops, const int8_t* __restrict__ xq, const int* __restrict__ xs32,
               const float* __restrict__ xd, unsigned* done, unsigned* sdone, unsigned* claim, float* sout, int ns,
               int mode, int ahead, unsigned long long* tl, unsigned long long* stalls) {
    extern __shared__ __align__(128) uint8_t smem[];
    uint8_t* stages = smem;
    int8_t* xs = (int8_t*)(smem + ns * STAGE_BYTES); // XMAX
    int* xsum = (int*)(xs + XMAX);                    // XMAX / 32 sums
    float* xds = (float*)(xsum + XMAX / 32);          // XMAX / 256 floats
    float* red = xds + XMAX / 256;                    // 32 floats
    int* meta = (int*)(red + 32);                     // ns: each stage's chunk (-1: the op's end)
    float* acc = (float*)(meta + 16);                 // [CW][ACCR] (R_ACC)
    unsigned long long* bars = (unsigned long long*)(acc + CW * ACCR); // full[ns], empty[ns]
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(bars);
    auto full = [&](int s) { return bar0 + 8u * s; };
    auto empty = [&](int s) { return bar0 + 8u * (ns + s); };
    const int G = gridDim.x, b = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < ns; ++s) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), (mode & R_OWN) ? 1 : CW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    // The input of op o is ready when every block has finished op o - 1 (and, with small ops,
    // when block 0 has run op o - 1's small op).
    auto input_ready = [&](int o) {
        if (o == 0) return;
        if (mode & R_SMALL) r_wait_at_least(sdone, (unsigned)o, mode & R_SPIN);
        else r_wait_at_least(done, (unsigned)(G * o), mode & R_SPIN);
    };

    if (warp == CW) { // the producer
        if (lane != 0) return;
        unsigned long long pol;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
        unsigned long long waited = 0;
        // ahead > 0 (contiguous ranges only): L2 is asked for the chunk `ahead` places past each
        // copy in the block's schedule (crossing op boundaries), so that the DRAM keeps streaming
        // while the ring is full and the consumers wait for an op's input.
        int lo = 0, lc = -1;
        auto l2_next = [&]() {
            while (lo < nops) {
                const ROp& q = ops[lo];
                const int qT = q.rows / TILE * (q.K / 256), qn = (qT + STAGE_T - 1) / STAGE_T, qC = q.nm * qn;
                const int qc0 = (int)((long long)qC * b / G), qc1 = (int)((long long)qC * (b + 1) / G);
                lc = lc < 0 ? qc0 : lc + 1;
                if (lc < qc1) {
                    const int m = lc / qn, t = (lc - m * qn) * STAGE_T;
                    const uint32_t bytes = (uint32_t)min(STAGE_T, qT - t) * TILE * RSB;
                    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((m ? q.w[1] : q.w[0]) +
                                                                               (size_t)t * TILE * RSB),
                                 "r"(bytes)
                                 : "memory");
                    return;
                }
                ++lo;
                lc = -1;
            }
        };
        const bool l2 = ahead > 0 && !(mode & (R_DYN | R_INTERLEAVE));
        if (l2)
            for (int i = 0; i < ahead; ++i) l2_next();
        int k = 0;
        auto next_stage = [&]() {
            const int s = k % ns;
            if (k >= ns) {
                const unsigned long long t0 = clock64();
                mbar_wait(empty(s), ((k / ns) - 1) & 1);
                waited += clock64() - t0;
            }
            ++k;
            return s;
        };
        for (int o = 0; o < nops; ++o) {
            const ROp op = ops[o];
            if (mode & R_NO_AHEAD) input_ready(o);
            const int T = op.rows / TILE * (op.K / 256), nch = (T + STAGE_T - 1) / STAGE_T, C = op.nm * nch;
            auto copy = [&](int c) {
                const int s = next_stage(), m = c / nch, t = (c - m * nch) * STAGE_T;
                const uint32_t bytes = (uint32_t)min(STAGE_T, T - t) * TILE * RSB;
                meta[s] = c;
                mbar_expect(full(s), bytes);
                bulk_copy_ef((uint32_t)__cvta_generic_to_shared(stages + (size_t)s * STAGE_BYTES),
                             (m ? op.w[1] : op.w[0]) + (size_t)t * TILE * RSB, bytes, full(s), pol);
                if (l2) l2_next();
            };
            if (mode & R_DYN) {
                unsigned next = atomicAdd(claim + o, 2u);
                while (next < (unsigned)C) {
                    const unsigned cur = next;
                    next = atomicAdd(claim + o, 2u);
                    copy((int)cur);
                    if (cur + 1 < (unsigned)C) copy((int)cur + 1);
                }
            } else if (mode & R_INTERLEAVE) {
                for (int c = b; c < C; c += G) copy(c);
            } else if (mode & R_PERM) {
                for (int m = 0; m < op.nm; ++m)
                    for (int c = (int)((long long)nch * b / G); c < (int)((long long)nch * (b + 1) / G); ++c)
                        copy(m * nch + c);
            } else {
                for (int c = (int)((long long)C * b / G); c < (int)((long long)C * (b + 1) / G); ++c) copy(c);
            }
            if (!(mode & R_OWN)) {
                const int s = next_stage();
                meta[s] = -1;
                mbar_arrive(full(s));
            }
        }
        if (stalls) atomicAdd(stalls, waited);
        return;
    }

    // The consumers: tile i of the ring's running count goes to warp i mod CW, one row per lane;
    // a lane keeps its row's running sum while the warp's tiles stay in one row group and adds it
    // to y (a global atomic) when the group changes and at the op's end.
    const int ct = threadIdx.x;
    unsigned long long waited = 0;
    int k = 0, gk = 0;
    for (int o = 0; o < nops; ++o) {
        const ROp op = ops[o];
        const int nb = op.K / 256, T = op.rows / TILE * nb, nch = (T + STAGE_T - 1) / STAGE_T;
        if (ct == 0) {
            input_ready(o);
            if (!(mode & R_LIGHT)) __threadfence();
            if (tl) tl[(size_t)2 * o * G + b] = globaltimer_ns();
        }
        consumers_sync(CW);
        if ((mode & R_SMALL_LOCAL) && o > 0) // the small op on op o - 1's output, by this block
            ring_small<CW>(ops[o - 1].y, sout, min(ops[o - 1].rows, 6656), b == 0, red);
        for (int i = ct; i < op.K / 16; i += CW * 32) ((int4*)xs)[i] = __ldcg((const int4*)xq + i);
        for (int i = ct; i < op.K / 32; i += CW * 32) xsum[i] = __ldcg(xs32 + i);
        for (int i = ct; i < nb; i += CW * 32) xds[i] = __ldcg(xd + i);
        const int C = op.nm * nch, c0 = (int)((long long)C * b / G), c1 = (int)((long long)C * (b + 1) / G);
        // R_ACC: the outputs' rows [rb, re) that the block's range touches
        const int rb = c0 / nch * op.rows + (c0 % nch) * STAGE_T / nb * TILE;
        const int re = c1 > c0 ? (c1 - 1) / nch * op.rows + (min((c1 - 1) % nch * STAGE_T + STAGE_T, T) - 1) / nb * TILE + TILE : rb;
        // R_PERM: rows [pb, pe) of each matrix, sums at m x ACCR / 2 + row - pb
        const int pc0 = (int)((long long)nch * b / G), pc1 = (int)((long long)nch * (b + 1) / G);
        const int pb = pc0 * STAGE_T / nb * TILE;
        const int pe = pc1 > pc0 ? (min(pc1 * STAGE_T, T) - 1) / nb * TILE + TILE : pb;
        float* accw = acc + warp * ACCR;
        if (mode & R_ACC)
            for (int i = ct; i < CW * ACCR; i += CW * 32) acc[i] = 0.0f;
        auto flush = [&](int row, float v) {
            if ((mode & R_ACC) && (mode & R_PERM)) {
                const int m = row >= op.rows ? 1 : 0;
                accw[m * (ACCR / 2) + row - m * op.rows - pb + lane] += v;
            } else if (mode & R_ACC) accw[row - rb + lane] += v;
            else red_add_f32(op.y + row + lane, v);
        };
        consumers_sync(CW);
        int cur_row = -1; // the first row of the lane's running sum's group, + m x rows
        float cur = 0.0f;
        if (mode & R_OWN) {
            for (int j = c0; j < c1; ++j, ++k) {
                if (k % CW != warp) continue;
                const int s = k % ns;
                const unsigned long long cl = clock64();
                mbar_wait(full(s), (k / ns) & 1);
                waited += clock64() - cl;
                const int m = j / nch, t = (j - m * nch) * STAGE_T, nt = min(STAGE_T, T - t);
                const uint8_t* st = stages + (size_t)s * STAGE_BYTES;
                int rg = t / nb, sb = t - rg * nb;
                if (!(mode & R_NOCOMP))
                    for (int i = 0; i < nt; ++i) {
                        const int row = m * op.rows + rg * TILE;
                        if (row != cur_row) {
                            if (cur_row >= 0) flush(cur_row, cur);
                            cur_row = row;
                            cur = 0.0f;
                        }
                        cur += q4k_block(st + (i * TILE + lane) * RSB, xs + 256 * sb, xsum + 8 * sb, xds[sb]);
                        if (++sb == nb) {
                            sb = 0;
                            ++rg;
                        }
                    }
                __syncwarp();
                if (lane == 0) mbar_arrive(empty(s));
            }
        } else
        for (;; ++k) {
            const int s = k % ns;
            const unsigned long long c0 = clock64();
            mbar_wait(full(s), (k / ns) & 1);
            waited += clock64() - c0;
            const int c = meta[s];
            if (c >= 0) {
                const int m = c / nch, t = (c - m * nch) * STAGE_T, nt = min(STAGE_T, T - t);
                const uint8_t* st = stages + (size_t)s * STAGE_BYTES;
                for (int i = 0; i < nt; ++i) {
                    if ((gk + i) % CW != warp || (mode & R_NOCOMP)) continue;
                    const int ti = t + i, rg = ti / nb, sb = ti - rg * nb, row = m * op.rows + rg * TILE;
                    if (row != cur_row) {
                        if (cur_row >= 0) flush(cur_row, cur);
                        cur_row = row;
                        cur = 0.0f;
                    }
                    cur += q4k_block(st + (i * TILE + lane) * RSB, xs + 256 * sb, xsum + 8 * sb, xds[sb]);
                }
                gk += nt;
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(empty(s));
            if (c < 0) {
                ++k;
                break;
            }
        }
        if (cur_row >= 0) flush(cur_row, cur);
        consumers_sync(CW);
        if ((mode & R_ACC) && (mode & R_PERM)) {
            for (int m = 0; m < op.nm; ++m)
                for (int r = pb + ct; r < pe; r += CW * 32) {
                    float v = 0.0f;
                    for (int w = 0; w < CW; ++w) v += acc[w * ACCR + m * (ACCR / 2) + r - pb];
                    red_add_f32(op.y + m * op.rows + r, v);
                }
            consumers_sync(CW);
        } else if (mode & R_ACC) {
            for (int r = rb + ct; r < re; r += CW * 32) {
                float v = 0.0f;
                for (int w = 0; w < CW; ++w) v += acc[w * ACCR + r - rb];
                red_add_f32(op.y + r, v);
            }
            consumers_sync(CW);
        }
        if (ct == 0) {
            if (tl) tl[(size_t)(2 * o + 1) * G + b] = globaltimer_ns();
            if (!(mode & R_LIGHT)) __threadfence();
            red_release(done, 1);
        }
        if ((mode & R_SMALL) && b == 0) { // the small op on op o's output, after every block's
            if (ct == 0) {
                r_wait_at_least(done, (unsigned)(G * (o + 1)));
                __threadfence();
            }
            consumers_sync(CW);
            ring_small<CW>(op.y, sout, min(op.rows, 6656), true, red);
            if (ct == 0) {
                __threadfence();
                red_release(sdone, 1);
            }
        }
    }
    if (stalls && lane == 0) atomicAdd(stalls + 1, waited);
}

// The reference: one thread per row, the same per-super-block values, summed in order.
__global__ void ring_ref(const uint8_t* w, const int8_t* xq, const int* xs32, const float* xd, float* y, int rows,
                         int K) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const int nb = K / 256;
    float s = 0.0f;
    for (int sb = 0; sb < nb; ++sb)
        s += q4k_block(w + ((size_t)(row / TILE * nb + sb) * TILE + row % TILE) * RSB, xq + 256 * sb, xs32 + 8 * sb,
                       xd[sb]);
    y[row] = s;
}

#ifndef __CUDACC_RTC__
static size_t ring_smem(int ns, int cw) {
    return (size_t)ns * STAGE_BYTES + XMAX + XMAX / 32 * 4 + XMAX / 256 * 4 + 32 * 4 + 16 * 4 + (size_t)cw * ACCR * 4 +
           16 * ns;
}

int main() {
    const int sms = chain_start();
    const double layer_bytes = LAYER_BYTES;
    const int NL = 8, LAYERS = 52;
    const std::vector<LayerW> lw = upload_layers(NL);
    int8_t* xq;
    float2* xds2;
    random_act(KF, &xq, &xds2);
    int* xs32; // the activation's sums of 32
    {
        std::vector<int8_t> h(KF);
        CK(cudaMemcpy(h.data(), xq, KF, cudaMemcpyDeviceToHost));
        std::vector<int> sums(KF / 32, 0);
        for (int i = 0; i < KF; ++i) sums[i / 32] += h[i];
        CK(cudaMalloc(&xs32, sums.size() * 4));
        CK(cudaMemcpy(xs32, sums.data(), sums.size() * 4, cudaMemcpyHostToDevice));
    }
    float* xd; // one float scale per 256 values for the ring's recipe
    {
        std::vector<float> h(KF / 256);
        for (auto& x : h) x = 0.001f * (1 + rand() % 100);
        CK(cudaMalloc(&xd, h.size() * 4));
        CK(cudaMemcpy(xd, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    }
    float *ys[4], *sout;
    for (int i = 0; i < 4; ++i) {
        CK(cudaMalloc(&ys[i], 2 * KF * sizeof(float)));
        CK(cudaMemset(ys[i], 0, 2 * KF * sizeof(float)));
    }
    CK(cudaMalloc(&sout, KF * sizeof(float)));
    float* cv;
    unsigned *cnt, *ctr;
    chain_scratch(&cv, &cnt);
    CK(cudaMalloc(&ctr, 64));
    unsigned long long *dtl, *dstall;
    CK(cudaMalloc(&dtl, sizeof(unsigned long long) * 2 * 4 * LAYERS * sms));
    CK(cudaMalloc(&dstall, 16));

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    StreamTimer timer(st);
    const double bw = chain_bandwidth(timer, sms);
    auto report = [&](const char* name, float ms) { report_layers(name, ms, layer_bytes, LAYERS, bw, 58); };

    // A: the engine's launches (chain.cu's variant A).
    const ChainGrids grids = chain_grids(sms);
    const int gq = grids.q, go = grids.o, gg = grids.g, gd = grids.d;
    auto graph_a_ms = [&](bool small) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int l = 0; l < LAYERS; ++l) {
            const LayerW& w = lw[l % NL];
            const unsigned char* mw[4] = {w.q, w.o, w.g, w.d};
            const int rows[4] = {RQKV, KD, KF, KD}, ks[4] = {KD, KO, KD, KF}, grid[4] = {gq, go, gg, gd};
            for (int t = 0; t < 4; ++t) {
                if (t == 2) {
                    launch_pdl(mvk_silu_1, gg, 128, st, (const uint8_t*)w.g, (int)FMT_Q4_K, (const uint8_t*)w.u,
                               (int)FMT_Q4_K, ys[2], KF, (const int8_t*)xq, (const float2*)xds2, KD, cv, cnt, 0);
                } else {
                    launch_pdl(mvk_1, grid[t], 128, st, q4k_job(mw[t], ys[t], rows[t]), (const int8_t*)xq, (const float2*)xds2, ks[t], cv, cnt, 0);
                }
                if (small) launch_pdl(small_k, 1, 128, st, (const float*)ys[t], sout, std::min(rows[t], 6656));
            }
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        const float ms = timer.ms([&] { CK(cudaGraphLaunch(ge, st)); }, 10);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        return ms;
    };

    // The ring's ops: 4 a layer.
    auto ring_ops = [&](int layers) {
        std::vector<ROp> ops;
        for (int l = 0; l < layers; ++l) {
            const LayerW& w = lw[l % NL];
            ops.push_back(ROp{{w.q, nullptr}, ys[0], RQKV, KD, 1});
            ops.push_back(ROp{{w.o, nullptr}, ys[1], KD, KO, 1});
            ops.push_back(ROp{{w.g, w.u}, ys[2], KF, KD, 2});
            ops.push_back(ROp{{w.d, nullptr}, ys[3], KD, KF, 1});
        }
        return ops;
    };
    // The ops on the device, uploaded once: [0, 4 LAYERS) the chain, then one layer for the check.
    ROp* dops;
    CK(cudaMalloc(&dops, sizeof(ROp) * 5 * LAYERS));
    unsigned* claim; // each op's claim counter
    CK(cudaMalloc(&claim, 4 * 4 * LAYERS));
    {
        std::vector<ROp> all = ring_ops(LAYERS), one = ring_ops(1);
        all.insert(all.end(), one.begin(), one.end());
        CK(cudaMemcpy(dops, all.data(), sizeof(ROp) * all.size(), cudaMemcpyHostToDevice));
    }
    for (const void* f : {(const void*)ring_chain<4>, (const void*)ring_chain<5>, (const void*)ring_chain<8>,
                          (const void*)ring_chain<12>, (const void*)ring_chain<16>})
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
    auto ring_run = [&](int cw, int ns, int mode, int layers, unsigned long long* tl, unsigned long long* stalls,
                        int ahead = 0) {
        if ((mode & R_OWN) && ns % cw != 0) {
            printf("R_OWN needs the stages (%d) a multiple of the consumer warps (%d)\n", ns, cw);
            exit(1);
        }
        CK(cudaMemsetAsync(ctr, 0, 64, st));
        CK(cudaMemsetAsync(claim, 0, 4 * 4 * LAYERS, st));
        const ROp* ops = layers == LAYERS ? dops : dops + 4 * LAYERS;
        int nops = 4 * layers;
        unsigned *done = ctr, *sdone = ctr + 8;
        const size_t sm = ring_smem(ns, cw);
        void* args[] = {(void*)&ops, (void*)&nops, (void*)&xq, (void*)&xs32, (void*)&xd, (void*)&done, (void*)&sdone,
                        (void*)&claim, (void*)&sout, (void*)&ns, (void*)&mode, (void*)&ahead, (void*)&tl, (void*)&stalls};
        const void* f = cw == 4    ? (const void*)ring_chain<4>
                        : cw == 5  ? (const void*)ring_chain<5>
                        : cw == 8  ? (const void*)ring_chain<8>
                        : cw == 12 ? (const void*)ring_chain<12>
                                   : (const void*)ring_chain<16>;
        CK(cudaLaunchCooperativeKernel(f, dim3(sms), dim3((cw + 1) * 32), args, sm, st));
    };

    if (getenv("RING_NCU")) { // one run of one configuration, for Nsight Compute
        ring_run(8, 10, R_ACC | R_LIGHT | R_SPIN, LAYERS, nullptr, nullptr);
        CK(cudaStreamSynchronize(st));
        return 0;
    }
    // Check: one layer of the ring against the reference, for each way of handing out chunks.
    for (int mode : {0, (int)R_INTERLEAVE, (int)R_DYN, (int)R_ACC, (int)(R_ACC | R_PERM), (int)(R_ACC | R_OWN)}) {
        for (int i = 0; i < 4; ++i) CK(cudaMemsetAsync(ys[i], 0, 2 * KF * sizeof(float), st));
        ring_run(8, (mode & R_OWN) ? 8 : 10, mode, 1, nullptr, nullptr);
        CK(cudaStreamSynchronize(st));
        CK(cudaGetLastError());
        float* yr;
        CK(cudaMalloc(&yr, KF * sizeof(float)));
        const LayerW& w = lw[0];
        const unsigned char* mats[5] = {w.q, w.o, w.g, w.u, w.d};
        const int rows[5] = {RQKV, KD, KF, KF, KD}, ks[5] = {KD, KO, KD, KD, KF}, slot[5] = {0, 1, 2, 2, 3},
                  off[5] = {0, 0, 0, KF, 0};
        double worst = 0;
        for (int t = 0; t < 5; ++t) {
            ring_ref<<<(rows[t] + 127) / 128, 128, 0, st>>>(mats[t], xq, xs32, xd, yr, rows[t], ks[t]);
            CK(cudaStreamSynchronize(st));
            std::vector<float> a(rows[t]), r(rows[t]);
            CK(cudaMemcpy(r.data(), yr, rows[t] * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(a.data(), ys[slot[t]] + off[t], rows[t] * 4, cudaMemcpyDeviceToHost));
            double mx = 0, err = 0;
            for (int i = 0; i < rows[t]; ++i) {
                mx = std::max(mx, (double)fabsf(r[i]));
                err = std::max(err, (double)fabsf(a[i] - r[i]));
            }
            worst = std::max(worst, err / mx);
        }
        CK(cudaFree(yr));
        printf("ring outputs (chunks %s) against the reference, one layer: worst |diff| / max|ref| = %.3g (%s)\n",
               mode == R_DYN ? "claimed" : mode == R_ACC ? "in ranges, row sums in shared memory" : mode == (R_ACC | R_PERM) ? "in ranges of each matrix, row sums in shared memory" : mode == (R_ACC | R_OWN) ? "in ranges, a warp a stage, row sums in shared memory" : mode ? "interleaved" : "in ranges", worst, worst < 1e-5 ? "ok" : "WRONG");
    }

    report("A  launches + PDL, graph, no small ops", graph_a_ms(false));
    report("A  launches + PDL, graph, small ops", graph_a_ms(true));
    struct Var {
        int cw, ns, mode, ahead;
    } vars[] = {{8, 8, R_OWN | R_ACC | R_LIGHT | R_SPIN, 0},
                {4, 8, R_OWN | R_ACC | R_LIGHT | R_SPIN, 0},
                {5, 10, R_OWN | R_ACC | R_LIGHT | R_SPIN, 0},
                {8, 10, R_ACC | R_LIGHT | R_SPIN, 0},
                {8, 8, R_OWN | R_ACC | R_SMALL_LOCAL | R_LIGHT | R_SPIN, 0},
                {5, 10, R_OWN | R_ACC | R_SMALL_LOCAL | R_LIGHT | R_SPIN, 0},
                {16, 9, R_NOCOMP | R_SMALL_LOCAL | R_LIGHT | R_SPIN, 0},
                {8, 8, R_OWN | R_ACC | R_SMALL_LOCAL | R_LIGHT | R_SPIN | R_NO_AHEAD, 0}};
    const char* tyname[4] = {"q+k+v", "attn_output", "gate+up", "ffn_down"};
    for (const Var& v : vars) {
        const float ms = timer.ms([&] { ring_run(v.cw, v.ns, v.mode, LAYERS, nullptr, nullptr, v.ahead); }, 10);
        char name[128];
        snprintf(name, sizeof name, "R  ring, %d warps, %d stages%s%s%s%s%s%s%s%s, L2 %d ahead", v.cw, v.ns,
                 v.mode & R_OWN ? ", a warp a stage" : v.mode & R_PERM ? ", ranges per matrix" : "", v.mode & R_ACC ? ", sums in smem" : "",
                 v.mode & R_SPIN ? (v.mode & R_LIGHT ? ", spin, no fences" : ", spin") : v.mode & R_LIGHT ? ", no fences" : "",
                 v.mode & R_NO_AHEAD ? ", no ahead" : "",
                 v.mode & R_SMALL ? ", small ops" : v.mode & R_SMALL_LOCAL ? ", small ops per block" : "",
                 v.mode & R_NOCOMP ? ", NO MATH" : "", v.mode & R_DYN ? ", claimed" : "",
                 v.mode & R_INTERLEAVE ? ", interleaved" : "", v.ahead);
        report(name, ms);
        // One more run with the timeline and the stall counters.
        CK(cudaMemsetAsync(dstall, 0, 16, st));
        ring_run(v.cw, v.ns, v.mode, LAYERS, dtl, dstall, v.ahead);
        CK(cudaStreamSynchronize(st));
        CK(cudaGetLastError());
        // Each block's pass (input ready) and finish of every op: tl[2 o G + b], tl[(2 o + 1) G + b].
        const int NO = 4 * LAYERS;
        std::vector<unsigned long long> h((size_t)2 * NO * sms), s(2);
        CK(cudaMemcpy(h.data(), dtl, h.size() * 8, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(s.data(), dstall, 16, cudaMemcpyDeviceToHost));
        auto at = [&](int o, int fin, int blk) { return (double)h[(size_t)(2 * o + fin) * sms + blk] / 1e3; };
        double sum[4] = {0, 0, 0, 0}, dmed[4] = {0}, dmax[4] = {0}, fsp[4] = {0}, lat[4] = {0}, psp[4] = {0};
        std::vector<int> last(sms, 0);
        int n[4] = {0};
        for (int o = 1; o + 1 < NO; ++o) {
            const int t = o % 4;
            std::vector<double> d(sms), f(sms), pn(sms);
            for (int blk = 0; blk < sms; ++blk) {
                d[blk] = at(o, 1, blk) - at(o, 0, blk);
                f[blk] = at(o, 1, blk);
                pn[blk] = at(o + 1, 0, blk);
            }
            const int lb = (int)(std::max_element(f.begin(), f.end()) - f.begin());
            ++last[lb];
            std::sort(d.begin(), d.end());
            std::sort(f.begin(), f.end());
            std::sort(pn.begin(), pn.end());
            sum[t] += at(o + 1, 0, 0) - at(o, 0, 0);
            dmed[t] += d[sms / 2];
            dmax[t] += d[sms - 1];
            fsp[t] += f[sms - 1] - f[sms / 2];
            lat[t] += pn[sms / 2] - f[sms - 1];
            psp[t] += pn[sms - 1] - pn[0];
            ++n[t];
        }
        printf("   per op, us (block 0's op / each block's op: median, slowest / finishes: median to last / last finish to the next op's median start / next starts' spread):\n");
        for (int t = 0; t < 4; ++t)
            printf("     %-11s %6.2f / %6.2f %6.2f / %5.2f / %5.2f / %5.2f\n", tyname[t], sum[t] / n[t], dmed[t] / n[t],
                   dmax[t] / n[t], fsp[t] / n[t], lat[t] / n[t], psp[t] / n[t]);
        {
            std::vector<int> idx(sms);
            for (int i = 0; i < sms; ++i) idx[i] = i;
            std::sort(idx.begin(), idx.end(), [&](int x, int y) { return last[x] > last[y]; });
            printf("   blocks finishing last most often (of %d ops):", NO - 2);
            for (int i = 0; i < 6; ++i) printf(" %d (%d)", idx[i], last[idx[i]]);
            printf("\n");
        }
        printf("; per SM: producer waited for a free stage %.1f us, consumer warps for a full one %.1f us each\n",
               s[0] / 1.98e3 / sms, s[1] / 1.98e3 / sms / v.cw);
    }
    return 0;
}
#endif
