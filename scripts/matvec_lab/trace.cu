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
#include <cmath>

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
            if (p_ == 0) {                                                                              \
                unsigned s_, w_;                                                                        \
                asm volatile("mov.u32 %0, %%smid;" : "=r"(s_));                                         \
                asm volatile("mov.u32 %0, %%warpid;" : "=r"(w_));                                       \
                g_[31] = s_ | ((unsigned long long)w_ << 32);                                           \
            }                                                                                           \
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
        int flags = 0; // the skew of the warps' shares (common.cuh: mvk_range) << 8
        auto launch = [&](int i) {
            if (c.silu) {
                mvk_silu_1<<<blocks, 128>>>(w[2 * i], FMT_Q4_K, w[2 * i + 1], FMT_Q4_K, y, c.rows, xq, xds, c.K, cv,
                                            cnt, flags);
            } else {
                MatvecJobs j{};
                j.w[0] = w[2 * i];
                j.y[0] = y;
                j.rows[0] = c.rows;
                j.ty[0] = FMT_Q4_K;
                j.start[0] = 0;
                j.start[1] = (int)(quads * 4);
                j.njobs = 1;
                mvk_1<<<blocks, 128>>>(j, xq, xds, c.K, cv, cnt, flags);
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
        // Run 24: the same launches with skewed shares (only on a grid of 4 blocks per SM), alternated;
        // needs mvk-skew.patch (which defines MVK_SKEW_SHIFT) applied to the kernels.
#ifdef MVK_SKEW_SHIFT
        if (blocks == 4 * sms) {
            printf("  run 24, us per launch by skew (per mille):");
            for (int rep = 0; rep < 2; ++rep)
                for (int sk : {0, 30, 45, 60, 80}) {
                    flags = sk << 8;
                    for (int i = 0; i < copies; ++i) launch(i);
                    CK(cudaEventRecord(e0));
                    for (int r = 0; r < reps; ++r) launch(r % copies);
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    float m2;
                    CK(cudaEventElapsedTime(&m2, e0, e1));
                    printf(" %d: %.2f", sk, m2 * 1000.0 / reps);
                }
            printf("\n");
            flags = 0;
        }
#endif
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
        // Run 56: the launch's read rate over its time. Each round that ends (points 2 .. 28) counts
        // a whole round's weights (2 tasks x 4 super-blocks x 4 rows x 144 bytes; a short chunk's
        // round counts whole, so this slightly over-counts K = 6656), binned by 1 us from the first
        // warp's entry; the steady rate is the median of the bins between the first and last 15%.
        {
            const double rb = 2.0 * 4 * 4 * 144;
            const int nbin = (int)((tend - t0) / 1000) + 1;
            std::vector<double> bins(nbin, 0.0);
            double total = 0;
            for (int wv = 0; wv < nw; ++wv)
                for (int r = 2; r < 29; ++r) {
                    const unsigned long long x = t[wv * 32 + r];
                    if (!x) break;
                    bins[std::min(nbin - 1, (int)((x - t0) / 1000))] += rb;
                    total += rb;
                }
            printf("  run 56: read rate by microsecond (GB/s):");
            for (int i = 0; i < nbin; ++i) printf(" %.0f", bins[i] / 1e3);
            std::vector<double> mid(bins.begin() + nbin * 15 / 100, bins.begin() + nbin * 85 / 100);
            std::sort(mid.begin(), mid.end());
            const double steady = mid.empty() ? 0.0 : mid[mid.size() / 2] / 1e3;
            printf("\n  run 56: %.1f MB in %.2f us; steady %.0f GB/s, at which they take %.2f us: %.2f us of ramp and tail\n",
                   total / 1e6, (tend - t0) / 1e3, steady, total / steady / 1e3, (tend - t0) / 1e3 - total / steady / 1e3);
        }
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
        // Run 23: is the spread of the warps' ends systematic (the same warps or SMs late in every
        // launch) or random? Five more traced launches (each after an untraced one of another
        // copy); per warp its last round's time from the launch's first entry, and per SM (its
        // own %smid, recorded at entry) the mean over its warps; correlations between launches.
        {
            const int R = 5;
            std::vector<std::vector<double>> wend(R, std::vector<double>(nw, 0.0));
            std::vector<std::vector<double>> send(R, std::vector<double>(sms, 0.0));
            std::vector<std::vector<int>> scount(R, std::vector<int>(sms, 0));
            std::vector<std::vector<int>> wslot(R, std::vector<int>(nw, -1));
            for (int r = 0; r < R; ++r) {
                CK(cudaMemcpyToSymbol(g_trace, &none, sizeof(none)));
                launch(r % copies);
                CK(cudaMemset(tr, 0, (size_t)sms * 16 * 32 * 8));
                CK(cudaMemcpyToSymbol(g_trace, &tr, sizeof(tr)));
                launch((r + 1) % copies);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpyToSymbol(g_trace, &none, sizeof(none)));
                std::vector<unsigned long long> tt((size_t)nw * 32);
                CK(cudaMemcpy(tt.data(), tr, tt.size() * 8, cudaMemcpyDeviceToHost));
                unsigned long long tz = ~0ull;
                for (int wv = 0; wv < nw; ++wv)
                    if (tt[wv * 32] && tt[wv * 32] < tz) tz = tt[wv * 32];
                for (int wv = 0; wv < nw; ++wv) {
                    const unsigned long long* p = &tt[wv * 32];
                    if (!p[0] || !p[29]) continue;
                    const double e = (p[29] - p[1]) / 1e3; // from its own wait's end: rounds only
                    wend[r][wv] = e;
                    const unsigned s = (unsigned)(p[31] & 0xffffffffu) % sms;
                    wslot[r][wv] = (int)(p[31] >> 32);
                    send[r][s] += e;
                    scount[r][s] += 1;
                }
                for (int s = 0; s < sms; ++s)
                    if (scount[r][s]) send[r][s] /= scount[r][s];
            }
            auto corr = [](const std::vector<double>& a, const std::vector<double>& b) {
                double ma = 0, mb = 0;
                int n = 0;
                for (size_t i = 0; i < a.size(); ++i)
                    if (a[i] > 0 && b[i] > 0) { ma += a[i]; mb += b[i]; ++n; }
                if (n < 2) return 0.0;
                ma /= n;
                mb /= n;
                double sab = 0, saa = 0, sbb = 0;
                for (size_t i = 0; i < a.size(); ++i)
                    if (a[i] > 0 && b[i] > 0) {
                        sab += (a[i] - ma) * (b[i] - mb);
                        saa += (a[i] - ma) * (a[i] - ma);
                        sbb += (b[i] - mb) * (b[i] - mb);
                    }
                return sab / sqrt(saa * sbb + 1e-30);
            };
            printf("  run 23: correlation of the warps' round-loop times between launches (warp by warp / SM by SM):");
            for (int r = 1; r < R; ++r) printf(" %.2f / %.2f", corr(wend[0], wend[r]), corr(send[0], send[r]));
            printf("\n");
            // The per-SM mean over the launches: spread, and how much of the slowest warps' lateness
            // their SM explains.
            std::vector<double> sm_mean(sms, 0.0);
            for (int s = 0; s < sms; ++s) {
                for (int r = 0; r < R; ++r) sm_mean[s] += send[r][s];
                sm_mean[s] /= R;
            }
            pct("run 23: SM's mean warp loop time", sm_mean);
            std::vector<double> wl;
            for (int wv = 0; wv < nw; ++wv) {
                double m = 0;
                for (int r = 0; r < R; ++r) m += wend[r][wv];
                wl.push_back(m / R);
            }
            pct("run 23: warp's loop time, mean of 5", wl);
            std::vector<double> w0 = wend[0];
            pct("run 23: warp's loop time, one launch", w0);
            // What the slow warps share: their hardware warp slot (%warpid: scheduler SMSP = slot % 4,
            // the slot's age), their place in the block, their block's place, their range's place.
            {
                double by_slot[64] = {0}, n_slot[64] = {0}, by_wib[4] = {0}, n_wib[4] = {0};
                double by_blk4[4] = {0}, n_blk4[4] = {0}, by_pos[8] = {0}, n_pos[8] = {0};
                for (int r = 0; r < R; ++r)
                    for (int wv = 0; wv < nw; ++wv) {
                        const double e = wend[r][wv];
                        if (e <= 0 || wslot[r][wv] < 0) continue;
                        const int sl = wslot[r][wv] & 63;
                        by_slot[sl] += e, n_slot[sl] += 1;
                        by_wib[wv % 4] += e, n_wib[wv % 4] += 1;
                        by_blk4[(wv / 4) % 4] += e, n_blk4[(wv / 4) % 4] += 1;
                        const int ps = (int)((long)wv * 8 / nw);
                        by_pos[ps] += e, n_pos[ps] += 1;
                    }
                printf("  run 23: mean loop time by %%warpid (slot: us, warps):");
                for (int i = 0; i < 64; ++i)
                    if (n_slot[i] > 0) printf(" %d:%.1f(%d)", i, by_slot[i] / n_slot[i], (int)n_slot[i]);
                printf("\n  run 23: by warp in block:");
                for (int i = 0; i < 4; ++i) printf(" %.2f", by_wib[i] / std::max(1.0, n_wib[i]));
                printf("; by block %% 4:");
                for (int i = 0; i < 4; ++i) printf(" %.2f", by_blk4[i] / std::max(1.0, n_blk4[i]));
                printf("; by eighth of the matrix:");
                for (int i = 0; i < 8; ++i) printf(" %.2f", by_pos[i] / std::max(1.0, n_pos[i]));
                printf("\n");
            }
        }
        for (auto p : w)
            if (p) CK(cudaFree(p));
    }
    return 0;
}
