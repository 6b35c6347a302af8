// Prefill matmul on the tensor cores: Y[c][r] = sum_k W[r][k] x[c][k] for many columns (more
// than the 8 of the matvec kernels), with the K-quant weights expanded to int8 in shared memory
// and the activation quantized to int8 (quantize_q8_k of matvec.cu), multiplied by integer MMA
// (mma.sync m16n8k32 s8, m16n8k16 for Q6_K whose scales cover 16 values).
//
// Per sub-block the integer dot is scaled in f32: acc += (d * sc_j)[r] * dx[c] * C[r][c] -
// (dmin * m_j)[r] * (dx * sum(qx))[c] (the second term for Q4_K/Q5_K's mins).
//
// Shapes served: Q4_K, Q5_K, Q6_K (repacked planes) and Q8_0 (planes, K % 256 == 0) matrices,
// any row count (tiles of 64, guarded), 9 or more columns (tiles of 64, guarded).
// Launch: grid (ceil(ncols / 64), ceil(rows / 64)) so that the column tiles of one row tile run
// next to each other and share its weights in L2; 128 threads = 2 x 2 warps, each warp a 32 x 32
// tile of the 64 x 64 output. One super-block (256 values of K) of the 64 weight rows is
// expanded into shared memory per step, beside the 64 x 256 int8 activation tile and its scales.
// v1 (2026-11-29) read the activation fragments and scales from global memory in the inner loop:
// Muse Glimmer pp512 1,185 tokens/s on the H200. v2 stages them in shared memory: 1,310 tokens/s
// (ncu: L1 98% busy with the scattered tile loads, DRAM 1%, 128 registers, 25% occupancy). v3
// (2026-11-29) loads both tiles in row-contiguous 16-byte pieces: pp512 1,490 tokens/s; per
// 512-token chunk of Muse Glimmer (52 layers, each op synchronized) gate+up 155 ms (~92 int8
// TOPS), ffn_down 85 ms, q/k/v/gate 53 ms, attn_output 19 ms. Next: bigger tiles, cp.async
// double buffering, integer accumulation across the sub-blocks of a super-block.

#define MMQ_BM 64
#define MMQ_BN 64
#define MMQ_AS 272 // bytes per row of the int8 tile: 256 + 16, so fragment loads hit 32 banks

__device__ __forceinline__ void mma_k32(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_k16(int (&c)[4], int a0, int a1, int b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

// Expands super-block b of rows r0..r0+63 into as (int8 [64][MMQ_AS]), scale ([64][16]: d*sc
// per sub-block of 32, or of 16 for Q6_K) and mins ([64][8]: dmin*m, Q4_K/Q5_K). The block's
// threads take 16-byte pieces of the rows in order (piece e: row e / P, piece e % P), so each
// warp's loads cover a few contiguous row segments (v1 gave each thread half a row: ncu showed
// the L1 saturated at 98% by those scattered loads).
template <int FMT>
__device__ __forceinline__ void mmq_load(const uint8_t* __restrict__ w, int rows, int K, int r0, int b,
                                         int8_t* as, float* scale, float* mins) {
    const int nb = K / QK_K;
    const uint4 z4 = make_uint4(0, 0, 0, 0);
    if (FMT == FMT_Q4_K || FMT == FMT_Q5_K) {
        constexpr bool Q5 = FMT == FMT_Q5_K;
        constexpr int BS = Q5 ? 176 : 144, QS = Q5 ? 48 : 16;
        // Pieces: 0 = header (d, dmin, scales), 1..8 = qs bytes 16 (p - 1) ...
        for (int e = threadIdx.x; e < MMQ_BM * 9; e += 128) {
            const int rr = e / 9, p = e % 9, r = r0 + rr;
            const uint8_t* blk = w + ((size_t)min(r, rows - 1) * nb + b) * BS;
            if (p == 0) {
                const uint4 hdr = r < rows ? *(const uint4*)blk : z4;
                uint32_t sc_lo, sc_hi, m_lo, m_hi;
                unpack_scales_k4(hdr.y, hdr.z, hdr.w, &sc_lo, &sc_hi, &m_lo, &m_hi);
                const float2 dm = __half22float2(*(const __half2*)&hdr.x);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    scale[rr * 16 + j] = dm.x * (float)((sc_lo >> (8 * j)) & 0xFF);
                    scale[rr * 16 + 4 + j] = dm.x * (float)((sc_hi >> (8 * j)) & 0xFF);
                    mins[rr * 8 + j] = dm.y * (float)((m_lo >> (8 * j)) & 0xFF);
                    mins[rr * 8 + 4 + j] = dm.y * (float)((m_hi >> (8 * j)) & 0xFF);
                }
            } else {
                const int q = p - 1, gg = q >> 1, half16 = q & 1;
                const uint4 qv = r < rows ? *(const uint4*)(blk + QS + 16 * q) : z4;
                const uint32_t qw[4] = {qv.x, qv.y, qv.z, qv.w};
                uint32_t hw[4] = {0, 0, 0, 0};
                if (Q5) {
                    const uint4 hv = r < rows ? *(const uint4*)(blk + 16 + 16 * half16) : z4;
                    hw[0] = hv.x;
                    hw[1] = hv.y;
                    hw[2] = hv.z;
                    hw[3] = hv.w;
                }
                uint32_t lo[4], hi[4];
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    lo[k] = (qw[k] & 0x0F0F0F0F) | (Q5 ? ((hw[k] >> (2 * gg)) & 0x01010101) << 4 : 0);
                    hi[k] = ((qw[k] >> 4) & 0x0F0F0F0F) | (Q5 ? ((hw[k] >> (2 * gg + 1)) & 0x01010101) << 4 : 0);
                }
                int8_t* dst = as + rr * MMQ_AS + 64 * gg + 16 * half16;
                *(uint4*)dst = make_uint4(lo[0], lo[1], lo[2], lo[3]);
                *(uint4*)(dst + 32) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            }
        }
    } else if (FMT == FMT_Q6_K) {
        // Pieces: 0..7 = ql bytes 16p of plane A (with the qh bytes they need), 8 = the scales.
        for (int e = threadIdx.x; e < MMQ_BM * 9; e += 128) {
            const int rr = e / 9, p = e % 9, r = r0 + rr;
            const size_t bi = (size_t)min(r, rows - 1) * nb + b;
            if (p == 8) {
                const uint4 sv = r < rows ? *(const uint4*)(w + (size_t)rows * nb * 192 + bi * 16) : z4;
                const float d = r < rows ? __half2float(((const __half*)(w + (size_t)rows * nb * 208))[bi]) : 0.0f;
                const int8_t* sc = (const int8_t*)&sv;
#pragma unroll
                for (int j = 0; j < 16; ++j) scale[rr * 16 + j] = d * (float)sc[j];
            } else {
                // ql byte j (0..63 of a half) holds value j (low nibble) and j + 64 (high); their
                // two high bits are bit pairs j / 32 and j / 32 + 2 of qh[j % 32].
                const int half = p >> 2, j0 = 16 * (p & 3), sh = 2 * (j0 >> 5);
                const uint8_t* qa = w + bi * 192;
                const uint4 lv = r < rows ? *(const uint4*)(qa + half * 64 + j0) : z4;
                const uint4 hv = r < rows ? *(const uint4*)(qa + 128 + half * 32 + (j0 & 31)) : z4;
                const uint32_t lw[4] = {lv.x, lv.y, lv.z, lv.w}, hw[4] = {hv.x, hv.y, hv.z, hv.w};
                uint32_t lo[4], hi[4];
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    lo[k] = __vsub4((lw[k] & 0x0F0F0F0F) | (((hw[k] >> sh) & 0x03030303) << 4), 0x20202020);
                    hi[k] = __vsub4(((lw[k] >> 4) & 0x0F0F0F0F) | (((hw[k] >> (sh + 4)) & 0x03030303) << 4), 0x20202020);
                }
                int8_t* dst = as + rr * MMQ_AS + half * 128 + j0;
                *(uint4*)dst = make_uint4(lo[0], lo[1], lo[2], lo[3]);
                *(uint4*)(dst + 64) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            }
        }
    } else { // Q8_0 planes: int8 [rows][K], d [rows][K/32]; pieces 0..15 quants, 16 the 8 scales
        for (int e = threadIdx.x; e < MMQ_BM * 17; e += 128) {
            const int rr = e / 17, p = e % 17, r = r0 + rr;
            const size_t rc = (size_t)min(r, rows - 1);
            if (p == 16) {
                const uint4 dv = r < rows ? *(const uint4*)((const __half*)(w + (size_t)rows * K) + rc * (K / 32) + b * 8) : z4;
                const __half* d = (const __half*)&dv;
#pragma unroll
                for (int j = 0; j < 8; ++j) scale[rr * 16 + j] = __half2float(d[j]);
            } else {
                *(uint4*)(as + rr * MMQ_AS + 16 * p) = r < rows ? *(const uint4*)(w + rc * K + b * 256 + 16 * p) : z4;
            }
        }
    }
}

template <int FMT>
__device__ void mmq(const uint8_t* __restrict__ w, int rows, int K, const int8_t* __restrict__ xq,
                    const float2* __restrict__ xds, float* __restrict__ y, int ncols) {
    __shared__ __align__(16) int8_t as[MMQ_BM * MMQ_AS];
    __shared__ __align__(16) int8_t xs[MMQ_BN * MMQ_AS];
    __shared__ float scale[MMQ_BM * 16];
    __shared__ float mins[MMQ_BM * 8];
    __shared__ float2 xd[MMQ_BN * 8];
    constexpr bool HAS_MIN = FMT == FMT_Q4_K || FMT == FMT_Q5_K;
    const int c0 = blockIdx.x * MMQ_BN, r0 = blockIdx.y * MMQ_BM;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane >> 2, t = lane & 3;
    const int wr = (warp & 1) * 32, wc = (warp >> 1) * 32;
    const int nb = K / QK_K, nb32 = K / 32;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    for (int b = 0; b < nb; ++b) {
        __syncthreads();
        mmq_load<FMT>(w, rows, K, r0, b, as, scale, mins);
        // The activation tile: 64 columns x 256 values of K (zeros past the last column), 16
        // consecutive threads per column, and its 64 x 8 block scales.
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int e = threadIdx.x + 128 * i, cl = e >> 4, piece = e & 15, c = c0 + cl;
            *(int4*)(xs + cl * MMQ_AS + 16 * piece) =
                c < ncols ? *(const int4*)(xq + (size_t)c * K + b * QK_K + 16 * piece) : make_int4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int e = threadIdx.x + 128 * i, cl = e >> 3, j = e & 7, c = c0 + cl;
            xd[cl * 8 + j] = c < ncols ? xds[(size_t)c * nb32 + b * 8 + j] : make_float2(0.0f, 0.0f);
        }
        __syncthreads();
#pragma unroll 2
        for (int j = 0; j < 8; ++j) { // 32 values of K per step
            int bf[4][2];
            float2 dx[4][2];
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int8_t* xc = xs + (wc + 8 * nt + g) * MMQ_AS + 32 * j + 4 * t;
                bf[nt][0] = *(const int*)xc;
                bf[nt][1] = *(const int*)(xc + 16);
#pragma unroll
                for (int e = 0; e < 2; ++e) dx[nt][e] = xd[(wc + 8 * nt + 2 * t + e) * 8 + j];
            }
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                const int ra = wr + 16 * mt + g; // rows ra and ra + 8 of the tile
                const int8_t* a_lo = as + ra * MMQ_AS + 32 * j + 4 * t;
                const int8_t* a_hi = a_lo + 8 * MMQ_AS;
                if (FMT == FMT_Q6_K) {
                    // Two k16 steps, each with its own 16-value scale.
#pragma unroll
                    for (int kk = 0; kk < 2; ++kk) {
                        int ck[4][4];
#pragma unroll
                        for (int nt = 0; nt < 4; ++nt) ck[nt][0] = ck[nt][1] = ck[nt][2] = ck[nt][3] = 0;
                        const int a0 = *(const int*)(a_lo + 16 * kk), a1 = *(const int*)(a_hi + 16 * kk);
#pragma unroll
                        for (int nt = 0; nt < 4; ++nt) mma_k16(ck[nt], a0, a1, bf[nt][kk]);
                        const float sl = scale[ra * 16 + 2 * j + kk], sh = scale[(ra + 8) * 16 + 2 * j + kk];
#pragma unroll
                        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                            for (int e = 0; e < 4; ++e)
                                acc[mt][nt][e] += (e < 2 ? sl : sh) * dx[nt][e & 1].x * (float)ck[nt][e];
                    }
                } else {
                    int c[4][4];
#pragma unroll
                    for (int nt = 0; nt < 4; ++nt) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0;
                    const int a0 = *(const int*)a_lo, a1 = *(const int*)a_hi;
                    const int a2 = *(const int*)(a_lo + 16), a3 = *(const int*)(a_hi + 16);
#pragma unroll
                    for (int nt = 0; nt < 4; ++nt) mma_k32(c[nt], a0, a1, a2, a3, bf[nt][0], bf[nt][1]);
                    const float sl = scale[ra * 16 + j], sh = scale[(ra + 8) * 16 + j];
                    float ml = 0.0f, mh = 0.0f;
                    if (HAS_MIN) {
                        ml = mins[ra * 8 + j];
                        mh = mins[(ra + 8) * 8 + j];
                    }
#pragma unroll
                    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const float2 d2 = dx[nt][e & 1];
                            float v = (e < 2 ? sl : sh) * d2.x * (float)c[nt][e];
                            if (HAS_MIN) v -= (e < 2 ? ml : mh) * d2.y;
                            acc[mt][nt][e] += v;
                        }
                }
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = r0 + wr + 16 * mt + g + (e < 2 ? 0 : 8);
                const int c = c0 + wc + 8 * nt + 2 * t + (e & 1);
                if (r < rows && c < ncols) y[(size_t)c * rows + r] = acc[mt][nt][e];
            }
}

#define MMQ_ARGS const uint8_t* __restrict__ w, int rows, int K, const int8_t* __restrict__ xq, \
    const float2* __restrict__ xds, float* __restrict__ y, int ncols
extern "C" __global__ void __launch_bounds__(128) mmq_q4_k(MMQ_ARGS) { pdl_wait(); mmq<FMT_Q4_K>(w, rows, K, xq, xds, y, ncols); }
extern "C" __global__ void __launch_bounds__(128) mmq_q5_k(MMQ_ARGS) { pdl_wait(); mmq<FMT_Q5_K>(w, rows, K, xq, xds, y, ncols); }
extern "C" __global__ void __launch_bounds__(128) mmq_q6_k(MMQ_ARGS) { pdl_wait(); mmq<FMT_Q6_K>(w, rows, K, xq, xds, y, ncols); }
extern "C" __global__ void __launch_bounds__(128) mmq_q8_0(MMQ_ARGS) { pdl_wait(); mmq<FMT_Q8_0>(w, rows, K, xq, xds, y, ncols); }

// out = silu(g) * u, elementwise (the prefill FFN after two mmq launches).
extern "C" __global__ void silu_mul(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out, int n) { pdl_wait();
    const int i = blockIdx.x * 256 + threadIdx.x;
    if (i < n) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
