// Lab run 62: does a 32-column decode launch lose time to its last partial wave? `mmw_4` (Q4_K,
// K = 6656, 32 columns, one job: 64-row blocks, 3 resident per SM) timed for B row blocks, B
// from one block per SM to past three waves of 396. If the blocks ran as a stream, time would
// grow with B; if in waves, it steps at multiples of 3 x SMs. Weights random, rotated over
// copies past L2. Build and run on the device:
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/scan scripts/matvec_lab/scan.cu && /tmp/scan
#include "lab_host.h"
#include <cstdint>
#include <cuda_fp16.h>

#include "../../crates/muser-cuda/kernels/common.cuh"
#include "../../crates/muser-cuda/kernels/kq_mma.cuh"
#include "../../crates/muser-cuda/kernels/mmt.cu"

int main() {
    const int K = 6656, nb = K / 256, n = 32, nt = 4;
    CK(cudaFuncSetAttribute(mmw_4, cudaFuncAttributeMaxDynamicSharedMemorySize, mmw_smem(nt)));
    int sms = 0, occ = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, mmw_4, 128, mmw_smem(nt)));
    printf("SMs %d, mmw_4 blocks per SM %d, one wave %d blocks\n", sms, occ, sms * occ);
    // Activation: random Q8_K values, packed once by mmw_pack.
    std::vector<int8_t> q((size_t)n * K), bs((size_t)n * nb * 16);
    std::vector<float2> ds((size_t)n * (K / 32));
    for (auto& x : q) x = (int8_t)(rand() % 255 - 127);
    for (auto& x : bs) x = (int8_t)(rand() % 127 - 63);
    for (auto& x : ds) x = make_float2(0.001f + (rand() % 1000) * 1e-5f, 0.0f);
    int8_t *xq, *xbs;
    float2* xds;
    uint8_t* blob;
    CK(cudaMalloc(&xq, q.size()));
    CK(cudaMalloc(&xbs, bs.size()));
    CK(cudaMalloc(&xds, ds.size() * sizeof(float2)));
    CK(cudaMalloc(&blob, (size_t)nb * mmw_xb(nt)));
    CK(cudaMemcpy(xq, q.data(), q.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(xbs, bs.data(), bs.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(xds, ds.data(), ds.size() * sizeof(float2), cudaMemcpyHostToDevice));
    mmw_pack<<<dim3(nb, 1), 128>>>(xq, xds, xbs, K, n, nt, blob);
    // The largest matrix: 4 waves of blocks; copies of it past L2 (at least 400 MB in all).
    const int maxb = 4 * sms * occ, rows_max = 64 * maxb;
    const size_t mbytes = (size_t)rows_max * nb * 144;
    const int copies = (int)std::max<size_t>(2, (size_t)400e6 / mbytes + 1);
    std::vector<uint8_t*> w(copies);
    std::vector<unsigned char> h(mbytes);
    for (int i = 0; i < copies; ++i) {
        fill_q4k(h, 11 + i);
        CK(cudaMalloc(&w[i], mbytes));
        CK(cudaMemcpy(w[i], h.data(), mbytes, cudaMemcpyHostToDevice));
    }
    float* y;
    CK(cudaMalloc(&y, (size_t)n * rows_max * 4));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int wave = sms * occ;
    std::vector<int> counts;
    for (int b = sms; b <= maxb; b += sms / 2) counts.push_back(b);
    for (int extra : {wave - 12, wave + 12, 2 * wave - 12, 2 * wave + 12, 624, 312})
        counts.push_back(extra);
    std::sort(counts.begin(), counts.end());
    printf("%8s %8s %10s %12s %12s\n", "blocks", "waves", "us", "us/block", "us/wave-eq");
    for (int B : counts) {
        if (B > maxb) continue;
        const int rows = 64 * B;
        MatvecJobs j{};
        j.rows[0] = rows;
        j.ty[0] = FMT_Q4_K;
        j.start[0] = 0;
        j.njobs = 1;
        for (int u = 1; u < 5; ++u) j.start[u] = rows;
        double best = 1e30;
        for (int round = 0; round < 3; ++round) {
            const int reps = 40;
            CK(cudaEventRecord(e0));
            for (int r = 0; r < reps; ++r) {
                j.w[0] = w[r % copies];
                j.y[0] = y;
                mmw_4<<<dim3(1, B, 1), 128, mmw_smem(nt)>>>(j, blob, K, n);
            }
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            best = std::min(best, (double)t * 1e3 / reps);
        }
        CK(cudaGetLastError());
        printf("%8d %8.2f %10.2f %12.4f %12.2f\n", B, (double)B / wave, best, best / B, best * wave / B);
    }
    return 0;
}
