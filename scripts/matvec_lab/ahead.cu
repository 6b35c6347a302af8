// Run 20 (issue 5): can the latency-bound part of a layer fetch the FFN's first bytes? Between the
// end of q+k+v and the start of gate+up a layer runs the attention's small kernels, attn_output
// (~54% of the read bandwidth) and a norm: ~20 us in which DRAM is mostly idle, before a
// bandwidth-bound gate+up launch of 150 MB. Here each warp of the q+k+v launch (and optionally of
// attn_output), once its own rounds are done, asks L2 for the first tasks of the same-numbered
// warp's range in the next gate+up launch, so gate+up would start on L2 hits in every warp.
// The chain is chain.cu's engine-like launches (52 Glimmer-shaped Q4_K layers, 8 distinct layers
// cycled, PDL in one graph, a one-block small op after each matvec); variants:
//   n tasks (2,304 bytes each) per gate+up warp, asked for by the q+k+v warps (and the next m by
//   attn_output's), as 128-byte line prefetches (prefetch.global.L2, or its ::evict_last form) or
//   one bulk request per task (cp.async.bulk.prefetch.L2).
// Prints us per layer against the same chain without requests, in alternation, and checks that
// the outputs are bit-identical (the requests change no value).
// Build and run on the device: bash scripts/matvec_lab/run_ahead.sh (~30 s)
#ifndef __CUDACC_RTC__
#include "lab_host.h"
#endif

#include "../../crates/muser-cuda/kernels/common.cuh"
#include "../../crates/muser-cuda/kernels/matvec.cu"
#include "lab_chain.cuh"

// The gate+up launch whose first bytes are asked for: its matrices, rows, K, warps W; tasks
// [skip, skip + n) of each warp's range; mode 1 line prefetch, 2 line prefetch evict_last,
// 3 bulk prefetch per task.
struct Ahead {
    const uint8_t* wg;
    const uint8_t* wu;
    int rows, K, W, skip, n, mode;
};

__device__ __forceinline__ void ahead_requests(const Ahead& a, int gw0, int stride) {
    const int lane = threadIdx.x % WARP, nch = kq_chunks(a.K), nb = a.K / QK_K;
    const unsigned T = (unsigned)((a.rows + 3) / 4) * 2 * nch;
    for (int gw = gw0; gw < a.W; gw += stride) {
        const int t0 = (int)(T * (unsigned)gw / (unsigned)a.W), t1 = (int)(T * (unsigned)(gw + 1) / (unsigned)a.W);
        const int ta = min(t0 + a.skip, t1), tb = min(ta + a.n, t1);
        if (a.mode == 3) {
            const int t = ta + lane;
            if (t < tb) {
                const MvkTask k = mvk_silu_task(a.wg, FMT_Q4_K, a.wu, FMT_Q4_K, a.rows, nch, t);
                const unsigned span = 4 * min(KQ_CHUNK, nb - KQ_CHUNK * k.ch) * 144;
                const uint8_t* p = k.w + kq_blk(k.row0, nb, KQ_CHUNK * k.ch) * 144;
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(span) : "memory");
            }
        } else {
            const int lines = 18; // 2,304 bytes (a full chunk; the last chunk of a row is 2 blocks)
            for (int i = lane; i < (tb - ta) * lines; i += WARP) {
                const int t = ta + i / lines, l = i % lines;
                const MvkTask k = mvk_silu_task(a.wg, FMT_Q4_K, a.wu, FMT_Q4_K, a.rows, nch, t);
                const int span = 4 * min(KQ_CHUNK, nb - KQ_CHUNK * k.ch) * 144;
                if (128 * l >= span) continue;
                const uint8_t* p = k.w + kq_blk(k.row0, nb, KQ_CHUNK * k.ch) * 144 + 128 * l;
                if (a.mode == 2) asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p));
                else prefetch_l2(p);
            }
        }
    }
}

// mvk_1, then the requests for the gate+up launch ahead.
extern "C" __global__ void __launch_bounds__(128, 4) mvk_1_ahead(MatvecJobs jobs, MVK_ACT, Ahead ah) {
    const MvkSpan sp = pdl_wait_prefetch_mvk(jobs, K);
    const int nch = kq_chunks(K);
    const uint8_t* w = jobs.w_of(sp.j);
    float* yj = jobs.y_of(sp.j);
    const int ty = jobs.ty_of(sp.j), rows = jobs.rows_of(sp.j), st = jobs.start_of(sp.j);
    mvk_fmt<false>(ty, [=](int gq, int ch) { return mvk_job_task_at(w, yj, ty, rows, st, gq, ch); }, sp.t0, sp.t1, nch,
                   xq, xds, K, cv, cnt, nullptr, flags);
    if (ah.n > 0) {
        __syncwarp();
        ahead_requests(ah, blockIdx.x * 4 + threadIdx.x / WARP, gridDim.x * 4);
    }
}

#ifndef __CUDACC_RTC__
int main() {
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    int l2;
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    const int NL = 8, LAYERS = 52;
    const size_t bq = BQ, bo = BO, bg = BG, bd = BD;
    const double layer_bytes = (double)(bq + bo + 2 * bg + bd);
    printf("%d SMs, L2 %.1f MB; a layer reads %.1f MB (q+k+v %.1f, attn_output %.1f, gate+up %.1f, ffn_down %.1f)\n",
           sms, l2 / 1e6, layer_bytes / 1e6, bq / 1e6, bo / 1e6, 2 * bg / 1e6, bd / 1e6);
    const std::vector<LayerW> lw = upload_layers(NL);
    int8_t* xq;
    float2* xds;
    random_act(KF, &xq, &xds);
    float *ys[2][4], *sout;
    for (int v = 0; v < 2; ++v)
        for (int i = 0; i < 4; ++i) {
            CK(cudaMalloc(&ys[v][i], KF * sizeof(float)));
            CK(cudaMemset(ys[v][i], 0, KF * sizeof(float)));
        }
    CK(cudaMalloc(&sout, KF * sizeof(float)));
    float* cv;
    unsigned* cnt;
    CK(cudaMalloc(&cv, (size_t)2 * KF * 16 * sizeof(float)));
    CK(cudaMalloc(&cnt, 2 * KF / 4 * sizeof(unsigned)));
    CK(cudaMemset(cnt, 0, 2 * KF / 4 * sizeof(unsigned)));

    const ChainGrids grids = chain_grids(sms);
    const int gq = grids.q, go = grids.o, gg = grids.g, gd = grids.d;
    const unsigned Tg = (unsigned)(KF / 4) * 2 * kq_chunks_host(KD);
    printf("grids (blocks of 4 warps): q+k+v %d, attn_output %d, gate+up %d (%.1f tasks a warp), ffn_down %d\n", gq, go,
           gg, (double)Tg / (gg * 4), gd);

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    StreamTimer timer(st);
    auto time_it = [&](auto&& run, int reps) { return timer.ms(run, reps); };

    // One graph of the chain: per layer q+k+v (asking for n tasks of each gate+up warp), small,
    // attn_output (asking for the next m), small, gate+up, small, ffn_down, small.
    auto chain_ms = [&](int v, bool small, int n, int m, int mode) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        auto mv = [&](const uint8_t* w, float* y, int rows, int K, int grid, Ahead ah) {
            launch_pdl(mvk_1_ahead, grid, 128, st, q4k_job(w, y, rows), (const int8_t*)xq, (const float2*)xds, K, cv, cnt, 0, ah);
        };
        auto sm = [&](const float* y, int len) {
            if (small) launch_pdl(small_k, 1, 128, st, y, sout, std::min(len, 6656));
        };
        for (int l = 0; l < LAYERS; ++l) {
            const LayerW& w = lw[l % NL];
            const LayerW& wn = lw[l % NL]; // this layer's FFN
            const Ahead none{nullptr, nullptr, KF, KD, gg * 4, 0, 0, mode};
            Ahead aq = none, ao = none;
            aq.wg = ao.wg = wn.g;
            aq.wu = ao.wu = wn.u;
            aq.n = n;
            ao.skip = n;
            ao.n = m;
            mv(w.q, ys[v][0], RQKV, KD, gq, aq);
            sm(ys[v][0], RQKV);
            mv(w.o, ys[v][1], KD, KO, go, ao);
            sm(ys[v][1], KD);
            launch_pdl(mvk_silu_1, gg, 128, st, (const uint8_t*)w.g, (int)FMT_Q4_K, (const uint8_t*)w.u, (int)FMT_Q4_K,
                       ys[v][2], KF, (const int8_t*)xq, (const float2*)xds, KD, cv, cnt, 0);
            sm(ys[v][2], KF);
            mv(w.d, ys[v][3], KD, KF, gd, none);
            sm(ys[v][3], KD);
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        const float ms = time_it([&] { CK(cudaGraphLaunch(ge, st)); }, 10);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        return ms * 1000.0 / LAYERS;
    };
    auto same = [&] {
        int s = 1;
        for (int i = 0; i < 4; ++i) {
            std::vector<float> a(KF), b(KF);
            CK(cudaMemcpy(a.data(), ys[0][i], KF * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(b.data(), ys[1][i], KF * 4, cudaMemcpyDeviceToHost));
            if (memcmp(a.data(), b.data(), KF * 4) != 0) s = 0;
        }
        return s;
    };
    const double ideal = layer_bytes / 4.5e12 * 1e6;
    printf("the bytes at 4.5 TB/s: %.2f us a layer\n", ideal);
    struct Var {
        const char* name;
        bool small;
        int n, m, mode;
    } vars[] = {
        {"small ops, q+k+v asks 4 tasks a warp, lines", true, 4, 0, 1},
        {"small ops, q+k+v asks 8, lines", true, 8, 0, 1},
        {"small ops, q+k+v asks 12, lines", true, 12, 0, 1},
        {"small ops, q+k+v asks 8, lines evict_last", true, 8, 0, 2},
        {"small ops, q+k+v asks 4, bulk", true, 4, 0, 3},
        {"small ops, q+k+v asks 8, bulk", true, 8, 0, 3},
        {"small ops, q+k+v asks 12, bulk", true, 12, 0, 3},
        {"small ops, q+k+v 6 + attn_output 4, lines", true, 6, 4, 1},
        {"small ops, q+k+v 8 + attn_output 4, bulk", true, 8, 4, 3},
        {"no small ops, q+k+v asks 8, lines", false, 8, 0, 1},
        {"no small ops, q+k+v asks 8, bulk", false, 8, 0, 3},
    };
    for (int rep = 0; rep < 2; ++rep)
        for (const Var& v : vars) {
            const double base = chain_ms(0, v.small, 0, 0, 1);
            const double with = chain_ms(1, v.small, v.n, v.m, v.mode);
            const double base2 = chain_ms(0, v.small, 0, 0, 1);
            printf("%-48s %7.2f us a layer against %7.2f / %7.2f without (%+.2f); %s\n", v.name, with, base, base2,
                   with - 0.5 * (base + base2), same() ? "same bits" : "BITS DIFFER");
        }
    return 0;
}
#endif
