// Rotary position embedding, in place: each head of row t (at position pos0 + t, or pos[t]) has its pairs
// rotated by theta_i = p * base^(-2i / n_rot), i < n_rot / 2. Pairs are (2i, 2i + 1)
// for GPT-J interleaved RoPE (Muse Glimmer) and (i, i + n_rot / 2) for NeoX. Angles are computed
// in double, as the CPU reference does: positions reach 65536, where an f32 angle would be off
// by ~0.004 rad.
//
// Decode groups pass `pos` (one position per row, on the device); a batch of one sequence passes
// null and pos0. The angle is the same function of the position either way, so a row rotates
// the same alone or in a group.
//
// Launch: one thread per (row, head, pair), 256 threads per block. Serves q (32 heads of 128)
// and k (2 heads) of every RoPE layer. Measured on the H200: latency-bound (16 KB per row).

extern "C" __global__ void rope(float* __restrict__ x, int n_rows, int cols, int head_dim, int n_rot, int pos0,
                                const int* __restrict__ pos, float freq_base, int neox) { pdl_wait();
    const int half = n_rot / 2;
    const int heads = cols / head_dim;
    const long long idx = (long long)blockIdx.x * 256 + threadIdx.x;
    if (idx >= (long long)n_rows * heads * half) return;
    const int i = idx % half;
    const long long hh = idx / half; // row * heads + head
    const int t = hh / heads;
    const int p = pos ? pos[t] : pos0 + t;
    rope_pair(x + hh * head_dim, i, n_rot, p, freq_base, neox);
}
