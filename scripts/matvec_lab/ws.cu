// Wide decode groups (issue 6) with the stages filled by bulk copies: lab run 25, then the
// check of the shipped kernels.
//
// mmt.cu's tiles (mmt_4, mmt_silu_4: 64 rows x 32 columns a block, 4 warps, two stages filled by
// every thread's cp.async copies, two barriers a super-block) spend ~100 of a warp's ~684
// instructions a super-block on the copies and their addresses, and Nsight Compute found the
// warps waiting on those copies (long scoreboard, MIO throttle, barriers: ~30% of samples).
// mmt.cu's mmw_* run the same arithmetic (kq_mma.cuh, mmt.cu's chunk trees, so the same bits)
// on stages filled by the copy engine: per super-block 16 bulk copies of a row quad's 4 blocks
// (one contiguous run in the resident layout; Q6_K 32, its quants and scales planes) and one of
// the column tile's activation, which mmw_pack lays out as the stage wants it. Three stages with
// an mbarrier each counting the bytes ("full") and one counting the 4 warps done with it
// ("empty"); a stage's refill is issued by one warp (turn by turn) once every warp is done with
// it. (Run 25 itself had its own copy of those kernels here: one job, 32-column tiles, Q4_K and
// Q5_K, the activation laid out by the host; the same code otherwise.)
//
// Prints, per case, us per launch and GB/s of mmt_* and mmw_* (and of mmw_pack), and whether
// every output of mmw_* equals mmt_*'s bit for bit. Weights are random K-quant blocks in the
// resident layout, rotated over copies so that L2 does not serve them. On the device:
//   bash scripts/matvec_lab/run_ws.sh
#include "lab_host.h"
#include <cstdint>
#include <cuda_fp16.h>

#include "../../crates/muser-cuda/kernels/common.cuh"
#include "../../crates/muser-cuda/kernels/kq_mma.cuh"
#include "../../crates/muser-cuda/kernels/mmt.cu"

// ------------------------------------------------------------------------------------------------
// Host.

// Random blocks in the resident layout with small halves for the scales: Q4_K/Q5_K d and dmin
// at the start of each block; Q6_K's plane C (after the 192-byte quants and 16-byte scales
// planes of `blocks` blocks).
static void fill_blocks(std::vector<unsigned char>& b, int ty, size_t blocks, unsigned long long seed) {
    unsigned long long x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t o = 0; o + 8 <= b.size(); o += 8) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        memcpy(&b[o], &x, 8);
    }
    if (ty == FMT_Q6_K) {
        for (size_t i = 0; i < blocks; ++i) {
            b[blocks * 208 + 2 * i] = 0x00;
            b[blocks * 208 + 2 * i + 1] = 0x18;
        }
        return;
    }
    const int bs = ty == FMT_Q5_K ? 176 : 144;
    for (size_t o = 0; o + bs <= b.size(); o += bs) {
        b[o] = 0x00; b[o + 1] = 0x20;
        b[o + 2] = 0x00; b[o + 3] = 0x1C;
    }
}

struct Acts {
    int8_t* xq; float2* xds; int8_t* xbs; uint8_t* blob;
};

// Random activations of n columns (K values each) in the Q8_K layouts mmt_* reads, and room for
// mmw_pack's regions (24- or 32-column tiles: the larger).
static Acts make_acts(int K, int n) {
    const int nb = K / 256, tiles = (n + 23) / 24;
    std::vector<int8_t> q((size_t)n * K), bs((size_t)n * nb * 16);
    std::vector<float2> ds((size_t)n * (K / 32));
    for (auto& x : q) x = (int8_t)(rand() % 255 - 127);
    for (auto& x : bs) x = (int8_t)(rand() % 255 - 127);
    for (auto& x : ds) x = make_float2(0.001f + (rand() % 1000) * 1e-5f, 0.0f);
    Acts a;
    CK(cudaMalloc(&a.xq, q.size()));
    CK(cudaMalloc(&a.xds, ds.size() * sizeof(float2)));
    CK(cudaMalloc(&a.xbs, bs.size()));
    CK(cudaMalloc(&a.blob, (size_t)tiles * nb * mmw_xb(4)));
    CK(cudaMemcpy(a.xq, q.data(), q.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a.xds, ds.data(), ds.size() * sizeof(float2), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a.xbs, bs.data(), bs.size(), cudaMemcpyHostToDevice));
    return a;
}

static bool same_bits(const float* a, const float* b, size_t n, size_t* first) {
    std::vector<float> ha(n), hb(n);
    CK(cudaMemcpy(ha.data(), a, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), b, n * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i)
        if (memcmp(&ha[i], &hb[i], 4) != 0) {
            *first = i;
            return false;
        }
    return true;
}

int main() {
    for (auto f : {(const void*)mmw_4, (const void*)mmw_silu_4, (const void*)mmw_split_4})
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, mmw_smem(4)));
    for (auto f : {(const void*)mmw_3, (const void*)mmw_silu_3, (const void*)mmw_split_3})
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, mmw_smem(3)));
    printf("KQ_SCALED_MAX_NT %d, MMW_STAGES %d\n", KQ_SCALED_MAX_NT, MMW_STAGES);
    int occ_t = 0, occ_w = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_t, mmt_4, 128, 0));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_w, mmw_4, 128, mmw_smem(4)));
    printf("blocks per SM: mmt_4 %d, mmw_4 %d (smem %d B)\n", occ_t, occ_w, mmw_smem(4));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    struct Case { const char* name; int ty; int rows; int K; int n; bool silu; int splits; };
    const Case cases[] = {
        {"gate+up+SiLU Q4_K 2x19968x6656", FMT_Q4_K, 19968, 6656, 32, true, 1},
        {"gate+up+SiLU Q4_K 2x19968x6656", FMT_Q4_K, 19968, 6656, 24, true, 1},
        {"gate+up+SiLU Q4_K 2x19968x6656", FMT_Q4_K, 19968, 6656, 48, true, 1},
        {"ffn_up Q5_K 19968x6656", FMT_Q5_K, 19968, 6656, 32, false, 1},
        {"attn_q Q4_K 4096x6656 (odd rows)", FMT_Q4_K, 4100, 6656, 32, false, 1},
        {"ffn_down Q4_K 6656x19968, 7 splits", FMT_Q4_K, 6656, 19968, 32, false, 7},
        {"ffn_down Q5_K 6656x19968, 7 splits", FMT_Q5_K, 6656, 19968, 32, false, 7},
        {"ffn_down Q6_K 6656x19968, 7 splits", FMT_Q6_K, 6656, 19968, 32, false, 7},
        {"ffn_down Q6_K 6656x19968, 7 splits", FMT_Q6_K, 6656, 19968, 20, false, 7},
        {"gate+up+SiLU Q6_K 2x4096x6656", FMT_Q6_K, 4096, 6656, 32, true, 1},
        {"attn_v Q6_K 1028x6656 (odd rows)", FMT_Q6_K, 1028, 6656, 32, false, 1},
        {"q+k+v Q4_K 5120x6656, 5 splits", FMT_Q4_K, 5120, 6656, 32, false, 5},
        {"attn_output Q4_K 6656x4096, 3 splits", FMT_Q4_K, 6656, 4096, 32, false, 3},
        {"attn_output Q4_K 6656x4096, 3 splits", FMT_Q4_K, 6656, 4096, 20, false, 3},
    };
    printf("%-38s %5s %10s %9s %10s %9s %6s %8s %s\n", "case", "cols", "mmt us", "GB/s", "mmw us", "GB/s", "x",
           "pack us", "bits");
    for (const Case& c : cases) {
        const int bs = c.ty == FMT_Q6_K ? 210 : c.ty == FMT_Q5_K ? 176 : 144, nb = c.K / 256;
        const int nt = (c.n + 23) / 24 * 3 < (c.n + 31) / 32 * 4 ? 3 : 4, bn = 8 * nt;
        const size_t mbytes = (size_t)((c.rows + 3) & ~3) * nb * bs;
        const int mats = c.silu ? 2 : 1;
        const int copies = (int)std::max<size_t>(2, (size_t)400e6 / (mbytes * mats) + 1);
        std::vector<uint8_t*> w(copies * mats);
        std::vector<unsigned char> h(mbytes);
        for (size_t i = 0; i < w.size(); ++i) {
            fill_blocks(h, c.ty, mbytes / bs, 77 + i);
            CK(cudaMalloc(&w[i], mbytes));
            CK(cudaMemcpy(w[i], h.data(), mbytes, cudaMemcpyHostToDevice));
        }
        const Acts a = make_acts(c.K, c.n);
        float *yt, *yw;
        CK(cudaMalloc(&yt, (size_t)c.n * c.rows * 4));
        CK(cudaMalloc(&yw, (size_t)c.n * c.rows * 4));
        const dim3 grid((c.n + bn - 1) / bn, (c.rows + 63) / 64, c.splits);
        const int C = (c.K / 256 + 3) / 4, tiles = grid.x * grid.y;
        float *cvt, *cvw;
        unsigned *cntt, *cntw;
        CK(cudaMalloc(&cvt, (size_t)tiles * C * 16 * 128 * 4));
        CK(cudaMalloc(&cvw, (size_t)tiles * C * 16 * 128 * 4));
        CK(cudaMalloc(&cntt, tiles * 4));
        CK(cudaMalloc(&cntw, tiles * 4));
        CK(cudaMemset(cntt, 0, tiles * 4));
        CK(cudaMemset(cntw, 0, tiles * 4));
        auto jobs = [&](const uint8_t* wm, float* y) {
            MatvecJobs j{};
            j.w[0] = wm; j.y[0] = y; j.rows[0] = c.rows; j.ty[0] = c.ty;
            j.start[0] = 0; j.njobs = 1;
            for (int u = 1; u < 5; ++u) j.start[u] = (c.rows + 63) / 64 * 64;
            return j;
        };
        auto pack = [&]() { mmw_pack<<<dim3(nb, grid.x), 128>>>(a.xq, a.xds, a.xbs, c.K, c.n, nt, a.blob); };
        auto run_t = [&](int i) {
            if (c.silu) {
                auto k = nt == 3 ? mmt_silu_3 : mmt_silu_4;
                k<<<grid, 128>>>(w[2 * i], c.ty, w[2 * i + 1], c.ty, yt, c.rows, a.xq, a.xds, a.xbs, c.K, c.n, 0);
            } else if (c.splits > 1) {
                auto k = nt == 3 ? mmt_split_3 : mmt_split_4;
                k<<<grid, 128>>>(jobs(w[i], yt), a.xq, a.xds, a.xbs, c.K, c.n, 0, cvt, cntt);
            } else {
                auto k = nt == 3 ? mmt_3 : mmt_4;
                k<<<grid, 128>>>(jobs(w[i], yt), a.xq, a.xds, a.xbs, c.K, c.n, 0);
            }
        };
        auto run_w = [&](int i) {
            const int sm = mmw_smem(nt);
            if (c.silu) {
                auto k = nt == 3 ? mmw_silu_3 : mmw_silu_4;
                k<<<grid, 128, sm>>>(w[2 * i], c.ty, w[2 * i + 1], c.ty, yw, c.rows, a.blob, c.K, c.n);
            } else if (c.splits > 1) {
                auto k = nt == 3 ? mmw_split_3 : mmw_split_4;
                k<<<grid, 128, sm>>>(jobs(w[i], yw), a.blob, c.K, c.n, cvw, cntw);
            } else {
                auto k = nt == 3 ? mmw_3 : mmw_4;
                k<<<grid, 128, sm>>>(jobs(w[i], yw), a.blob, c.K, c.n);
            }
        };
        pack();
        run_t(0);
        run_w(0);
        CK(cudaDeviceSynchronize());
        size_t first = 0;
        const bool ok = same_bits(yt, yw, (size_t)c.n * c.rows, &first);
        double ms[3] = {0, 0, 0};
        const int reps = 30;
        for (int round = 0; round < 2; ++round)
            for (int v = 0; v < 3; ++v) {
                CK(cudaEventRecord(e0));
                for (int r = 0; r < reps; ++r) {
                    if (v == 2) pack();
                    else if (v) run_w(r % copies);
                    else run_t(r % copies);
                }
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float t;
                CK(cudaEventElapsedTime(&t, e0, e1));
                if (round == 1) ms[v] = t / reps;
            }
        const double gb = (double)mbytes * mats / 1e9;
        printf("%-38s %5d %10.2f %9.1f %10.2f %9.1f %6.2f %8.2f %s", c.name, c.n, ms[0] * 1e3, gb / (ms[0] * 1e-3),
               ms[1] * 1e3, gb / (ms[1] * 1e-3), ms[0] / ms[1], ms[2] * 1e3, ok ? "=" : "DIFFER");
        if (!ok) printf(" (first at %zu)", first);
        printf("\n");
        CK(cudaGetLastError());
        for (auto p : w) CK(cudaFree(p));
        CK(cudaFree(yt)); CK(cudaFree(yw));
        CK(cudaFree(cvt)); CK(cudaFree(cvw)); CK(cudaFree(cntt)); CK(cudaFree(cntw));
        CK(cudaFree(a.xq)); CK(cudaFree(a.xds)); CK(cudaFree(a.xbs)); CK(cudaFree(a.blob));
    }
    return 0;
}
