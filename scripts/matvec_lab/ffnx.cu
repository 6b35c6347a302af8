// Issue 5, run 79: the FFN as one dataflow launch on thread-block clusters (`ffnx.cu`).
//
// Every one-column design so far ties the FFN to two grid-wide boundaries: gate+up+SiLU must
// end everywhere before silu_finish_q8k quantizes its output, which must end before ffn_down
// starts (two ramps, two tails and a small kernel between them). But ffn_down's K is
// the FFN's intermediate dimension, and a Q8_K super-block of its input (256 values of
// silu(gate) x up) depends only on 256 gate rows and 256 up rows. So the FFN splits into 78
// independent pieces (llama-glimmer: 19,968 / 256), piece s:
//   - gate and up rows 256 s .. 256 s + 255 against the normed input (mvk_silu_1's warp code on
//     the piece's row quads: the same tasks, chunk trees and chunk order);
//   - silu(g) x up of those rows, quantized to Q8_K (q8k_warp, quantize_q8_k's bits);
//   - super-block s of every ffn_down row against it: v_s(row), the canonical super-block value
//     (the same integers as mvk_1's, kq_value_q45).
// Piece s runs on a cluster of P blocks (block p: 1/P of the gate/up row quads, then 1/P of the
// ffn_down rows); the cluster's hardware barrier is the piece's only wait, so a piece that is
// done with gate/up starts its ffn_down rows while other pieces still stream gate/up. ffn_down's
// blocks of super-block s lie contiguous (a layout made once, as the engine's kq_blk is), so a
// warp's round of 8 row quads is one 4.6 KB run. A combine launch then adds each row's v_s in
// the canonical order (chunk trees (v0 + v1) + (v2 + v3), chunks from 0): the bits of mvk_1.
//
// Compared in the same run with the engine's launches (mvk_silu_1 deferring its shared row quads,
// silu_finish_q8k, mvk_1), in a chain of whole layers as ringx.cu's A (residual_norm, q+k+v,
// quantize_q8_k, attn_output, residual_norm, FFN; programmatic dependencies, one CUDA graph),
// every value checked bit for bit. A third form (F_GLOBAL) uses no clusters: plain blocks, 4 an
// SM, meeting at counts in global memory.
// Result (lab README run 79; two calls, the third form not yet run): bit-identical to the
// engine's, but slower (91-95 against 87.7 us a layer). Chained, the engine's FFN launches lose
// little at the boundary this removes: gate+up and ffn_down alone add up to the two chained.
//
// Build and run on the device: RING=ffnx bash scripts/matvec_lab/run_ring.sh (~1 min)
#ifndef __CUDACC_RTC__
#include "lab_host.h"
#endif

#include "../../crates/muser-cuda/kernels/common.cuh"
#include "../../crates/muser-cuda/kernels/kq_mma.cuh"
#include "../../crates/muser-cuda/kernels/matvec.cu"
#include "../../crates/muser-cuda/kernels/mmt.cu"
#include "../../crates/muser-cuda/kernels/norm.cu"
#include "lab_chain.cuh"

constexpr int FNB = 19968 / 256; // the pieces (ffn_down's super-blocks)

// Flags. Diagnostics, with wrong outputs by design: F_NOWAIT: no barrier (each block quantizes
// whatever its piece's rows hold); F_NODOWN / F_NOUP: the gate/up part / the ffn_down part alone.
// F_NOAHEAD: no L2 request for the first ffn_down round before the barrier.
// F_DEFER: the gate/up row quads shared by two warps are not completed by atomics at the end of
// their ranges (mvk_warp with MVK_DEFER_SHARED) but summed from cv by the warp that quantizes
// the piece, after the barrier (silu_finish_q8k's way, inside the cluster).
// F_ORIG: ffn_down read in the engine's own layout (kq_blk: a row quad's super-blocks together,
// so a round's 8 quads are 8 pieces of 576 bytes, 45 KB apart) instead of regrouped by super-block.
// F_GLOBAL: no clusters: a plain launch of any grid of at least FNB blocks (piece s gets
// gridDim / FNB blocks or one more), the piece's blocks meeting at a count in global memory (a
// release add, then an acquire poll); every block is resident at once (one wave), so none waits
// for a block that cannot start. ffn_combine zeroes the counts for the next launch.
enum { F_NOWAIT = 1, F_NOAHEAD = 2, F_NODOWN = 4, F_NOUP = 8, F_DEFER = 16, F_ORIG = 32, F_GLOBAL = 64 };

// v_s of row q of a row quad (in lane q of each quad of lanes): this lane's quarter q of the
// quad's 4 rows (blk0: their block s side by side), the activation's 256 values in shared memory.
// mvk_value's arithmetic with the activation read from shared memory.
__device__ __forceinline__ float ffn_down_value(const uint8_t* __restrict__ blk0, bool ok, int q, const int8_t* xs,
                                                const float2* xds) {
    int isc[4] = {0, 0, 0, 0}, im[4] = {0, 0, 0, 0};
    float2 dm[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) dm[r] = make_float2(0.0f, 0.0f);
    float dx = 0.0f;
    if (ok) {
        RawQ45 raw[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) raw[r] = load_q45<false>(blk0 + r * 144, q);
        dx = xds[0].x;
        X64 x;
        x.x0 = *(const int4*)(xs + 64 * q);
        x.x1 = *(const int4*)(xs + 64 * q + 16);
        x.x2 = *(const int4*)(xs + 64 * q + 32);
        x.x3 = *(const int4*)(xs + 64 * q + 48);
        x.dd = *(const float4*)(xds + 2 * q);
        const int xsum = (int)__byte_perm(__float2int_rn(x.dd.y), __float2int_rn(x.dd.w), 0x5410);
#pragma unroll
        for (int r = 0; r < 4; ++r) q45_quarter_ints<false>(raw[r], x, xsum, q, &isc[r], &im[r], &dm[r]);
    }
    const int s = quad_scatter(isc, q);
    const float2 dq = q == 0 ? dm[0] : q == 1 ? dm[1] : q == 2 ? dm[2] : dm[3];
    return kq_value_q45(dq.x, dq.y, s, quad_scatter(im, q), dx);
}

// The FFN of one column: grid FNB x P blocks of NW = 4 or 5 warps in clusters of P (block p of
// cluster s), or with F_GLOBAL any grid of 4-warp blocks (piece s gets 6 or 7 of 528). wd: ffn_down's Q4_K blocks with super-block s of every row quad together
// ((s * quads + g) * 4 + r); V: [FNB][D] the rows' super-block values.
__global__ void __launch_bounds__(160, 4)
    ffn_fused(const uint8_t* __restrict__ wg, const uint8_t* __restrict__ wu, const uint8_t* __restrict__ wd,
              const int8_t* __restrict__ xq, const float2* __restrict__ xds, int K, int F, int D, float* __restrict__ yff,
              float* __restrict__ cv, unsigned* __restrict__ cnt, float* __restrict__ V, unsigned* __restrict__ pc,
              int flags) {
    __shared__ __align__(16) int8_t xs[256];
    __shared__ float2 xsd[8];
    __shared__ int8_t xbs[16];
    // Piece s and this block's part p of its P: the first E pieces have P0 + 1 blocks.
    const int P0 = (int)(gridDim.x / FNB), E = (int)gridDim.x - P0 * FNB, b = blockIdx.x;
    int s, p, P;
    if (b < E * (P0 + 1)) {
        P = P0 + 1;
        s = b / P;
        p = b % P;
    } else {
        P = P0;
        s = E + (b - E * (P0 + 1)) / P;
        p = (b - E * (P0 + 1)) % P;
    }
    const int NW = blockDim.x / WARP, warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, nch = kq_chunks(K),
              per = 2 * nch;
    // Gate/up: the piece's 64 row quads, block p's share, warp w's share of its tasks.
    const int qa = 64 * s + 64 * p / P, qb = 64 * s + 64 * (p + 1) / P;
    const int T0 = qa * per, T1 = qb * per;
    const int t0 = T0 + (T1 - T0) * warp / NW, t1 = T0 + (T1 - T0) * (warp + 1) / NW;
    {
        const int t = t0 + (lane >= 16);
        if (t < t1) mvk_prefetch(mvk_silu_task(wg, FMT_Q4_K, wu, FMT_Q4_K, F, nch, t), K);
    }
    pdl_wait();
    if (!(flags & F_NOUP))
        mvk_warp<true, FMT_Q4_K>(
            [&](int gq, int rem) { return mvk_silu_task_at(wg, FMT_Q4_K, wu, FMT_Q4_K, F, nch, gq, rem); }, t0, t1, nch,
            xq, xds, K, cv, cnt, yff, flags & F_DEFER ? MVK_DEFER_SHARED : 0);
    if (flags & F_NODOWN) return;
    // ffn_down: block p's share of the D / 4 row quads, warp w's share, in rounds of 8.
    const int nq = D / 4, da = nq * p / P, db = nq * (p + 1) / P;
    const int d0 = da + (db - da) * warp / NW, d1 = da + (db - da) * (warp + 1) / NW;
    const int nbd = F / QK_K;
    // Row quad g's block s at ws + g * gs.
    const uint8_t* ws = flags & F_ORIG ? wd + (size_t)s * 576 : wd + (size_t)s * nq * 576;
    const size_t gs = flags & F_ORIG ? (size_t)nbd * 576 : 576;
    if (!(flags & F_NOAHEAD)) {
        const int span = min(8, d1 - d0) * 576;
        if (flags & F_ORIG) {
            if (lane < 8 && d0 + lane < d1)
                for (int o = 0; o < 576; o += 128) prefetch_l2(ws + (size_t)(d0 + lane) * gs + o);
        } else {
            for (int o = 128 * lane; o < span; o += 128 * 32) prefetch_l2(ws + (size_t)d0 * 576 + o);
        }
    }
    if (flags & F_NOWAIT) {
    } else if (flags & F_GLOBAL) {
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            red_release(&pc[s], 1u);
            while (ld_acquire(&pc[s]) < (unsigned)P) {
            }
        }
        __syncthreads();
    } else {
        asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
        asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
    }
    if (warp == 0) {
        const float4 f0 = __ldcg((const float4*)(yff + 256 * s + 8 * lane)),
                     f1 = __ldcg((const float4*)(yff + 256 * s + 8 * lane + 4));
        float f[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
        if (flags & F_DEFER) {
#pragma unroll 1
            for (int i = 0; i < 8; i += 4) { // the lane's two row quads
                const int row = 256 * s + 8 * lane + i, lq = 2 * lane + i / 4;
                int pb = 0;
                while (pb + 1 < P && 64 * (pb + 1) / P <= lq) ++pb;
                const int A0 = (64 * s + 64 * pb / P) * per, n = (64 * s + 64 * (pb + 1) / P) * per - A0;
                const int r0 = (row / 4) * per - A0, r1 = r0 + per - 1;
                if (((r0 + 1) * NW + n - 1) / n != ((r1 + 1) * NW + n - 1) / n) { // shared by two warps
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        const float* cr = cv + (size_t)(row + k) * per;
                        float g, u;
                        kq_sum_chunks<true>(cr, cr + nch, nch, &g, &u);
                        f[i + k] = g / (1.0f + expf(-g)) * u;
                        yff[row + k] = f[i + k];
                    }
                }
            }
        }
        q8k_warp(f, 0, lane, xs, xsd, xbs, 256, 0);
    }
    __syncthreads();
    const int j = lane >> 2, q = lane & 3;
#pragma unroll 1
    for (int g0 = d0; g0 < d1; g0 += 8) {
        const int g = g0 + j;
        const bool ok = g < d1;
        const float v = ffn_down_value(ws + (size_t)g * gs, ok, q, xs, xsd);
        if (ok) V[(size_t)s * D + 4 * g + q] = v;
    }
}

// y[row] = the row's super-block values in the canonical order: chunks (v0 + v1) + (v2 + v3) of
// KQ_CHUNK, added from 0 (mvk_warp's butterfly and running sum). Blocks of 32 rows x 20 chunks:
// thread (r, c) makes chunk c of row r from its 4 values (one L2 round trip for the whole block),
// thread (r, 0) adds the 20 in order. Block 0 zeroes ffn_fused's piece counts (pc).
__global__ void __launch_bounds__(640) ffn_combine(const float* __restrict__ V, float* __restrict__ y, int D,
                                                   unsigned* __restrict__ pc) {
    __shared__ float cs[20][33];
    pdl_wait();
    const int r = threadIdx.x % 32, c = threadIdx.x / 32, row = blockIdx.x * 32 + r;
    if (blockIdx.x == 0 && threadIdx.x < FNB) pc[threadIdx.x] = 0u;
    const int n = min(4, FNB - 4 * c);
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = i < n && row < D ? __ldcg(V + (size_t)(4 * c + i) * D + row) : 0.0f;
    float a = v[0];
    if (n > 1) a = kq_add(a, v[1]);
    if (n > 2) {
        float b2 = v[2];
        if (n > 3) b2 = kq_add(b2, v[3]);
        a = kq_add(a, b2);
    }
    cs[c][r] = a;
    __syncthreads();
    if (c == 0 && row < D) {
        float y0 = 0.0f;
#pragma unroll
        for (int k = 0; k < 20; ++k) y0 = kq_add(y0, cs[k][r]);
        y[row] = y0;
    }
}
// The one-thread-a-row combine of the first two calls (its 78 loads, at 32 registers, went out a
// few at a time).
__global__ void __launch_bounds__(128) ffn_combine_row(const float* __restrict__ V, float* __restrict__ y, int D) {
    pdl_wait();
    const int row = blockIdx.x * 128 + threadIdx.x;
    if (row >= D) return;
    float v[FNB];
#pragma unroll
    for (int b = 0; b < FNB; ++b) v[b] = __ldcg(V + (size_t)b * D + row);
    float y0 = 0.0f;
#pragma unroll
    for (int c = 0; c * 4 < FNB; ++c) {
        const int n = min(4, FNB - 4 * c);
        float a = v[4 * c];
        if (n > 1) a = kq_add(a, v[4 * c + 1]);
        if (n > 2) {
            float b2 = v[4 * c + 2];
            if (n > 3) b2 = kq_add(b2, v[4 * c + 3]);
            a = kq_add(a, b2);
        }
        y0 = kq_add(y0, a);
    }
    y[row] = y0;
}

// ffn_down's blocks regrouped by super-block: out block (s * nq + g) * 4 + r = in block
// (g * nb + s) * 4 + r (144 bytes each).
__global__ void regroup_down(const uint4* __restrict__ in, uint4* __restrict__ out, int nq, int nb) {
    const size_t blocks = (size_t)nq * nb * 4;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < blocks * 9; i += (size_t)gridDim.x * blockDim.x) {
        const size_t b = i / 9, w = i % 9, r = b & 3, sg = b >> 2, s = sg / nq, g = sg % nq;
        out[i] = in[((g * nb + s) * 4 + r) * 9 + w];
    }
}

#ifndef __CUDACC_RTC__

int main(int argc, char** argv) {
    const int sms = chain_start();
    const double layer_bytes = LAYER_BYTES;
    const int NL = 8, LAYERS = 52;
    const std::vector<LayerW> lw = upload_layers(NL);
    std::vector<unsigned char*> wdr(NL);
    for (int l = 0; l < NL; ++l) {
        CK(cudaMalloc(&wdr[l], BD));
        regroup_down<<<sms * 8, 256>>>((const uint4*)lw[l].d, (uint4*)wdr[l], KD / 4, KF / 256);
    }
    CK(cudaDeviceSynchronize());
    const float eps = 1e-5f;
    float* h_init = dev_random(KD, -1.0f, 1.0f, 11);
    float* o_init = dev_random(KD, -0.5f, 0.5f, 12);
    float* w_attn = dev_random(KD, 0.5f, 1.5f, 13);
    float* w_ffn = dev_random(KD, 0.5f, 1.5f, 14);
    float *hb, *y_qkv, *y_ao, *y_ff, *y_down, *xn, *V;
    for (auto** p : {&hb, &y_qkv, &y_ao, &y_ff, &y_down, &xn}) CK(cudaMalloc(p, KF * sizeof(float)));
    CK(cudaMalloc(&V, (size_t)FNB * KD * sizeof(float)));
    unsigned* pc;
    CK(cudaMalloc(&pc, FNB * sizeof(unsigned)));
    CK(cudaMemset(pc, 0, FNB * sizeof(unsigned)));
    int8_t *aq, *abs_;
    float2* ads;
    chain_act(&aq, &ads, &abs_);
    float* cv;
    unsigned* cnt;
    chain_scratch(&cv, &cnt);

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    StreamTimer timer(st);
    const double bw = chain_bandwidth(timer, sms);
    auto report = [&](const char* name, float ms) { report_layers(name, ms, layer_bytes, LAYERS, bw, 58); };
    auto reset_h = [&]() { CK(cudaMemcpyAsync(hb, h_init, KD * sizeof(float), cudaMemcpyDeviceToDevice, st)); };

    const ChainGrids grids = chain_grids(sms);
    const int gq = grids.q, go = grids.o, gg = grids.g, gd = grids.d;
    auto mv = [&](const unsigned char* w, float* y, int rows, int K, int grid) {
        launch_pdl(mvk_1, grid, 128, st, q4k_job(w, y, rows), (const int8_t*)aq, (const float2*)ads, K, cv, cnt, 0);
    };
    // The fused FFN: a cluster launch that is also a programmatic dependent.
    // mode: 100 NW + P (NW warps a block, clusters of P; NW 0: 4); with F_GLOBAL, mode - 10000
    // blocks of 4 warps and no clusters.
    auto fused = [&](int l, int mode, int flags, bool combine) {
        if (mode >= 10000) flags |= F_GLOBAL;
        const int P = mode % 100, NW = mode >= 10000 ? 4 : mode / 100 ? mode / 100 : 4;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(mode >= 10000 ? mode - 10000 : FNB * P);
        cfg.blockDim = dim3(32 * NW);
        cfg.stream = st;
        cudaLaunchAttribute at[2];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        at[1].id = cudaLaunchAttributeClusterDimension;
        at[1].val.clusterDim.x = P;
        at[1].val.clusterDim.y = 1;
        at[1].val.clusterDim.z = 1;
        cfg.attrs = at;
        cfg.numAttrs = mode >= 10000 ? 1 : 2;
        const LayerW& w = lw[l % NL];
        CK(cudaLaunchKernelEx(&cfg, ffn_fused, (const uint8_t*)w.g, (const uint8_t*)w.u,
                              (const uint8_t*)(flags & F_ORIG ? w.d : wdr[l % NL]),
                              (const int8_t*)aq, (const float2*)ads, KD, KF, KD, y_ff, cv, cnt, V, pc, flags));
        if (combine) launch_pdl(ffn_combine, (KD + 31) / 32, 640, st, (const float*)V, y_down, KD, pc);
    };
    // mode 0: the engine's FFN; else the fused FFN (fused's mode). part: 0 whole layers, 1 the
    // FFN and its norm, 2 the FFN alone, 3 gate+up alone (A: mvk_silu_1 + silu_finish_q8k; F:
    // F_NODOWN), 4 ffn_down alone (A: mvk_1; F: F_NOUP and the combine).
    auto chain = [&](int layers, int mode, int flags, int part) {
        const bool ffn_only = part > 0;
        for (int l = 0; l < layers; ++l) {
            const LayerW& w = lw[l % NL];
            if (part >= 2) {
                if (mode == 0) {
                    if (part != 4) {
                        launch_pdl(mvk_silu_1, gg, 128, st, (const uint8_t*)w.g, (int)FMT_Q4_K, (const uint8_t*)w.u,
                                   (int)FMT_Q4_K, y_ff, KF, (const int8_t*)aq, (const float2*)ads, KD, cv, cnt,
                                   (int)MVK_DEFER_SHARED);
                        launch_pdl(silu_finish_q8k, KF / 256, 256, st, (const float*)cv, y_ff, KF, kq_chunks_host(KD),
                                   (unsigned)(KF / 4 * 2 * kq_chunks_host(KD)), (unsigned)(gg * 4), aq, ads, abs_);
                    }
                    if (part != 3) mv(w.d, y_down, KD, KF, gd);
                } else {
                    fused(l, mode, flags | (part == 3 ? F_NODOWN : part == 4 ? F_NOUP : 0), part != 3);
                }
                continue;
            }
            if (!ffn_only) {
                launch_pdl(residual_norm, 1, NORM_T, st, hb, (const float*)(l == 0 ? o_init : y_down),
                           (const float*)nullptr, 0.0f, (const float*)w_attn, eps, xn, KD, aq, ads, abs_,
                           (uint8_t*)nullptr, 0);
                mv(w.q, y_qkv, RQKV, KD, gq);
                launch_pdl(quantize_q8_k, (KO / 256 + 3) / 4, 128, st, (const float*)y_qkv, aq, ads, abs_, KO / 256, KO,
                           0, (uint8_t*)nullptr, 0);
                mv(w.o, y_ao, KD, KO, go);
            }
            launch_pdl(residual_norm, 1, NORM_T, st, hb, (const float*)(ffn_only ? (l == 0 ? o_init : y_down) : y_ao),
                       (const float*)nullptr, 0.0f, (const float*)w_ffn, eps, xn, KD, aq, ads, abs_, (uint8_t*)nullptr,
                       0);
            if (mode == 0) {
                launch_pdl(mvk_silu_1, gg, 128, st, (const uint8_t*)w.g, (int)FMT_Q4_K, (const uint8_t*)w.u,
                           (int)FMT_Q4_K, y_ff, KF, (const int8_t*)aq, (const float2*)ads, KD, cv, cnt,
                           (int)MVK_DEFER_SHARED);
                launch_pdl(silu_finish_q8k, KF / 256, 256, st, (const float*)cv, y_ff, KF, kq_chunks_host(KD),
                           (unsigned)(KF / 4 * 2 * kq_chunks_host(KD)), (unsigned)(gg * 4), aq, ads, abs_);
                mv(w.d, y_down, KD, KF, gd);
            } else {
                fused(l, mode, flags, true);
            }
        }
    };
    auto graph_of = [&](int mode, int flags, int part) {
        cudaGraphExec_t ge;
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        chain(LAYERS, mode, flags, part);
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphDestroy(g));
        return ge;
    };
    // Which shapes fit: blocks an SM and clusters resident at once (78 clusters must fit, or
    // some pieces wait for a second wave).
    const int modes[] = {6, 10528, 10468};
    const int F_D = F_DEFER;
    for (int mode : {6, 7, 506}) {
        const int P = mode % 100, NW = mode / 100 ? mode / 100 : 4;
        int ncl = 0, nb = 0;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(FNB * P);
        cfg.blockDim = dim3(32 * NW);
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = P;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        CK(cudaOccupancyMaxActiveClusters(&ncl, (void*)ffn_fused, &cfg));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, ffn_fused, 32 * NW, 0));
        printf("ffn_fused, %d warps a block, clusters of %d: %d blocks an SM, %d clusters at once (%d needed)\n", NW, P,
               nb, ncl, FNB);
    }
    int bad = 0;
    // Bits: one layer, then the whole chain.
    {
        reset_h();
        chain(1, 0, 0, 0);
        CK(cudaStreamSynchronize(st));
        CK(cudaGetLastError());
        const auto a_ff = host_copy(y_ff, KF), a_down = host_copy(y_down, KD);
        for (int mode : modes) {
            for (float* p : {y_ff, y_down}) CK(cudaMemsetAsync(p, 0, KF * sizeof(float), st));
            reset_h();
            chain(1, mode, 0, 0);
            CK(cudaStreamSynchronize(st));
            CK(cudaGetLastError());
            printf("one layer, mode %d:\n", mode);
            compare("silu(gate) x up", host_copy(y_ff, KF), a_ff, &bad);
            compare("ffn_down", host_copy(y_down, KD), a_down, &bad);
        }
        cudaGraphExec_t ga = graph_of(0, 0, 0);
        reset_h();
        CK(cudaGraphLaunch(ga, st));
        CK(cudaStreamSynchronize(st));
        const auto c_down = host_copy(y_down, KD), c_h = host_copy(hb, KD);
        for (int mode : {6, 10528, 10468, 10528 + 100000}) {
            const int fl = (mode > 100000 ? F_D : 0);
            mode %= 100000;
            cudaGraphExec_t gf = graph_of(mode, fl, 0);
            reset_h();
            CK(cudaGraphLaunch(gf, st));
            CK(cudaStreamSynchronize(st));
            CK(cudaGetLastError());
            printf("%d layers, mode %d%s%s:\n", LAYERS, mode, fl & F_D ? ", shared quads deferred" : "",
                   fl & F_ORIG ? ", engine's layout" : "");
            compare("ffn_down of the last layer", host_copy(y_down, KD), c_down, &bad);
            compare("h (after 104 norms)", host_copy(hb, KD), c_h, &bad);
            CK(cudaGraphExecDestroy(gf));
        }
        CK(cudaGraphExecDestroy(ga));
        printf("bits: %s\n", bad ? "DIFFERENT" : "every value identical to the engine's");
    }
    struct Var {
        const char* name;
        int mode, flags, part;
    };
    const Var vars[] = {
        {"A  engine launches, whole layers", 0, 0, 0},
        {"F  clusters of 6 (4 warps), whole layers", 6, 0, 0},
        {"G  528 blocks, piece counts, whole layers", 10528, 0, 0},
        {"G  468 blocks, piece counts, whole layers", 10468, 0, 0},
        {"G  528 blocks, deferred quads, whole layers", 10528, F_D, 0},
        {"G  528 blocks, NO WAIT (diagnostic), whole layers", 10528, F_NOWAIT, 0},
        {"A  the FFN alone (3 launches)", 0, 0, 2},
        {"F  clusters of 6, the FFN alone (+ combine)", 6, 0, 2},
        {"G  528 blocks, the FFN alone (+ combine)", 10528, 0, 2},
        {"A  gate+up + silu_finish_q8k alone", 0, 0, 3},
        {"G  528 blocks, gate+up phase alone", 10528, 0, 3},
        {"A  ffn_down alone", 0, 0, 4},
        {"G  528 blocks, ffn_down phase alone (+ combine)", 10528, 0, 4},
        {"A  engine launches, whole layers (again)", 0, 0, 0},
        {"G  528 blocks, piece counts, whole layers (again)", 10528, 0, 0},
    };
    for (const Var& v : vars) {
        cudaGraphExec_t g = graph_of(v.mode, v.flags, v.part);
        report(v.name, timer.ms([&] { reset_h(); CK(cudaGraphLaunch(g, st)); }, 10));
        CK(cudaGraphExecDestroy(g));
    }
    return bad ? 2 : 0;
}
#endif
