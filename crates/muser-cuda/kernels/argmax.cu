// Greedy sampling on the GPU: the index of the largest logit of each row (the first on ties, as
// muser-sample's argmax), so a greedy decode reads back 4 bytes instead of the vocabulary.
// Launch: one block of 1024 threads per row (202048 logits: 198 per thread).
// Measured on the H200: ~0.8 MB per row, latency-bound.

extern "C" __global__ void __launch_bounds__(1024) argmax_rows(const float* __restrict__ x, int cols,
                                                               uint32_t* __restrict__ idx) { pdl_wait();
    const float* r = x + (size_t)blockIdx.x * cols;
    float best = -INFINITY;
    int bi = 0x7FFFFFFF;
    for (int i = threadIdx.x; i < cols; i += 1024) {
        const float v = r[i];
        if (v > best || (bi == 0x7FFFFFFF && v == best)) { best = v; bi = i; }
    }
    // Reduce (value, index): larger value wins, then the smaller index.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    __shared__ float sv[32];
    __shared__ int si[32];
    const int w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (lane == 0) { sv[w] = best; si[w] = bi; }
    __syncthreads();
    if (w == 0) {
        best = sv[lane];
        bi = si[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
        }
        if (lane == 0) idx[blockIdx.x] = bi == 0x7FFFFFFF ? 0 : bi;
    }
}

// Top-k candidates on the GPU, for a sampler whose pick depends only on the k best-ranked raw
// logits (muser_sample::top_k_logits: the highest logit first, the lower id first on ties, NaN
// never; k <= TOPK_MAX), so a sampled decode reads back k pairs per row instead of the
// vocabulary. Each value becomes a 64-bit key whose order is that ranking: the logit's bits
// mapped to an unsigned total order (as f32::total_cmp, -0 below +0) above ~id; NaN gets key 0,
// below every number, and so does padding. Every key is distinct, so the result does not depend
// on the order of the work. Two launches: topk_slices keeps the TOPK_MAX largest keys of each
// slice of a row (TOPK_SORT values), topk_merge the TOPK_MAX largest of a row's slices' keys.
#define TOPK_MAX 64
#define TOPK_SORT 4096
#define TOPK_THREADS 512
#define TOPK_PER (TOPK_SORT / TOPK_THREADS)

__device__ __forceinline__ unsigned long long topk_key(float v, unsigned id) {
    const unsigned b = __float_as_uint(v);
    unsigned o = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    if (v != v) o = 0u;
    return ((unsigned long long)o << 32) | (unsigned long long)(0xFFFFFFFFu - id);
}

// Sorts the first n (a power of two, <= TOPK_SORT) keys of s in descending order (bitonic
// network; every thread of the block takes part).
__device__ __forceinline__ void topk_sort_desc(unsigned long long* s, int n) {
    for (int ls_size = 1; (1 << ls_size) <= n; ++ls_size)
        for (int ls = ls_size - 1; ls >= 0; --ls) {
            __syncthreads();
            const int size = 1 << ls_size, stride = 1 << ls;
            for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
                // Pair i: lo has bit ls clear, hi = lo + stride (shifts: the strides are powers of 2).
                const int lo = ((i >> ls) << (ls + 1)) | (i & (stride - 1)), hi = lo + stride;
                const unsigned long long a = s[lo], b = s[hi];
                // Descending within blocks of `size` whose index has bit `size` clear.
                if (((lo & size) == 0) == (a < b)) {
                    s[lo] = b;
                    s[hi] = a;
                }
            }
        }
    __syncthreads();
}

// The TOPK_MAX largest of the block's keys (TOPK_PER per thread, TOPK_THREADS threads) into
// s[0 .. TOPK_MAX), largest first. The TOPK_MAX-th largest of the threads' maxima, tau, has at
// least TOPK_MAX keys at or above it (those maxima), so the answer is among the keys >= tau:
// only those (usually a few more than TOPK_MAX) are gathered and sorted.
__device__ __forceinline__ void topk_block(const unsigned long long (&v)[TOPK_PER], unsigned long long* s, int* count) {
    unsigned long long m = v[0];
#pragma unroll
    for (int j = 1; j < TOPK_PER; ++j) m = v[j] > m ? v[j] : m;
    s[threadIdx.x] = m;
    if (threadIdx.x == 0) *count = 0;
    topk_sort_desc(s, TOPK_THREADS);
    const unsigned long long tau = s[TOPK_MAX - 1];
    __syncthreads();
#pragma unroll
    for (int j = 0; j < TOPK_PER; ++j)
        if (v[j] >= tau) s[atomicAdd(count, 1)] = v[j];
    __syncthreads();
    const int c = *count;
    int n = TOPK_MAX;
    while (n < c) n <<= 1;
    for (int i = c + threadIdx.x; i < n; i += blockDim.x) s[i] = 0ull;
    topk_sort_desc(s, n);
}

// Grid (slices, rows), TOPK_THREADS threads: slice s of row r is values s * slice .. of the
// row (slice <= TOPK_SORT).
extern "C" __global__ void __launch_bounds__(TOPK_THREADS) topk_slices(const float* __restrict__ x, int cols,
                                                                        int slice,
                                                                        unsigned long long* __restrict__ part) { pdl_wait();
    __shared__ unsigned long long s[TOPK_SORT];
    __shared__ int count;
    const float* r = x + (size_t)blockIdx.y * cols;
    const int c0 = blockIdx.x * slice, n = min(slice, cols - c0);
    unsigned long long v[TOPK_PER];
#pragma unroll
    for (int j = 0; j < TOPK_PER; ++j) {
        const int i = threadIdx.x + j * TOPK_THREADS;
        v[j] = i < n ? topk_key(r[c0 + i], (unsigned)(c0 + i)) : 0ull;
    }
    topk_block(v, s, &count);
    unsigned long long* out = part + ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * TOPK_MAX;
    for (int i = threadIdx.x; i < TOPK_MAX; i += blockDim.x) out[i] = s[i];
}

// Grid (rows), TOPK_THREADS threads: the `nparts` * TOPK_MAX keys of a row's slices (<=
// TOPK_SORT) into its TOPK_MAX largest, best first.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS) topk_merge(const unsigned long long* __restrict__ part,
                                                                       int nparts,
                                                                       unsigned long long* __restrict__ out) { pdl_wait();
    __shared__ unsigned long long s[TOPK_SORT];
    __shared__ int count;
    const int n = nparts * TOPK_MAX;
    const unsigned long long* p = part + (size_t)blockIdx.x * n;
    unsigned long long v[TOPK_PER];
#pragma unroll
    for (int j = 0; j < TOPK_PER; ++j) {
        const int i = threadIdx.x + j * TOPK_THREADS;
        v[j] = i < n ? p[i] : 0ull;
    }
    topk_block(v, s, &count);
    for (int i = threadIdx.x; i < TOPK_MAX; i += blockDim.x) out[(size_t)blockIdx.x * TOPK_MAX + i] = s[i];
}
