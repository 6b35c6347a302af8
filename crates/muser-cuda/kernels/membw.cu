// Read bandwidth probe for `muser bench`: streams a large buffer with 16-byte loads, several in
// flight per thread (grid-stride), and folds it into one word per block so nothing is elided.
// Launch: 256 threads per block, 4 blocks per SM x SMs (grid-stride covers the rest).

extern "C" __global__ void __launch_bounds__(256) read_bandwidth(const uint4* __restrict__ x, size_t n, unsigned* __restrict__ out) {
    unsigned acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = x[i], b = x[i + stride], c = x[i + 2 * stride], d = x[i + 3 * stride];
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        const uint4 a = x[i];
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if (threadIdx.x % 32 == 0) atomicXor(out + blockIdx.x, acc);
}
