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
// Muse Glimmer pp512 1,185 tokens/s on the H200. v2 (2026-11-29) stages them in shared memory.

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
// per sub-block of 32, or of 16 for Q6_K) and mins ([64][8]: dmin*m, Q4_K/Q5_K). Thread tid
// takes row tid / 2, half tid % 2 of the super-block.
template <int FMT>
__device__ __forceinline__ void mmq_load(const uint8_t* __restrict__ w, int rows, int K, int r0, int b,
                                         int8_t* as, float* scale, float* mins) {
    const int rr = threadIdx.x >> 1, h = threadIdx.x & 1, r = r0 + rr;
    int8_t* dst = as + rr * MMQ_AS;
    const int nb = K / QK_K;
    if (r >= rows) {
        for (int i = 0; i < 8; ++i) *(int4*)(dst + 128 * h + 16 * i) = make_int4(0, 0, 0, 0);
        for (int j = 0; j < 8; ++j) {
            scale[rr * 16 + 8 * h + j] = 0.0f;
            if (h == 0) mins[rr * 8 + j] = 0.0f;
        }
        return;
    }
    if (FMT == FMT_Q4_K || FMT == FMT_Q5_K) {
        const bool q5 = FMT == FMT_Q5_K;
        const uint8_t* blk = w + ((size_t)r * nb + b) * (q5 ? 176 : 144);
        const uint8_t* qs = blk + (q5 ? 48 : 16);
        uint4 qh0 = make_uint4(0, 0, 0, 0), qh1 = qh0;
        if (q5) {
            qh0 = *(const uint4*)(blk + 16);
            qh1 = *(const uint4*)(blk + 32);
        }
        const uint32_t qhw[8] = {qh0.x, qh0.y, qh0.z, qh0.w, qh1.x, qh1.y, qh1.z, qh1.w};
#pragma unroll
        for (int gg2 = 0; gg2 < 2; ++gg2) {
            const int gg = 2 * h + gg2; // group of 64 values
#pragma unroll
            for (int half16 = 0; half16 < 2; ++half16) {
                const uint4 q = *(const uint4*)(qs + 32 * gg + 16 * half16);
                const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
                uint32_t lo[4], hi[4];
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    lo[k] = qw[k] & 0x0F0F0F0F;
                    hi[k] = (qw[k] >> 4) & 0x0F0F0F0F;
                    if (q5) {
                        const uint32_t hb = qhw[4 * half16 + k];
                        lo[k] |= ((hb >> (2 * gg)) & 0x01010101) << 4;
                        hi[k] |= ((hb >> (2 * gg + 1)) & 0x01010101) << 4;
                    }
                }
                *(uint4*)(dst + 64 * gg + 16 * half16) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
                *(uint4*)(dst + 64 * gg + 32 + 16 * half16) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            }
        }
        if (h == 0) {
            const float d = __half2float(*(const __half*)blk), dmin = __half2float(*(const __half*)(blk + 2));
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                int sc, m;
                scale_min_k4(j, blk + 4, &sc, &m);
                scale[rr * 16 + j] = d * (float)sc;
                mins[rr * 8 + j] = dmin * (float)m;
            }
        }
    } else if (FMT == FMT_Q6_K) {
        const size_t bi = (size_t)r * nb + b;
        const uint8_t* qa = w + bi * 192;
        const int8_t* sc = (const int8_t*)(w + (size_t)rows * nb * 192) + bi * 16;
        const float d = __half2float(((const __half*)(w + (size_t)rows * nb * 208))[bi]);
        const int hf = h; // 128 values per half
#pragma unroll
        for (int qq = 0; qq < 4; ++qq) {
#pragma unroll
            for (int l16 = 0; l16 < 2; ++l16) {
                const uint4 L = *(const uint4*)(qa + hf * 64 + 32 * (qq & 1) + 16 * l16);
                const uint4 H = *(const uint4*)(qa + 128 + hf * 32 + 16 * l16);
                const uint32_t lw[4] = {L.x, L.y, L.z, L.w}, hw[4] = {H.x, H.y, H.z, H.w};
                uint32_t o[4];
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    o[k] = __vsub4(((lw[k] >> (4 * (qq >> 1))) & 0x0F0F0F0F) | (((hw[k] >> (2 * qq)) & 0x03030303) << 4),
                                   0x20202020);
                *(uint4*)(dst + hf * 128 + 32 * qq + 16 * l16) = make_uint4(o[0], o[1], o[2], o[3]);
            }
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) scale[rr * 16 + 8 * h + j] = d * (float)sc[8 * h + j];
    } else { // Q8_0 planes: int8 [rows][K], d [rows][K/32]
        const int8_t* qa = (const int8_t*)w + (size_t)r * K + b * 256 + 128 * h;
#pragma unroll
        for (int i = 0; i < 8; ++i) *(int4*)(dst + 128 * h + 16 * i) = *(const int4*)(qa + 16 * i);
        const __half* dc = (const __half*)(w + (size_t)rows * K) + (size_t)r * (K / 32) + b * 8;
        if (h == 0) {
#pragma unroll
            for (int j = 0; j < 8; ++j) scale[rr * 16 + j] = __half2float(dc[j]);
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
        {
            // The activation tile: 64 columns x 256 values of K (zeros past the last column),
            // and its 64 x 8 block scales.
            const int cl = threadIdx.x >> 1, h = threadIdx.x & 1, c = c0 + cl;
            int4* dst = (int4*)(xs + cl * MMQ_AS + 128 * h);
            const int4* src = (const int4*)(xq + (size_t)c * K + b * QK_K + 128 * h);
#pragma unroll
            for (int i = 0; i < 8; ++i) dst[i] = c < ncols ? src[i] : make_int4(0, 0, 0, 0);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int j = 4 * h + i;
                xd[cl * 8 + j] = c < ncols ? xds[(size_t)c * nb32 + b * 8 + j] : make_float2(0.0f, 0.0f);
            }
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
extern "C" __global__ void __launch_bounds__(128) mmq_q4_k(MMQ_ARGS) { mmq<FMT_Q4_K>(w, rows, K, xq, xds, y, ncols); }
extern "C" __global__ void __launch_bounds__(128) mmq_q5_k(MMQ_ARGS) { mmq<FMT_Q5_K>(w, rows, K, xq, xds, y, ncols); }
extern "C" __global__ void __launch_bounds__(128) mmq_q6_k(MMQ_ARGS) { mmq<FMT_Q6_K>(w, rows, K, xq, xds, y, ncols); }
extern "C" __global__ void __launch_bounds__(128) mmq_q8_0(MMQ_ARGS) { mmq<FMT_Q8_0>(w, rows, K, xq, xds, y, ncols); }

// out = silu(g) * u, elementwise (the prefill FFN after two mmq launches).
extern "C" __global__ void silu_mul(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out, int n) {
    const int i = blockIdx.x * 256 + threadIdx.x;
    if (i < n) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
