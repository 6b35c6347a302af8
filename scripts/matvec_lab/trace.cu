// Where a one-column launch spends its time (issue 5): per-warp timestamps (%globaltimer) of
// mvk_silu_1 (gate+up+SiLU, Q4_K 2 x 19968 x 6656), mvk_1 (ffn_down, Q4_K 6656 x 19968) and mvk_1
// over a matrix as large as the LM head (Q4_K 202048 x 6656), the shipped kernels of
// crates/muser-cuda/kernels/matvec.cu with its MVK_TRACE hook defined: each warp's entry, the
// end of its wait, the end of each round and of its loop. Weights are random bytes in the
// resident layout (timing only; every weight copy is rotated so L2 does not serve them).
// Prints, per case: the event-timed launch (GB/s), then the spread of the warps' phases and the
// rounds' durations. Build and run on the device:
//   nvcc -O3 -arch=sm_90 -o /tmp/trace scripts/matvec_lab/trace.cu && /tmp/trace
#include "lab_host.h"

__device__ unsigned long long* g_trace; // [warp][32]: points 0 .. 31

// Points 0 (entry), 1 (wait done), 2 + r (round r done; rounds past 26 only in slot 29), 29 (the
// last round done), 30 (the loop done).
#define MVK_TRACE(point, dep)                                                                          \
    do {                                                                                                \
        if (g_trace && (threadIdx.x & 31) == 0) {                                                       \
            unsigned long long t_;                                                                      \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_) : "f"((float)(dep)) : "memory");     \
            unsigned long long* g_ = g_trace + (size_t)(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 32; \
            const int p_ = (point);                                                                     \
            if (p_ < 2 || p_ == 30) g_[p_] = t_;                                                        \
            else {                                                                                      \
                if (p_ < 29) g_[p_] = t_;                                                               \
                g_[29] = t_;                                                                            \
            }                                                                                           \
        }                                                                                               \
    } while (0)

#include "../../crates/muser-cuda/kernels/common.cuh"
#include "../../crates/muser-cuda/kernels/matvec.cu"

__global__ void smid_of_warps(unsigned* out) {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    if ((threadIdx.x & 31) == 0) out[blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32] = s;
}

static void pct(const char* what, std::vector<double> v) {
    if (v.empty()) return;
    std::sort(v.begin(), v.end());
    auto at = [&](double p) { return v[(size_t)(p * (v.size() - 1))]; };
    printf("  %-34s min %7.2f  p10 %7.2f  p50 %7.2f  p90 %7.2f  max %7.2f us\n", what, at(0), at(0.1), at(0.5),
           at(0.9), at(1));
}

int main() {
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int K1 = 6656, K2 = 19968;
    // Activation (largest K), its scales; scratch.
    int8_t* xq;
    float2* xds;
    random_act(K2, &xq, &xds);
    float *cv, *y;
    unsigned* cnt;
    CK(cudaMalloc(&cv, (size_t)202048 * 8 * sizeof(float)));
    CK(cudaMemset(cv, 0, (size_t)202048 * 8 * sizeof(float)));
    CK(cudaMalloc(&cnt, 202048 / 4 * sizeof(unsigned)));
    CK(cudaMemset(cnt, 0, 202048 / 4 * sizeof(unsigned)));
    CK(cudaMalloc(&y, 202048 * sizeof(float)));
    unsigned long long* tr;
    CK(cudaMalloc(&tr, (size_t)sms * 16 * 32 * 8));
    unsigned* smid;
    CK(cudaMalloc(&smid, sms * 16 * sizeof(unsigned)));

    struct Case {
        const char* name;
        int rows, K, silu;
    } cases[] = {{"gate+up+SiLU Q4_K 2 x 19968 x 6656", 19968, K1, 1},
                 {"ffn_down Q4_K 6656 x 19968", 6656, K2, 0},
                 {"attn_q+gate-sized Q4_K 8704 x 6656", 8704, K1, 0},
                 {"LM-head-sized Q4_K 202048 x 6656", 202048, K1, 0}};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (const Case& c : cases) {
        const size_t mbytes = (size_t)c.rows * (c.K / 256) * 144; // rows a multiple of 4 here
        const size_t per_launch = mbytes * (c.silu ? 2 : 1);
        const int copies = (int)std::max<size_t>(1, std::min<size_t>(8, 600000000 / per_launch + 1));
        std::vector<unsigned char*> w(copies * 2);
        std::vector<unsigned char> h(mbytes);
        for (int i = 0; i < copies * 2; ++i) {
            if (!c.silu && (i & 1)) { w[i] = nullptr; continue; }
            fill_q4k(h, 7 + i);
            CK(cudaMalloc(&w[i], mbytes));
            CK(cudaMemcpy(w[i], h.data(), mbytes, cudaMemcpyHostToDevice));
        }
        const int nch = (c.K / 256 + 3) / 4;
        const long quads = (c.rows + 3) / 4;
        const int blocks = mvk_blocks(quads, (c.silu ? 2 : 1) * nch, sms);
        auto launch = [&](int i) {
            if (c.silu) {
                mvk_silu_1<<<blocks, 128>>>(w[2 * i], FMT_Q4_K, w[2 * i + 1], FMT_Q4_K, y, c.rows, xq, xds, c.K, cv,
                                            cnt, 0);
            } else {
                MatvecJobs j{};
                j.w[0] = w[2 * i];
                j.y[0] = y;
                j.rows[0] = c.rows;
                j.ty[0] = FMT_Q4_K;
                j.start[0] = 0;
                j.start[1] = (int)(quads * 4);
                j.njobs = 1;
                mvk_1<<<blocks, 128>>>(j, xq, xds, c.K, cv, cnt, 0);
            }
        };
        unsigned long long* none = nullptr;
        CK(cudaMemcpyToSymbol(g_trace, &none, sizeof(none)));
        for (int i = 0; i < copies; ++i) launch(i);
        const int reps = 24;
        CK(cudaEventRecord(e0));
        for (int r = 0; r < reps; ++r) launch(r % copies);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = ms * 1000.0 / reps;
        printf("%s: %d blocks, %.1f MB, %.2f us per launch back to back = %.0f GB/s\n", c.name, blocks,
               per_launch / 1e6, us, per_launch / us / 1e3);
        // One traced launch (after one untraced launch of another copy, so L2 holds none of it).
        CK(cudaMemset(tr, 0, (size_t)sms * 16 * 32 * 8));
        CK(cudaMemcpyToSymbol(g_trace, &tr, sizeof(tr)));
        launch(copies > 1 ? 1 : 0);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpyToSymbol(g_trace, &none, sizeof(none)));
        launch(0);
        CK(cudaMemset(tr, 0, (size_t)sms * 16 * 32 * 8));
        CK(cudaMemcpyToSymbol(g_trace, &tr, sizeof(tr)));
        launch(copies > 1 ? 1 : 0);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpyToSymbol(g_trace, &none, sizeof(none)));
        smid_of_warps<<<blocks, 128>>>(smid);
        CK(cudaDeviceSynchronize());
        const int nw = blocks * 4;
        std::vector<unsigned long long> t((size_t)nw * 32);
        CK(cudaMemcpy(t.data(), tr, t.size() * 8, cudaMemcpyDeviceToHost));
        unsigned long long t0 = ~0ull, tend = 0;
        for (int wv = 0; wv < nw; ++wv) {
            if (t[wv * 32] && t[wv * 32] < t0) t0 = t[wv * 32];
            if (t[wv * 32 + 30] > tend) tend = t[wv * 32 + 30];
        }
        std::vector<double> entry, waited, first, last_round, done, rdur, rdur_mid, gap_end;
        for (int wv = 0; wv < nw; ++wv) {
            const unsigned long long* p = &t[wv * 32];
            if (!p[0]) continue;
            entry.push_back((p[0] - t0) / 1e3);
            waited.push_back((p[1] - t0) / 1e3);
            if (p[2]) first.push_back((p[2] - t0) / 1e3);
            int nr = 0;
            for (int r = 2; r < 29 && p[r]; ++r) nr = r - 1;
            if (p[29]) last_round.push_back((p[29] - t0) / 1e3);
            done.push_back((p[30] - t0) / 1e3);
            if (p[29]) gap_end.push_back((p[30] - p[29]) / 1e3);
            for (int r = 3; r < 29 && p[r]; ++r) {
                rdur.push_back((p[r] - p[r - 1]) / 1e3);
                if (r > 4 && r + 2 < 29 && p[r + 2]) rdur_mid.push_back((p[r] - p[r - 1]) / 1e3);
            }
            (void)nr;
        }
        printf(" traced launch: first entry to last warp done %.2f us (%d warps, rounds per warp up to %d)\n",
               (tend - t0) / 1e3, nw, 27);
        pct("warp entry", entry);
        pct("wait done (after prefetch, pdl)", waited);
        pct("first round done", first);
        pct("round duration (2nd on)", rdur);
        pct("round duration (mid rounds)", rdur_mid);
        pct("last round done", last_round);
        pct("after the loop (shared quads)", gap_end);
        pct("warp done", done);
        // Per SM: when its last warp ends.
        std::vector<unsigned> sm(nw);
        CK(cudaMemcpy(sm.data(), smid, nw * sizeof(unsigned), cudaMemcpyDeviceToHost));
        std::vector<double> smend(sms, 0.0), smstart(sms, 1e30);
        for (int wv = 0; wv < nw; ++wv) {
            if (!t[wv * 32]) continue;
            // The smid launch may map blocks to other SMs than the traced one: a rough picture only.
            const unsigned s = sm[wv] % sms;
            smend[s] = std::max(smend[s], (t[wv * 32 + 30] - t0) / 1e3);
            smstart[s] = std::min(smstart[s], (t[wv * 32] - t0) / 1e3);
        }
        std::vector<double> se;
        for (int s = 0; s < sms; ++s)
            if (smend[s] > 0) se.push_back(smend[s]);
        pct("SM's last warp done (smid rough)", se);
        for (auto p : w)
            if (p) CK(cudaFree(p));
    }
    return 0;
}
