// The integer tensor-core pieces shared by mmk.cu and mmt.cu (compile.rs puts this header
// before both): the activation arguments, the MMA instructions, the scale bytes, the chunk-tree
// leaf and the L2 prefetch of a chunk of weights.

struct KAct {
    const int8_t* __restrict__ xq;  // [ncols][K] int8, row-major or (kmajor) k-major as in matvec.cu
    const float2* __restrict__ xds; // [ncols][K / 32] (d, sum)
    const int8_t* __restrict__ xbs; // [ncols][K / 256][16] sums split (lo 8, hi 8)
    int K;
    int ncols;
    int kmajor;
};

__device__ __forceinline__ void mmk_k32(int (&d)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mmk_k16(int (&d)[4], int a0, int a1, int b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// Byte s (0..7) of the packed 8 scales lo (0..3), hi (4..7): unsigned.
__device__ __forceinline__ int byte_u(uint32_t lo, uint32_t hi, int s) {
    return (int)(((s < 4 ? lo : hi) >> (8 * (s & 3))) & 0xFF);
}

// Signed byte s (0..15) of 16 int8 values.
__device__ __forceinline__ int byte_s(const uint4& v, int s) {
    const uint32_t w = s < 4 ? v.x : s < 8 ? v.y : s < 12 ? v.z : v.w;
    return (int)(int8_t)(w >> (8 * (s & 3)));
}

// The chunk tree (common.cuh) of super-blocks b0 .. b1 - 1 (at most KQ_CHUNK), for rows row0 + g,
// row0 + g + 8: lo = v_b0 (+ v_b0+1), hi = v_b0+2 (+ v_b0+3); the chunk is lo + hi (or lo).
__device__ __forceinline__ void kq_leaf(float& lo, float& hi, int k, float v) {
    if (k == 0) lo = v;
    else if (k == 1) lo = kq_add(lo, v);
    else if (k == 2) hi = v;
    else hi = kq_add(hi, v);
}

// Asks L2 for chunk ch of the warp's 16 rows (the quants plane of Q6_K): lane l takes row l / 2
// and every other 64 bytes of its chunk, so every 128-byte line is asked for.
__device__ __forceinline__ void mmk_prefetch_chunk(const uint8_t* w, int ty, int row0, int rows, int K, int ch) {
    const int lane = threadIdx.x % WARP, nb = K / QK_K, b0 = ch * KQ_CHUNK;
    if (b0 >= nb || row0 >= rows) return;
    const int bs = ty == FMT_Q6_K ? 192 : ty == FMT_Q5_K ? 176 : 144;
    const int span = (min(b0 + KQ_CHUNK, nb) - b0) * bs;
    const uint8_t* p = w + ((size_t)min(row0 + (lane >> 1), rows - 1) * nb + b0) * bs;
    for (int o = (lane & 1) * 64; o < span; o += 128) prefetch_l2(p + o);
}

// Columns blockIdx.x * BN .. of the launch.
__device__ __forceinline__ KAct mmk_slice(const KAct& a, int bn) {
    const int c0 = blockIdx.x * bn;
    return KAct{a.xq + (size_t)c0 * a.K, a.xds + (size_t)c0 * (a.K / 32), a.xbs + (size_t)c0 * (a.K / QK_K) * 16,
                a.K, min(bn, a.ncols - c0), a.kmajor};
}

#define KACT_ARGS const int8_t* __restrict__ xq, const float2* __restrict__ xds, const int8_t* __restrict__ xbs, \
    int K, int ncols, int kmajor
#define KACT KAct{xq, xds, xbs, K, ncols, kmajor}

#define MMK_SILU_ARGS const uint8_t* __restrict__ wg, int tyg, const uint8_t* __restrict__ wu, int tyu, \
    float* __restrict__ y, int rows

