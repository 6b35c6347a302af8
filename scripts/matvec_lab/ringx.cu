// Issue 5: the streaming ring of run 57 with the engine's layout, bits and small ops (run 58).
//
// Run 57m found the ring's consumers keeping up with the stream once each stage has one owner
// warp (73.9-75.1 us a layer against 77.5 for the engine's launches, no small ops). Its small op
// was a stand-in, its layout a lab layout and its row sums not the canonical ones. Here the
// chain is a layer of the engine itself, every value checked bit for bit against the engine's
// kernels run the same way:
//   [residual norm -> Q8_K] q+k+v  [Q8_K of q: the attention's stand-in] attn_output
//   [residual norm -> Q8_K] gate+up+SiLU  [Q8_K of the SiLU product] ffn_down
// (llama-glimmer's shapes, every matrix Q4_K, random bytes).
//   - The weights stay in the engine's resident layout (kq_blk: row quads, each quad's chunk of 4
//     super-blocks one contiguous run). A stage is one chunk of one 32-row group (8 quads x up to 4
//     super-blocks, 8 bulk copies, 18.5 KB with padding), owned by one consumer warp, one row per
//     lane.
//   - Row sums in the canonical order (common.cuh): each lane makes its row's chunk value
//     (v0 + v1) + (v2 + v3), kept in a shared-memory table; at the op's end the block adds the
//     chunks of the row groups it begins, in order from 0. A row group that the next block
//     continues gets that block's chunks through global memory: the later block publishes each
//     one as it is made (a release add per chunk), and the earlier one waits for the count.
// Result (lab README run 58): every value bit-identical to the engine's, but slower than its
// launches (94.87-100.02 against 87.4-87.7 us a layer); even with neither arithmetic nor small
// ops the ring takes 69.5-71.3.
//   - The small ops run by every block on its own at the start of the op that reads them, into its
//     shared-memory activation (no grid step): the residual norm (h += o, then rmsnorm with the
//     reduction order of norm.cu's 1024-thread residual_norm, then q8k_warp); each block writes
//     its slice of the new h (h in two buffers, alternated). The quantizations by q8k_warp.
// Compared in the same run with the engine's launches for the same chain (residual_norm,
// mvk_1, quantize_q8_k, mvk_silu_1 + silu_finish_q8k; programmatic dependencies, one CUDA graph).
//
// Build and run on the device: RING=ringx bash scripts/matvec_lab/run_ring.sh (~1 min)
#ifndef __CUDACC_RTC__
#include "lab_host.h"
#endif

#include "../../crates/muser-cuda/kernels/common.cuh"
#include "../../crates/muser-cuda/kernels/kq_mma.cuh"
#include "../../crates/muser-cuda/kernels/matvec.cu"
#include "../../crates/muser-cuda/kernels/mmt.cu"
#include "../../crates/muser-cuda/kernels/norm.cu"
#include "lab_chain.cuh"

constexpr int XQB = 576;                    // a Q4_K quad's super-block: 4 x 144 bytes
// Each quad's run in a stage is followed by XQPAD bytes: unpadded, runs of 4 super-blocks lie
// 2,304 bytes apart (a multiple of 128), so the 8 quads' lanes read the same banks; 64 bytes
// more put quads 2i and 2i + 1 in opposite halves (4 wavefronts a 16-byte load, the fewest).
constexpr int XQPAD = 64;
constexpr int XSTAGE = 8 * (4 * XQB + XQPAD); // 18,944: 8 quads x 4 super-blocks, padded
constexpr int XMAXK = 19968;                 // the largest K
constexpr int XNORM = 6656;                  // the norms' width (scratch)
constexpr int XTAB = 4096;                   // floats of the chunk table
constexpr int XPER = 20;                     // the most chunks a row group (gate+up: 2 x 7; K = 19968: 20)

enum { XS_NORM = 1, XS_QUANT = 2 };
// One matvec and the small op that makes its input.
struct XOp {
    const uint8_t* w[2]; // the matrix (gate and up for gate+up)
    float* y;            // [rows] (gate+up: silu(gate) x up)
    int rows, K, nm;     // rows a multiple of 32
    int small;           // XS_NORM: h' = hsrc + src, x = rmsnorm(h', nw); XS_QUANT: x = src
    const float* src;
    const float* hsrc;
    float* hdst;
    const float* nw;
    float eps;
};

// Flags: X_LIGHT: the op's end without __threadfence before the release (the block barrier and
// the release add alone). Diagnostics (wrong outputs by design): X_NOSMALL: no small ops (each
// op reads the activation left by the one before); X_NOMATH: the stages taken without arithmetic.
enum { X_LIGHT = 1, X_NOSMALL = 2, X_NOMATH = 4 };

// The canonical value v_b of one Q4_K super-block (blk) of one row against the Q8_K activation
// in shared memory (xs: int8 values, xds: (d, sum) per 32), by one lane: isc and im exact
// (lab_q4k_isc), then kq_value_q45.
__device__ __forceinline__ float x_q4k_value(const uint8_t* blk, const int8_t* xs, const float2* xds, int sb) {
    const uint4 hd = *(const uint4*)blk;
    uint32_t sc_lo, sc_hi, m_lo, m_hi;
    unpack_scales_k4(hd.y, hd.z, hd.w, &sc_lo, &sc_hi, &m_lo, &m_hi);
    const int isc = lab_q4k_isc(blk, xs + 256 * sb, sc_lo, sc_hi);
    const float2* xd = xds + 8 * sb;
    int im = 0;
#pragma unroll
    for (int s = 0; s < 8; ++s)
        im += (int)(((s < 4 ? m_lo : m_hi) >> (8 * (s & 3))) & 0xFF) * __float2int_rn(xd[s].y);
    const float2 dm = __half22float2(*(const __half2*)blk);
    return kq_value_q45(dm.x, dm.y, isc, im, xd[0].x);
}

// The small op before op `op`, by the block's CW consumer warps, into the shared-memory
// activation (xs, xds, xbs).
template <int CW>
__device__ __forceinline__ void x_small(const XOp& op, int8_t* xs, float2* xds, int8_t* xbs, float* hsc, float* part) {
    constexpr int NT = CW * 32;
    const int ct = threadIdx.x, warp = ct / 32, lane = ct % 32, K = op.K;
    if (op.small == XS_QUANT) {
        // XB blocks of 256 a warp at a time, their loads issued together.
        constexpr int XB = 5;
        for (int b0 = warp; b0 < K / QK_K; b0 += XB * CW) {
            float4 a[XB], c[XB];
#pragma unroll
            for (int u = 0; u < XB; ++u) {
                const int blk = b0 + u * CW;
                if (blk < K / QK_K) {
                    a[u] = __ldcg((const float4*)(op.src + blk * 256 + 8 * lane));
                    c[u] = __ldcg((const float4*)(op.src + blk * 256 + 8 * lane + 4));
                }
            }
#pragma unroll
            for (int u = 0; u < XB; ++u) {
                const int blk = b0 + u * CW;
                if (blk < K / QK_K) {
                    const float f[8] = {a[u].x, a[u].y, a[u].z, a[u].w, c[u].x, c[u].y, c[u].z, c[u].w};
                    q8k_warp(f, blk, lane, xs, xds, xbs, K, 0);
                }
            }
        }
        return;
    }
    // The residual norm: h' = h + o into the scratch (XU float4 loads of each a thread in
    // flight: all of them at K = 6656 with 8 warps); the block's slice of h' to hdst.
    constexpr int XU = 7;
    for (int i0 = 4 * ct; i0 < K; i0 += 4 * XU * NT) {
        float4 hv[XU], ov[XU];
#pragma unroll
        for (int u = 0; u < XU; ++u)
            if (i0 + 4 * NT * u < K) {
                hv[u] = __ldcg((const float4*)(op.hsrc + i0 + 4 * NT * u));
                ov[u] = __ldcg((const float4*)(op.src + i0 + 4 * NT * u));
            }
#pragma unroll
        for (int u = 0; u < XU; ++u)
            if (i0 + 4 * NT * u < K)
                *(float4*)(hsc + i0 + 4 * NT * u) =
                    make_float4(hv[u].x + ov[u].x, hv[u].y + ov[u].y, hv[u].z + ov[u].z, hv[u].w + ov[u].w);
    }
    const int G = gridDim.x, b = blockIdx.x;
    consumers_sync(CW);
    for (int i = K * b / G + ct; i < K * (b + 1) / G; i += NT) op.hdst[i] = hsc[i];
    // residual_norm's sum of squares: thread t (of 1024) sums values t + 1024 k (sum_sq), then
    // each warp of 32 threads (warp_sum), then the 32 warps' sums (warp_sum). Thread p here plays
    // threads p + NT j, whose warps are warp + CW j.
#pragma unroll
    for (int j = 0; j < NORM_T / NT; ++j) {
        const int t = ct + NT * j;
        float hv[NORM_V];
#pragma unroll
        for (int k = 0; k < NORM_V; ++k) {
            const int i = t + k * NORM_T;
            hv[k] = i < K ? hsc[i] : 0.0f;
        }
        const float s = warp_sum(sum_sq(hv));
        if (lane == 0) part[warp + CW * j] = s;
    }
    consumers_sync(CW);
    const float inv2 = rsqrtf(warp_sum(part[lane]) / (float)K + op.eps);
    for (int blk = warp; blk < K / QK_K; blk += CW) {
        float f[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int at = blk * 256 + 8 * lane + i;
            f[i] = hsc[at] * inv2 * op.nw[at];
        }
        q8k_warp(f, blk, lane, xs, xds, xbs, K, 0);
    }
}

// The chain: one block per SM, CW consumer warps and one producer warp.
template <int CW>
__global__ void __launch_bounds__((CW + 1) * 32, 1)
    ringx_chain(const XOp* __restrict__ ops, int nops, float* __restrict__ cvg, unsigned* __restrict__ cnt,
                unsigned* done, int ns, int flags, unsigned long long* __restrict__ tl) {
    extern __shared__ __align__(128) uint8_t smem[];
    uint8_t* stages = smem;
    int8_t* xs = (int8_t*)(smem + ns * XSTAGE);           // XMAXK
    float2* xds = (float2*)(xs + XMAXK);                  // XMAXK / 32
    int8_t* xbs = (int8_t*)(xds + XMAXK / 32);            // XMAXK / 256 x 16
    float* tab = (float*)(xbs + XMAXK / 256 * 16);        // XTAB
    float* hsc = tab + XTAB;                              // XNORM
    float* part = hsc + XNORM;                            // 32
    unsigned long long* bars = (unsigned long long*)(part + 32); // full[ns], empty[ns]
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(bars);
    auto full = [&](int s) { return bar0 + 8u * s; };
    auto empty = [&](int s) { return bar0 + 8u * (ns + s); };
    const int G = gridDim.x, b = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < ns; ++s) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == CW) { // the producer: the block's chunks of every op in turn, 8 bulk copies each
        if (lane != 0) return;
        unsigned long long pol;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
        int k = 0;
        for (int o = 0; o < nops; ++o) {
            const XOp& op = ops[o];
            const int nb = op.K / QK_K, nch = kq_chunks(op.K), per = op.nm * nch, C = op.rows / 32 * per;
            const int c0 = (int)((long long)C * b / G), c1 = (int)((long long)C * (b + 1) / G);
            const uint8_t* w0 = op.w[0];
            const uint8_t* w1 = op.w[1];
            for (int c = c0; c < c1; ++c, ++k) {
                const int s = k % ns;
                if (k >= ns) mbar_wait(empty(s), ((k / ns) - 1) & 1);
                const int rg = c / per, rem = c - rg * per, m = rem / nch, ch = rem - m * nch;
                const uint32_t bytes = (uint32_t)min(4, nb - 4 * ch) * XQB;
                mbar_expect(full(s), 8 * bytes);
                const uint8_t* src = (m ? w1 : w0) + ((size_t)(8 * rg) * nb + 4 * ch) * XQB;
                const uint32_t dst = (uint32_t)__cvta_generic_to_shared(stages + (size_t)s * XSTAGE);
#pragma unroll
                for (int qd = 0; qd < 8; ++qd)
                    bulk_copy_ef(dst + qd * (bytes + XQPAD), src + (size_t)qd * nb * XQB, bytes, full(s), pol);
            }
        }
        return;
    }

    // The consumers.
    const int ct = threadIdx.x;
    int k = 0;
    // tl (null: none): block b's global timer at phase p of op o, tl[(4 o + p) G + b]: its input
    // ready, its small op done, its stages consumed, its rows written.
    auto mark = [&](int o, int p) {
        if (tl && ct == 0) tl[(size_t)(4 * o + p) * G + b] = globaltimer_ns();
    };
    for (int o = 0; o < nops; ++o) {
        const XOp op = ops[o];
        const int nb = op.K / QK_K, nch = kq_chunks(op.K), per = op.nm * nch, C = op.rows / 32 * per;
        const int c0 = (int)((long long)C * b / G), c1 = (int)((long long)C * (b + 1) / G);
        if (o > 0) {
            if (ct == 0) {
                while (ld_acquire(done) < (unsigned)(G * o)) {
                }
            }
            consumers_sync(CW);
        }
        mark(o, 0);
        if (!(flags & X_NOSMALL)) x_small<CW>(op, xs, xds, xbs, hsc, part);
        consumers_sync(CW);
        mark(o, 1);
        const int rgf = c0 / per;
        for (int j = c0; j < c1; ++j, ++k) {
            if (k % CW != warp) continue;
            const int s = k % ns;
            mbar_wait(full(s), (k / ns) & 1);
            const int rg = j / per, rem = j - rg * per, ch = rem % nch, nsb = min(4, nb - 4 * ch);
            const uint8_t* st = stages + (size_t)s * XSTAGE + (lane >> 2) * (nsb * XQB + XQPAD) + (lane & 3) * 144;
            // (X_NOMATH: the chunk is published as 0, so the row groups' counts still complete.)
            float c = 0.0f;
            if (!(flags & X_NOMATH)) {
                const float v0 = x_q4k_value(st, xs, xds, 4 * ch);
                c = v0;
                if (nsb > 1) c = kq_add(v0, x_q4k_value(st + XQB, xs, xds, 4 * ch + 1));
                if (nsb > 2) {
                    float v2 = x_q4k_value(st + 2 * XQB, xs, xds, 4 * ch + 2);
                    if (nsb > 3) v2 = kq_add(v2, x_q4k_value(st + 3 * XQB, xs, xds, 4 * ch + 3));
                    c = kq_add(c, v2);
                }
            }
            tab[((rg - rgf) * per + rem) * 32 + lane] = c;
            if (rg * per < c0) { // a row group begun by an earlier block: its chunk goes there now
                cvg[((size_t)rg * per + rem) * 32 + lane] = c;
                __syncwarp();
                if (lane == 0) red_release(&cnt[rg], 1u);
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(empty(s));
        }
        consumers_sync(CW);
        mark(o, 2);
        // The op's end: the rows of the row groups the block begins, summed in chunk order from 0:
        // the chunks from the table, and those of the blocks after it (a row group the next block
        // continues) from global memory, where they were put as they were made (so the count is
        // usually complete by now: no atomic round trip at the end).
        if (c1 > c0) {
            const int rgl = (c1 - 1) / per;
            for (int rg = rgf + warp; rg <= rgl; rg += CW) {
                if (rg * per < c0) continue; // begun by an earlier block, which sums it
                const int mine = min(c1, (rg + 1) * per) - rg * per; // chunks 0 .. mine - 1 here
                const float* tr = tab + (rg - rgf) * per * 32 + lane;
                float gv[XPER];
                if (mine < per) {
                    if (lane == 0)
                        while (ld_acquire(&cnt[rg]) < (unsigned)(per - mine)) {
                        }
                    __syncwarp();
                    const float* gr = cvg + (size_t)rg * per * 32 + lane;
#pragma unroll
                    for (int i = 0; i < XPER; ++i) gv[i] = i >= mine && i < per ? __ldcg(gr + i * 32) : 0.0f;
                    __syncwarp();
                    if (lane == 0) cnt[rg] = 0u;
                }
                float g = 0.0f, u = 0.0f;
#pragma unroll
                for (int i = 0; i < XPER; ++i) {
                    if (i >= per) break;
                    const float v = i < mine ? tr[i * 32] : gv[i];
                    if (i < nch) g = kq_add(g, v);
                    else u = kq_add(u, v);
                }
                op.y[rg * 32 + lane] = op.nm == 2 ? g / (1.0f + expf(-g)) * u : g;
            }
        }
        consumers_sync(CW);
        mark(o, 3);
        if (ct == 0) {
            if (!(flags & X_LIGHT)) __threadfence();
            red_release(done, 1);
        }
    }
}

#ifndef __CUDACC_RTC__
static size_t ringx_smem(int ns) {
    return (size_t)ns * XSTAGE + XMAXK + XMAXK / 32 * 8 + XMAXK / 256 * 16 + (size_t)(XTAB + XNORM + 32) * 4 + 16 * ns;
}

int main() {
    const int sms = chain_start();
    const double layer_bytes = LAYER_BYTES;
    const int NL = 8, LAYERS = 52;
    const std::vector<LayerW> lw = upload_layers(NL);
    const float eps = 1e-5f;
    float* h_init = dev_random(KD, -1.0f, 1.0f, 11);
    float* o_init = dev_random(KD, -0.5f, 0.5f, 12);
    float* w_attn = dev_random(KD, 0.5f, 1.5f, 13);
    float* w_ffn = dev_random(KD, 0.5f, 1.5f, 14);
    float *hb[2], *y_qkv, *y_ao, *y_ff, *y_down, *xn;
    for (auto** p : {&hb[0], &hb[1], &y_qkv, &y_ao, &y_ff, &y_down, &xn}) CK(cudaMalloc(p, KF * sizeof(float)));
    int8_t *aq, *abs_;
    float2* ads;
    chain_act(&aq, &ads, &abs_);
    float* cv;
    unsigned *cnt, *done;
    chain_scratch(&cv, &cnt);
    CK(cudaMalloc(&done, 64));

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    StreamTimer timer(st);
    const double bw = chain_bandwidth(timer, sms);
    auto report = [&](const char* name, float ms) { report_layers(name, ms, layer_bytes, LAYERS, bw, 62); };
    auto reset_h = [&]() {
        CK(cudaMemcpyAsync(hb[0], h_init, KD * sizeof(float), cudaMemcpyDeviceToDevice, st));
        CK(cudaMemcpyAsync(hb[1], h_init, KD * sizeof(float), cudaMemcpyDeviceToDevice, st));
    };

    // A: the engine's launches.
    const ChainGrids grids = chain_grids(sms);
    const int gq = grids.q, go = grids.o, gg = grids.g, gd = grids.d;
    auto mv = [&](const unsigned char* w, float* y, int rows, int K, int grid) {
        launch_pdl(mvk_1, grid, 128, st, q4k_job(w, y, rows), (const int8_t*)aq, (const float2*)ads, K, cv, cnt, 0);
    };
    auto chain_a = [&](int layers, bool small = true) {
        for (int l = 0; l < layers; ++l) {
            const LayerW& w = lw[l % NL];
            if (!small) {
                mv(w.q, y_qkv, RQKV, KD, gq);
                mv(w.o, y_ao, KD, KO, go);
                launch_pdl(mvk_silu_1, gg, 128, st, (const uint8_t*)w.g, (int)FMT_Q4_K, (const uint8_t*)w.u,
                           (int)FMT_Q4_K, y_ff, KF, (const int8_t*)aq, (const float2*)ads, KD, cv, cnt, 0);
                mv(w.d, y_down, KD, KF, gd);
                continue;
            }
            launch_pdl(residual_norm, 1, NORM_T, st, hb[0], (const float*)(l == 0 ? o_init : y_down),
                       (const float*)nullptr, 0.0f, (const float*)w_attn, eps, xn, KD, aq, ads, abs_,
                       (uint8_t*)nullptr, 0);
            mv(w.q, y_qkv, RQKV, KD, gq);
            launch_pdl(quantize_q8_k, (KO / 256 + 3) / 4, 128, st, (const float*)y_qkv, aq, ads, abs_, KO / 256, KO, 0,
                       (uint8_t*)nullptr, 0);
            mv(w.o, y_ao, KD, KO, go);
            launch_pdl(residual_norm, 1, NORM_T, st, hb[0], (const float*)y_ao, (const float*)nullptr, 0.0f,
                       (const float*)w_ffn, eps, xn, KD, aq, ads, abs_, (uint8_t*)nullptr, 0);
            launch_pdl(mvk_silu_1, gg, 128, st, (const uint8_t*)w.g, (int)FMT_Q4_K, (const uint8_t*)w.u, (int)FMT_Q4_K,
                       y_ff, KF, (const int8_t*)aq, (const float2*)ads, KD, cv, cnt, (int)MVK_DEFER_SHARED);
            launch_pdl(silu_finish_q8k, KF / 256, 256, st, (const float*)cv, y_ff, KF, kq_chunks_host(KD),
                       (unsigned)(KF / 4 * 2 * kq_chunks_host(KD)), (unsigned)(gg * 4), aq, ads, abs_);
            mv(w.d, y_down, KD, KF, gd);
        }
    };
    auto graph_of = [&](bool small) {
        cudaGraphExec_t ge;
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        chain_a(LAYERS, small);
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphDestroy(g));
        return ge;
    };
    cudaGraphExec_t ga = graph_of(true), ga0 = graph_of(false);

    // The ring's ops: 4 a layer (h alternates between the two buffers at each norm).
    auto ring_ops = [&](int layers) {
        std::vector<XOp> ops;
        int norms = 0;
        auto norm_op = [&](const unsigned char* w0, const unsigned char* w1, float* y, int rows, int K, int nm,
                           const float* src, const float* nw) {
            XOp op{{w0, w1}, y, rows, K, nm, XS_NORM, src, hb[norms % 2], hb[(norms + 1) % 2], nw, eps};
            ++norms;
            ops.push_back(op);
        };
        for (int l = 0; l < layers; ++l) {
            const LayerW& w = lw[l % NL];
            norm_op(w.q, nullptr, y_qkv, RQKV, KD, 1, l == 0 ? o_init : y_down, w_attn);
            ops.push_back(XOp{{w.o, nullptr}, y_ao, KD, KO, 1, XS_QUANT, y_qkv, nullptr, nullptr, nullptr, 0.0f});
            norm_op(w.g, w.u, y_ff, KF, KD, 2, y_ao, w_ffn);
            ops.push_back(XOp{{w.d, nullptr}, y_down, KD, KF, 1, XS_QUANT, y_ff, nullptr, nullptr, nullptr, 0.0f});
        }
        return ops;
    };
    // [0, 4 LAYERS): the chain; then one layer.
    XOp* dops;
    CK(cudaMalloc(&dops, sizeof(XOp) * 5 * LAYERS));
    {
        std::vector<XOp> all = ring_ops(LAYERS), one = ring_ops(1);
        all.insert(all.end(), one.begin(), one.end());
        // Every block's row groups must fit the chunk table.
        for (const XOp& op : all) {
            const int nch = kq_chunks_host(op.K), per = op.nm * nch, C = op.rows / 32 * per;
            if (per > XPER) {
                printf("a row group of %d chunks: more than XPER\n", per);
                return 1;
            }
            for (int b = 0; b < sms; ++b) {
                const int c0 = (int)((long long)C * b / sms), c1 = (int)((long long)C * (b + 1) / sms);
                if (c1 > c0 && ((c1 - 1) / per - c0 / per + 1) * per * 32 > XTAB) {
                    printf("chunk table too small for rows %d K %d\n", op.rows, op.K);
                    return 1;
                }
            }
        }
        CK(cudaMemcpy(dops, all.data(), sizeof(XOp) * all.size(), cudaMemcpyHostToDevice));
    }
    for (const void* f : {(const void*)ringx_chain<4>, (const void*)ringx_chain<8>})
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
    unsigned long long* dtl;
    CK(cudaMalloc(&dtl, sizeof(unsigned long long) * 4 * 4 * LAYERS * sms));
    auto ring_run = [&](int cw, int ns, int flags, int layers, unsigned long long* tl = nullptr) {
        if (ns % cw != 0) {
            printf("the stages (%d) must be a multiple of the consumer warps (%d)\n", ns, cw);
            exit(1);
        }
        CK(cudaMemsetAsync(done, 0, 64, st));
        const XOp* ops = layers == LAYERS ? dops : dops + 4 * LAYERS;
        int nops = 4 * layers;
        void* args[] = {(void*)&ops, (void*)&nops, (void*)&cv, (void*)&cnt, (void*)&done, (void*)&ns, (void*)&flags, (void*)&tl};
        const void* f = cw == 4 ? (const void*)ringx_chain<4> : (const void*)ringx_chain<8>;
        CK(cudaLaunchCooperativeKernel(f, dim3(sms), dim3((cw + 1) * 32), args, ringx_smem(ns), st));
    };

    struct Var {
        int cw, ns, flags;
    } vars[] = {{8, 8, 0}, {4, 8, 0}, {8, 8, X_LIGHT}};
    const Var diag[] = {{8, 8, X_LIGHT | X_NOSMALL}, {8, 8, X_LIGHT | X_NOMATH}, {8, 8, X_LIGHT | X_NOSMALL | X_NOMATH}};
    // The bits: one layer, then the whole chain, against the engine's launches.
    int bad = 0;
    {
        reset_h();
        chain_a(1);
        CK(cudaStreamSynchronize(st));
        CK(cudaGetLastError());
        const auto a_qkv = host_copy(y_qkv, RQKV), a_ao = host_copy(y_ao, KD), a_ff = host_copy(y_ff, KF),
                   a_down = host_copy(y_down, KD), a_h = host_copy(hb[0], KD);
        for (const Var& v : vars) {
            for (float* p : {y_qkv, y_ao, y_ff, y_down}) CK(cudaMemsetAsync(p, 0, KF * sizeof(float), st));
            reset_h();
            ring_run(v.cw, v.ns, v.flags, 1);
            CK(cudaStreamSynchronize(st));
            CK(cudaGetLastError());
            printf("one layer, ring of %d warps, %d stages%s:\n", v.cw, v.ns, v.flags & X_LIGHT ? ", no fences" : "");
            compare("q+k+v", host_copy(y_qkv, RQKV), a_qkv, &bad);
            compare("attn_output", host_copy(y_ao, KD), a_ao, &bad);
            compare("silu(gate) x up", host_copy(y_ff, KF), a_ff, &bad);
            compare("ffn_down", host_copy(y_down, KD), a_down, &bad);
            compare("h (after the 2 norms)", host_copy(hb[0], KD), a_h, &bad);
        }
        reset_h();
        CK(cudaGraphLaunch(ga, st));
        CK(cudaStreamSynchronize(st));
        const auto c_down = host_copy(y_down, KD), c_h = host_copy(hb[0], KD);
        for (const Var& v : vars) {
            reset_h();
            ring_run(v.cw, v.ns, v.flags, LAYERS);
            CK(cudaStreamSynchronize(st));
            CK(cudaGetLastError());
            printf("%d layers, ring of %d warps, %d stages%s:\n", LAYERS, v.cw, v.ns, v.flags & X_LIGHT ? ", no fences" : "");
            compare("ffn_down of the last layer", host_copy(y_down, KD), c_down, &bad);
            compare("h (after 104 norms)", host_copy(hb[0], KD), c_h, &bad);
        }
        printf("bits: %s\n", bad ? "DIFFERENT" : "every value identical to the engine's");
    }

    report("A  the engine's launches + PDL, one graph", timer.ms([&] { reset_h(); CK(cudaGraphLaunch(ga, st)); }, 10));
    report("A  the same without the small kernels (diagnostic)",
           timer.ms([&] { reset_h(); CK(cudaGraphLaunch(ga0, st)); }, 10));
    std::vector<Var> all(std::begin(vars), std::end(vars));
    all.insert(all.end(), std::begin(diag), std::end(diag));
    for (const Var& v : all) {
        char name[128];
        snprintf(name, sizeof name, "R  ring, %d warps, %d stages%s%s%s", v.cw, v.ns, v.flags & X_LIGHT ? ", no fences" : "",
                 v.flags & X_NOSMALL ? ", NO SMALL OPS" : "", v.flags & X_NOMATH ? ", NO MATH" : "");
        report(name, timer.ms([&] { reset_h(); ring_run(v.cw, v.ns, v.flags, LAYERS); }, 10));
        // One more run with the timeline: per op kind, us (medians over the blocks, then means over
        // the layers): small op, stages, rows; the last block's rows written after the median's;
        // from the last block's release to the next op's median input-ready.
        reset_h();
        ring_run(v.cw, v.ns, v.flags, LAYERS, dtl);
        CK(cudaStreamSynchronize(st));
        CK(cudaGetLastError());
        const int NO = 4 * LAYERS;
        std::vector<unsigned long long> h((size_t)4 * NO * sms);
        CK(cudaMemcpy(h.data(), dtl, h.size() * 8, cudaMemcpyDeviceToHost));
        auto at = [&](int o, int p, int blk) { return (double)h[(size_t)(4 * o + p) * sms + blk] / 1e3; };
        double acc[4][5] = {{0}};
        int n[4] = {0};
        for (int o = 1; o + 1 < NO; ++o) {
            const int t = o % 4;
            std::vector<double> d[5];
            for (int blk = 0; blk < sms; ++blk) {
                d[0].push_back(at(o, 1, blk) - at(o, 0, blk));
                d[1].push_back(at(o, 2, blk) - at(o, 1, blk));
                d[2].push_back(at(o, 3, blk) - at(o, 2, blk));
                d[3].push_back(at(o, 3, blk));
                d[4].push_back(at(o + 1, 0, blk));
            }
            for (auto& x : d) std::sort(x.begin(), x.end());
            acc[t][0] += d[0][sms / 2];
            acc[t][1] += d[1][sms / 2];
            acc[t][2] += d[2][sms / 2];
            acc[t][3] += d[3][sms - 1] - d[3][sms / 2];
            acc[t][4] += d[4][sms / 2] - d[3][sms - 1];
            ++n[t];
        }
        const char* tyname[4] = {"norm + q+k+v", "Q8_K + attn_output", "norm + gate+up", "Q8_K + ffn_down"};
        printf("   us: small op / stages / rows / last block after the median / to the next op's input\n");
        for (int t = 0; t < 4; ++t)
            printf("     %-20s %6.2f / %6.2f / %5.2f / %5.2f / %5.2f\n", tyname[t], acc[t][0] / n[t], acc[t][1] / n[t],
                   acc[t][2] / n[t], acc[t][3] / n[t], acc[t][4] / n[t]);
    }
    report("A  the engine's launches + PDL, one graph (again)",
           timer.ms([&] { reset_h(); CK(cudaGraphLaunch(ga, st)); }, 10));
    return bad ? 2 : 0;
}
#endif
