// Host helpers shared by the matvec lab's programs (trace.cu, chain.cu, ring.cu, ...): error checks,
// random Q4_K weights, the engine's one-column grid size (matvec.rs: mvk_blocks), a plain read
// kernel for the read bandwidth and a random Q8_K activation.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

// Random bytes with every Q4_K block's d and dmin set to small halves.
static void fill_q4k(std::vector<unsigned char>& b, unsigned long long seed) {
    unsigned long long x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t o = 0; o + 8 <= b.size(); o += 8) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        memcpy(&b[o], &x, 8);
    }
    for (size_t o = 0; o + 144 <= b.size(); o += 144) {
        b[o] = 0x00; b[o + 1] = 0x20; // d ~ 0.0078
        b[o + 2] = 0x00; b[o + 3] = 0x1C;
    }
}

static int mvk_blocks(long quads, long per, int sms) {
    const long most = sms * 4L, warps = sms * 16L;
    if (quads <= warps && 4 * quads >= 3 * warps) return (int)((quads + 3) / 4);
    long b = ((quads * per + 1) / 2 + 3) / 4;
    return (int)std::max(1L, std::min(b, most));
}

// A plain streaming read of n 16-byte words (the read bandwidth the chain labs report against).
__global__ void read_bw(const uint4* __restrict__ p, size_t n, unsigned* sink) {
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldcs(p + i);
        acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) *sink = 1;
}

// A random int8 activation of K values and its (scale, sum) per 32 values, on the device.
static void random_act(int K, int8_t** xq, float2** xds) {
    CK(cudaMalloc(xq, K));
    CK(cudaMalloc(xds, K / 32 * sizeof(float2)));
    std::vector<int8_t> h(K);
    for (auto& x : h) x = (int8_t)(rand() % 255 - 127);
    CK(cudaMemcpy(*xq, h.data(), K, cudaMemcpyHostToDevice));
    std::vector<float2> d(K / 32);
    for (auto& x : d) x = make_float2(0.01f, (float)(rand() % 2000 - 1000));
    CK(cudaMemcpy(*xds, d.data(), d.size() * sizeof(float2), cudaMemcpyHostToDevice));
}
