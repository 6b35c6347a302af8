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
// Launch: one thread per (row, pair), 256 threads per block: the pair's cosine and sine once
// (double-precision pow and sincos), then the pair of every head of the row (q: 32 heads of
// 128, k: 2). H200, llama-glimmer pp512: one thread per (row, head, pair), computing them for
// every head, took 2.36 ms of the 512-token prefill (104 launches, 22.7 us each).

extern "C" __global__ void rope(float* __restrict__ x, int n_rows, int cols, int head_dim, int n_rot, int pos0,
                                const int* __restrict__ pos, float freq_base, int neox) { pdl_wait();
    const int half = n_rot / 2;
    const int heads = cols / head_dim;
    const long long idx = (long long)blockIdx.x * 256 + threadIdx.x;
    if (idx >= (long long)n_rows * half) return;
    const int i = idx % half;
    const int t = idx / half;
    const int p = pos ? pos[t] : pos0 + t;
    float cf, sf;
    rope_cs(i, n_rot, p, freq_base, &cf, &sf);
    float* row = x + (size_t)t * cols;
    for (int h = 0; h < heads; ++h) rope_rot(row + (size_t)h * head_dim, i, n_rot, neox, cf, sf);
}
