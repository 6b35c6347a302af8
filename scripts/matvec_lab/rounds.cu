// Round-structure microbenchmark (issue 5): a warp reads a round of 9 x 512 bytes (mvk's Q4_K
// round), then spends C instructions per lane on it (4 independent dp4a chains), the wave's
// warps striding over 150 MB. PIPE = 1: the next round's loads are issued before the current
// round's arithmetic (registers hold two rounds). Shows how the read bandwidth falls with the
// arithmetic per round, and what overlapping the two buys. Build and run on the device:
//   nvcc -O3 -arch=sm_90 -o /tmp/rounds scripts/matvec_lab/rounds.cu && /tmp/rounds
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

#define PER 9

template <int C>
__device__ __forceinline__ void work(const uint4 (&v)[PER], int (&acc)[4]) {
#pragma unroll
    for (int j = 0; j < C / 4; ++j) {
        const uint4 x = v[j % PER];
        const int wv = (j & 3) == 0 ? x.x : (j & 3) == 1 ? x.y : (j & 3) == 2 ? x.z : x.w;
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[c] = __dp4a(wv ^ c, acc[c] | j, acc[c]);
    }
}

template <int C, int PIPE, int MINB>
__global__ void __launch_bounds__(128, MINB) walk(const uint4* __restrict__ w, size_t pieces, unsigned* out) {
    const unsigned W = gridDim.x * 4, wid = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    int acc[4] = {0, 1, 2, 3};
    const size_t rounds = (pieces + W - 1) / W;
    uint4 nx[PER];
    if (PIPE && wid < pieces)
#pragma unroll
        for (int k = 0; k < PER; ++k) nx[k] = w[(size_t)wid * 32 * PER + 32 * k + lane];
    for (size_t i = 0; i < rounds; ++i) {
        const size_t p = i * W + wid;
        if (p >= pieces) break;
        uint4 v[PER];
        if (PIPE) {
#pragma unroll
            for (int k = 0; k < PER; ++k) v[k] = nx[k];
            const size_t pn = p + W;
            if (pn < pieces)
#pragma unroll
                for (int k = 0; k < PER; ++k) nx[k] = w[pn * 32 * PER + 32 * k + lane];
        } else {
#pragma unroll
            for (int k = 0; k < PER; ++k) v[k] = w[p * 32 * PER + 32 * k + lane];
        }
        work<C>(v, acc);
    }
    if ((acc[0] ^ acc[1] ^ acc[2] ^ acc[3]) == 0x12345678) out[0] = 1;
}

template <int C, int PIPE, int MINB>
float run(const uint4* w, size_t bytes, unsigned* out, int blocks) {
    const size_t pieces = bytes / (512 * PER);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    walk<C, PIPE, MINB><<<blocks, 128>>>(w, pieces, out);
    cudaEventRecord(a);
    const int n = 20;
    for (int i = 0; i < n; ++i) walk<C, PIPE, MINB><<<blocks, 128>>>(w + (i % 2) * (bytes / 16), pieces, out);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    return (float)(pieces * 512 * PER) * n / (ms * 1e-3f) / 1e9f;
}

template <int C>
void row(const uint4* w, size_t bytes, unsigned* out, int sms) {
    printf("C %4d instr/round: 4 blk/SM %5.0f pipe %5.0f | 3 blk/SM %5.0f pipe %5.0f | 6 blk/SM %5.0f pipe %5.0f | 8 blk/SM %5.0f\n", C,
           run<C, 0, 4>(w, bytes, out, 4 * sms), run<C, 1, 4>(w, bytes, out, 4 * sms),
           run<C, 0, 3>(w, bytes, out, 3 * sms), run<C, 1, 3>(w, bytes, out, 3 * sms),
           run<C, 0, 6>(w, bytes, out, 6 * sms), run<C, 1, 6>(w, bytes, out, 6 * sms),
           run<C, 0, 8>(w, bytes, out, 8 * sms));
}

int main() {
    int sms;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const size_t bytes = 150u << 20;
    uint4* w;
    unsigned* out;
    cudaMalloc(&w, 2 * bytes);
    cudaMalloc(&out, 4);
    cudaMemset(w, 1, 2 * bytes);
    row<0>(w, bytes, out, sms);
    row<64>(w, bytes, out, sms);
    row<128>(w, bytes, out, sms);
    row<256>(w, bytes, out, sms);
    row<384>(w, bytes, out, sms);
    row<512>(w, bytes, out, sms);
    row<768>(w, bytes, out, sms);
    return 0;
}
