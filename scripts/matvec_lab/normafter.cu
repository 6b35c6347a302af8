// Run 22 (issue 5): what would applying the RMS norm's scale after the matvec save? The decode
// chain runs a one-block `residual_norm` (norm.cu, the shipped kernel) after attn_output and after
// ffn_down: h += y; x = h * w / rms(h); x quantized to Q8_K for the next matvec. Q8_K scales each
// 256 values by their own maximum, so quantize(h * w) needs no global sum, and the next matvec
// could multiply its outputs by 1 / rms from the 26 per-256 sums of squares. Here that design's
// timing, in chain.cu's engine-like chain (52 Glimmer-shaped Q4_K layers, 8 distinct layers
// cycled, PDL in one graph; weights random, every matvec reading one fixed random activation):
//   A: q+k+v, small op (standing in for qkv_rows and the attention), attn_output, residual_norm,
//      gate+up, small op (silu_finish), ffn_down, residual_norm;
//   E: no residual_norm: attn_output and ffn_down (one warp per row quad at these shapes) end with
//      an epilogue: each warp counts its quad into its 256-row block (release atomic); the warp
//      that completes a block (acquire) loads its 256 outputs and h, writes h + y, its sum of
//      squares and the Q8_K quantization of (h + y) * w (q8k_warp); the next matvec (gate+up,
//      q+k+v) loads the 26 sums after its wait and uses 1 / rms at its end;
//   E0: no residual_norm and nothing in its place (the bound).
// Prints us per layer of each, alternated. Build and run on the device:
// nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/normafter scripts/matvec_lab/normafter.cu && /tmp/normafter
#ifndef __CUDACC_RTC__
#include "lab_host.h"
#endif

#include "../../crates/muser-cuda/kernels/common.cuh"
#include "../../crates/muser-cuda/kernels/matvec.cu"
#include "lab_chain.cuh"
#include "../../crates/muser-cuda/kernels/norm.cu"

// The residual's state and the norm's outputs (one row of 6656).
struct NormIo {
    float* h;       // [6656]
    const float* w; // norm weights [6656]
    float* part;    // the 26 sums of squares
    unsigned* cnt;  // a count per 256-row block
    int8_t* q;      // Q8_K of (h + y) * w
    float2* ds;
    int8_t* bs;
};

// mvk_1 over one warp per row quad (the launch's grid has a warp per quad: attn_output, ffn_down),
// then, with io.h set, the epilogue above.
extern "C" __global__ void __launch_bounds__(128, 4) mvk_1_epi(MatvecJobs jobs, MVK_ACT, NormIo io, const float* part_in,
                                                               int n_part, float* sink) {
    const MvkSpan sp = pdl_wait_prefetch_mvk(jobs, K);
    // The previous norm's sums (consumer side of E): loaded now, used at the end.
    float ss = 0.0f;
    if (n_part > 0 && threadIdx.x % WARP < n_part) ss = __ldcg(part_in + threadIdx.x % WARP);
    const int nch = kq_chunks(K);
    const uint8_t* w = jobs.w_of(sp.j);
    float* yj = jobs.y_of(sp.j);
    const int ty = jobs.ty_of(sp.j), rows = jobs.rows_of(sp.j), st = jobs.start_of(sp.j);
    mvk_fmt<false>(ty, [=](int gq, int ch) { return mvk_job_task_at(w, yj, ty, rows, st, gq, ch); }, sp.t0, sp.t1, nch,
                   xq, xds, K, cv, cnt, nullptr, flags);
    if (n_part > 0) {
        const float inv = rsqrtf(warp_sum(ss) / 6656.0f + 1e-5f);
        if (inv < 0.0f) *sink = inv; // never: keeps the load and the sum
    }
    if (!io.h) return;
    const int lane = threadIdx.x % WARP, gq = sp.t0 / nch; // the warp's row quad
    if (sp.t1 <= sp.t0 || 4 * gq >= rows) return;
    const int blk = gq / 64;
    __syncwarp();
    int last = 0;
    if (lane == 0) {
        last = atom_add_release(&io.cnt[blk], 1u) == 63u;
        if (last) fence_acquire();
    }
    last = __shfl_sync(0xffffffffu, last, 0);
    if (!last) return;
    __syncwarp();
    const int i0 = blk * 256 + 8 * lane;
    float f[8], s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float hv = io.h[i0 + i] + __ldcg(yj + i0 + i);
        io.h[i0 + i] = hv;
        s += hv * hv;
        f[i] = hv * io.w[i0 + i];
    }
    s = warp_sum(s);
    if (lane == 0) {
        io.part[blk] = s;
        io.cnt[blk] = 0u;
    }
    q8k_warp(f, blk, lane, io.q, io.ds, io.bs, rows, 0);
}

// mvk_silu_1, loading the previous norm's sums after its wait (E).
extern "C" __global__ void __launch_bounds__(128, 4) mvk_silu_1_p(SILU_ARGS, MVK_ACT, const float* part_in, int n_part,
                                                                  float* sink) {
    const int2 range = pdl_wait_prefetch_mvk_silu(wg, tyg, wu, tyu, rows, K);
    float ss = 0.0f;
    if (n_part > 0 && threadIdx.x % WARP < n_part) ss = __ldcg(part_in + threadIdx.x % WARP);
    const int nch = kq_chunks(K);
    mvk_fmt<true>(tyg, [&](int gq, int rem) { return mvk_silu_task_at(wg, tyg, wu, tyu, rows, nch, gq, rem); }, range.x,
                  range.y, nch, xq, xds, K, cv, cnt, y, flags);
    if (n_part > 0) {
        const float inv = rsqrtf(warp_sum(ss) / 6656.0f + 1e-5f);
        if (inv < 0.0f) *sink = inv;
    }
}

#ifndef __CUDACC_RTC__
int main() {
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int NL = 8, LAYERS = 52;
    const std::vector<LayerW> lw = upload_layers(NL);
    int8_t* xq;
    float2* xds;
    random_act(KF, &xq, &xds);
    float *y[4], *sout, *h, *w, *xnorm, *part, *sink;
    for (int i = 0; i < 4; ++i) {
        CK(cudaMalloc(&y[i], KF * sizeof(float)));
        CK(cudaMemset(y[i], 0, KF * sizeof(float)));
    }
    CK(cudaMalloc(&sout, KF * sizeof(float)));
    CK(cudaMalloc(&h, KD * sizeof(float)));
    CK(cudaMalloc(&w, KD * sizeof(float)));
    CK(cudaMalloc(&xnorm, KD * sizeof(float)));
    CK(cudaMalloc(&part, 64 * sizeof(float)));
    CK(cudaMalloc(&sink, 4));
    {
        std::vector<float> hv(KD), wv(KD);
        for (int i = 0; i < KD; ++i) {
            hv[i] = (float)(rand() % 2001 - 1000) / 1000.0f;
            wv[i] = 1.0f + (float)(rand() % 200 - 100) / 1000.0f;
        }
        CK(cudaMemcpy(h, hv.data(), KD * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(w, wv.data(), KD * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(part, 0, 64 * 4));
    }
    int8_t *nq, *nbs;
    float2* nds;
    unsigned* bcnt;
    CK(cudaMalloc(&nq, KD));
    CK(cudaMalloc(&nds, KD / 32 * sizeof(float2)));
    CK(cudaMalloc(&nbs, KD / 16));
    CK(cudaMalloc(&bcnt, 64 * sizeof(unsigned)));
    CK(cudaMemset(bcnt, 0, 64 * sizeof(unsigned)));
    float* cv;
    unsigned* cnt;
    CK(cudaMalloc(&cv, (size_t)2 * KF * 16 * sizeof(float)));
    CK(cudaMalloc(&cnt, 2 * KF / 4 * sizeof(unsigned)));
    CK(cudaMemset(cnt, 0, 2 * KF / 4 * sizeof(unsigned)));

    const ChainGrids grids = chain_grids(sms);
    const int gq = grids.q, go = grids.o, gg = grids.g, gd = grids.d;
    printf("grids (blocks of 4 warps): q+k+v %d, attn_output %d (%d row quads), gate+up %d, ffn_down %d\n", gq, go,
           KD / 4, gg, gd);
    if (go * 4 != KD / 4 || gd * 4 != KD / 4) printf("warning: attn_output / ffn_down not one warp per row quad\n");

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    StreamTimer timer(st);
    auto time_it = [&](auto&& run, int reps) { return timer.ms(run, reps); };

    // mode 0: A (residual_norm launches), 1: E (epilogue + sums), 2: E0 (nothing).
    auto chain_us = [&](int mode) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        const NormIo none{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
        const NormIo io{h, w, part, bcnt, nq, nds, nbs};
        const int np = mode == 1 ? 26 : 0;
        auto mv = [&](const uint8_t* wt, float* yy, int rows, int K, int grid, NormIo nio, int n_part) {
            launch_pdl(mvk_1_epi, grid, 128, st, q4k_job(wt, yy, rows), (const int8_t*)xq, (const float2*)xds, K, cv, cnt, 0, nio,
                       (const float*)part, n_part, sink);
        };
        auto norm = [&](const float* yy) {
            if (mode == 0)
                launch_pdl(residual_norm, 1, NORM_T, st, h, yy, (const float*)nullptr, 0.0f, (const float*)w, 1e-5f,
                           xnorm, KD, nq, nds, nbs, (uint8_t*)nullptr, 0);
        };
        for (int l = 0; l < LAYERS; ++l) {
            const LayerW& lwl = lw[l % NL];
            mv(lwl.q, y[0], RQKV, KD, gq, none, l > 0 ? np : 0);
            launch_pdl(small_k, 1, 128, st, (const float*)y[0], sout, RQKV);
            mv(lwl.o, y[1], KD, KO, go, mode == 1 ? io : none, 0);
            norm(y[1]);
            launch_pdl(mvk_silu_1_p, gg, 128, st, (const uint8_t*)lwl.g, (int)FMT_Q4_K, (const uint8_t*)lwl.u,
                       (int)FMT_Q4_K, y[2], KF, (const int8_t*)xq, (const float2*)xds, KD, cv, cnt, 0,
                       (const float*)part, np, sink);
            launch_pdl(small_k, 1, 128, st, (const float*)y[2], sout, KD);
            mv(lwl.d, y[3], KD, KF, gd, mode == 1 ? io : none, 0);
            norm(y[3]);
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        const float ms = time_it([&] { CK(cudaGraphLaunch(ge, st)); }, 10);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        return ms * 1000.0 / LAYERS;
    };
    const char* names[3] = {"A  residual_norm launches", "E  norm in the matvec epilogue, scale after",
                            "E0 no norm at all (bound)"};
    for (int rep = 0; rep < 3; ++rep)
        for (int m = 0; m < 3; ++m) printf("%-46s %7.2f us a layer\n", names[m], chain_us(m));
    unsigned hc[64];
    CK(cudaMemcpy(hc, bcnt, sizeof hc, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < 64; ++i) bad += hc[i] != 0;
    printf("block counts left non-zero: %d (0 expected)\n", bad);
    return 0;
}
#endif
