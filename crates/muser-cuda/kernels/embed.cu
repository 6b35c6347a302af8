// Embedding lookup: out[t][i] = dequantized value i of row tokens[t] of the table. Serves the
// token_embd of every model (Muse Glimmer: Q4_K, 202048 rows of 6656 values); one row per token,
// so its time is a few microseconds whatever the kernel does.
//
// Launch: grid (ceil(cols / 256), n_tokens), 256 threads, one value per thread. The formats and
// the repacked Q6_K/Q8_0 planes are those of matvec.cu (FMT_* and the planes described there).
// Measured on the H200: a launch-latency-bound kernel (one row: ~26 KB of Q4_K).

#define EMB_F32 0
#define EMB_F16 1
#define EMB_BF16 2
#define EMB_Q8_0 3
#define EMB_Q4_K 4
#define EMB_Q5_K 5
#define EMB_Q6_K 6

// Value i of row r of a table of `rows` rows of `cols` values, format ty.
__device__ float dequant_value(int ty, const uint8_t* __restrict__ t, long long rows, long long r, int cols, int i) {
    switch (ty) {
    case EMB_F32: return ((const float*)t)[r * cols + i];
    case EMB_F16: return __half2float(((const __half*)t)[r * cols + i]);
    case EMB_BF16: return __uint_as_float((uint32_t)((const uint16_t*)t)[r * cols + i] << 16);
    case EMB_Q8_0: {
        // Planes: int8 [rows][cols], then f16 d [rows][cols/32].
        const float d = __half2float(((const __half*)(t + rows * cols))[r * (cols / 32) + i / 32]);
        return d * (float)((const int8_t*)t)[r * cols + i];
    }
    case EMB_Q4_K:
    case EMB_Q5_K: {
        const bool q5 = ty == EMB_Q5_K;
        const int nb = cols / QK_K;
        const uint8_t* blk = t + kq_blk((int)r, nb, i / QK_K) * (q5 ? 176 : 144);
        const int j = i % QK_K, g = j / 64, within = j % 64, upper = within >= 32, l = within % 32;
        const uint8_t* qs = blk + (q5 ? 48 : 16);
        int q = (qs[32 * g + l] >> (4 * upper)) & 0xF;
        if (q5) q |= ((blk[16 + l] >> (2 * g + upper)) & 1) << 4;
        int sc, m;
        scale_min_k4(2 * g + upper, blk + 4, &sc, &m);
        const float d = __half2float(*(const __half*)blk), dmin = __half2float(*(const __half*)(blk + 2));
        return d * (float)sc * (float)q - dmin * (float)m;
    }
    default: {
        // Q6_K planes (blocks in the order of kq_blk): ql/qh [192], scales [16], d.
        const int nb = cols / QK_K;
        const size_t b = kq_blk((int)r, nb, i / QK_K), n = kq_rows(rows) * nb;
        const uint8_t* qa = t + b * 192;
        const int8_t* sc = (const int8_t*)(t + n * 192) + b * 16;
        const float d = __half2float(((const __half*)(t + n * 208))[b]);
        const int j = i % QK_K, half = j / 128, v = j % 128, quarter = v / 32, l = v % 32;
        const int lowbits = (qa[half * 64 + l + 32 * (quarter & 1)] >> (4 * (quarter >> 1))) & 0xF;
        const int highbits = (qa[128 + half * 32 + l] >> (2 * quarter)) & 3;
        return d * (float)sc[half * 8 + v / 16] * (float)((lowbits | (highbits << 4)) - 32);
    }
    }
}

// out: [n_tokens][cols]; tokens: [n_tokens] (checked < rows by the session).
extern "C" __global__ void embed_rows(const uint8_t* __restrict__ table, int ty, long long rows, int cols,
                                      const uint32_t* __restrict__ tokens, float* __restrict__ out) { pdl_wait();
    const int i = blockIdx.x * 256 + threadIdx.x;
    if (i >= cols) return;
    const int t = blockIdx.y;
    out[(size_t)t * cols + i] = dequant_value(ty, table, rows, tokens[t], cols, i);
}
