// Elementwise ops of the decode chain: the output gate a *= sigmoid(g) (SPEC row 8; 4096 per
// token on Muse Glimmer) and the LM head's epilogue logits = c * tanh(logits * scale / c)
// (rows 15-16; 202048 per token). One thread per value, 256 per block. Measured on the H200:
// latency-bound (under 1 MB each).

extern "C" __global__ void sigmoid_gate(float* __restrict__ a, const float* __restrict__ g, int n) { pdl_wait();
    const int i = blockIdx.x * 256 + threadIdx.x;
    if (i < n) a[i] *= 1.0f / (1.0f + expf(-g[i]));
}

// softcap <= 0: no cap, only the scale.
extern "C" __global__ void scale_softcap(float* __restrict__ x, int n, float scale, float softcap) { pdl_wait();
    const int i = blockIdx.x * 256 + threadIdx.x;
    if (i >= n) return;
    x[i] = softcap > 0.0f ? softcap * tanhf(x[i] * scale / softcap) : x[i] * scale;
}

// The LM head in row chunks (lab run 89): chunk [n][rows] at src, each value scaled (and capped)
// as scale_softcap does, into column r0.. of the [n][v] logits at dst.
extern "C" __global__ void scale_softcap_into(const float* __restrict__ src, float* __restrict__ dst,
                                              int n, int rows, int v, int r0, float scale,
                                              float softcap) { pdl_wait();
    const long i = (long)blockIdx.x * 256 + threadIdx.x;
    if (i >= (long)n * rows) return;
    const long j = i / rows, r = i - j * rows;
    const float x = src[i];
    dst[j * v + r0 + r] = softcap > 0.0f ? softcap * tanhf(x * scale / softcap) : x * scale;
}
