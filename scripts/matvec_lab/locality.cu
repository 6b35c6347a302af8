// Read-pattern microbenchmark (issue 5): does the order in which the warps of one wave walk a
// matrix change the DRAM bandwidth? Each pattern reads the same bytes (16 bytes per lane per
// load, `per` loads per lane in flight per round, results summed so nothing is elided):
//   stride:  round i of warp w reads piece i * W + w (the warps of the wave read adjacent pieces)
//   ranges:  warp w reads its own contiguous range, piece after piece (mvk's split: at any time
//            the wave's requests are spread over the whole matrix)
//   blocks:  as ranges, but the ranges are per block of 4 warps, and the block's warps take
//            adjacent pieces inside it
// A piece is 512 * per bytes (one round of a warp). Build and run on the device:
//   nvcc -O3 -arch=sm_90 -o /tmp/loc scripts/matvec_lab/locality.cu && /tmp/loc
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

template <int PER, int MODE>
__global__ void __launch_bounds__(128) walk(const uint4* __restrict__ w, size_t pieces, unsigned* out) {
    const unsigned W = gridDim.x * 4, wid = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    unsigned acc = 0;
    const size_t per_warp = (pieces + W - 1) / W;
    for (size_t i = 0; i < per_warp; ++i) {
        size_t p;
        if (MODE == 0) p = i * W + wid;
        else if (MODE == 1) p = (size_t)wid * per_warp + i;
        else p = ((size_t)blockIdx.x * per_warp + i) * 4 + threadIdx.x / 32;
        if (p >= pieces) break;
        const uint4* b = w + p * 32 * PER;
        uint4 v[PER];
#pragma unroll
        for (int k = 0; k < PER; ++k) v[k] = b[32 * k + lane];
#pragma unroll
        for (int k = 0; k < PER; ++k) acc += v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}

template <int PER, int MODE>
float run(const uint4* w, size_t bytes, unsigned* out, int blocks) {
    const size_t pieces = bytes / (512 * PER);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    walk<PER, MODE><<<blocks, 128>>>(w, pieces, out);
    cudaEventRecord(a);
    const int n = 20;
    for (int i = 0; i < n; ++i) walk<PER, MODE><<<blocks, 128>>>(w + (i % 2) * (bytes / 16), pieces, out);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    return (float)(pieces * 512 * PER) * n / (ms * 1e-3f) / 1e9f;
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
    const char* names[3] = {"stride", "ranges", "blocks"};
    for (int bps : {4, 8}) {
        const int blocks = sms * bps;
        printf("blocks per SM %d (%d warps)\n", bps, blocks * 4);
        for (int mode = 0; mode < 3; ++mode) {
            float g[4];
            switch (mode) {
            case 0: g[0] = run<1, 0>(w, bytes, out, blocks); g[1] = run<3, 0>(w, bytes, out, blocks);
                    g[2] = run<9, 0>(w, bytes, out, blocks); g[3] = run<18, 0>(w, bytes, out, blocks); break;
            case 1: g[0] = run<1, 1>(w, bytes, out, blocks); g[1] = run<3, 1>(w, bytes, out, blocks);
                    g[2] = run<9, 1>(w, bytes, out, blocks); g[3] = run<18, 1>(w, bytes, out, blocks); break;
            default: g[0] = run<1, 2>(w, bytes, out, blocks); g[1] = run<3, 2>(w, bytes, out, blocks);
                    g[2] = run<9, 2>(w, bytes, out, blocks); g[3] = run<18, 2>(w, bytes, out, blocks); break;
            }
            printf("  %-7s GB/s at 512 B x 1 / 3 / 9 / 18 per round: %7.0f %7.0f %7.0f %7.0f\n", names[mode], g[0], g[1],
                   g[2], g[3]);
        }
    }
    return 0;
}
