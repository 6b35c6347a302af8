// Matrix-vector products for decode: y[c][r] = sum_k W[r][k] * x[c][k] for 1..8 activation
// columns c (one decode step, or a decode group of several sequences).
//
// Weights stay in their GGUF block layout (Q4_K, Q5_K, Q6_K, Q8_0, F16, F32); nothing is
// dequantized to memory. For the quantized formats the activation is quantized once per input by
// `quantize_q8_1` to int8 with one f32 scale per 32 values (plus that block's scaled sum, for the
// Q4_K/Q5_K mins), and the dots run on dp4a. Float formats read the f32 activation.
//
// Launch: 128 threads (4 warps) per block, one warp per row, grid = ceil(rows / 4). Lane l of a
// row's warp takes work items l, l+32, ... (an item is 16 quantized values of two sub-blocks),
// so each row's reduction order depends only on K, never on the number of columns: results are
// batch-invariant. Version 1 (2026-11-29): correctness first; not yet tuned for bandwidth.

// x: [n][32] f32 blocks (n = ncols * K / 32). q: int8 [n][32]; ds: (d, d * sum(q)) per block.
extern "C" __global__ void quantize_q8_1(const float* __restrict__ x, int8_t* __restrict__ q,
                                         float2* __restrict__ ds, int n_blocks) {
    const int blk = blockIdx.x * 4 + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (blk >= n_blocks) return;
    const float v = x[(size_t)blk * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const int qi = amax == 0.0f ? 0 : __float2int_rn(v / d);
    q[(size_t)blk * 32 + lane] = (int8_t)qi;
    const float s = warp_sum((float)qi);
    if (lane == 0) ds[blk] = make_float2(d, d * s);
}

template <int NC>
__device__ __forceinline__ void store_rows(float (&acc)[NC], float* __restrict__ y, int row, int rows) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        const float v = warp_sum(acc[c]);
        if (threadIdx.x % WARP == 0) y[(size_t)c * rows + row] = v;
    }
}

// Q4_K: item = (super-block b, group g of 64 values, half h): 16 qs bytes give 16 values of
// sub-block 2g (low nibbles) and 16 of sub-block 2g+1 (high nibbles).
template <int NC>
__device__ void matvec_q4_k(const uint8_t* __restrict__ w, const int8_t* __restrict__ xq,
                            const float2* __restrict__ xds, float* __restrict__ y, int rows, int K) {
    const int row = blockIdx.x * 4 + threadIdx.x / WARP;
    if (row >= rows) return;
    const int nb = K / QK_K;
    const block_q4_k* B = (const block_q4_k*)(w + (size_t)row * nb * sizeof(block_q4_k));
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    for (int item = threadIdx.x % WARP; item < nb * 8; item += WARP) {
        const int b = item >> 3, g = (item >> 1) & 3, h = item & 1;
        const block_q4_k* blk = B + b;
        const uint4 qv = *(const uint4*)(blk->qs + 32 * g + 16 * h);
        const int qw[4] = {(int)qv.x, (int)qv.y, (int)qv.z, (int)qv.w};
        int sc0, m0, sc1, m1;
        scale_min_k4(2 * g, blk->scales, &sc0, &m0);
        scale_min_k4(2 * g + 1, blk->scales, &sc1, &m1);
        const float d = __half2float(blk->d), dmin = __half2float(blk->dmin);
        const int i0 = b * QK_K + 64 * g + 16 * h;
        const int a0 = (b * QK_K + 64 * g) / 32;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const int8_t* xc = xq + (size_t)c * K;
            const int4 x0 = *(const int4*)(xc + i0);
            const int4 x1 = *(const int4*)(xc + i0 + 32);
            const int xa[4] = {x0.x, x0.y, x0.z, x0.w}, xb[4] = {x1.x, x1.y, x1.z, x1.w};
            int s0 = 0, s1 = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                s0 = __dp4a(qw[k] & 0x0F0F0F0F, xa[k], s0);
                s1 = __dp4a((qw[k] >> 4) & 0x0F0F0F0F, xb[k], s1);
            }
            const float2 ds0 = xds[(size_t)c * (K / 32) + a0], ds1 = xds[(size_t)c * (K / 32) + a0 + 1];
            acc[c] += d * (sc0 * ds0.x * s0 + sc1 * ds1.x * s1);
            if (h == 0) acc[c] -= dmin * (m0 * ds0.y + m1 * ds1.y);
        }
    }
    store_rows<NC>(acc, y, row, rows);
}

// Q5_K: as Q4_K, the fifth bit of value l of group g is bit 2g (low) / 2g+1 (high) of qh[l].
template <int NC>
__device__ void matvec_q5_k(const uint8_t* __restrict__ w, const int8_t* __restrict__ xq,
                            const float2* __restrict__ xds, float* __restrict__ y, int rows, int K) {
    const int row = blockIdx.x * 4 + threadIdx.x / WARP;
    if (row >= rows) return;
    const int nb = K / QK_K;
    const block_q5_k* B = (const block_q5_k*)(w + (size_t)row * nb * sizeof(block_q5_k));
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    for (int item = threadIdx.x % WARP; item < nb * 8; item += WARP) {
        const int b = item >> 3, g = (item >> 1) & 3, h = item & 1;
        const block_q5_k* blk = B + b;
        const uint4 qv = *(const uint4*)(blk->qs + 32 * g + 16 * h);
        const uint4 hv = *(const uint4*)(blk->qh + 16 * h);
        const int qw[4] = {(int)qv.x, (int)qv.y, (int)qv.z, (int)qv.w};
        const int hw[4] = {(int)hv.x, (int)hv.y, (int)hv.z, (int)hv.w};
        int sc0, m0, sc1, m1;
        scale_min_k4(2 * g, blk->scales, &sc0, &m0);
        scale_min_k4(2 * g + 1, blk->scales, &sc1, &m1);
        const float d = __half2float(blk->d), dmin = __half2float(blk->dmin);
        const int i0 = b * QK_K + 64 * g + 16 * h;
        const int a0 = (b * QK_K + 64 * g) / 32;
        int lo[4], hi[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            lo[k] = (qw[k] & 0x0F0F0F0F) | (((hw[k] >> (2 * g)) & 0x01010101) << 4);
            hi[k] = ((qw[k] >> 4) & 0x0F0F0F0F) | (((hw[k] >> (2 * g + 1)) & 0x01010101) << 4);
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const int8_t* xc = xq + (size_t)c * K;
            const int4 x0 = *(const int4*)(xc + i0);
            const int4 x1 = *(const int4*)(xc + i0 + 32);
            const int xa[4] = {x0.x, x0.y, x0.z, x0.w}, xb[4] = {x1.x, x1.y, x1.z, x1.w};
            int s0 = 0, s1 = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                s0 = __dp4a(lo[k], xa[k], s0);
                s1 = __dp4a(hi[k], xb[k], s1);
            }
            const float2 ds0 = xds[(size_t)c * (K / 32) + a0], ds1 = xds[(size_t)c * (K / 32) + a0 + 1];
            acc[c] += d * (sc0 * ds0.x * s0 + sc1 * ds1.x * s1);
            if (h == 0) acc[c] -= dmin * (m0 * ds0.y + m1 * ds1.y);
        }
    }
    store_rows<NC>(acc, y, row, rows);
}

// Q6_K: item = (super-block b, half, lp, k): ql bytes half*64 + 32lp + 16k (+16) hold 16 values
// of sub-block half*8 + 2lp + k (low nibbles) and 16 of sub-block +4 (high nibbles); their two
// high bits are bit pairs lp and lp+2 of qh[half*32 + 16k + l]. Blocks are 210 bytes, so only
// 2-byte aligned loads are safe.
template <int NC>
__device__ void matvec_q6_k(const uint8_t* __restrict__ w, const int8_t* __restrict__ xq,
                            const float2* __restrict__ xds, float* __restrict__ y, int rows, int K) {
    const int row = blockIdx.x * 4 + threadIdx.x / WARP;
    if (row >= rows) return;
    const int nb = K / QK_K;
    const block_q6_k* B = (const block_q6_k*)(w + (size_t)row * nb * sizeof(block_q6_k));
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    for (int item = threadIdx.x % WARP; item < nb * 8; item += WARP) {
        const int b = item >> 3, half = (item >> 2) & 1, lp = (item >> 1) & 1, k = item & 1;
        const block_q6_k* blk = B + b;
        const uint8_t* ql = blk->ql + half * 64 + 32 * lp + 16 * k;
        const uint8_t* qh = blk->qh + half * 32 + 16 * k;
        int lo[4], hi[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int l = load_i32_a2(ql + 4 * j), hb = load_i32_a2(qh + 4 * j);
            lo[j] = __vsub4((l & 0x0F0F0F0F) | (((hb >> (2 * lp)) & 0x03030303) << 4), 0x20202020);
            hi[j] = __vsub4(((l >> 4) & 0x0F0F0F0F) | (((hb >> (2 * lp + 4)) & 0x03030303) << 4), 0x20202020);
        }
        const int sidx = half * 8 + 2 * lp + k;
        const float d = __half2float(blk->d);
        const int sc0 = blk->scales[sidx], sc1 = blk->scales[sidx + 4];
        const int i0 = b * QK_K + half * 128 + 32 * lp + 16 * k;
        const int a0 = (b * QK_K + half * 128 + 32 * lp) / 32;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const int8_t* xc = xq + (size_t)c * K;
            const int4 x0 = *(const int4*)(xc + i0);
            const int4 x1 = *(const int4*)(xc + i0 + 64);
            const int xa[4] = {x0.x, x0.y, x0.z, x0.w}, xb[4] = {x1.x, x1.y, x1.z, x1.w};
            int s0 = 0, s1 = 0;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                s0 = __dp4a(lo[j], xa[j], s0);
                s1 = __dp4a(hi[j], xb[j], s1);
            }
            const float2 ds0 = xds[(size_t)c * (K / 32) + a0], ds1 = xds[(size_t)c * (K / 32) + a0 + 2];
            acc[c] += d * (sc0 * ds0.x * s0 + sc1 * ds1.x * s1);
        }
    }
    store_rows<NC>(acc, y, row, rows);
}

// Q8_0: item = (block, half): 16 int8 values.
template <int NC>
__device__ void matvec_q8_0(const uint8_t* __restrict__ w, const int8_t* __restrict__ xq,
                            const float2* __restrict__ xds, float* __restrict__ y, int rows, int K) {
    const int row = blockIdx.x * 4 + threadIdx.x / WARP;
    if (row >= rows) return;
    const int nb = K / QK8_0;
    const block_q8_0* B = (const block_q8_0*)(w + (size_t)row * nb * sizeof(block_q8_0));
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    for (int item = threadIdx.x % WARP; item < nb * 2; item += WARP) {
        const int b = item >> 1, h = item & 1;
        const block_q8_0* blk = B + b;
        int qw[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) qw[j] = load_i32_a2((const uint8_t*)blk->qs + 16 * h + 4 * j);
        const float d = __half2float(blk->d);
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const int4 x0 = *(const int4*)(xq + (size_t)c * K + b * 32 + 16 * h);
            const int xa[4] = {x0.x, x0.y, x0.z, x0.w};
            int s = 0;
#pragma unroll
            for (int j = 0; j < 4; ++j) s = __dp4a(qw[j], xa[j], s);
            acc[c] += d * xds[(size_t)c * (K / 32) + b].x * s;
        }
    }
    store_rows<NC>(acc, y, row, rows);
}

// F16 weights, f32 activation: item = 8 values (one 16-byte load).
template <int NC>
__device__ void matvec_f16(const uint8_t* __restrict__ w, const float* __restrict__ x,
                           float* __restrict__ y, int rows, int K) {
    const int row = blockIdx.x * 4 + threadIdx.x / WARP;
    if (row >= rows) return;
    const __half* W = (const __half*)w + (size_t)row * K;
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    for (int item = threadIdx.x % WARP; item < K / 8; item += WARP) {
        const uint4 raw = *(const uint4*)(W + 8 * item);
        const __half2* h2 = (const __half2*)&raw;
        float wf[8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 f = __half22float2(h2[j]);
            wf[2 * j] = f.x;
            wf[2 * j + 1] = f.y;
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const float4* xc = (const float4*)(x + (size_t)c * K + 8 * item);
            const float4 p = xc[0], q = xc[1];
            acc[c] += wf[0] * p.x + wf[1] * p.y + wf[2] * p.z + wf[3] * p.w +
                      wf[4] * q.x + wf[5] * q.y + wf[6] * q.z + wf[7] * q.w;
        }
    }
    store_rows<NC>(acc, y, row, rows);
}

// F32 weights: item = 4 values.
template <int NC>
__device__ void matvec_f32(const uint8_t* __restrict__ w, const float* __restrict__ x,
                           float* __restrict__ y, int rows, int K) {
    const int row = blockIdx.x * 4 + threadIdx.x / WARP;
    if (row >= rows) return;
    const float4* W = (const float4*)((const float*)w + (size_t)row * K);
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    for (int item = threadIdx.x % WARP; item < K / 4; item += WARP) {
        const float4 wv = W[item];
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const float4 p = ((const float4*)(x + (size_t)c * K))[item];
            acc[c] += wv.x * p.x + wv.y * p.y + wv.z * p.z + wv.w * p.w;
        }
    }
    store_rows<NC>(acc, y, row, rows);
}

#define Q_ARGS const uint8_t* __restrict__ w, const int8_t* __restrict__ xq, const float2* __restrict__ xds, float* __restrict__ y, int rows, int K
#define F_ARGS const uint8_t* __restrict__ w, const float* __restrict__ x, float* __restrict__ y, int rows, int K

// One entry point per (format, columns): NVRTC exports them by these names.
extern "C" __global__ void __launch_bounds__(128) matvec_q4_k_1(Q_ARGS) { matvec_q4_k<1>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q4_k_2(Q_ARGS) { matvec_q4_k<2>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q4_k_3(Q_ARGS) { matvec_q4_k<3>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q4_k_4(Q_ARGS) { matvec_q4_k<4>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q4_k_5(Q_ARGS) { matvec_q4_k<5>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q4_k_6(Q_ARGS) { matvec_q4_k<6>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q4_k_7(Q_ARGS) { matvec_q4_k<7>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q4_k_8(Q_ARGS) { matvec_q4_k<8>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q5_k_1(Q_ARGS) { matvec_q5_k<1>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q5_k_2(Q_ARGS) { matvec_q5_k<2>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q5_k_3(Q_ARGS) { matvec_q5_k<3>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q5_k_4(Q_ARGS) { matvec_q5_k<4>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q5_k_5(Q_ARGS) { matvec_q5_k<5>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q5_k_6(Q_ARGS) { matvec_q5_k<6>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q5_k_7(Q_ARGS) { matvec_q5_k<7>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q5_k_8(Q_ARGS) { matvec_q5_k<8>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q6_k_1(Q_ARGS) { matvec_q6_k<1>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q6_k_2(Q_ARGS) { matvec_q6_k<2>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q6_k_3(Q_ARGS) { matvec_q6_k<3>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q6_k_4(Q_ARGS) { matvec_q6_k<4>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q6_k_5(Q_ARGS) { matvec_q6_k<5>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q6_k_6(Q_ARGS) { matvec_q6_k<6>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q6_k_7(Q_ARGS) { matvec_q6_k<7>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q6_k_8(Q_ARGS) { matvec_q6_k<8>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q8_0_1(Q_ARGS) { matvec_q8_0<1>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q8_0_2(Q_ARGS) { matvec_q8_0<2>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q8_0_3(Q_ARGS) { matvec_q8_0<3>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q8_0_4(Q_ARGS) { matvec_q8_0<4>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q8_0_5(Q_ARGS) { matvec_q8_0<5>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q8_0_6(Q_ARGS) { matvec_q8_0<6>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q8_0_7(Q_ARGS) { matvec_q8_0<7>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_q8_0_8(Q_ARGS) { matvec_q8_0<8>(w, xq, xds, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f16_1(F_ARGS) { matvec_f16<1>(w, x, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f16_2(F_ARGS) { matvec_f16<2>(w, x, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f16_3(F_ARGS) { matvec_f16<3>(w, x, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f16_4(F_ARGS) { matvec_f16<4>(w, x, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f16_5(F_ARGS) { matvec_f16<5>(w, x, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f16_6(F_ARGS) { matvec_f16<6>(w, x, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f16_7(F_ARGS) { matvec_f16<7>(w, x, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f16_8(F_ARGS) { matvec_f16<8>(w, x, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f32_1(F_ARGS) { matvec_f32<1>(w, x, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f32_2(F_ARGS) { matvec_f32<2>(w, x, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f32_3(F_ARGS) { matvec_f32<3>(w, x, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f32_4(F_ARGS) { matvec_f32<4>(w, x, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f32_5(F_ARGS) { matvec_f32<5>(w, x, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f32_6(F_ARGS) { matvec_f32<6>(w, x, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f32_7(F_ARGS) { matvec_f32<7>(w, x, y, rows, K); }
extern "C" __global__ void __launch_bounds__(128) matvec_f32_8(F_ARGS) { matvec_f32<8>(w, x, y, rows, K); }
