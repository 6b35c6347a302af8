// Prefill chunks on Hopper's warpgroup tensor cores (wgmma, sm_90a: compile.rs file_arch): the
// K-quant weights (Q4_K, Q5_K, Q6_K in the resident layout of matvec.rs `repack`) dequantized in
// registers to f16 straight into the A operand of wgmma.mma_async m64n128k16 (f16 x f16 -> f32),
// the activation (act_f16: converted once per matmul to f16) read by the MMA from shared memory.
// Unlike the integer kernels (mmk.cu, mmt.cu: the canonical order of common.cuh, every column the
// bits of mvk_1), this is a plain GEMM: per output one f32 accumulator over K in a fixed order,
// so a column's result depends on that column alone (not on the other columns of the chunk, nor
// on its place in a tile, nor on the tile configuration) but is not the bits of the one-column
// kernels. The engine runs it on every prefill chunk (of `mmh_min` columns or more, 1 by
// default), never on decode groups (batch.rs: decode stays bit-identical alone and in groups).
//
// Activation (act_f16): column c of x (f32) scaled by 2^-e_c so its largest magnitude lies in
// [2^13, 2^14) (exact: a power of two; the outputs are multiplied back by xs[c] = 2^e_c), as f16,
// each group of 4 values stored in the order 0, 2, 1, 3, laid out in tiles of BN columns x 128
// values (BN x 256 bytes): [16-value slice s][8-value piece p][column c][8 values], the core
// matrices (8 columns x 16 bytes) wgmma reads without swizzling (leading byte offset 16 BN
// between the two pieces of a slice, stride byte offset 128 between groups of 8 columns). One
// bulk copy (the tensor memory accelerator's 1-D form) moves a tile into shared memory.
//
// Launch (MmhCfg): NWG warpgroups (128 NWG threads) per block; a block takes BM = 64 NWG rows (one
// job's: each job padded to BM rows) x BN columns (grid x: column tiles, so the blocks of one row
// block run side by side and share its weights in L2; grid y: row blocks). Warpgroup q takes rows
// 64 q .. + 63 and every column: BN / 2 f32 accumulators per thread. Configurations: 128 x 128
// (chunks past 192 columns), 64 x 64 and 64 x 32 (narrower chunks). Pipeline: the weights by
// super-block (cp.async, WS stages of BM rows' blocks), the activation by half super-block (bulk
// copies, four stages, two ahead, each with an mbarrier); per 64-value chunk of a row the
// lanes dequantize 4 k16 slices, then issue their 4 MMAs as one group, and the next chunk's
// dequantization runs while they compute. With one warpgroup (the narrow configurations) a block
// meets once per super-block and never waits for all its MMAs inside the loop; with two (128 x
// 128) both warpgroups' MMAs end and the block meets after each half super-block. H200,
// llama-glimmer (2026-12-03, against the previous call, which met and waited after each half in
// every configuration): pp16 903.46 -> 936.50 / 932.53 tokens/s, pp64 2,742.36 -> 2,887.05 /
// 2,877.35, the same bits.
//
// A fragments: lane (g, t) of warp w of a warpgroup holds rows 16 (w % 4) + g, + 8 and, per k16
// slice of stored values 16 s .. 16 s + 15, the stored positions 2t, 2t + 1 and 2t + 8, 2t + 9.
// With the stored order (0, 2, 1, 3 per 4 values) those are the values (0, 2), (1, 3), (4, 6),
// (5, 7) (+ 8) for t = 0 .. 3: quant bytes 4 (t / 2) and + 2 of one word shifted by 8 (t % 2),
// so one mask makes the half2 pair. A 32-value group (bytes l = 0 .. 31 of its quants: Q4_K/Q5_K
// qs, Q6_K ql; low nibbles one group, high nibbles another) is two slices: words t / 2 + {0, 2}
// and t / 2 + {4, 6} of its 32 bytes. Each value becomes f16 as (1024 + q) - 1024 (exact) times
// its sub-block's scale minus its min (Q4_K, Q5_K: one rounding, fma) or ((1024 + q) - 1056)
// times its scale (Q6_K: q - 32 exact, one rounding).


// Per format: 16-byte pieces of a row's super-block copied (Q6_K: plane A, then plane B's 16
// scales), the shared-memory row stride (bytes) and where the quants start in it.
template <int FMT>
struct MmhFmt;
template <>
struct MmhFmt<FMT_Q4_K> {
    static constexpr int PC = 9, WS = 160, Q = 16;
};
template <>
struct MmhFmt<FMT_Q5_K> {
    static constexpr int PC = 11, WS = 224, Q = 48;
};
template <>
struct MmhFmt<FMT_Q6_K> {
    static constexpr int PC = 13, WS = 224, Q = 0;
};


__device__ __forceinline__ void mmh_cp16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}
__device__ __forceinline__ void mmh_cp8(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

// Bytes 2p and 2p + 1 of w (unsigned; signed with S8) as the two halves of a half2, exactly:
// moved to bits 0-7 and 16-23, put under the exponent of 1024 (plus 128 for a signed byte, whose
// sign bit is flipped first) and that taken away again.
template <bool S8>
__device__ __forceinline__ __half2 mmh_byte_pair(uint32_t w, int p) {
    uint32_t r = __byte_perm(w, 0, p ? 0x4342 : 0x4140);
    if (S8) r ^= 0x00800080u;
    r |= 0x64006400u;
    return __hsub2(*reinterpret_cast<const __half2*>(&r), __float2half2_rn(S8 ? 1152.f : 1024.f));
}

// One row's scales in a super-block, as f16 pairs made once per super-block. Q4_K/Q5_K: s[p] the
// scales of sub-blocks 2p, 2p + 1 (d times the 6-bit scale), m[p] their negated mins (-dmin times
// the 6-bit min); Q6_K: s[p] those of its 16-value sub-blocks 2p, 2p + 1 (d times the int8
// scale). Each is the one rounding to f16 of an exact product (an f16 times an integer of at most
// 8 bits), as the f32 product rounded to f16 was before (2026-12-03): the same bits, without
// integer-to-float conversions.
template <int FMT>
struct MmhRow {
    static constexpr int NP = FMT == FMT_Q6_K ? 8 : 4;
    __half2 s[NP], m[FMT == FMT_Q6_K ? 1 : 4];
    // Q6_K: dq is the row's d (plane C).
    __device__ __forceinline__ void load(const uint8_t* row, __half dq) {
        if (FMT == FMT_Q6_K) {
            const uint4 w = *reinterpret_cast<const uint4*>(row + 192);
            const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
            const __half2 d2 = __half2half2(dq);
#pragma unroll
            for (int p = 0; p < NP; ++p) s[p] = __hmul2(mmh_byte_pair<true>(ws[p >> 1], p & 1), d2);
        } else {
            const uint4 h = *reinterpret_cast<const uint4*>(row);
            const __half2 dd = *reinterpret_cast<const __half2*>(&h.x);
            const __half2 d2 = __low2half2(dd), nm2 = __hneg2(__high2half2(dd));
            uint32_t a, b, c, e;
            unpack_scales_k4(h.y, h.z, h.w, &a, &b, &c, &e);
#pragma unroll
            for (int p = 0; p < NP; ++p) {
                s[p] = __hmul2(mmh_byte_pair<false>(p < 2 ? a : b, p & 1), d2);
                m[p] = __hmul2(mmh_byte_pair<false>(p < 2 ? c : e, p & 1), nm2);
            }
        }
    }
};

// The f16 values of quant pair (x & 0x000F000F) | hi (bits 0-5 and 16-21; hi: Q5_K's or Q6_K's
// high bits, at bits 4-5 and 20-21, 0 for Q4_K) with scale s and negated min m: the mask, the high
// bits and the exponent of 1024 in one three-input logic op ((a & b) | c), then 1024 (Q6_K: 1056)
// taken away.
template <int FMT>
__device__ __forceinline__ uint32_t mmh_value(uint32_t x, uint32_t hi, __half2 s, __half2 m) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(x), "r"(0x000F000Fu), "r"(hi | 0x64006400u));
    const __half2 v = *reinterpret_cast<const __half2*>(&r);
    if (FMT == FMT_Q6_K) return h2_bits(__hmul2(__hsub2(v, __float2half2_rn(1056.f)), s));
    return h2_bits(__hfma2(__hsub2(v, __float2half2_rn(1024.f)), s, m));
}

// A tile configuration: BN columns, NWG warpgroups (BM = 64 NWG rows, 128 NWG threads), WS weight
// stages. Activation stage layout (act_f16's tiled layout for tiles of BN columns): slice s at
// s * SLICE, its piece p at + p * LBO, column c at + 16 c.
template <int BN_, int NWG_, int WS_>
struct MmhCfg {
    static constexpr int BN = BN_, NWG = NWG_, WS = WS_, BM = 64 * NWG, T = 128 * NWG;
    static constexpr int LBO = 16 * BN, SLICE = 2 * LBO;
    // One weight stage (one super-block of BM rows x 224 + Q6_K's d) and one activation stage
    // (half a super-block: 8 slices); 4 activation stages, so the activation is copied two half
    // super-blocks ahead.
    static constexpr int WST = BM * 224 + BM * 2, XST = 8 * SLICE;
};

// wgmma m64nNk16 (f16 x f16 -> f32) for the tile widths N = BN of mmg_kernel: N / 2 accumulators
// per thread.
__device__ __forceinline__ void wgmma_n32(float (&d)[16], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          unsigned long long desc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
#else
    __trap(); // routed to only on sm_90 (compiled as sm_90a: compile.rs file_arch)
#endif
}
__device__ __forceinline__ void wgmma_n64(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          unsigned long long desc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
#else
    __trap(); // routed to only on sm_90 (compiled as sm_90a: compile.rs file_arch)
#endif
}
__device__ __forceinline__ void wgmma_n128(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
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
template <int BN>
__device__ __forceinline__ void wgmma_bn(float (&d)[BN / 2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         unsigned long long desc) {
    if constexpr (BN == 32) wgmma_n32(d, a0, a1, a2, a3, desc);
    else if constexpr (BN == 64) wgmma_n64(d, a0, a1, a2, a3, desc);
    else wgmma_n128(d, a0, a1, a2, a3, desc);
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
template <int N, int NA>
__device__ __forceinline__ void wgmma_wait(float (&d)[NA]) {
    WGMMA_WAIT(N);
#pragma unroll
    for (int i = 0; i < NA; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Descriptor of the k16 slice at shared address `addr`: no swizzle, leading byte offset LBO
// (the slice's second piece), stride byte offset 128 (the next 8 columns).
template <int LBO>
__device__ __forceinline__ unsigned long long mmg_desc(uint32_t addr) {
    return (unsigned long long)((addr >> 4) & 0x3FFF) | ((unsigned long long)((LBO >> 4) & 0x3FFF) << 16) |
           ((unsigned long long)((128 >> 4) & 0x3FFF) << 32);
}

// The block's copies, planned once per launch: weights by super-block into weight
// stages (the activation goes by bulk copies, mmg_bulk_x).
template <int FMT, class C>
struct MmgPlan {
    using F = MmhFmt<FMT>;
    static constexpr int NP = (C::BM * F::PC + C::T - 1) / C::T;
    static constexpr uint32_t BS = FMT == FMT_Q4_K ? 144 : FMT == FMT_Q5_K ? 176 : 192;
    uint32_t src[NP]; // bytes from w at super-block 0
    uint32_t dst[NP]; // place in the weight stage (bit 31: Q6_K's scales piece); 0xFFFFFFFF: none
    uint32_t dsrc;    // Q6_K, threads < BM / 4: the quad's d at super-block 0 (0xFFFFFFFF: none)
    __device__ __forceinline__ MmgPlan(int row0, int rows, int nb) {
        const int t = threadIdx.x;
        const uint32_t nblk = (uint32_t)(kq_rows(rows) * nb);
#pragma unroll
        for (int i = 0; i < NP; ++i) {
            const int p = t + C::T * i, r = p / F::PC, c = p - r * F::PC;
            dst[i] = 0xFFFFFFFFu;
            src[i] = 0;
            if (p < C::BM * F::PC && row0 + r < rows) {
                const uint32_t blk = (uint32_t)kq_blk(row0 + r, nb, 0);
                src[i] = FMT == FMT_Q6_K ? (c < 12 ? blk * 192 + 16 * c : nblk * 192 + blk * 16) : blk * BS + 16 * c;
                dst[i] = (r * F::WS + 16 * c) | (FMT == FMT_Q6_K && c == 12 ? 0x80000000u : 0);
            }
        }
        dsrc = FMT == FMT_Q6_K && t < C::BM / 4 && row0 + 4 * t < rows
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
        if (FMT == FMT_Q6_K && dsrc != 0xFFFFFFFFu) mmh_cp8(st + C::BM * 224 + 8 * t, w + (dsrc + 8u * sb));
    }
};

// The activation by bulk copies (the tensor memory accelerator's 1-D form): act_f16 lays
// each BN columns x 128 values out as the stage wants them, contiguous, so one thread
// copies a half super-block with one instruction and the stage's mbarrier counts its bytes.
__device__ __forceinline__ void mmg_bar_init(uint32_t bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
template <int XST>
__device__ __forceinline__ void mmg_bulk_x(uint32_t dst, const void* src, uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "n"(XST) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "n"(XST), "r"(bar)
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
// are per 16 values), each broadcast to both halves.
template <int FMT>
__device__ __forceinline__ void mmg_scale(const MmhRow<FMT>& r, int ch, int grp, int sl, __half2& s, __half2& m) {
    if (FMT == FMT_Q6_K) {
        const int p = 4 * (ch >> 1) + (ch & 1) + 2 * grp; // sub-block 2p + sl
        s = sl ? __high2half2(r.s[p]) : __low2half2(r.s[p]);
        m = __float2half2_rn(0.f);
    } else {
        // sub-block 2 ch + grp
        s = grp ? __high2half2(r.s[ch]) : __low2half2(r.s[ch]);
        m = grp ? __high2half2(r.m[ch]) : __low2half2(r.m[ch]);
    }
}

template <int FMT, class C>
__device__ __forceinline__ void mmg_kernel(const uint8_t* __restrict__ w, int rows, float* __restrict__ y, int row0,
                                           const __half* __restrict__ xh, const float* __restrict__ xs, int k,
                                           int ncols, const float* __restrict__ gate, uint8_t* smem) {
    using F = MmhFmt<FMT>;
    constexpr int NA = C::BN / 2, WS = C::WS, XST = C::XST, WST = C::WST;
    constexpr bool LEAN = C::NWG == 1;
    const int nb = k / QK_K, c0 = blockIdx.x * C::BN;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wrow = 16 * warp + g; // warpgroup warp / 4: rows 64 (warp / 4) + 16 (warp % 4) + g
    const int o = t >> 1, bsh = 8 * (t & 1);
    float d[NA];
#pragma unroll
    for (int i = 0; i < NA; ++i) d[i] = 0.f;
    const MmgPlan<FMT, C> plan(row0, rows, nb);
    uint8_t* const xst = smem + WS * WST;
    const uint32_t xbase = (uint32_t)__cvta_generic_to_shared(xst);
    __shared__ __align__(8) unsigned long long xbar[4];
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(xbar);
    // This column tile's half super-blocks, XST bytes apart (act_f16 tiled).
    const uint8_t* xt = (const uint8_t*)xh + (size_t)blockIdx.x * nb * 2 * XST;
    if (threadIdx.x == 0) {
        for (int i = 0; i < 4; ++i) mmg_bar_init(bar0 + 8 * i);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mmg_bulk_x<XST>(xbase, xt, bar0);
        mmg_bulk_x<XST>(xbase + XST, xt + XST, bar0 + 8); // nb >= 1: two halves at least
    }
    // Super-blocks 0 .. WS - 2 into their stages, one cp.async group each (empty past nb).
#pragma unroll
    for (int s = 0; s + 1 < WS; ++s) {
        if (s < nb) plan.copy_w(smem + s * WST, w, s);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    const uint8_t* wr[2];
    MmhRow<FMT> hd[2];
    uint32_t qh5[2][4]; // Q5_K: the lane's qh words (t / 2 + 2 m)
#pragma unroll 1
    for (int sb = 0; sb < nb; ++sb) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
        const int hh = 2 * sb + half;
        if (threadIdx.x == 0 && hh + 2 < 2 * nb)
            mmg_bulk_x<XST>(xbase + ((hh + 2) & 3) * XST, xt + (size_t)(hh + 2) * XST, bar0 + 8 * ((hh + 2) & 3));
        if (half == 0) {
            if constexpr (LEAN) {
                // One warpgroup: one block barrier a super-block, and no wait for the MMAs in
                // flight. Before the barrier this super-block's weights have landed (WS - 2
                // later groups at most are left); after it, super-block sb + WS - 1's weights
                // (one cp.async group per super-block) go into the stage every warp finished
                // reading in the last super-block. The activation stage thread 0 copied into
                // above was read by MMAs two half super-blocks back, which have ended: the
                // warpgroup's wait_group 1 after each chunk leaves only its last chunk running.
                asm volatile("cp.async.wait_group %0;" ::"n"(WS - 2) : "memory");
                __syncthreads();
                if (sb + WS - 1 < nb) plan.copy_w(smem + ((sb + WS - 1) % WS) * WST, w, sb + WS - 1);
                asm volatile("cp.async.commit_group;" ::: "memory");
            } else {
                // Super-block sb + WS - 1's weights (one cp.async group per super-block) into
                // the stage read last round; this one's have landed once WS - 1 groups at most
                // are left.
                if (sb + WS - 1 < nb) plan.copy_w(smem + ((sb + WS - 1) % WS) * WST, w, sb + WS - 1);
                asm volatile("cp.async.commit_group;" ::: "memory");
                asm volatile("cp.async.wait_group %0;" ::"n"(WS - 1) : "memory");
                __syncthreads();
            }
        }
        mmg_bar_wait(bar0 + 8 * (hh & 3), (hh >> 2) & 1);
        const uint32_t xb = xbase + (hh & 3) * XST;
        if (half == 0) {
            const uint8_t* sw = smem + (sb % WS) * WST;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wrow + 8 * h;
                wr[h] = sw + r * F::WS;
                hd[h].load(wr[h], FMT == FMT_Q6_K ? reinterpret_cast<const __half*>(sw + C::BM * 224)[r] : __half());
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
                            uint32_t hi = 0;
                            if (FMT == FMT_Q5_K) hi = ((hw[h][m] >> (bsh + hb)) & 0x00010001u) << 4;
                            if (FMT == FMT_Q6_K) hi = ((hw[h][m] >> (bsh + hb)) & 0x00030003u) << 4;
                            a[grp][sl][2 * kk + h] = mmh_value<FMT>(qw[h][m] >> (bsh + 4 * grp), hi, sc, mn);
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
                    wgmma_bn<C::BN>(d, a[grp][sl][0], a[grp][sl][1], a[grp][sl][2], a[grp][sl][3],
                                    mmg_desc<C::LBO>(xb + (uint32_t)(v0 / 16 - 8 * half + sl) * C::SLICE));
            }
            wgmma_commit();
            wgmma_wait<1>(d);
        }
        if constexpr (!LEAN) {
            // Two warpgroups: the other one's MMAs may still read the stages that later copies
            // overwrite.
            wgmma_wait<0>(d);
            __syncthreads();
        }
        }
    }
    wgmma_wait<0>(d);
    // d[4j + e]: row wrow (e < 2) or wrow + 8, column 8 j + 2 t + (e & 1).
#pragma unroll
    for (int j = 0; j < C::BN / 8; ++j)
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

// y_j = W_j x for the matrices of `jobs` (rows padded to C::BM per job; a block's rows lie in
// one job), x the tiled f16 activation of act_f16 (ncols columns of K values in tiles of C::BN,
// column scales xs). gate (or null): y = silu(gate) * (W x) elementwise, gate laid out as y (the
// up half of ffn_gate_up_silu; the gate's own launch wrote it). Dynamic shared memory: mmh.rs
// `MmhTile::smem`.
template <class C>
__device__ __forceinline__ void mmh_entry(const MatvecJobs& jobs, const __half* __restrict__ xh,
                                          const float* __restrict__ xs, int K, int ncols, const float* __restrict__ gate) {
    extern __shared__ __align__(128) uint8_t mmg_smem[];
    const int grow = blockIdx.y * C::BM;
    int j = 0;
#pragma unroll
    for (int u = 1; u < 4; ++u)
        if (u < jobs.njobs && grow >= jobs.start_of(u)) j = u;
    const int row0 = grow - jobs.start_of(j);
    if (row0 >= jobs.rows_of(j)) return;
    if (jobs.ty_of(j) == FMT_Q4_K)
        mmg_kernel<FMT_Q4_K, C>(jobs.w_of(j), jobs.rows_of(j), jobs.y_of(j), row0, xh, xs, K, ncols, gate, mmg_smem);
    else if (jobs.ty_of(j) == FMT_Q5_K)
        mmg_kernel<FMT_Q5_K, C>(jobs.w_of(j), jobs.rows_of(j), jobs.y_of(j), row0, xh, xs, K, ncols, gate, mmg_smem);
    else if (jobs.ty_of(j) == FMT_Q6_K)
        mmg_kernel<FMT_Q6_K, C>(jobs.w_of(j), jobs.rows_of(j), jobs.y_of(j), row0, xh, xs, K, ncols, gate, mmg_smem);
}

// The tile configurations (mmh.rs `mmh_tile` picks one by the chunk's width): 128 x 128 with two
// weight stages for chunks past 192 columns (pp512: weights re-read by 4 column tiles at most),
// 64 rows x 64 or 32 columns with 3 weight stages for narrower chunks (64 x 64 from 33 columns,
// up to three column tiles), where the row blocks are the main parallelism: twice as many of
// them, 2 (n64) or 3 (n32) blocks per SM. Every
// configuration sums each output over K in the same order (the same k16 slices, one wgmma after
// the other), so a column's bits do not depend on the configuration. H200, llama-glimmer,
// tokens/s (2026-12-01): pp8 414 (n32 with 4 stages and 2 blocks per SM) -> 463 (3 and 3),
// pp32 1,595 (the 128 x 128 tiles: 832), pp64 2,748 / 2,678 (128 x 128: 1,631). Tried and
// dropped: K split in three for ffn_down's 19,968 (its 78 super-blocks per row are the long pole
// of the narrow launches), the splits merged in order by a second kernel: pp8 493 / 498 against
// 463 / 460, but pp64 2,658 / 2,649 against 2,678 / 2,671 and pp512 5,477 / 5,487 against
// 5,584 / 5,592.
typedef MmhCfg<128, 2, 2> MmhWide;
typedef MmhCfg<64, 1, 3> MmhN64;
typedef MmhCfg<32, 1, 3> MmhN32;
#define MMH_ARGS MatvecJobs jobs, const __half* __restrict__ xh, const float* __restrict__ xs, int K, int ncols, \
    const float* __restrict__ gate
#define MMH_PASS jobs, xh, xs, K, ncols, gate
extern "C" __global__ void __launch_bounds__(256, 1) mmh(MMH_ARGS) {
    pdl_wait();
    mmh_entry<MmhWide>(MMH_PASS);
}
extern "C" __global__ void __launch_bounds__(128, 2) mmh_n64(MMH_ARGS) {
    pdl_wait();
    mmh_entry<MmhN64>(MMH_PASS);
}
extern "C" __global__ void __launch_bounds__(128, 3) mmh_n32(MMH_ARGS) {
    pdl_wait();
    mmh_entry<MmhN32>(MMH_PASS);
}

// y = silu(g) * y elementwise (n values), the float expression of mmh_entry's gate epilogue, for
// gate and up run as one launch of two jobs (mmh.rs `mmh_silu`, narrow tiles): the same bits.
extern "C" __global__ void __launch_bounds__(256) mmh_silu_mul(const float* __restrict__ g, float* __restrict__ y,
                                                               int n) {
    pdl_wait();
    const int i = blockIdx.x * 256 + threadIdx.x;
    if (i >= n) return;
    float v = y[i];
    const float gv = g[i];
    v *= gv / (1.0f + expf(-gv));
    y[i] = v;
}

// Column blockIdx.x of x (K f32 values, K a multiple of 128) as f16 for mmh: scaled by 2^-e (xs
// = 2^e) so its largest magnitude lies in [2^13, 2^14) (e = 0 for a column of zeros or with an
// infinity, which then reaches the outputs as it would in f32; a NaN does too), each group of 4
// values stored in the order 0, 2, 1, 3, in the tiled layout (see the top): tile (column tile,
// half super-block) of tn columns x 128 values (tn = the launch's BN), inside
// [slice][piece][column][8 values].
// Columns of the last tile past ncols are not written (their outputs are never stored).
extern "C" __global__ void __launch_bounds__(256) act_f16(const float* __restrict__ x, __half* __restrict__ xh,
                                                          float* __restrict__ xs, int K, int tn) {
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
    const int ct = blockIdx.x / tn, c = blockIdx.x % tn, nhh = K / 128;
    uint2* tiles = reinterpret_cast<uint2*>(xh);
    for (int i = threadIdx.x; i < K / 4; i += 256) {
        const float4 v = xr[i];
        const __half2 a = __floats2half2_rn(v.x * inv, v.z * inv), b = __floats2half2_rn(v.y * inv, v.w * inv);
        const int val = 4 * i, hh = val >> 7, wv = val & 127;
        const size_t off = ((((size_t)ct * nhh + hh) * 8 + (wv >> 4)) * 2 + ((wv >> 3) & 1)) * (8 * tn) + c * 8 + (wv & 7);
        tiles[off / 4] = make_uint2(h2_bits(a), h2_bits(b));
    }
}
