// RMS norms: out = x / sqrt(mean(x^2) + eps) * w, per row (entry, attention, FFN and output
// norms; widths up to the 6656 of Muse Glimmer), per head (the QK norms: 128-wide heads), and
// the fused residual tail h += rmsnorm(x, post); out = rmsnorm(h, next) (SPEC rows 10 and 13).
//
// Launch: rmsnorm and residual_norm one block of 1024 threads per row, each thread holding its
// (at most 8) values in registers between the passes (values tid + 1024 k; sums in f32 over a
// fixed tree, so a row's result never depends on the batch); rows up to 8192 wide. rmsnorm_heads one warp per head, 4
// heads per block. Measured on the H200 (2026-11-29, v1 with 256 threads and three passes over
// memory): residual_norm ~20 us per 6656-wide row, latency-bound; this version keeps one load:
// 104 calls per Glimmer token take 1.4 ms synchronized (~6 us each once the ~8 us of
// synchronization is taken off).

// Sum over the block (NORM_T threads = 32 warps); every thread gets the total.
#define NORM_T 1024
#define NORM_V 8 // values per thread held in registers: rows up to 8192 wide
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    v = warp_sum(v);
    const int w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    return warp_sum(part[lane]);
}

// Loads this thread's values i = tid + k * NORM_T of a row (zeros past the end).
__device__ __forceinline__ void load_row(const float* __restrict__ r, int cols, float (&v)[NORM_V]) {
#pragma unroll
    for (int k = 0; k < NORM_V; ++k) {
        const int i = threadIdx.x + k * NORM_T;
        v[k] = i < cols ? r[i] : 0.0f;
    }
}

__device__ __forceinline__ float sum_sq(const float (&v)[NORM_V]) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < NORM_V; ++k) s += v[k] * v[k];
    return s;
}

// x, out: [rows][cols] (cols <= 8192); w: [cols] or null (weight ones).
extern "C" __global__ void __launch_bounds__(NORM_T) rmsnorm(const float* __restrict__ x, const float* __restrict__ w,
                                                             float* __restrict__ out, int cols, float eps) { pdl_wait();
    const size_t off = (size_t)blockIdx.x * cols;
    float v[NORM_V];
    load_row(x + off, cols, v);
    const float inv = rsqrtf(block_sum(sum_sq(v)) / (float)cols + eps);
#pragma unroll
    for (int k = 0; k < NORM_V; ++k) {
        const int i = threadIdx.x + k * NORM_T;
        if (i < cols) out[off + i] = v[k] * inv * (w ? w[i] : 1.0f);
    }
}

// In place over every head_dim-wide head of x (n_heads heads in all); w: [head_dim].
extern "C" __global__ void __launch_bounds__(128) rmsnorm_heads(float* __restrict__ x, const float* __restrict__ w,
                                                                int head_dim, int n_heads, float eps) { pdl_wait();
    const int h = blockIdx.x * 4 + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (h >= n_heads) return;
    float* xh = x + (size_t)h * head_dim;
    float ss = 0.0f;
    for (int i = lane; i < head_dim; i += WARP) ss += xh[i] * xh[i];
    const float inv = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
    for (int i = lane; i < head_dim; i += WARP) xh[i] = xh[i] * inv * w[i];
}

// The thread's values of the weights post (if any) and next of residual_norm, loaded before
// waiting for the kernel before (they do not depend on it), then pdl_wait.
struct NormW {
    float p[NORM_V], n[NORM_V];
};
__device__ __forceinline__ NormW pdl_wait_norm_w(const float* __restrict__ post, const float* __restrict__ next,
                                                 int cols) {
    NormW w;
    if (post) load_row(post, cols, w.p);
    load_row(next, cols, w.n);
    pdl_wait();
    return w;
}

// h += post ? rmsnorm(x, post, post_eps) : x; out = rmsnorm(h, next, next_eps). h, x, out:
// [rows][cols] (cols <= 8192); post (may be null) and next: [cols]. With q non-null (cols a
// multiple of 256) it also writes out's Q8_K quantization (q8k_warp: the bits quantize_q8_k
// would give, row-major) for the matmul that reads out next, which then skips its quantizer
// (backend.rs: residual_norm, quantize_for): out goes through shared memory so that warp w
// holds values 256 w .. 256 w + 255, 8 consecutive ones per lane. H200, llama-glimmer decode:
// 104 residual norms and 209 quantizer launches per token (v10b timeline: 4.4 and 2.2 us each).
// The weights post and next are loaded before pdl_wait (they do not depend on the kernel before).
// xblob (null: none): the quantization in mmw's layout of nt-tile columns as well (q8k_warp).
extern "C" __global__ void __launch_bounds__(NORM_T) residual_norm(float* __restrict__ h, const float* __restrict__ x,
                                                                   const float* __restrict__ post, float post_eps,
                                                                   const float* __restrict__ next, float next_eps,
                                                                   float* __restrict__ out, int cols,
                                                                   int8_t* __restrict__ q, float2* __restrict__ ds,
                                                                   int8_t* __restrict__ bs, uint8_t* __restrict__ xblob,
                                                                   int nt) {
    const NormW wt = pdl_wait_norm_w(post, next, cols);
    __shared__ __align__(16) float so[NORM_V * NORM_T];
    const float(&pw)[NORM_V] = wt.p;
    const float(&nw)[NORM_V] = wt.n;
    const size_t off = (size_t)blockIdx.x * cols;
    float xv[NORM_V], hv[NORM_V];
    load_row(x + off, cols, xv);
    load_row(h + off, cols, hv);
    const float inv = post ? rsqrtf(block_sum(sum_sq(xv)) / (float)cols + post_eps) : 1.0f;
#pragma unroll
    for (int k = 0; k < NORM_V; ++k) {
        const int i = threadIdx.x + k * NORM_T;
        if (i < cols) hv[k] += post ? xv[k] * inv * pw[k] : xv[k];
    }
    const float inv2 = rsqrtf(block_sum(sum_sq(hv)) / (float)cols + next_eps);
#pragma unroll
    for (int k = 0; k < NORM_V; ++k) {
        const int i = threadIdx.x + k * NORM_T;
        if (i < cols) {
            const float o = hv[k] * inv2 * nw[k];
            h[off + i] = hv[k];
            out[off + i] = o;
            so[i] = o;
        }
    }
    if (!q) return;
    __syncthreads();
    // Warps whose 256 values lie in the row (cols a multiple of 256: all or none of a warp's).
    const int i0 = NORM_V * threadIdx.x;
    if (i0 < cols) {
        const float4 a = *(const float4*)(so + i0), b = *(const float4*)(so + i0 + 4);
        const float f[NORM_V] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        q8k_warp(f, blockIdx.x * (cols / QK_K) + threadIdx.x / WARP, threadIdx.x % WARP, q, ds, bs, cols, 0, xblob, nt);
    }
}
