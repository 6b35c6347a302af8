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
// ("empty"); since run 31 each warp refills its own rows of a stage as soon as it is done with
// it, the last warp done the activation (mmw_prime, mmw_refill). (Run 25 itself had its own copy of those kernels here: one job, 32-column tiles, Q4_K and
// Q5_K, the activation laid out by the host; the same code otherwise.)
//
// Prints, per case, us per launch and GB/s of mmt_* and mmw_* (and of mmw_pack), and whether
// every output of mmw_* equals mmt_*'s bit for bit. Then run 26 (prepared, not yet run):
// mmwg_silu_4, the same stages with the MMAs on the warpgroup tensor cores (below), against
// mmt_silu_4's bits and mmw_silu_4's time. Weights are random K-quant blocks in the
// resident layout, rotated over copies so that L2 does not serve them. On the device:
//   bash scripts/matvec_lab/run_ws.sh
#include "lab_host.h"
#include <cstdint>
#include <cuda_fp16.h>

#include "../../crates/muser-cuda/kernels/common.cuh"
#include "../../crates/muser-cuda/kernels/kq_mma.cuh"
#include "../../crates/muser-cuda/kernels/mmt.cu"

// ------------------------------------------------------------------------------------------------
// Run 26 (prepared 2026-12-02, not yet run): mmw's stages with the MMAs on the warpgroup tensor
// cores (wgmma), Q4_K/Q5_K, 32-column tiles. Per super-block and sub-block s, A = the warp's
// quants times the low and the high 3 bits of the sub-block's scale (u8, from registers: sc = lo +
// 8 hi, q lo and q hi below 256, as kq45_superblock's folded form), B = the activation's k32 slice
// s from the stage, in wgmma's canonical K-major layout without swizzle (column c's 16-byte piece
// p of slice s at s * 1024 + p * 512 + 16 c; mmg_desc<512>); isc = L + 8 H after the super-block's
// 16 wgmma m64n32k32 (two chains), exact as before. Bytes within a piece follow kq45_superblock's
// k order (lane t's slots 4t..4t+3 and 16+4t.. hold values 8t..8t+7), so A loads as today.
// The mins and the float step stay as kq45_superblock's (same bits).

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ASM(...) asm volatile(__VA_ARGS__)
#else
#define WG_ASM(...) __trap()
#endif

// d (+)= A . B: m64n32k32, A u8 from registers, B s8 from shared memory (desc); accumulate false:
// d = A . B.
__device__ __forceinline__ void wg_mma_u8(int (&d)[16], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          unsigned long long desc, int accumulate) {
    WG_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
           "wgmma.mma_async.sync.aligned.m64n32k32.s32.u8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
           "%12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p;\n}\n"
           : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
             "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
           : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(accumulate));
}
__device__ __forceinline__ void wg_fence() { WG_ASM("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit_wait1(int (&a)[16], int (&b)[16]) {
    WG_ASM("wgmma.commit_group.sync.aligned;" ::: "memory");
    WG_ASM("wgmma.wait_group.sync.aligned 1;" ::: "memory");
#pragma unroll
    for (int i = 0; i < 16; ++i) asm volatile("" : "+r"(a[i]), "+r"(b[i])::"memory");
}
__device__ __forceinline__ void wg_wait0(int (&a)[16], int (&b)[16]) {
    WG_ASM("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < 16; ++i) asm volatile("" : "+r"(a[i]), "+r"(b[i])::"memory");
}
// No swizzle, leading byte offset 512 (a slice's second piece), stride byte offset 128 (the next
// 8 columns): mmh.cu's mmg_desc, checked there for f16 (both offsets are in bytes).
__device__ __forceinline__ unsigned long long wg_desc(uint32_t addr) {
    return (unsigned long long)((addr >> 4) & 0x3FFF) | ((unsigned long long)((512 >> 4) & 0x3FFF) << 16) |
           ((unsigned long long)((128 >> 4) & 0x3FFF) << 32);
}

// One super-block of the warpgroup's 64 rows x 32 columns from an mmw stage (mmw_q45's rows:
// row 16 w + g is block g & 3 of quad 4 w + g / 4).
// The chunk tree of common.cuh without branches: P is the current pair's sum (v of an even
// position, then + v of the odd one; -0 + v = v, bit for bit), F the chunk's first pair, and y
// takes F + P (or P) when the chunk is complete, by selects, so no carried value changes
// registers between the loop's paths (mmt_leaves' four branches left ~32 register moves a
// super-block in this kernel).
__device__ __forceinline__ void wg_leaves(int k, bool last, const float (&v)[4][4], float (&P)[4][4],
                                          float (&F)[4][4], float (&y)[4][4]) {
    const bool odd = k & 1, first = k == 1, emit = k == KQ_CHUNK - 1 || last, two = k >= 2;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float p = kq_add(odd ? P[nt][e] : -0.0f, v[nt][e]);
            F[nt][e] = first ? p : F[nt][e];
            P[nt][e] = p;
            const float c = two ? kq_add(F[nt][e], p) : p;
            y[nt][e] = emit ? kq_add(y[nt][e], c) : y[nt][e];
        }
}

template <bool Q5>
__device__ __forceinline__ void mmwg_q45(const uint8_t* st, int k, bool last, float (&P)[4][4], float (&F)[4][4],
                                         float (&y)[4][4]) {
    constexpr int BS = Q5 ? 176 : 144, QS = Q5 ? 48 : 16, BN = 32;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane >> 2, t = lane & 3;
    const uint8_t* ba = st + (4 * warp + (g >> 2)) * 4 * BS + (g & 3) * BS;
    const uint8_t* bb = ba + 2 * 4 * BS;
    const uint8_t* sx = st + MMT_ROWS * BS;
    const uint32_t xs = (uint32_t)__cvta_generic_to_shared(sx);
    const float* sd = (const float*)(sx + BN * 256);
    const int8_t* sbs = (const int8_t*)(sx + BN * 260);
    const uint4 ha = *(const uint4*)ba, hb = *(const uint4*)bb;
    uint32_t sa_lo, sa_hi, ma_lo, ma_hi, sb_lo, sb_hi, mb_lo, mb_hi;
    unpack_scales_k4(ha.y, ha.z, ha.w, &sa_lo, &sa_hi, &ma_lo, &ma_hi);
    unpack_scales_k4(hb.y, hb.z, hb.w, &sb_lo, &sb_hi, &mb_lo, &mb_hi);
    uint2 xa = make_uint2(0, 0), xb = make_uint2(0, 0);
    if (Q5) {
        xa = *(const uint2*)(ba + 16 + 8 * t);
        xb = *(const uint2*)(bb + 16 + 8 * t);
    }
    int accl[16], acch[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) accl[i] = acch[i] = 0;
    // Per pair of sub-blocks: both sub-blocks' A registers (the quants times the scales' low and
    // high bits) made first, then the 4 MMAs issued back to back as one group (mmh.cu's pattern:
    // registers are written only between groups, behind a fence); the next pair's A is made
    // while this group runs (wait_group 1 before its MMAs).
#pragma unroll
    for (int gi = 0; gi < 4; ++gi) {
        const uint2 qa = *(const uint2*)(ba + QS + 32 * gi + 8 * t), qb = *(const uint2*)(bb + QS + 32 * gi + 8 * t);
        const uint32_t qw[4] = {qa.x, qb.x, qa.y, qb.y};
        const uint32_t hw[4] = {xa.x, xb.x, xa.y, xb.y};
        uint32_t L[2][4], H[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int s = 2 * gi + h;
            const int sca = byte_u(sa_lo, sa_hi, s), scb = byte_u(sb_lo, sb_hi, s);
            const uint32_t ls[4] = {(uint32_t)sca & 7, (uint32_t)scb & 7, (uint32_t)sca & 7, (uint32_t)scb & 7};
            const uint32_t hs[4] = {(uint32_t)sca >> 3, (uint32_t)scb >> 3, (uint32_t)sca >> 3, (uint32_t)scb >> 3};
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                uint32_t a = (qw[q] >> (4 * h)) & 0x0F0F0F0F;
                if (Q5) a |= ((hw[q] >> s) & 0x01010101) << 4;
                L[h][q] = a * ls[q];
                H[h][q] = a * hs[q];
            }
        }
        wg_fence();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int s = 2 * gi + h;
            const unsigned long long desc = wg_desc(xs + s * 1024);
            wg_mma_u8(accl, L[h][0], L[h][1], L[h][2], L[h][3], desc, s > 0);
            wg_mma_u8(acch, H[h][0], H[h][1], H[h][2], H[h][3], desc, s > 0);
        }
        wg_commit_wait1(accl, acch);
    }
    wg_wait0(accl, acch);
    // The mins and the float step: kq45_superblock's.
    const int alo0 = t == 0 ? (int)ma_lo : t == 1 ? (int)ma_hi : 0;
    const int alo1 = t == 0 ? (int)mb_lo : t == 1 ? (int)mb_hi : 0;
    const int ahi0 = t == 2 ? (int)ma_lo : t == 3 ? (int)ma_hi : 0;
    const int ahi1 = t == 2 ? (int)mb_lo : t == 3 ? (int)mb_hi : 0;
    const float2 dma = __half22float2(*(const __half2*)&ha.x), dmb = __half22float2(*(const __half2*)&hb.x);
    float v[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
        const int bs = *(const int*)(sbs + (8 * nt + g) * 16 + 4 * t);
        int rl[4] = {0, 0, 0, 0}, rh[4] = {0, 0, 0, 0};
        mmk_k16(rl, alo0, alo1, bs);
        mmk_k16(rh, ahi0, ahi1, bs);
        const float dx0 = sd[8 * nt + 2 * t], dx1 = sd[8 * nt + 2 * t + 1];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float2 dm = e < 2 ? dma : dmb;
            const int isc = accl[4 * nt + e] + 8 * acch[4 * nt + e];
            v[nt][e] = kq_value_q45(dm.x, dm.y, isc, rl[e] + 64 * rh[e], (e & 1) ? dx1 : dx0);
        }
    }
    wg_leaves(k, last, v, P, F, y);
}

// mmw_rows with mmwg_q45 (one job, Q4_K or Q5_K, q0 as there).
template <int FMT>
__device__ __forceinline__ void mmwg_rows(const uint8_t* __restrict__ w, int row0, int rows, int K,
                                          const uint8_t* __restrict__ xt, uint8_t* smem, uint32_t bars, int q0,
                                          float (&y)[4][4]) {
    constexpr int ST = mmw_stage(4);
    const int nb = K / QK_K, warp = threadIdx.x / WARP, n = nb;
    const uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem);
    float P[4][4], F[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) P[nt][e] = F[nt][e] = y[nt][e] = 0.0f;
    mmw_prime<FMT, 4>(s0, bars, w, row0, rows, nb, xt, q0, 0, n, warp);
#pragma unroll 1
    for (int i = 0; i < n; ++i) {
        const int q = q0 + i, s = q % MMW_STAGES;
        mbar_wait(bars + 8 * s, (q / MMW_STAGES) & 1);
        mmwg_q45<FMT == FMT_Q5_K>(smem + s * ST, i % KQ_CHUNK, i == n - 1, P, F, y);
        __syncwarp();
        mmw_refill<FMT, 4>(s0, bars, w, row0, rows, nb, xt, q, i, n, i);
    }
    __syncthreads();
}

template <int FMT>
__device__ __forceinline__ void mmwg_sum(const uint8_t* w, int row0, int rows, int K, const uint8_t* xt, uint8_t* smem,
                                         uint32_t bars, int q0, float (&y)[4][4]) {
    mmwg_rows<FMT>(w, row0, rows, K, xt, smem, bars, q0, y);
}

// Gate and up (both Q4_K or both Q5_K), then silu(gate) * up: mmw_silu_4 on the warpgroup MMAs.
extern "C" __global__ void __launch_bounds__(128, 3)
    mmwg_silu_4(const uint8_t* __restrict__ wg, int ty, const uint8_t* __restrict__ wu, float* y, int rows,
                const uint8_t* __restrict__ xblob, int K, int ncols) {
    extern __shared__ __align__(128) uint8_t wg_smem[];
    const int row0 = blockIdx.y * MMT_ROWS;
    if (row0 >= rows) return;
    const uint32_t bars = mmw_init<4>(wg_smem);
    const uint8_t* xt = xblob + (size_t)blockIdx.x * (K / QK_K) * mmw_xb(4);
    float gs[4][4], us[4][4];
    if (ty == FMT_Q5_K) {
        mmwg_sum<FMT_Q5_K>(wg, row0, rows, K, xt, wg_smem, bars, 0, gs);
        mmwg_sum<FMT_Q5_K>(wu, row0, rows, K, xt, wg_smem, bars, K / QK_K, us);
    } else {
        mmwg_sum<FMT_Q4_K>(wg, row0, rows, K, xt, wg_smem, bars, 0, gs);
        mmwg_sum<FMT_Q4_K>(wu, row0, rows, K, xt, wg_smem, bars, K / QK_K, us);
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) gs[nt][e] = gs[nt][e] / (1.0f + expf(-gs[nt][e])) * us[nt][e];
    mmt_store<4>(y, rows, row0, blockIdx.x * 32, min(32, ncols - (int)blockIdx.x * 32), gs);
}

// mmwg's activation regions (32-column tiles): slice s of column c, piece p (k slots 16 p ..
// 16 p + 15) at s * 1024 + p * 512 + 16 c, slot 4 t + j of piece 0 holding value 8 t + j of the
// sub-block and of piece 1 value 8 t + 4 + j (the words 0, 2, 4, 6 and 1, 3, 5, 7 of its 32
// bytes); then the scales and split sums as mmw_pack's. Block (super-block, tile), 128 threads.
extern "C" __global__ void __launch_bounds__(128) mmwg_pack(const int8_t* __restrict__ xq,
                                                            const float2* __restrict__ xds,
                                                            const int8_t* __restrict__ xbs, int K, int ncols,
                                                            uint8_t* __restrict__ xblob) {
    const int nb = K / QK_K, b = blockIdx.x, T = blockIdx.y;
    uint8_t* r = xblob + ((size_t)T * nb + b) * mmw_xb(4);
    for (int i = threadIdx.x; i < 32 * 8 * 2; i += blockDim.x) {
        const int cc = i & 31, s = (i >> 5) & 7, p = i >> 8, c = T * 32 + cc;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (c < ncols) {
            const uint32_t* src = (const uint32_t*)(xq + (size_t)c * K + b * QK_K + 32 * s);
            v = make_uint4(src[p], src[2 + p], src[4 + p], src[6 + p]);
        }
        *(uint4*)(r + s * 1024 + p * 512 + 16 * cc) = v;
    }
    for (int cc = threadIdx.x; cc < 32; cc += blockDim.x) {
        const int c = T * 32 + cc;
        const bool in = c < ncols;
        *(float*)(r + 32 * 256 + 4 * cc) = in ? xds[(size_t)c * (K / 32) + 8 * b].x : 0.0f;
        *(uint4*)(r + 32 * 260 + 16 * cc) =
            in ? *(const uint4*)(xbs + ((size_t)c * nb + b) * 16) : make_uint4(0, 0, 0, 0);
    }
}

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
    if (getenv("WS_SKIP_26")) return 0; // run 27's variants of mmw_* time run 25's cases only
    // Run 26: the warpgroup-MMA tiles (mmwg_silu_4, with mmwg_pack) against mmt_silu_4 (bits)
    // and mmw_silu_4 (time), gate+up at the Glimmer shape.
    CK(cudaFuncSetAttribute(mmwg_silu_4, cudaFuncAttributeMaxDynamicSharedMemorySize, mmw_smem(4)));
    printf("\nrun 26: gate+up on the warpgroup MMAs\n%-38s %5s %10s %10s %10s %6s %8s %s\n", "case", "cols",
           "mmt us", "mmw us", "mmwg us", "x mmw", "pack us", "bits (mmwg = mmt)");
    for (int ty : {FMT_Q4_K, FMT_Q5_K})
        for (int n : {32, 24, 64}) {
            const int rows = 19968, K = 6656, nb = K / 256, bs = ty == FMT_Q5_K ? 176 : 144;
            const size_t mbytes = (size_t)rows * nb * bs;
            const int copies = (int)std::max<size_t>(2, (size_t)400e6 / (2 * mbytes) + 1);
            std::vector<uint8_t*> w(2 * copies);
            std::vector<unsigned char> h(mbytes);
            for (size_t i = 0; i < w.size(); ++i) {
                fill_blocks(h, ty, mbytes / bs, 177 + i);
                CK(cudaMalloc(&w[i], mbytes));
                CK(cudaMemcpy(w[i], h.data(), mbytes, cudaMemcpyHostToDevice));
            }
            const Acts a = make_acts(K, n);
            uint8_t* blob_g;
            const int tiles = (n + 31) / 32;
            CK(cudaMalloc(&blob_g, (size_t)tiles * nb * mmw_xb(4)));
            float *yt, *yw, *yg;
            CK(cudaMalloc(&yt, (size_t)n * rows * 4));
            CK(cudaMalloc(&yw, (size_t)n * rows * 4));
            CK(cudaMalloc(&yg, (size_t)n * rows * 4));
            const dim3 grid(tiles, rows / 64);
            auto run = [&](int v, int i) {
                if (v == 0)
                    mmt_silu_4<<<grid, 128>>>(w[2 * i], ty, w[2 * i + 1], ty, yt, rows, a.xq, a.xds, a.xbs, K, n, 0);
                else if (v == 1)
                    mmw_silu_4<<<grid, 128, mmw_smem(4)>>>(w[2 * i], ty, w[2 * i + 1], ty, yw, rows, a.blob, K, n);
                else if (v == 2)
                    mmwg_silu_4<<<grid, 128, mmw_smem(4)>>>(w[2 * i], ty, w[2 * i + 1], yg, rows, blob_g, K, n);
                else
                    mmwg_pack<<<dim3(nb, tiles), 128>>>(a.xq, a.xds, a.xbs, K, n, blob_g);
            };
            mmw_pack<<<dim3(nb, tiles), 128>>>(a.xq, a.xds, a.xbs, K, n, 4, a.blob);
            run(3, 0);
            for (int v = 0; v < 3; ++v) run(v, 0);
            CK(cudaDeviceSynchronize());
            CK(cudaGetLastError());
            size_t first = 0;
            const bool ok = same_bits(yt, yg, (size_t)n * rows, &first);
            double ms[4] = {0, 0, 0, 0};
            for (int round = 0; round < 2; ++round)
                for (int v = 0; v < 4; ++v) {
                    CK(cudaEventRecord(e0));
                    for (int r = 0; r < 30; ++r) run(v, r % copies);
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    float t;
                    CK(cudaEventElapsedTime(&t, e0, e1));
                    if (round == 1) ms[v] = t / 30;
                }
            printf("%-38s %5d %10.2f %10.2f %10.2f %6.2f %8.2f %s", ty == FMT_Q5_K ? "gate+up+SiLU Q5_K 2x19968x6656"
                                                                                : "gate+up+SiLU Q4_K 2x19968x6656",
                   n, ms[0] * 1e3, ms[1] * 1e3, ms[2] * 1e3, ms[1] / ms[2], ms[3] * 1e3, ok ? "=" : "DIFFER");
            if (!ok) printf(" (first at %zu)", first);
            printf("\n");
            for (auto p : w) CK(cudaFree(p));
            CK(cudaFree(yt)); CK(cudaFree(yw)); CK(cudaFree(yg)); CK(cudaFree(blob_g));
            CK(cudaFree(a.xq)); CK(cudaFree(a.xds)); CK(cudaFree(a.xbs)); CK(cudaFree(a.blob));
        }
    return 0;
}
