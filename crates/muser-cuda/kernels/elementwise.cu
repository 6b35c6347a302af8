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
