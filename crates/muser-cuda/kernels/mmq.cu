// Prefill matmul of Q8_0 matrices on the tensor cores: Y[c][r] = sum_k W[r][k] x[c][k] for more
// columns than the matvec kernels take (64), the activation quantized to int8 (quantize_q8_0 or,
// with a K-quant sharing the input, quantize_q8_k of matvec.cu), multiplied by integer MMA
// (mma.sync m16n8k32 s8), each 32-value block's integer dot scaled in f32. (The K-quants run on
// mmk.cu, in the canonical order every decode kernel shares.)
//
// Shapes served: Q8_0 repacked planes with K % 256 == 0, any row count (tiles of 64, guarded),
// 65 or more columns (tiles of 64, guarded).
// Launch: grid (ceil(ncols / 64), ceil(rows / 64)) so that the column tiles of one row tile run
// next to each other and share its weights in L2; 128 threads = 2 x 2 warps, each warp a 32 x 32
// tile of the 64 x 64 output. 256 values of K of the 64 weight rows are staged in shared memory
// per step, beside the 64 x 256 int8 activation tile and its scales (row-contiguous 16-byte
// pieces: v1 gave each thread half a row, and ncu showed the L1 saturated at 98%).

#define MMQ_BM 64
#define MMQ_BN 64
#define MMQ_AS 272 // bytes per row of the int8 tile: 256 + 16, so fragment loads hit 32 banks

__device__ __forceinline__ void mma_k32(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Stages 256 values (block b of 256) of rows r0..r0+63 of a Q8_0 matrix (planes: int8 [rows][K],
// d [rows][K/32]) into as (int8 [64][MMQ_AS]) and scale ([64][16], the first 8 used): pieces
// 0..15 of a row are its quants, piece 16 its 8 scales.
__device__ __forceinline__ void mmq_load(const uint8_t* __restrict__ w, int rows, int K, int r0, int b, int8_t* as,
                                         float* scale) {
    const uint4 z4 = make_uint4(0, 0, 0, 0);
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

__device__ void mmq_q8(const uint8_t* __restrict__ w, int rows, int K, const int8_t* __restrict__ xq,
                       const float2* __restrict__ xds, float* __restrict__ y, int ncols) {
    __shared__ __align__(16) int8_t as[MMQ_BM * MMQ_AS];
    __shared__ __align__(16) int8_t xs[MMQ_BN * MMQ_AS];
    __shared__ float scale[MMQ_BM * 16];
    __shared__ float2 xd[MMQ_BN * 8];
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
        mmq_load(w, rows, K, r0, b, as, scale);
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
            float dx[4][2];
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int8_t* xc = xs + (wc + 8 * nt + g) * MMQ_AS + 32 * j + 4 * t;
                bf[nt][0] = *(const int*)xc;
                bf[nt][1] = *(const int*)(xc + 16);
#pragma unroll
                for (int e = 0; e < 2; ++e) dx[nt][e] = xd[(wc + 8 * nt + 2 * t + e) * 8 + j].x;
            }
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                const int ra = wr + 16 * mt + g; // rows ra and ra + 8 of the tile
                const int8_t* a_lo = as + ra * MMQ_AS + 32 * j + 4 * t;
                const int8_t* a_hi = a_lo + 8 * MMQ_AS;
                int c[4][4];
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0;
                const int a0 = *(const int*)a_lo, a1 = *(const int*)a_hi;
                const int a2 = *(const int*)(a_lo + 16), a3 = *(const int*)(a_hi + 16);
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) mma_k32(c[nt], a0, a1, a2, a3, bf[nt][0], bf[nt][1]);
                const float sl = scale[ra * 16 + j], sh = scale[(ra + 8) * 16 + j];
#pragma unroll
                for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[mt][nt][e] += (e < 2 ? sl : sh) * dx[nt][e & 1] * (float)c[nt][e];
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
extern "C" __global__ void __launch_bounds__(128) mmq_q8_0(MMQ_ARGS) { pdl_wait(); mmq_q8(w, rows, K, xq, xds, y, ncols); }

// out = silu(g) * u, elementwise (the prefill FFN after two mmq launches).
extern "C" __global__ void silu_mul(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out, int n) { pdl_wait();
    const int i = blockIdx.x * 256 + threadIdx.x;
    if (i < n) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
