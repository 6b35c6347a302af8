// Prefill chunks on the f16 tensor cores: K-quant weights (Q4_K, Q5_K, Q6_K in the resident
// layout of matvec.rs `repack`) dequantized in registers straight into the A fragments of
// mma.m16n8k16 (f16 x f16 -> f32), times the activation converted once per matmul to f16 by
// act_f16. Unlike the integer kernels (mmk.cu, mmt.cu: the canonical order of common.cuh, every
// column the bits of mvk_1), the arithmetic is a plain GEMM: per output one f32 accumulator over
// K in a fixed order, so a column's result still depends on that column alone (not on the other
// columns of the chunk, nor on its place in a tile), but it is not the bits of the one-column
// kernels. The engine runs these only on prefill chunks of MMH_MIN (matvec.rs) columns or more,
// never on decode groups (batch.rs: decode stays bit-identical alone and in groups).
//
// Activation (act_f16): column c of x (f32) scaled by 2^-e_c so its largest magnitude lies in
// [2^13, 2^14) (exact: a power of two; the output is multiplied back by xs[c] = 2^e_c), as f16,
// each group of 4 values stored in the order 0, 2, 1, 3 (what the fragment layout below wants).
//
// Launch: 256 threads (8 warps) per block; a block takes MMH_BM = 128 rows (one job's: each job
// padded to 128 rows) and MMH_BN = 128 columns (grid x: column tiles, so the blocks of one row
// block run side by side and share its weights in L2; grid y: row blocks). Warp w takes rows
// 32 (w % 4) .. + 31 (2 MMA row tiles) and columns 64 (w / 4) .. + 63 (8 MMA column tiles): 64
// f32 accumulators per thread. Per super-block, the block copies the 128 rows' blocks and the 128
// columns' 256 f16 values to shared memory with cp.async (two stages: the next super-block's
// copy runs under this one's MMAs).
//
// Fragments: lane (g = lane / 4, t = lane % 4) of a warp reads 8 weight bytes per row and
// 64-value chunk of a super-block, the bytes 8t .. 8t + 7 of the chunk's 32 quant bytes (Q4_K,
// Q5_K: qs; Q6_K: ql), whose low nibbles are 8 values of one 32-value group and whose high
// nibbles 8 values of another. One k16 step takes 4 of those bytes: fragment positions 2t,
// 2t + 1, 2t + 8, 2t + 9 hold the values of bytes 0, 2, 1, 3 (one mask pulls bytes 0 and 2 into
// the two halves of a register), and the activation's stored order 0, 2, 1, 3 puts the same
// values' activations at the same positions of the B fragment, read with one 16-byte load per
// column tile and two k16 steps. Each value becomes f16 as (1024 + q) - 1024 (exact) times its
// sub-block's scale minus its min (Q4_K, Q5_K: one rounding, fma) or ((1024 + q) - 1056) times
// its scale (Q6_K: q - 32 exact, one rounding).

#define MMH_BM 128
#define MMH_BN 128
#define MMH_THREADS 256
// Shared-memory row stride of the activation (bytes): 256 f16 values + 64, so the 8 columns a
// quarter warp reads with 16-byte loads (2 columns x 4 lanes) fall in distinct banks.
#define MMH_XS 576

// Per format: bytes of a row's super-block copied (Q6_K: plane A, then plane B's 16 scales),
// 16-byte pieces, and the shared-memory row stride (bytes mod 128 = 32 or 96: the 8-byte
// weight loads of a quarter warp, 4 rows x 4 lanes, are free of bank conflicts).
template <int FMT>
struct MmhFmt;
template <>
struct MmhFmt<FMT_Q4_K> {
    static constexpr int PC = 9, WS = 160, Q = 16; // Q: where the 4-bit quants start
};
template <>
struct MmhFmt<FMT_Q5_K> {
    static constexpr int PC = 11, WS = 224, Q = 48;
};
template <>
struct MmhFmt<FMT_Q6_K> {
    static constexpr int PC = 13, WS = 224, Q = 0;
};

// Bytes of one stage: the activation tile, the weights, Q6_K's 128 d values.
#define MMH_STAGE (MMH_BN * MMH_XS + MMH_BM * 224 + MMH_BM * 2)

__device__ __forceinline__ void mmh_cp16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}
__device__ __forceinline__ void mmh_cp8(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}

// The block's copies of one super-block, planned once per launch: thread t copies the 16-byte
// pieces p = t + 256 i of the weights (row p / PC, piece p % PC), whose sources move by 4 blocks
// per super-block (kq_blk), and piece t % 32 of columns t / 32 + 8 i of the activation. Rows and
// columns past the matrix are not copied: their outputs are never stored, and each output reads
// only its own row's and column's stage bytes. Offsets are 32-bit (matvec.rs: mmt_fits).
template <int FMT, int THREADS>
struct MmhPlan {
    using F = MmhFmt<FMT>;
    static constexpr int NP = (MMH_BM * F::PC + THREADS - 1) / THREADS, CP = THREADS / 32; // CP: columns per pass
    static constexpr uint32_t BS = FMT == FMT_Q4_K ? 144 : FMT == FMT_Q5_K ? 176 : 192;
    uint32_t src[NP]; // bytes from w at super-block 0
    uint32_t dst[NP]; // place in the stage (bit 31: Q6_K's scales piece); 0xFFFFFFFF: no piece
    uint32_t dsrc;    // Q6_K, threads < 32: the quad's d at super-block 0 (0xFFFFFFFF: none)
    const uint8_t* x; // the activation piece of column t / 32 at super-block 0
    int nx;           // activation pieces of this thread (columns t / 32 + 8 i < ncols)
    size_t xstep;     // 8 columns further

    __device__ __forceinline__ MmhPlan(int row0, int rows, int nb, const __half* xh, int k, int c0, int ncols) {
        const int t = threadIdx.x;
        const uint32_t nblk = (uint32_t)(kq_rows(rows) * nb);
#pragma unroll
        for (int i = 0; i < NP; ++i) {
            const int p = t + THREADS * i, r = p / F::PC, c = p - r * F::PC;
            dst[i] = 0xFFFFFFFFu;
            src[i] = 0;
            if (p < MMH_BM * F::PC && row0 + r < rows) {
                const uint32_t blk = (uint32_t)kq_blk(row0 + r, nb, 0);
                src[i] = FMT == FMT_Q6_K ? (c < 12 ? blk * 192 + 16 * c : nblk * 192 + blk * 16) : blk * BS + 16 * c;
                dst[i] = (MMH_BN * MMH_XS + r * F::WS + 16 * c) | (FMT == FMT_Q6_K && c == 12 ? 0x80000000u : 0);
            }
        }
        dsrc = FMT == FMT_Q6_K && t < MMH_BM / 4 && row0 + 4 * t < rows
                   ? nblk * 208 + (uint32_t)kq_blk(row0 + 4 * t, nb, 0) * 2
                   : 0xFFFFFFFFu;
        const int col = t >> 5;
        x = (const uint8_t*)(xh + (size_t)(c0 + col) * k) + 16 * (t & 31);
        xstep = (size_t)2 * CP * k;
        nx = c0 + col < ncols ? (ncols - 1 - c0 - col) / CP + 1 : 0;
    }

    // Super-block sb into stage st, committed.
    __device__ __forceinline__ void copy(uint8_t* st, const uint8_t* __restrict__ w, int sb) const {
        const int t = threadIdx.x;
        uint8_t* dx = st + (t >> 5) * MMH_XS + 16 * (t & 31);
        const uint8_t* sx = x + (size_t)sb * 512;
#pragma unroll
        for (int i = 0; i < MMH_BN / CP; ++i)
            if (i < nx) mmh_cp16(dx + CP * i * MMH_XS, sx + i * xstep);
        // Q6_K: plane B's scales (piece 12) move by 4 x 16 bytes per super-block, the rest 4 blocks.
#pragma unroll
        for (int i = 0; i < NP; ++i)
            if (dst[i] != 0xFFFFFFFFu) {
                const uint32_t step = dst[i] >> 31 ? 64 : 4 * BS;
                mmh_cp16(st + (dst[i] & 0x7FFFFFFFu), w + (src[i] + (uint32_t)sb * step));
            }
        if (FMT == FMT_Q6_K && dsrc != 0xFFFFFFFFu) mmh_cp8(st + MMH_BN * MMH_XS + MMH_BM * 224 + 8 * t, w + (dsrc + 8u * sb));
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
};

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
// The values v (0 .. 1023, in bits 0-9 and 16-25) as the halves 1024 + v.
__device__ __forceinline__ __half2 h2_magic(uint32_t v) {
    const uint32_t r = v | 0x64006400u;
    return *reinterpret_cast<const __half2*>(&r);
}

// One row's scales for one 64-value chunk: the f16 scale and negated min of its two groups
// (broadcast to both halves), Q6_K's mins unused.
struct MmhScales {
    __half2 s0, m0, s1, m1;
};

// One row's header of a super-block (what every chunk's scales come from).
template <int FMT>
struct MmhRow {
    float d, dmin;
    uint32_t a, b, c, e; // Q4_K/Q5_K: packed 6-bit scales lo, hi, mins lo, hi; Q6_K: the 16 int8 scales
    uint2 qh;            // Q5_K: the lane's 8 bytes of qh
    __device__ __forceinline__ void load(const uint8_t* row, int t) {
        if (FMT == FMT_Q6_K) {
            const uint4 s = *reinterpret_cast<const uint4*>(row + 192);
            a = s.x, b = s.y, c = s.z, e = s.w;
        } else {
            const uint4 h = *reinterpret_cast<const uint4*>(row);
            const __half2 dd = *reinterpret_cast<const __half2*>(&h.x);
            d = __low2float(dd), dmin = __high2float(dd);
            unpack_scales_k4(h.y, h.z, h.w, &a, &b, &c, &e);
            if (FMT == FMT_Q5_K) qh = *reinterpret_cast<const uint2*>(row + 16 + 8 * t);
        }
    }
    // Chunk ch (0..3). Q4_K/Q5_K: groups = sub-blocks 2 ch, 2 ch + 1. Q6_K: half n = ch / 2,
    // p = ch % 2: groups q = p (low nibbles) and q = p + 2 (high), the lane's scale of each
    // (l / 16 = t / 2): byte 8n + 2q + t / 2.
    __device__ __forceinline__ MmhScales scales(int ch, int t) const {
        MmhScales r;
        if (FMT == FMT_Q6_K) {
            const int n = ch >> 1, p = ch & 1, i0 = 8 * n + 2 * p + (t >> 1), i1 = i0 + 4;
            const uint32_t w0 = i0 < 4 ? a : i0 < 8 ? b : i0 < 12 ? c : e;
            const uint32_t w1 = i1 < 4 ? a : i1 < 8 ? b : i1 < 12 ? c : e;
            r.s0 = __float2half2_rn(d * (float)(int8_t)(w0 >> (8 * (i0 & 3))));
            r.s1 = __float2half2_rn(d * (float)(int8_t)(w1 >> (8 * (i1 & 3))));
            r.m0 = r.m1 = __float2half2_rn(0.f);
        } else {
            const uint32_t sc = ch < 2 ? a : b, mn = ch < 2 ? c : e;
            const int sh = 16 * (ch & 1);
            r.s0 = __float2half2_rn(d * (float)((sc >> sh) & 0xFF));
            r.s1 = __float2half2_rn(d * (float)((sc >> (sh + 8)) & 0xFF));
            r.m0 = __float2half2_rn(-dmin * (float)((mn >> sh) & 0xFF));
            r.m1 = __float2half2_rn(-dmin * (float)((mn >> (sh + 8)) & 0xFF));
        }
        return r;
    }
};

// The f16 values of quant pair v (bits 0-5 and 16-21) with scale s and negated min m.
template <int FMT>
__device__ __forceinline__ uint32_t mmh_value(uint32_t v, __half2 s, __half2 m) {
    if (FMT == FMT_Q6_K) return h2_bits(__hmul2(__hsub2(h2_magic(v), __float2half2_rn(1056.f)), s));
    return h2_bits(__hfma2(__hsub2(h2_magic(v), __float2half2_rn(1024.f)), s, m));
}

// A fragments of one row for one k16 step: quant word u (4 bytes), high-bit word h (Q5_K: qh
// bytes, bit hb; Q6_K: qh bytes, bits hb, hb + 1), nibble shift ns (0: low, 4: high).
template <int FMT>
__device__ __forceinline__ void mmh_pair(uint32_t u, uint32_t h, int ns, int hb, __half2 s, __half2 m, uint32_t& p02,
                                         uint32_t& p13) {
    uint32_t a = (u >> ns) & 0x000F000Fu, b = (u >> (ns + 8)) & 0x000F000Fu;
    if (FMT == FMT_Q5_K) {
        a |= ((h >> hb) & 0x00010001u) << 4;
        b |= ((h >> (hb + 8)) & 0x00010001u) << 4;
    } else if (FMT == FMT_Q6_K) {
        a |= ((h >> hb) & 0x00030003u) << 4;
        b |= ((h >> (hb + 8)) & 0x00030003u) << 4;
    }
    p02 = mmh_value<FMT>(a, s, m);
    p13 = mmh_value<FMT>(b, s, m);
}

// The MMAs of one super-block of the stage (weights at sw, the lane's first activation at sx)
// for the warp's MT row tiles (lane rows wrow + 16 i (+ 8)) and NT column tiles.
template <int FMT, int MT, int NT, bool UNR>
__device__ __forceinline__ void mmh_superblock(float (&acc)[MT][NT][4], const uint8_t* sw, const uint8_t* sx,
                                               int wrow, int t) {
    using F = MmhFmt<FMT>;
    // The lane's rows: row tile i, half h -> wrow + 16 i + 8 h.
    const uint8_t* wr[MT][2];
    MmhRow<FMT> hd[MT][2];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = wrow + 16 * i + 8 * h;
            wr[i][h] = sw + r * F::WS;
            hd[i][h].load(wr[i][h], t);
            if (FMT == FMT_Q6_K) hd[i][h].d = __half2float(reinterpret_cast<const __half*>(sw + MMH_BM * 224)[r]);
            if (FMT != FMT_Q5_K) hd[i][h].qh = make_uint2(0, 0);
        }
#pragma unroll(UNR ? 4 : 1)
    for (int ch = 0; ch < 4; ++ch) {
        // The lane's 8 quant bytes of each row, and Q6_K's 8 qh bytes (half ch / 2).
        uint2 q[MT][2], h6[MT][2];
        MmhScales s[MT][2];
        const int qoff = FMT == FMT_Q6_K ? 64 * (ch >> 1) + 32 * (ch & 1) : F::Q + 32 * ch;
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                q[i][h] = *reinterpret_cast<const uint2*>(wr[i][h] + qoff + 8 * t);
                h6[i][h] = FMT == FMT_Q6_K ? *reinterpret_cast<const uint2*>(wr[i][h] + 128 + 32 * (ch >> 1) + 8 * t)
                                           : hd[i][h].qh;
                s[i][h] = hd[i][h].scales(ch, t);
            }
        // Group 0 (low nibbles) and 1 (high), their first values in the super-block.
#pragma unroll
        for (int grp = 0; grp < 2; ++grp) {
            const int v0 = FMT == FMT_Q6_K ? 128 * (ch >> 1) + 32 * (ch & 1) + 64 * grp : 64 * ch + 32 * grp;
            // Q5_K: qh bit 2 ch + grp; Q6_K: bits 2q, 2q + 1 with q = ch % 2 + 2 grp.
            const int hb = FMT == FMT_Q6_K ? 2 * ((ch & 1) + 2 * grp) : 2 * ch + grp;
            // Both k16 steps' A fragments, then the column tiles 8 at a time: one 16-byte
            // activation load per column tile serves both steps.
            uint32_t a[2][MT][4];
#pragma unroll
            for (int step = 0; step < 2; ++step)
#pragma unroll
                for (int i = 0; i < MT; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const uint32_t u = step ? q[i][h].y : q[i][h].x;
                        const uint32_t hw = step ? h6[i][h].y : h6[i][h].x;
                        mmh_pair<FMT>(u, hw, 4 * grp, hb, grp ? s[i][h].s1 : s[i][h].s0, grp ? s[i][h].m1 : s[i][h].m0,
                                      a[step][i][h], a[step][i][h + 2]);
                    }
#pragma unroll
            for (int jh = 0; jh < NT / 8; ++jh) {
                uint4 bx[8];
#pragma unroll
                for (int j = 0; j < 8; ++j)
                    bx[j] = *reinterpret_cast<const uint4*>(sx + (8 * jh + j) * 8 * MMH_XS + 2 * v0);
#pragma unroll
                for (int step = 0; step < 2; ++step)
#pragma unroll
                    for (int i = 0; i < MT; ++i)
#pragma unroll
                        for (int j = 0; j < 8; ++j)
                            mma_f16(acc[i][8 * jh + j], a[step][i][0], a[step][i][1], a[step][i][2], a[step][i][3],
                                    step ? bx[j].z : bx[j].x, step ? bx[j].w : bx[j].y);
            }
        }
    }
}

// mmh_superblock for one row tile and 16 column tiles (mmh_p), software-pipelined: the 32-value
// groups' MMAs run in two halves of 8 column tiles, and each half's activation loads are issued
// before the MMAs of the half before it, so the shared-memory latency hides under the tensor
// pipe's work (two warps per scheduler cannot hide it otherwise).
template <int FMT>
__device__ __forceinline__ void mmh_superblock_p(float (&acc)[1][16][4], const uint8_t* sw, const uint8_t* sx,
                                                 int wrow, int t) {
    using F = MmhFmt<FMT>;
    const uint8_t* wr[2];
    MmhRow<FMT> hd[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = wrow + 8 * h;
        wr[h] = sw + r * F::WS;
        hd[h].load(wr[h], t);
        if (FMT == FMT_Q6_K) hd[h].d = __half2float(reinterpret_cast<const __half*>(sw + MMH_BM * 224)[r]);
        if (FMT != FMT_Q5_K) hd[h].qh = make_uint2(0, 0);
    }
    // Group p (0..7): chunk p / 2, low (p even) or high nibbles; its first value in the super-block.
    auto v0_of = [](int p) {
        const int ch = p >> 1, grp = p & 1;
        return FMT == FMT_Q6_K ? 128 * (ch >> 1) + 32 * (ch & 1) + 64 * grp : 64 * ch + 32 * grp;
    };
    uint4 b0[8], b1[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) b0[j] = *reinterpret_cast<const uint4*>(sx + j * 8 * MMH_XS + 2 * v0_of(0));
    uint2 q[2], h6[2];
    MmhScales sc[2];
#pragma unroll 1
    for (int p = 0; p < 8; ++p) {
        const int ch = p >> 1, grp = p & 1, v0 = v0_of(p);
        if (grp == 0) {
            const int qoff = FMT == FMT_Q6_K ? 64 * (ch >> 1) + 32 * (ch & 1) : F::Q + 32 * ch;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                q[h] = *reinterpret_cast<const uint2*>(wr[h] + qoff + 8 * t);
                h6[h] = FMT == FMT_Q6_K ? *reinterpret_cast<const uint2*>(wr[h] + 128 + 32 * (ch >> 1) + 8 * t) : hd[h].qh;
                sc[h] = hd[h].scales(ch, t);
            }
        }
        const int hb = FMT == FMT_Q6_K ? 2 * ((ch & 1) + 2 * grp) : 2 * ch + grp;
        uint32_t a[2][4];
#pragma unroll
        for (int step = 0; step < 2; ++step)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                mmh_pair<FMT>(step ? q[h].y : q[h].x, step ? h6[h].y : h6[h].x, 4 * grp, hb, grp ? sc[h].s1 : sc[h].s0,
                              grp ? sc[h].m1 : sc[h].m0, a[step][h], a[step][h + 2]);
#pragma unroll
        for (int j = 0; j < 8; ++j) b1[j] = *reinterpret_cast<const uint4*>(sx + (8 + j) * 8 * MMH_XS + 2 * v0);
#pragma unroll
        for (int step = 0; step < 2; ++step)
#pragma unroll
            for (int j = 0; j < 8; ++j)
                mma_f16(acc[0][j], a[step][0], a[step][1], a[step][2], a[step][3], step ? b0[j].z : b0[j].x,
                        step ? b0[j].w : b0[j].y);
        if (p + 1 < 8) {
            const int vn = v0_of(p + 1);
#pragma unroll
            for (int j = 0; j < 8; ++j) b0[j] = *reinterpret_cast<const uint4*>(sx + j * 8 * MMH_XS + 2 * vn);
        }
#pragma unroll
        for (int step = 0; step < 2; ++step)
#pragma unroll
            for (int j = 0; j < 8; ++j)
                mma_f16(acc[0][8 + j], a[step][0], a[step][1], a[step][2], a[step][3], step ? b1[j].z : b1[j].x,
                        step ? b1[j].w : b1[j].y);
    }
}

// One block's tile. MT x NT = 16 MMA tiles per warp: MT = 2 (warps 4 x 2: 32 rows x 64
// columns each) or MT = 1 (warps 8 x 1: 16 rows x 128 columns each, no weight dequantized
// twice); UNR: the chunk loop unrolled.
template <int FMT, int MT, bool UNR, int WARPS, bool PIPE>
__device__ __forceinline__ void mmh_kernel(const uint8_t* __restrict__ w, int rows, float* __restrict__ y, int row0,
                                           const __half* __restrict__ xh, const float* __restrict__ xs, int k,
                                           int ncols, const float* __restrict__ gate, uint8_t* smem) {
    constexpr int NT = WARPS == 16 ? 8 : 16 / MT;
    const int nb = k / QK_K, c0 = blockIdx.x * MMH_BN;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // The lane's first row and the warp's first column.
    const int wrow = WARPS == 16 ? 16 * (warp & 7) + g : MT == 2 ? 32 * (warp & 3) + g : 16 * warp + g;
    const int wcol = WARPS == 16 ? 64 * (warp >> 3) : MT == 2 ? 64 * (warp >> 2) : 0;
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    const MmhPlan<FMT, 32 * WARPS> plan(row0, rows, nb, xh, k, c0, ncols);
    plan.copy(smem, w, 0);
#pragma unroll 1
    for (int sb = 0; sb < nb; ++sb) {
        uint8_t* st = smem + (sb & 1) * MMH_STAGE;
        if (sb + 1 < nb) {
            plan.copy(smem + ((sb + 1) & 1) * MMH_STAGE, w, sb + 1);
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncthreads();
        if constexpr (PIPE)
            mmh_superblock_p<FMT>(acc, st + MMH_BN * MMH_XS, st + g * MMH_XS + 16 * t, wrow, t);
        else
            mmh_superblock<FMT, MT, NT, UNR>(acc, st + MMH_BN * MMH_XS, st + (wcol + g) * MMH_XS + 16 * t, wrow, t);
        __syncthreads(); // the next iteration's copy overwrites this stage
    }

    // Outputs: acc[i][j] = rows wrow + 16 i (+ 8), columns wcol + 8 j + 2 t (+ 1).
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int col = c0 + wcol + 8 * j + 2 * t + e;
            if (col >= ncols) continue;
            const float sc = xs[col];
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = row0 + wrow + 16 * i + 8 * h;
                    if (r >= rows) continue;
                    const size_t o = (size_t)col * rows + r;
                    float v = acc[i][j][2 * h + e] * sc;
                    if (gate) {
                        const float gv = gate[o];
                        v *= gv / (1.0f + expf(-gv));
                    }
                    y[o] = v;
                }
        }
}

template <int MT, bool UNR, int WARPS = 8, bool PIPE = false>
__device__ __forceinline__ void mmh_entry(const MatvecJobs& jobs, const __half* __restrict__ xh,
                                          const float* __restrict__ xs, int K, int ncols,
                                          const float* __restrict__ gate) {
    extern __shared__ __align__(16) uint8_t mmh_smem[];
    const int grow = blockIdx.y * MMH_BM;
    int j = 0;
#pragma unroll
    for (int u = 1; u < 4; ++u)
        if (u < jobs.njobs && grow >= jobs.start[u]) j = u;
    const int row0 = grow - jobs.start[j];
    if (row0 >= jobs.rows[j]) return; // padding rows of the job
    if (jobs.ty[j] == FMT_Q4_K)
        mmh_kernel<FMT_Q4_K, MT, UNR, WARPS, PIPE>(jobs.w[j], jobs.rows[j], jobs.y[j], row0, xh, xs, K, ncols, gate, mmh_smem);
    else if (jobs.ty[j] == FMT_Q5_K)
        mmh_kernel<FMT_Q5_K, MT, UNR, WARPS, PIPE>(jobs.w[j], jobs.rows[j], jobs.y[j], row0, xh, xs, K, ncols, gate, mmh_smem);
    else if (jobs.ty[j] == FMT_Q6_K)
        mmh_kernel<FMT_Q6_K, MT, UNR, WARPS, PIPE>(jobs.w[j], jobs.rows[j], jobs.y[j], row0, xh, xs, K, ncols, gate, mmh_smem);
}

// y_j = W_j x for the matrices of `jobs` (rows padded to MMH_BM per job; a block's rows lie in
// one job), x the f16 activation of act_f16 (ncols columns of K values, column scales xs).
// gate (or null): y = silu(gate) * (W x) elementwise, gate laid out as y (the up half of
// ffn_gate_up_silu; the gate's own launch wrote it). Dynamic shared memory: 2 * MMH_STAGE.
#define MMH_ARGS                                                                                                   \
    MatvecJobs jobs, const __half *__restrict__ xh, const float *__restrict__ xs, int K, int ncols,               \
        const float *__restrict__ gate
extern "C" __global__ void __launch_bounds__(MMH_THREADS, 1) mmh(MMH_ARGS) {
    pdl_wait();
    mmh_entry<2, false>(jobs, xh, xs, K, ncols, gate);
}
extern "C" __global__ void __launch_bounds__(MMH_THREADS, 1) mmh_u(MMH_ARGS) {
    pdl_wait();
    mmh_entry<2, true>(jobs, xh, xs, K, ncols, gate);
}
extern "C" __global__ void __launch_bounds__(MMH_THREADS, 1) mmh_w(MMH_ARGS) {
    pdl_wait();
    mmh_entry<1, false>(jobs, xh, xs, K, ncols, gate);
}
extern "C" __global__ void __launch_bounds__(MMH_THREADS, 1) mmh_wu(MMH_ARGS) {
    pdl_wait();
    mmh_entry<1, true>(jobs, xh, xs, K, ncols, gate);
}
// Warps of 16 rows x 128 columns, software-pipelined (mmh_superblock_p).
extern "C" __global__ void __launch_bounds__(MMH_THREADS, 1) mmh_p(MMH_ARGS) {
    pdl_wait();
    mmh_entry<1, false, 8, true>(jobs, xh, xs, K, ncols, gate);
}
// 16 warps (8 x 2: 16 rows x 64 columns each) at most 128 registers.
extern "C" __global__ void __launch_bounds__(512, 1) mmh_x(MMH_ARGS) {
    pdl_wait();
    mmh_entry<1, false, 16>(jobs, xh, xs, K, ncols, gate);
}
extern "C" __global__ void __launch_bounds__(512, 1) mmh_xu(MMH_ARGS) {
    pdl_wait();
    mmh_entry<1, true, 16>(jobs, xh, xs, K, ncols, gate);
}

// ---------------------------------------------------------------------------------------------
// mmh_g: the same GEMM on Hopper's warpgroup MMA (wgmma.mma_async m64n128k16, A from registers,
// B from shared memory): two warpgroups per block, each 64 of the block's 128 rows x all 128
// columns, so each dequantized weight feeds 128 columns in one asynchronous MMA and the next
// chunk's dequantization runs while it computes.
//
// B (the activation) in shared memory: 16-value k16 slices of MMG_SLICE bytes, each two pieces
// of 8 stored values (p = 0, 1) x 128 columns, piece p of column c at p * MMG_LBO + 16 c: the
// core matrices (8 columns x 16 bytes) wgmma reads without swizzling, leading byte offset
// MMG_LBO, stride byte offset 128. MMG_LBO = 2048 + 16 and MMG_SLICE = 4096 + 32 put a quarter
// warp's 8 copies (4 slices x 2 pieces of one column) in 8 different bank groups.
//
// A: lane (g, t) of warp q of the warpgroup holds rows 16 q + g, + 8 and, per k16 slice of
// stored values 16 s .. 16 s + 15, the stored positions 2t, 2t + 1 and 2t + 8, 2t + 9. With the
// activation's stored order (0, 2, 1, 3 per 4 values) those are the values (0, 2), (1, 3), (4,
// 6), (5, 7) (+ 8) for t = 0 .. 3: quant bytes 4 (t / 2) and + 2 of one word, shifted by 8 (t % 2)
// -- one mask makes the half2 pair. A 32-value group (bytes l = 0 .. 31 of its quants) is two
// slices: words t / 2 + {0, 2} and t / 2 + {4, 6} of its 32 bytes.

#define MMG_LBO 2048
#define MMG_SLICE 4096
// The pipeline's shared memory: 2 weight stages (one super-block each: 128 rows x 224 + Q6_K's
// d) and 4 activation stages of half a super-block (8 slices), so the activation is copied two
// half super-blocks ahead.
#define MMG_WST (MMH_BM * 224 + MMH_BM * 2)
#define MMG_XST (8 * MMG_SLICE)

__device__ __forceinline__ void wgmma_128(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          unsigned long long desc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
#else
    __trap(); // routed to only on sm_90 (compiled as sm_90a: compile.rs file_arch)
#endif
}
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
#define WGMMA_WAIT(N) asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory")
#else
__device__ __forceinline__ void wgmma_fence() {}
__device__ __forceinline__ void wgmma_commit() {}
#define WGMMA_WAIT(N)
#endif
template <int N>
__device__ __forceinline__ void wgmma_wait(float (&d)[64]) {
    WGMMA_WAIT(N);
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Descriptor of the k16 slice at shared address `addr` (no swizzle; LBO, SBO as above).
__device__ __forceinline__ unsigned long long mmg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (unsigned long long)((addr >> 4) & 0x3FFF) | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16) |
           ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32);
}

// The block's copies, planned once per launch (as MmhPlan): weights by super-block into weight
// stages, the activation by half super-block into activation stages.
template <int FMT>
struct MmgPlan {
    using F = MmhFmt<FMT>;
    static constexpr int NP = (MMH_BM * F::PC + 255) / 256;
    static constexpr uint32_t BS = FMT == FMT_Q4_K ? 144 : FMT == FMT_Q5_K ? 176 : 192;
    uint32_t src[NP]; // bytes from w at super-block 0
    uint32_t dst[NP]; // place in the weight stage (bit 31: Q6_K's scales piece); 0xFFFFFFFF: none
    uint32_t dsrc;    // Q6_K, threads < 32: the quad's d at super-block 0 (0xFFFFFFFF: none)
    __device__ __forceinline__ MmgPlan(int row0, int rows, int nb, const __half* xh, int k, int c0, int ncols) {
        const int t = threadIdx.x;
        const uint32_t nblk = (uint32_t)(kq_rows(rows) * nb);
#pragma unroll
        for (int i = 0; i < NP; ++i) {
            const int p = t + 256 * i, r = p / F::PC, c = p - r * F::PC;
            dst[i] = 0xFFFFFFFFu;
            src[i] = 0;
            if (p < MMH_BM * F::PC && row0 + r < rows) {
                const uint32_t blk = (uint32_t)kq_blk(row0 + r, nb, 0);
                src[i] = FMT == FMT_Q6_K ? (c < 12 ? blk * 192 + 16 * c : nblk * 192 + blk * 16) : blk * BS + 16 * c;
                dst[i] = (r * F::WS + 16 * c) | (FMT == FMT_Q6_K && c == 12 ? 0x80000000u : 0);
            }
        }
        dsrc = FMT == FMT_Q6_K && t < MMH_BM / 4 && row0 + 4 * t < rows
                   ? nblk * 208 + (uint32_t)kq_blk(row0 + 4 * t, nb, 0) * 2
                   : 0xFFFFFFFFu;
    }
    // The weights of super-block sb into weight stage st (not committed).
    __device__ __forceinline__ void copy_w(uint8_t* st, const uint8_t* __restrict__ w, int sb) const {
        const int t = threadIdx.x;
#pragma unroll
        for (int i = 0; i < NP; ++i)
            if (dst[i] != 0xFFFFFFFFu) {
                const uint32_t step = dst[i] >> 31 ? 64 : 4 * BS;
                mmh_cp16(st + (dst[i] & 0x7FFFFFFFu), w + (src[i] + (uint32_t)sb * step));
            }
        if (FMT == FMT_Q6_K && dsrc != 0xFFFFFFFFu) mmh_cp8(st + MMH_BM * 224 + 8 * t, w + (dsrc + 8u * sb));
    }
};

// The activation by bulk copies (the tensor memory accelerator's 1-D form): act_f16 (tiled) laid
// each 128 columns x 128 values out as the stage wants them, 32 KB contiguous, so one thread
// copies a half super-block with one instruction and the stage's mbarrier counts its bytes.
__device__ __forceinline__ void mmg_bar_init(uint32_t bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mmg_bulk_x(uint32_t dst, const void* src, uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "n"(MMG_XST) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "n"(MMG_XST), "r"(bar)
                 : "memory");
#endif
}
__device__ __forceinline__ void mmg_bar_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred done;\nwait_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
#endif
}

// One row's scale (s) and negated min (m) of a group of a chunk, and slice sl (Q6_K's scales
// are per 16 values).
template <int FMT>
__device__ __forceinline__ void mmg_scale(const MmhRow<FMT>& r, int ch, int grp, int sl, __half2& s, __half2& m) {
    if (FMT == FMT_Q6_K) {
        const int i = 8 * (ch >> 1) + 2 * ((ch & 1) + 2 * grp) + sl;
        const uint32_t w = i < 4 ? r.a : i < 8 ? r.b : i < 12 ? r.c : r.e;
        s = __float2half2_rn(r.d * (float)(int8_t)(w >> (8 * (i & 3))));
        m = __float2half2_rn(0.f);
    } else {
        const int j = 2 * ch + grp; // sub-block
        const uint32_t sc = j < 4 ? r.a : r.b, mn = j < 4 ? r.c : r.e;
        s = __float2half2_rn(r.d * (float)((sc >> (8 * (j & 3))) & 0xFF));
        m = __float2half2_rn(-r.dmin * (float)((mn >> (8 * (j & 3))) & 0xFF));
    }
}

template <int FMT>
__device__ __forceinline__ void mmg_kernel(const uint8_t* __restrict__ w, int rows, float* __restrict__ y, int row0,
                                           const __half* __restrict__ xh, const float* __restrict__ xs, int k,
                                           int ncols, const float* __restrict__ gate, uint8_t* smem, int lbo, int sbo) {
    using F = MmhFmt<FMT>;
    const int nb = k / QK_K, c0 = blockIdx.x * MMH_BN;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wrow = 16 * warp + g; // warpgroup warp / 4: rows 64 (warp / 4) + 16 (warp % 4) + g
    const int o = t >> 1, bsh = 8 * (t & 1);
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    const MmgPlan<FMT> plan(row0, rows, nb, xh, k, c0, ncols);
    uint8_t* const xst = smem + 2 * MMG_WST;
    const uint32_t xbase = (uint32_t)__cvta_generic_to_shared(xst);
    __shared__ __align__(8) unsigned long long xbar[4];
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(xbar);
    // This column tile's half super-blocks, 32 KB apart (act_f16 tiled).
    const uint8_t* xt = (const uint8_t*)xh + (size_t)blockIdx.x * nb * 2 * MMG_XST;
    if (threadIdx.x == 0) {
        for (int i = 0; i < 4; ++i) mmg_bar_init(bar0 + 8 * i);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mmg_bulk_x(xbase, xt, bar0);
        mmg_bulk_x(xbase + MMG_XST, xt + MMG_XST, bar0 + 8); // nb >= 1: two halves at least
    }
    plan.copy_w(smem, w, 0);
    asm volatile("cp.async.commit_group;" ::: "memory");
    const uint8_t* wr[2];
    MmhRow<FMT> hd[2];
    uint32_t qh5[2][4]; // Q5_K: the lane's qh words (t / 2 + 2 m)
#pragma unroll 1
    for (int sb = 0; sb < nb; ++sb) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
        const int hh = 2 * sb + half;
        if (threadIdx.x == 0 && hh + 2 < 2 * nb)
            mmg_bulk_x(xbase + ((hh + 2) & 3) * MMG_XST, xt + (size_t)(hh + 2) * MMG_XST, bar0 + 8 * ((hh + 2) & 3));
        if (half == 0) {
            // The next super-block's weights (one cp.async group per super-block); this one's landed.
            if (sb + 1 < nb) plan.copy_w(smem + ((sb + 1) & 1) * MMG_WST, w, sb + 1);
            asm volatile("cp.async.commit_group;" ::: "memory");
            asm volatile("cp.async.wait_group 1;" ::: "memory");
            __syncthreads();
        }
        mmg_bar_wait(bar0 + 8 * (hh & 3), (hh >> 2) & 1);
        const uint32_t xb = xbase + (hh & 3) * MMG_XST;
        if (half == 0) {
            const uint8_t* sw = smem + (sb & 1) * MMG_WST;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wrow + 8 * h;
                wr[h] = sw + r * F::WS;
                hd[h].load(wr[h], 0);
                if (FMT == FMT_Q6_K) hd[h].d = __half2float(reinterpret_cast<const __half*>(sw + MMH_BM * 224)[r]);
#pragma unroll
                for (int m = 0; m < 4; ++m)
                    qh5[h][m] = FMT == FMT_Q5_K ? *reinterpret_cast<const uint32_t*>(wr[h] + 16 + 4 * (o + 2 * m)) : 0;
            }
        }
#pragma unroll
        for (int ch = 2 * half; ch < 2 * half + 2; ++ch) {
            const int qoff = FMT == FMT_Q6_K ? 64 * (ch >> 1) + 32 * (ch & 1) : F::Q + 32 * ch;
            uint32_t qw[2][4], hw[2][4];
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int m = 0; m < 4; ++m) {
                    qw[h][m] = *reinterpret_cast<const uint32_t*>(wr[h] + qoff + 4 * (o + 2 * m));
                    hw[h][m] = FMT == FMT_Q6_K ? *reinterpret_cast<const uint32_t*>(wr[h] + 128 + 32 * (ch >> 1) + 4 * (o + 2 * m))
                                               : qh5[h][m];
                }
            // The chunk's 4 slices (2 groups x 2), dequantized together, then their 4 MMAs
            // issued back to back as one group; the next chunk's dequantization runs under them
            // (wait_group 1 lets this group run while the previous one must have ended).
            uint32_t a[2][2][4];
#pragma unroll
            for (int grp = 0; grp < 2; ++grp) {
                // Q5_K: qh bit 2 ch + grp; Q6_K: bits 2q, 2q + 1 with q = ch % 2 + 2 grp.
                const int hb = FMT == FMT_Q6_K ? 2 * ((ch & 1) + 2 * grp) : 2 * ch + grp;
#pragma unroll
                for (int sl = 0; sl < 2; ++sl)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        __half2 sc, mn;
                        mmg_scale<FMT>(hd[h], ch, grp, sl, sc, mn);
#pragma unroll
                        for (int kk = 0; kk < 2; ++kk) {
                            const int m = 2 * sl + kk;
                            uint32_t v = (qw[h][m] >> (bsh + 4 * grp)) & 0x000F000Fu;
                            if (FMT == FMT_Q5_K) v |= ((hw[h][m] >> (bsh + hb)) & 0x00010001u) << 4;
                            if (FMT == FMT_Q6_K) v |= ((hw[h][m] >> (bsh + hb)) & 0x00030003u) << 4;
                            a[grp][sl][2 * kk + h] = mmh_value<FMT>(v, sc, mn);
                        }
                    }
            }
            wgmma_fence();
#pragma unroll
            for (int grp = 0; grp < 2; ++grp) {
                // The group's first stored value in the super-block.
                const int v0 = FMT == FMT_Q6_K ? 128 * (ch >> 1) + 32 * (ch & 1) + 64 * grp : 64 * ch + 32 * grp;
#pragma unroll
                for (int sl = 0; sl < 2; ++sl)
                    wgmma_128(d, a[grp][sl][0], a[grp][sl][1], a[grp][sl][2], a[grp][sl][3],
                              mmg_desc(xb + (uint32_t)(v0 / 16 - 8 * half + sl) * MMG_SLICE, lbo, sbo));
            }
            wgmma_commit();
            wgmma_wait<1>(d);
        }
        wgmma_wait<0>(d);
        __syncthreads(); // later copies overwrite these stages
        }
    }
    // d[4j + e]: row wrow (e < 2) or wrow + 8, column 8 j + 2 t + (e & 1).
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = c0 + 8 * j + 2 * t + (e & 1), r = row0 + wrow + 8 * (e >> 1);
            if (col >= ncols || r >= rows) continue;
            const size_t oo = (size_t)col * rows + r;
            float v = d[4 * j + e] * xs[col];
            if (gate) {
                const float gv = gate[oo];
                v *= gv / (1.0f + expf(-gv));
            }
            y[oo] = v;
        }
}

extern "C" __global__ void __launch_bounds__(256, 1) mmh_g(MMH_ARGS, int lbo, int sbo) {
    pdl_wait();
    extern __shared__ __align__(128) uint8_t mmg_smem[];
    const int grow = blockIdx.y * MMH_BM;
    int j = 0;
#pragma unroll
    for (int u = 1; u < 4; ++u)
        if (u < jobs.njobs && grow >= jobs.start[u]) j = u;
    const int row0 = grow - jobs.start[j];
    if (row0 >= jobs.rows[j]) return;
    if (jobs.ty[j] == FMT_Q4_K)
        mmg_kernel<FMT_Q4_K>(jobs.w[j], jobs.rows[j], jobs.y[j], row0, xh, xs, K, ncols, gate, mmg_smem, lbo, sbo);
    else if (jobs.ty[j] == FMT_Q5_K)
        mmg_kernel<FMT_Q5_K>(jobs.w[j], jobs.rows[j], jobs.y[j], row0, xh, xs, K, ncols, gate, mmg_smem, lbo, sbo);
    else if (jobs.ty[j] == FMT_Q6_K)
        mmg_kernel<FMT_Q6_K>(jobs.w[j], jobs.rows[j], jobs.y[j], row0, xh, xs, K, ncols, gate, mmg_smem, lbo, sbo);
}

// Column blockIdx.x of x (K f32 values) as f16 for mmh: scaled by 2^-e (xs = 2^e) so its
// largest magnitude lies in [2^13, 2^14) (e = 0 for a column of zeros or with an infinity, which
// then reaches the outputs as it would in f32; a NaN does too), each group of 4 values stored
// in the order 0, 2, 1, 3.
extern "C" __global__ void __launch_bounds__(256) act_f16(const float* __restrict__ x, __half* __restrict__ xh,
                                                          float* __restrict__ xs, int K, int tiled) {
    pdl_wait();
    __shared__ float red[8];
    const float4* xr = reinterpret_cast<const float4*>(x + (size_t)blockIdx.x * K);
    float m = 0.f;
    for (int i = threadIdx.x; i < K / 4; i += 256) {
        const float4 v = xr[i];
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = red[0];
#pragma unroll
    for (int i = 1; i < 8; ++i) m = fmaxf(m, red[i]);
    int e = 0;
    if (m > 0.f && m <= 3.402823466e38f) {
        frexpf(m, &e); // m = f 2^e, f in [0.5, 1)
        e = min(max(e - 14, -126), 127);
    }
    const float inv = ldexpf(1.f, -e);
    if (threadIdx.x == 0) xs[blockIdx.x] = ldexpf(1.f, e);
    uint2* out = reinterpret_cast<uint2*>(xh + (size_t)blockIdx.x * K);
    // tiled (mmh_g): blocks of 128 columns x 128 values (32 KB, one bulk copy each), inside
    // [slice s][piece p][column c][8 values]: the shared-memory layout wgmma reads.
    const int ct = blockIdx.x >> 7, c = blockIdx.x & 127, nhh = K / 128;
    uint2* tiles = reinterpret_cast<uint2*>(xh);
    for (int i = threadIdx.x; i < K / 4; i += 256) {
        const float4 v = xr[i];
        const __half2 a = __floats2half2_rn(v.x * inv, v.z * inv), b = __floats2half2_rn(v.y * inv, v.w * inv);
        const uint2 u = make_uint2(h2_bits(a), h2_bits(b));
        if (tiled) {
            const int val = 4 * i, hh = val >> 7, wv = val & 127;
            const size_t off = ((((size_t)ct * nhh + hh) * 8 + (wv >> 4)) * 2 + ((wv >> 3) & 1)) * 1024 + c * 8 + (wv & 7);
            tiles[off / 4] = u;
        } else {
            out[i] = u;
        }
    }
}
