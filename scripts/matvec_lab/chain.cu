// Does a persistent decode step pay (issue 5)? The matvec chain of 52 Glimmer-shaped layers
// (Q4_K: q+k+v 4608 x 6656, attn_output 6656 x 4096, gate+up+SiLU 2 x 19968 x 6656, ffn_down
// 6656 x 19968; 257 MB a layer, 8 distinct layers cycled so that L2 serves none of it), with or
// without a one-block "small op" after each matvec (an RMS norm of 6656 values, standing in for
// the norms, qkv_rows and the attention), run over the same device code (mvk_warp of
// crates/muser-cuda/kernels/matvec.cu; the same warp ranges, so the same bits, checked against A
// at the end of every variant):
//   A: as the engine does: one launch per matvec and per small op, programmatic dependent launches
//      in one CUDA graph (the matvecs ask L2 for their first round before their wait); also each
//      op type alone, 52 chained launches of it;
//   C: A's launches, the warps' static ranges covering part of the tasks and the rest claimed a
//      round at a time from a counter (a dynamic tail, dyn_mv);
//   B: one cooperative launch for the whole chain, 4 blocks of 4 warps per SM, a grid-wide
//      counter between ops (mode bits: arrivals per warp or per block, one or eight counters,
//      pollers sleeping or spinning, the op's warps spread over the SMs by %smid), the small op
//      run by block 0 while the other blocks wait on its flag; before waiting, a warp does
//      nothing (B0) or asks L2 for its next range's first round (B1); a timeline of each op's end.
// Two more variants were measured and then removed (they needed a copy of mvk_warp's round; see
// commit 6d56ddd): the next op's first round loaded into registers before the barrier (B2), and
// a dataflow launch without barriers, each round waiting for the rows of its input chunk (DF).
// Results (H200, 2026-12-02, seven runs; BENCHMARKS.md has the tables): us per layer, bytes at
// the read bandwidth 56-57; A without small ops 80.2-80.9, with 117.8-118.8; B without small ops
// 86.2-90.8 whatever the barrier (B2 96-99), with 125-128; DF 111-117; C 84.4 (100% static) to
// 107.3 (70%). No persistent, dataflow or dynamic variant beat the launches.
// Prints ms per 52 layers, GB/s and % of the read bandwidth measured in the same run, and
// whether every variant's outputs equal A's bit for bit. Weights are random bytes (timing only).
// Build and run on the device: bash scripts/matvec_lab/run_chain.sh (~30 s)
#ifndef __CUDACC_RTC__
#include "lab_host.h"
#endif

#include "../../crates/muser-cuda/kernels/common.cuh"
#include "../../crates/muser-cuda/kernels/matvec.cu"
#include "lab_chain.cuh"


struct Op {
    const uint8_t* w;  // weights (gate for SiLU)
    const uint8_t* wu; // up (SiLU)
    float* y;
    float* small_out;  // the small op's output (its input is y)
    int rows, K, silu, W; // W: the warps that share the op's tasks (the launch's in A)
};


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

// Mode bits: 1 = ask L2 for the next range's first round before the wait (B1), 4 = small ops;
// the grid barrier: 8 = one arrival per block (else per warp), 16 = eight arrival counters (else
// one), 32 = pollers spin without sleeping.
// tl (if not null): when each op's last warp arrived, as block 0 saw it (%globaltimer, ns).
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
        if (o > 0) wait_all(arrived, (mode & 4) ? smalls : 0u); // the previous op (and its small op) done
        if (t0 < t1) {
            if (op.silu) {
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
int main() {
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int NL = 8, LAYERS = 52;
    const size_t bq = BQ, bo = BO, bg = BG, bd = BD;
    const double layer_bytes = (double)(bq + bo + 2 * bg + bd);
    printf("%d SMs; a layer reads %.1f MB (q+k+v %.1f, attn_output %.1f, gate+up %.1f, ffn_down %.1f)\n", sms,
           layer_bytes / 1e6, bq / 1e6, bo / 1e6, 2 * bg / 1e6, bd / 1e6);
    const std::vector<LayerW> lw = upload_layers(NL);
    int8_t* xq;
    float2* xds;
    random_act(KF, &xq, &xds);
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

    const ChainGrids grids = chain_grids(sms);
    const int gq = grids.q, go = grids.o, gg = grids.g, gd = grids.d;
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
    StreamTimer timer(st);
    auto time_it = [&](auto&& run, int reps) { return timer.ms(run, reps); };

    // Read bandwidth: 4 GiB in one pass.
    const double bw = read_bandwidth(timer, sms);
    printf("read bandwidth: %.1f GB/s; the chain's bytes at that rate: %.3f ms per %d layers\n", bw,
           layer_bytes * LAYERS / bw / 1e6, LAYERS);
    auto report = [&](const char* name, float ms) {
        const double gbs = layer_bytes * LAYERS / (ms * 1e-3) / 1e9;
        printf("%-62s %8.3f ms  %7.1f GB/s  %5.1f%%  (%.2f us a layer)\n", name, ms, gbs, 100.0 * gbs / bw,
               ms * 1000.0 / LAYERS);
    };

    // A: launches with programmatic dependencies, in one graph; with and without the small ops;
    // then each op type alone (52 launches of it chained).
    const char* tyname[4] = {"q+k+v", "attn_output", "gate+up", "ffn_down"};
    unsigned* claim;
    CK(cudaMalloc(&claim, 4));
    CK(cudaMemset(claim, 0, 4));
    // The ops captured into one graph of programmatic launches and timed: spm 0 the engine's
    // kernels (A), else dyn_mv with that static share (C); small, a small op after each.
    auto graph_dyn_ms = [&](const std::vector<Op>& ops, bool small, int spm) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (const Op& op : ops) {
            if (spm && op.silu) {
                launch_pdl(dyn_mv<true>, op.W / 4, 128, st, op, (const int8_t*)xq, (const float2*)xds, cv, cnt, claim, spm);
            } else if (spm) {
                launch_pdl(dyn_mv<false>, op.W / 4, 128, st, op, (const int8_t*)xq, (const float2*)xds, cv, cnt, claim, spm);
            } else if (op.silu) {
                launch_pdl(mvk_silu_1, gg, 128, st, op.w, (int)FMT_Q4_K, op.wu, (int)FMT_Q4_K, op.y, op.rows,
                           (const int8_t*)xq, (const float2*)xds, op.K, cv, cnt, 0);
            } else {
                launch_pdl(mvk_1, op.W / 4, 128, st, q4k_job(op.w, op.y, op.rows), (const int8_t*)xq, (const float2*)xds, op.K, cv, cnt, 0);
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
    auto graph_ms = [&](const std::vector<Op>& ops, bool small) { return graph_dyn_ms(ops, small, 0); };
    // Bits against A's outputs (the last layer's four matvecs).
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
    {
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, chain_persist, 128, 0));
        cudaFuncAttributes fa;
        CK(cudaFuncGetAttributes(&fa, chain_persist));
        printf("chain_persist: %d registers, %zu bytes local, %d blocks per SM\n", fa.numRegs, fa.localSizeBytes, occ);
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
    } vars[] = {{"B- persistent, no small ops; per block, 1 counter, sleep", 8},
                {"B1- persistent, first round asked of L2 before the wait", 9},
                {"B1 persistent, small ops, L2 ahead", 13}};
    int vi = 1;
    for (const Var& v : vars) {
        const int slot = std::min(vi, NV - 1);
        const std::vector<Op> ops = ops_for(slot);
        CK(cudaMemcpy(dops, ops.data(), sizeof(Op) * ops.size(), cudaMemcpyHostToDevice));
        int nops = (int)ops.size(), mode = v.mode;
        const int8_t* xq_ = xq;
        const float2* xds_ = xds;
        unsigned long long* tl = nullptr;
        const void* f = (const void*)chain_persist;
        auto run = [&] {
            CK(cudaMemsetAsync(bar, 0, 1 << 20, st));
            void* args[] = {(void*)&dops, (void*)&nops, (void*)&xq_, (void*)&xds_, (void*)&cv, (void*)&cnt,
                            (void*)&bar, (void*)&mode, (void*)&tl};
            CK(cudaLaunchCooperativeKernel(f, dim3(sms * 4), dim3(128), args, 0, st));
        };
        const float ms = time_it(run, 10);
        report(v.name, ms);
        if (!(mode & 4)) { // the timeline: each op type's mean time from the last arrival before it
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
        printf("   outputs %s A's\n", same_as_a(slot) ? "bit-identical to" : "DIFFER from");
        ++vi;
    }
    return 0;
}
#endif
