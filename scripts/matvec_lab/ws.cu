// Wide decode groups (issue 6) with the stages filled by bulk copies: lab run 25.
//
// mmt.cu's tiles (mmt_4, mmt_silu_4: 64 rows x 32 columns a block, 4 warps, two stages filled by
// every thread's cp.async copies, two barriers a super-block) spend ~100 of a warp's ~684
// instructions a super-block on the copies and their addresses, and Nsight Compute found the
// warps waiting on those copies (long scoreboard, MIO throttle, barriers: ~30% of samples). Here
// the same arithmetic (kq_mma.cuh's kq45_superblock, mmt.cu's chunk trees, so the same bits)
// reads stages filled by the copy engine: per super-block 16 bulk copies of a row quad's 4
// blocks (one contiguous run in the resident layout) and one of the column tile's activation,
// laid out by the host here (by the quantizer in the engine) as the stage wants it: 32 columns
// x 256 int8 with their 16-byte pieces swizzled so that the fragment loads are free of bank
// conflicts, then the 32 scales and the 32 split sums. Three stages with an mbarrier each
// counting the bytes ("full") and one counting the 4 warps done with it ("empty"); the refill of
// a stage is issued by one warp (turn by turn) as soon as every warp is done with it.
//
// Prints, per case, us per launch and GB/s of mmt_* and mmw_*, and whether every output of
// mmw_* equals mmt_*'s bit for bit. Weights are random Q4_K/Q5_K blocks in the resident layout,
// rotated over copies so that L2 does not serve them. Build and run on the device:
//   nvcc -O3 -std=c++17 -arch=sm_90a -Xptxas -v -o /tmp/ws scripts/matvec_lab/ws.cu && /tmp/ws
#include "lab_host.h"
#include <cstdint>
#include <cuda_fp16.h>

#include "../../crates/muser-cuda/kernels/common.cuh"
#include "../../crates/muser-cuda/kernels/kq_mma.cuh"
#include "../../crates/muser-cuda/kernels/mmt.cu"

#define MMW_STAGES 3
#define MMW_BN 32
// The activation region of one super-block of a 32-column tile: int8 values, scales, split sums.
#define MMW_XB (MMW_BN * 256 + MMW_BN * 4 + MMW_BN * 16)

template <int FMT>
__host__ __device__ constexpr int mmw_bs() {
    return FMT == FMT_Q5_K ? 176 : 144;
}
// A stage: 64 rows' blocks (16 quads of 4 blocks, each quad as in memory), then the activation.
#define MMW_STAGE (64 * 176 + MMW_XB)
#define MMW_SMEM (MMW_STAGES * MMW_STAGE + 64)

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile("{\n.reg .pred done;\nwait_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// Super-block b of the block's quads and column tile into the stage at `st` (shared address),
// by the calling warp: lane 0 arms the full barrier with the byte count, lanes 0..15 copy a quad
// each (quads past the matrix's padded rows are not copied: their outputs are never stored),
// lane 16 the activation.
template <int FMT>
__device__ __forceinline__ void mmw_issue(uint32_t st, uint32_t full, const uint8_t* __restrict__ w, int row0,
                                          int rows, int nb, const uint8_t* __restrict__ xt, int b) {
    constexpr int BS = mmw_bs<FMT>();
    const int lane = threadIdx.x % WARP;
    const int quads = min(16, (int)(kq_rows(rows) - row0) / 4);
    if (lane == 0) mbar_expect(full, (uint32_t)(quads * 4 * BS + MMW_XB));
    __syncwarp();
    if (lane < quads)
        bulk_copy(st + lane * 4 * BS, w + kq_blk(row0 + 4 * lane, nb, b) * BS, 4 * BS, full);
    else if (lane == 16)
        bulk_copy(st + 64 * BS, xt + (size_t)b * MMW_XB, MMW_XB, full);
}

// mmt_q45 on an mmw stage.
template <int NT, bool Q5, class CHUNK>
__device__ __forceinline__ void mmw_q45(const uint8_t* st, int k, bool last, CHUNK chunk, float (&lo)[NT][4],
                                        float (&hi)[NT][4]) {
    constexpr int BS = Q5 ? 176 : 144, QS = Q5 ? 48 : 16;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane >> 2, t = lane & 3;
    // Row 16 warp + g is block g & 3 of quad 4 warp + g / 4; row + 8 two quads on.
    const uint8_t* ba = st + (4 * warp + (g >> 2)) * 4 * BS + (g & 3) * BS;
    const uint8_t* bb = ba + 2 * 4 * BS;
    const uint8_t* sx = st + 64 * BS;
    const float* sd = (const float*)(sx + MMW_BN * 256);
    const int8_t* sbs = (const int8_t*)(sx + MMW_BN * 260);
    const uint4 ha = *(const uint4*)ba, hb = *(const uint4*)bb;
    float v[NT][4];
    uint2 xa = make_uint2(0, 0), xb = make_uint2(0, 0);
    if (Q5) {
        xa = *(const uint2*)(ba + 16 + 8 * t);
        xb = *(const uint2*)(bb + 16 + 8 * t);
    }
    const int swz = 2 * (g & 3), half = 8 * (t & 1), p0 = t >> 1;
    kq45_superblock<NT, Q5>(
        ha, hb, [&](int gi, int r) { return *(const uint2*)((r ? bb : ba) + QS + 32 * gi + 8 * t); }, xa, xb,
        [&](int nt, int s) {
            return *(const uint2*)(sx + (8 * nt + g) * 256 + (((2 * s + p0) ^ swz) << 4) + half);
        },
        [&](int nt) { return *(const int*)(sbs + (8 * nt + g) * 16 + 4 * t); },
        [&](int nt, int j) { return sd[8 * nt + 2 * t + j]; }, [&](int nt, int e, float x) { v[nt][e] = x; });
    mmt_leaves<NT>(k, last, v, lo, hi, chunk);
}

// y[nt][e] over the whole row (chunks in order), through the three stages. q0: how many
// super-blocks the block ran through its stages before this row (the barriers' phases count on).
template <int FMT, int NT>
__device__ __forceinline__ void mmw_sum(const uint8_t* __restrict__ w, int row0, int rows, int K,
                                        const uint8_t* __restrict__ xt, uint8_t* smem, int q0, float (&y)[NT][4]) {
    const int nb = K / QK_K, warp = threadIdx.x / WARP;
    const uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t bars = s0 + MMW_STAGES * MMW_STAGE; // full[3], then empty[3]
    float lo[NT][4], hi[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) y[nt][e] = lo[nt][e] = hi[nt][e] = 0.0f;
    // Super-block b is use (q0 + b) / 3 of stage (q0 + b) % 3: its full barrier's phase of that
    // parity, and the empty barrier's, complete once for it.
    if (warp == 0)
        for (int i = 0; i < MMW_STAGES && i < nb; ++i) {
            const int q = q0 + i;
            mmw_issue<FMT>(s0 + (q % MMW_STAGES) * MMW_STAGE, bars + 8 * (q % MMW_STAGES), w, row0, rows, nb, xt, i);
        }
#pragma unroll 1
    for (int b = 0; b < nb; ++b) {
        const int q = q0 + b, s = q % MMW_STAGES;
        // Super-block b + 2 into the stage super-block b - 1 used, once every warp is done with it.
        if (b >= 1 && b + MMW_STAGES - 1 < nb && warp == b % 4) {
            const int sp = (q - 1) % MMW_STAGES;
            mbar_wait(bars + 8 * (MMW_STAGES + sp), ((q - 1) / MMW_STAGES) & 1);
            mmw_issue<FMT>(s0 + sp * MMW_STAGE, bars + 8 * sp, w, row0, rows, nb, xt, b + MMW_STAGES - 1);
        }
        mbar_wait(bars + 8 * s, (q / MMW_STAGES) & 1);
        const int k = b % KQ_CHUNK;
        mmw_q45<NT, FMT == FMT_Q5_K>(smem + s * MMW_STAGE, k, b == nb - 1,
                                     [&](int nt, int e, float c) { y[nt][e] = kq_add(y[nt][e], c); }, lo, hi);
        __syncwarp();
        if (threadIdx.x % WARP == 0) mbar_arrive(bars + 8 * (MMW_STAGES + s));
    }
    // The next row (silu's up matrix) fills its first stages without waiting on their empty
    // barriers: every warp is done with this row first.
    __syncthreads();
}

__device__ __forceinline__ void mmw_init(uint8_t* smem) {
    const uint32_t bars = (uint32_t)__cvta_generic_to_shared(smem) + MMW_STAGES * MMW_STAGE;
    if (threadIdx.x == 0) {
        for (int i = 0; i < MMW_STAGES; ++i) {
            mbar_init(bars + 8 * i, 1);
            mbar_init(bars + 8 * (MMW_STAGES + i), 4);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}

template <int FMT>
__device__ __forceinline__ void mmw_sum_any(int ty, const uint8_t* w, int row0, int rows, int K, const uint8_t* xt,
                                            uint8_t* smem, int q0, float (&y)[4][4]) {
    if (ty == FMT_Q5_K) mmw_sum<FMT_Q5_K, 4>(w, row0, rows, K, xt, smem, q0, y);
    else mmw_sum<FMT_Q4_K, 4>(w, row0, rows, K, xt, smem, q0, y);
}

// One matrix (rows x K) times the 32-column tiles: grid (tiles, row blocks of 64).
extern "C" __global__ void __launch_bounds__(128, 3) mmw_4(const uint8_t* __restrict__ w, int ty, float* y, int rows,
                                                            const uint8_t* __restrict__ xblob, int K, int ncols) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int row0 = blockIdx.y * MMT_ROWS;
    if (row0 >= rows) return;
    mmw_init(smem);
    const uint8_t* xt = xblob + (size_t)blockIdx.x * (K / QK_K) * MMW_XB;
    float v[4][4];
    mmw_sum_any<0>(ty, w, row0, rows, K, xt, smem, 0, v);
    mmt_store<4>(y, rows, row0, blockIdx.x * MMW_BN, min(MMW_BN, ncols - (int)blockIdx.x * MMW_BN), v);
}

// Gate and up (both rows x K), then silu(gate) * up, as mmt_silu_kernel.
extern "C" __global__ void __launch_bounds__(128, 3)
    mmw_silu_4(const uint8_t* __restrict__ wg, int tyg, const uint8_t* __restrict__ wu, int tyu, float* y, int rows,
               const uint8_t* __restrict__ xblob, int K, int ncols) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int row0 = blockIdx.y * MMT_ROWS;
    if (row0 >= rows) return;
    mmw_init(smem);
    const uint8_t* xt = xblob + (size_t)blockIdx.x * (K / QK_K) * MMW_XB;
    float gs[4][4], us[4][4];
    mmw_sum_any<0>(tyg, wg, row0, rows, K, xt, smem, 0, gs);
    mmw_sum_any<0>(tyu, wu, row0, rows, K, xt, smem, K / QK_K, us);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) gs[nt][e] = gs[nt][e] / (1.0f + expf(-gs[nt][e])) * us[nt][e];
    mmt_store<4>(y, rows, row0, blockIdx.x * MMW_BN, min(MMW_BN, ncols - (int)blockIdx.x * MMW_BN), gs);
}

// ------------------------------------------------------------------------------------------------
// Host.

static void fill_blocks(std::vector<unsigned char>& b, int bs, unsigned long long seed) {
    unsigned long long x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t o = 0; o + 8 <= b.size(); o += 8) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        memcpy(&b[o], &x, 8);
    }
    for (size_t o = 0; o + bs <= b.size(); o += bs) {
        b[o] = 0x00; b[o + 1] = 0x20;
        b[o + 2] = 0x00; b[o + 3] = 0x1C;
    }
}

struct Acts {
    int8_t* xq; float2* xds; int8_t* xbs; uint8_t* blob;
};

// Random activations of n columns (K values each) in mmt's layouts and in the mmw blob.
static Acts make_acts(int K, int n) {
    const int nb = K / 256, tiles = (n + MMW_BN - 1) / MMW_BN;
    std::vector<int8_t> q((size_t)n * K), bs((size_t)n * nb * 16);
    std::vector<float2> ds((size_t)n * (K / 32));
    for (auto& x : q) x = (int8_t)(rand() % 255 - 127);
    for (auto& x : bs) x = (int8_t)(rand() % 255 - 127);
    for (auto& x : ds) x = make_float2(0.001f + (rand() % 1000) * 1e-5f, 0.0f);
    std::vector<uint8_t> blob((size_t)tiles * nb * MMW_XB, 0);
    for (int c = 0; c < n; ++c) {
        const int T = c / MMW_BN, cc = c % MMW_BN;
        for (int b = 0; b < nb; ++b) {
            uint8_t* r = &blob[((size_t)T * nb + b) * MMW_XB];
            for (int p = 0; p < 16; ++p)
                memcpy(r + cc * 256 + ((p ^ (2 * (cc & 3))) << 4), &q[(size_t)c * K + b * 256 + 16 * p], 16);
            memcpy(r + MMW_BN * 256 + cc * 4, &ds[(size_t)c * (K / 32) + 8 * b].x, 4);
            memcpy(r + MMW_BN * 260 + cc * 16, &bs[((size_t)c * nb + b) * 16], 16);
        }
    }
    Acts a;
    CK(cudaMalloc(&a.xq, q.size()));
    CK(cudaMalloc(&a.xds, ds.size() * sizeof(float2)));
    CK(cudaMalloc(&a.xbs, bs.size()));
    CK(cudaMalloc(&a.blob, blob.size()));
    CK(cudaMemcpy(a.xq, q.data(), q.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a.xds, ds.data(), ds.size() * sizeof(float2), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a.xbs, bs.data(), bs.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a.blob, blob.data(), blob.size(), cudaMemcpyHostToDevice));
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
    CK(cudaFuncSetAttribute(mmw_4, cudaFuncAttributeMaxDynamicSharedMemorySize, MMW_SMEM));
    CK(cudaFuncSetAttribute(mmw_silu_4, cudaFuncAttributeMaxDynamicSharedMemorySize, MMW_SMEM));
    int occ_t = 0, occ_w = 0, occ_ts = 0, occ_ws = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_t, mmt_4, 128, 0));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_w, mmw_4, 128, MMW_SMEM));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_ts, mmt_silu_4, 128, 0));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_ws, mmw_silu_4, 128, MMW_SMEM));
    printf("blocks per SM: mmt_4 %d, mmw_4 %d, mmt_silu_4 %d, mmw_silu_4 %d (stage %d B, smem %d B)\n", occ_t, occ_w,
           occ_ts, occ_ws, MMW_STAGE, MMW_SMEM);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    struct Case { const char* name; int ty; int rows; int K; int n; bool silu; };
    const Case cases[] = {
        {"gate+up+SiLU Q4_K 2x19968x6656", FMT_Q4_K, 19968, 6656, 32, true},
        {"gate+up+SiLU Q4_K 2x19968x6656", FMT_Q4_K, 19968, 6656, 24, true},
        {"ffn_up Q5_K 19968x6656", FMT_Q5_K, 19968, 6656, 32, false},
        {"attn_q Q4_K 4096x6656 (odd rows)", FMT_Q4_K, 4100, 6656, 32, false},
        {"ffn_down Q4_K 6656x19968", FMT_Q4_K, 6656, 19968, 32, false},
        {"ffn_down Q4_K 6656x19968, 64 cols", FMT_Q4_K, 6656, 19968, 64, false},
    };
    printf("%-38s %5s %10s %9s %10s %9s %6s %s\n", "case", "cols", "mmt us", "GB/s", "mmw us", "GB/s", "x", "bits");
    for (const Case& c : cases) {
        const int bs = c.ty == FMT_Q5_K ? 176 : 144, nb = c.K / 256;
        const size_t mbytes = (size_t)((c.rows + 3) & ~3) * nb * bs;
        const int mats = c.silu ? 2 : 1;
        const int copies = (int)std::max<size_t>(2, (size_t)400e6 / (mbytes * mats) + 1);
        std::vector<uint8_t*> w(copies * mats);
        std::vector<unsigned char> h(mbytes);
        for (size_t i = 0; i < w.size(); ++i) {
            fill_blocks(h, bs, 77 + i);
            CK(cudaMalloc(&w[i], mbytes));
            CK(cudaMemcpy(w[i], h.data(), mbytes, cudaMemcpyHostToDevice));
        }
        const Acts a = make_acts(c.K, c.n);
        float *yt, *yw;
        CK(cudaMalloc(&yt, (size_t)c.n * c.rows * 4));
        CK(cudaMalloc(&yw, (size_t)c.n * c.rows * 4));
        const dim3 grid((c.n + 31) / 32, (c.rows + 63) / 64);
        auto run_t = [&](int i) {
            if (c.silu) {
                mmt_silu_4<<<grid, 128>>>(w[2 * i], c.ty, w[2 * i + 1], c.ty, yt, c.rows, a.xq, a.xds, a.xbs, c.K,
                                          c.n, 0);
            } else {
                MatvecJobs j{};
                j.w[0] = w[i]; j.y[0] = yt; j.rows[0] = c.rows; j.ty[0] = c.ty;
                j.start[0] = 0; j.start[1] = (c.rows + 63) / 64 * 64; j.njobs = 1;
                for (int u = 2; u < 5; ++u) j.start[u] = j.start[1];
                mmt_4<<<grid, 128>>>(j, a.xq, a.xds, a.xbs, c.K, c.n, 0);
            }
        };
        auto run_w = [&](int i) {
            if (c.silu)
                mmw_silu_4<<<grid, 128, MMW_SMEM>>>(w[2 * i], c.ty, w[2 * i + 1], c.ty, yw, c.rows, a.blob, c.K, c.n);
            else
                mmw_4<<<grid, 128, MMW_SMEM>>>(w[i], c.ty, yw, c.rows, a.blob, c.K, c.n);
        };
        run_t(0);
        run_w(0);
        CK(cudaDeviceSynchronize());
        size_t first = 0;
        const bool ok = same_bits(yt, yw, (size_t)c.n * c.rows, &first);
        double ms[2] = {0, 0};
        const int reps = 30;
        for (int round = 0; round < 2; ++round)
            for (int v = 0; v < 2; ++v) {
                CK(cudaEventRecord(e0));
                for (int r = 0; r < reps; ++r) {
                    if (v) run_w(r % copies);
                    else run_t(r % copies);
                }
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float t;
                CK(cudaEventElapsedTime(&t, e0, e1));
                if (round == 1) ms[v] = t / reps;
            }
        const double gb = (double)mbytes * mats / 1e9;
        printf("%-38s %5d %10.2f %9.1f %10.2f %9.1f %6.2f %s", c.name, c.n, ms[0] * 1e3, gb / (ms[0] * 1e-3),
               ms[1] * 1e3, gb / (ms[1] * 1e-3), ms[0] / ms[1], ok ? "=" : "DIFFER");
        if (!ok) printf(" (first at %zu)", first);
        printf("\n");
        CK(cudaGetLastError());
        for (auto p : w) CK(cudaFree(p));
        CK(cudaFree(yt)); CK(cudaFree(yw));
        CK(cudaFree(a.xq)); CK(cudaFree(a.xds)); CK(cudaFree(a.xbs)); CK(cudaFree(a.blob));
    }
    return 0;
}
