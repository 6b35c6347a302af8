// What the chain labs share (chain.cu, ahead.cu, normafter.cu, ring.cu), included after matvec.cu:
// grid-wide counters, the one-block small op standing in for the norms, qkv_rows and the attention;
// and, on the host, programmatic launches, the Glimmer-shaped Q4_K layer weights, a CUDA-event
// timer and the read bandwidth.
#pragma once

// A counter read with acquire and added to with release (GPU scope): the grid-wide steps of the
// persistent variants.
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release(unsigned* p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// The small op: out = in / rms(in), one block of 128 threads (two passes over n values).
__device__ __forceinline__ void small_body(const float* __restrict__ in, float* __restrict__ out, int n) {
    __shared__ float red[4];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += 128) {
        const float v = __ldcg(in + i);
        ss = fmaf(v, v, ss);
    }
    ss = warp_sum(ss);
    if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = ss;
    __syncthreads();
    const float s = rsqrtf((red[0] + red[1] + red[2] + red[3]) / n + 1e-6f);
    for (int i = threadIdx.x; i < n; i += 128) out[i] = __ldcg(in + i) * s;
    __syncthreads();
}

__global__ void __launch_bounds__(128) small_k(const float* in, float* out, int n) {
    pdl_wait();
    small_body(in, out, n);
}

#ifndef __CUDACC_RTC__
static int kq_chunks_host(int K) { return (K / 256 + 3) / 4; }

// A launch that may start before the kernel before it ends (its pdl_wait holds it).
template <typename... Args, typename... Real>
static void launch_pdl(void (*k)(Args...), int grid, int block, cudaStream_t s, Real... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, k, args...));
}

// Glimmer's one-column matvec shapes and one layer's Q4_K weights (random bytes, timing only).
constexpr int KD = 6656, KF = 19968, KO = 4096, RQKV = 4608;
constexpr size_t BQ = (size_t)RQKV * (KD / 256) * 144, BO = (size_t)KD * (KO / 256) * 144,
                 BG = (size_t)KF * (KD / 256) * 144, BD = (size_t)KD * (KF / 256) * 144;
struct LayerW {
    unsigned char *q, *o, *g, *u, *d;
};
// nl distinct layers, so that L2 serves none of a cycled chain's weights.
static std::vector<LayerW> upload_layers(int nl) {
    std::vector<LayerW> lw(nl);
    std::vector<unsigned char> h(BG);
    int seed = 1;
    auto up = [&](unsigned char** p, size_t n) {
        h.resize(n);
        fill_q4k(h, seed++);
        CK(cudaMalloc(p, n));
        CK(cudaMemcpy(*p, h.data(), n, cudaMemcpyHostToDevice));
    };
    for (auto& l : lw) {
        up(&l.q, BQ);
        up(&l.o, BO);
        up(&l.g, BG);
        up(&l.u, BG);
        up(&l.d, BD);
    }
    return lw;
}

// ms per run over `reps` runs on stream st, after two warm-up runs.
struct StreamTimer {
    cudaStream_t st;
    cudaEvent_t e0, e1;
    explicit StreamTimer(cudaStream_t s) : st(s) {
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
    }
    template <class F>
    float ms(F&& run, int reps) {
        run();
        run();
        CK(cudaStreamSynchronize(st));
        CK(cudaEventRecord(e0, st));
        for (int r = 0; r < reps; ++r) run();
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        return t / reps;
    }
};

// GB/s of one streaming read of 4 GiB (read_bw of lab_host.h), timed on the timer's stream.
static double read_bandwidth(StreamTimer& timer, int sms) {
    const size_t n = (size_t)4 << 30;
    uint4* p;
    unsigned* sink;
    CK(cudaMalloc(&p, n));
    CK(cudaMemset(p, 1, n));
    CK(cudaMalloc(&sink, 4));
    const float ms = timer.ms([&] { read_bw<<<sms * 8, 512, 0, timer.st>>>(p, n / 16, sink); }, 5);
    CK(cudaFree(p));
    CK(cudaFree(sink));
    return n / (ms * 1e-3) / 1e9;
}
#endif
