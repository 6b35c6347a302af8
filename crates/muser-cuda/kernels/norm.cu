// RMS norms: out = x / sqrt(mean(x^2) + eps) * w, per row (entry, attention, FFN and output
// norms; widths up to the 6656 of Muse Glimmer), per head (the QK norms: 128-wide heads), and
// the fused residual tail h += rmsnorm(x, post); out = rmsnorm(h, next) (SPEC rows 10 and 13).
//
// Launch: rmsnorm and residual_norm one block of 256 threads per row (sums in f32 over a
// fixed tree, so a row's result never depends on the batch); rmsnorm_heads one warp per head,
// 4 heads per block. Measured on the H200: latency-bound (a 6656-wide row is 26 KB).

// Sum over the block (256 threads); every thread gets the total.
__device__ __forceinline__ float block_sum_256(float v) {
    __shared__ float part[8];
    v = warp_sum(v);
    const int w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    float t = lane < 8 ? part[lane] : 0.0f;
    return warp_sum(t);
}

// x, out: [rows][cols]; w: [cols] or null (weight ones).
extern "C" __global__ void __launch_bounds__(256) rmsnorm(const float* __restrict__ x, const float* __restrict__ w,
                                                          float* __restrict__ out, int cols, float eps) {
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* o = out + (size_t)blockIdx.x * cols;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += 256) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum_256(ss) / (float)cols + eps);
    for (int i = threadIdx.x; i < cols; i += 256) o[i] = xr[i] * inv * (w ? w[i] : 1.0f);
}

// In place over every head_dim-wide head of x (n_heads heads in all); w: [head_dim].
extern "C" __global__ void __launch_bounds__(128) rmsnorm_heads(float* __restrict__ x, const float* __restrict__ w,
                                                                int head_dim, int n_heads, float eps) {
    const int h = blockIdx.x * 4 + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (h >= n_heads) return;
    float* xh = x + (size_t)h * head_dim;
    float ss = 0.0f;
    for (int i = lane; i < head_dim; i += WARP) ss += xh[i] * xh[i];
    const float inv = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
    for (int i = lane; i < head_dim; i += WARP) xh[i] = xh[i] * inv * w[i];
}

// h += post ? rmsnorm(x, post, post_eps) : x; out = rmsnorm(h, next, next_eps). h, x, out:
// [rows][cols]; post (may be null) and next: [cols].
extern "C" __global__ void __launch_bounds__(256) residual_norm(float* __restrict__ h, const float* __restrict__ x,
                                                                const float* __restrict__ post, float post_eps,
                                                                const float* __restrict__ next, float next_eps,
                                                                float* __restrict__ out, int cols) {
    const size_t off = (size_t)blockIdx.x * cols;
    float* hr = h + off;
    const float* xr = x + off;
    float* o = out + off;
    float inv = 1.0f;
    if (post) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < cols; i += 256) ss += xr[i] * xr[i];
        inv = rsqrtf(block_sum_256(ss) / (float)cols + post_eps);
    }
    float ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += 256) {
        const float v = hr[i] + (post ? xr[i] * inv * post[i] : xr[i]);
        hr[i] = v;
        ss += v * v;
    }
    const float inv2 = rsqrtf(block_sum_256(ss) / (float)cols + next_eps);
    for (int i = threadIdx.x; i < cols; i += 256) o[i] = hr[i] * inv2 * next[i];
}
