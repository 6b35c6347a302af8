// What the chain labs share (chain.cu, ahead.cu, normafter.cu, ring.cu, ringx.cu, ffnx.cu), included
// after matvec.cu: grid-wide counters, the one-block small op standing in for the norms, qkv_rows
// and the attention; and, on the host, programmatic launches, the Glimmer-shaped Q4_K layer
// weights, a CUDA-event timer, the read bandwidth, the engine's grids and scratch, and the tables'
// lines and bitwise comparisons.
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

// The global timer in ns (the chain labs' timelines).
__device__ __forceinline__ unsigned long long globaltimer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// The ring labs (ring.cu, ringx.cu): a barrier of the cw consumer warps alone (named barrier 1),
// and a bulk copy global -> shared counted on an mbarrier, with an L2 cache policy (sm_90).
__device__ __forceinline__ void consumers_sync(int cw) { asm volatile("bar.sync 1, %0;" ::"r"(cw * 32) : "memory"); }
__device__ __forceinline__ void bulk_copy_ef(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                             unsigned long long pol) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            dst),
        "l"(src), "r"(bytes), "r"(bar), "l"(pol)
        : "memory");
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

// The exact integer sum isc = sum_s sc_s (q . x)_s of one Q4_K super-block (blk) of one row against
// 256 int8 activation values (xp), by one lane (ring.cu, ringx.cu): dp4a over the nibbles, the
// high ones dotted in place (x 16, the sum then shifted back: exact); sc_lo / sc_hi the unpacked
// scales (unpack_scales_k4).
__device__ __forceinline__ int lab_q4k_isc(const uint8_t* blk, const int8_t* xp, uint32_t sc_lo, uint32_t sc_hi) {
    int isc = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint4 q0 = *(const uint4*)(blk + 16 + 32 * j), q1 = *(const uint4*)(blk + 32 + 32 * j);
        const int4 xa0 = *(const int4*)(xp + 64 * j), xa1 = *(const int4*)(xp + 64 * j + 16);
        const int4 xb0 = *(const int4*)(xp + 64 * j + 32), xb1 = *(const int4*)(xp + 64 * j + 48);
        int da0 = dp4a_us(q0.x & 0x0F0F0F0Fu, xa0.x, 0), da1 = dp4a_us(q1.x & 0x0F0F0F0Fu, xa1.x, 0);
        int db0 = dp4a_us(q0.x & 0xF0F0F0F0u, xb0.x, 0), db1 = dp4a_us(q1.x & 0xF0F0F0F0u, xb1.x, 0);
        da0 = dp4a_us(q0.y & 0x0F0F0F0Fu, xa0.y, da0), da1 = dp4a_us(q1.y & 0x0F0F0F0Fu, xa1.y, da1);
        db0 = dp4a_us(q0.y & 0xF0F0F0F0u, xb0.y, db0), db1 = dp4a_us(q1.y & 0xF0F0F0F0u, xb1.y, db1);
        da0 = dp4a_us(q0.z & 0x0F0F0F0Fu, xa0.z, da0), da1 = dp4a_us(q1.z & 0x0F0F0F0Fu, xa1.z, da1);
        db0 = dp4a_us(q0.z & 0xF0F0F0F0u, xb0.z, db0), db1 = dp4a_us(q1.z & 0xF0F0F0F0u, xb1.z, db1);
        da0 = dp4a_us(q0.w & 0x0F0F0F0Fu, xa0.w, da0), da1 = dp4a_us(q1.w & 0x0F0F0F0Fu, xa1.w, da1);
        db0 = dp4a_us(q0.w & 0xF0F0F0F0u, xb0.w, db0), db1 = dp4a_us(q1.w & 0xF0F0F0F0u, xb1.w, db1);
        const uint32_t scw = j < 2 ? sc_lo : sc_hi;
        const int sh = 16 * (j & 1);
        isc += (int)((scw >> sh) & 0xFF) * (da0 + da1) + (int)((scw >> (sh + 8)) & 0xFF) * ((db0 + db1) >> 4);
    }
    return isc;
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

// One Q4_K matrix as the only job of a one-column launch (mvk_1).
static MatvecJobs q4k_job(const unsigned char* w, float* y, int rows) {
    MatvecJobs j{};
    j.w[0] = w;
    j.y[0] = y;
    j.rows[0] = rows;
    j.ty[0] = FMT_Q4_K;
    j.start[1] = (rows + 3) / 4 * 4;
    j.njobs = 1;
    return j;
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

// The engine's one-column grids of the Glimmer-shaped chain (matvec.rs: mvk_blocks).
struct ChainGrids {
    int q, o, g, d; // q+k+v, attn_output, gate+up, ffn_down
};
static ChainGrids chain_grids(int sms) {
    return ChainGrids{mvk_blocks(RQKV / 4, kq_chunks_host(KD), sms), mvk_blocks(KD / 4, kq_chunks_host(KO), sms),
                      mvk_blocks(KF / 4, 2 * kq_chunks_host(KD), sms), mvk_blocks(KD / 4, kq_chunks_host(KF), sms)};
}

// One line of a chain lab's table: ms per run of `layers` layers of `layer_bytes` each, the rate
// and its share of the read bandwidth bw (GB/s), us a layer.
static void report_layers(const char* name, float ms, double layer_bytes, int layers, double bw, int width = 62) {
    const double gbs = layer_bytes * layers / (ms * 1e-3) / 1e9;
    printf("%-*s %8.3f ms  %7.1f GB/s  %5.1f%%  %7.2f us a layer\n", width, name, ms, gbs, 100.0 * gbs / bw,
           ms * 1000.0 / layers);
}

// Random floats in [lo, hi) on the device.
static float* dev_random(int n, float lo, float hi, unsigned seed) {
    std::vector<float> h(n);
    srand(seed);
    for (auto& x : h) x = lo + (hi - lo) * (float)rand() / (float)RAND_MAX;
    float* d;
    CK(cudaMalloc(&d, n * sizeof(float)));
    CK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static std::vector<float> host_copy(const float* d, int n) {
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// Bitwise comparison with the engine's values r: the number of differing values (added to
// *bad_total) and the largest relative difference.
static void compare(const char* what, const std::vector<float>& a, const std::vector<float>& r, int* bad_total) {
    int bad = 0;
    double mx = 0, err = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (memcmp(&a[i], &r[i], 4) != 0) ++bad;
        mx = std::max(mx, (double)fabsf(r[i]));
        err = std::max(err, (double)fabsf(a[i] - r[i]));
    }
    printf("  %-28s %6d of %6zu values differ from the engine's (largest |diff| / max|ref| %.3g)\n", what, bad, a.size(),
           mx > 0 ? err / mx : err);
    *bad_total += bad;
}

// A chain lab's start: line-buffered output (a hung run still leaves its lines in the log), the
// SM count, and the bytes of one layer (every chain lab's layer: q+k+v, attn_output, gate, up,
// ffn_down) printed.
constexpr double LAYER_BYTES = (double)(BQ + BO + 2 * BG + BD);
static int chain_start() {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("%d SMs; a layer reads %.1f MB\n", sms, LAYER_BYTES / 1e6);
    return sms;
}

// The read bandwidth (GB/s), printed with one layer's bytes at that rate.
static double chain_bandwidth(StreamTimer& timer, int sms) {
    const double bw = read_bandwidth(timer, sms);
    printf("read bandwidth: %.1f GB/s; the chain's bytes at that rate: %.2f us a layer\n", bw, LAYER_BYTES / bw / 1e3);
    return bw;
}

// The one-column kernels' scratch: the shared row quads' chunk values (cv) and counts (cnt, zeroed).
static void chain_scratch(float** cv, unsigned** cnt) {
    CK(cudaMalloc(cv, (size_t)2 * KF * 16 * sizeof(float)));
    CK(cudaMalloc(cnt, 2 * KF / 4 * sizeof(unsigned)));
    CK(cudaMemset(*cnt, 0, 2 * KF / 4 * sizeof(unsigned)));
}

// A Q8_K activation of up to KF values: int8 values, (d, sum) per 32, split sums per 256.
static void chain_act(int8_t** q, float2** ds, int8_t** bs) {
    CK(cudaMalloc(q, KF));
    CK(cudaMalloc(ds, KF / 32 * sizeof(float2)));
    CK(cudaMalloc(bs, KF / 256 * 16));
}
#endif
