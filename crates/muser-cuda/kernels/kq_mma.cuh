// The integer tensor-core pieces shared by mmk.cu and mmt.cu (compile.rs puts this header
// before both): the activation arguments, the MMA instructions, the scale bytes, the chunk-tree
// leaves, the L2 prefetch of a chunk of weights, a block's job, and the arithmetic of one
// super-block (kq45_superblock, kq6_superblock), so both kernels give every output the same bits.

struct KAct {
    const int8_t* __restrict__ xq;  // [ncols][K] int8, row-major or (kmajor) k-major as in matvec.cu
    const float2* __restrict__ xds; // [ncols][K / 32] (d, sum)
    const int8_t* __restrict__ xbs; // [ncols][K / 256][16] sums split (lo 8, hi 8)
    int K;
    int ncols;
    int kmajor;
};

// Asynchronous copies global -> shared (cp.async): 16 bytes through L2 only, 8 through L1.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src));
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void mmk_k32(int (&d)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The same with A unsigned (u8 x s8).
__device__ __forceinline__ void mmk_k32u(int (&d)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mmk_k16(int (&d)[4], int a0, int a1, int b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// d = A B (f16 x f16 -> f32, C = 0): one m16n8k16 tile.
__device__ __forceinline__ void mmh_k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

// The mins of lane t's k slots of an f16 m16n8k16 A fragment (k 2t, 2t + 1 of the row's 8 mins
// m_lo (m0..m3), m_hi (m4..m7)) as two exact halves: bytes to the low bytes of the 16-bit halves,
// 1024 + m as f16 bits, minus 1024.
__device__ __forceinline__ uint32_t mins_h2(uint32_t m_lo, uint32_t m_hi, int t) {
    const uint32_t w = __byte_perm(t < 2 ? m_lo : m_hi, 0u, (t & 1) ? 0x4342u : 0x4140u) | 0x64006400u;
    const __half2 h = __hsub2(*(const __half2*)&w, __float2half2_rn(1024.0f));
    return *(const uint32_t*)&h;
}
__device__ __forceinline__ uint32_t h2_times64(uint32_t v) {
    const __half2 h = __hmul2(*(const __half2*)&v, __float2half2_rn(64.0f));
    return *(const uint32_t*)&h;
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
// row0 + g + 8: lo = v_b0 (+ v_b0+1), hi = v_b0+2 (+ v_b0+3); the chunk is lo + hi (or lo). The
// values v of every output of the lane at position k of the chunk: k is warp-uniform, so this is
// one branch per super-block (a loop over the chunk's positions runs one copy of the super-block's
// code: unrolled, the kernels outgrew the instruction cache).
template <int NT>
__device__ __forceinline__ void kq_leaves(int k, const float (&v)[NT][4], float (&lo)[NT][4], float (&hi)[NT][4]) {
    if (k == 0) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) lo[nt][e] = v[nt][e];
    } else if (k == 1) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) lo[nt][e] = kq_add(lo[nt][e], v[nt][e]);
    } else if (k == 2) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) hi[nt][e] = v[nt][e];
    } else {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) hi[nt][e] = kq_add(hi[nt][e], v[nt][e]);
    }
}

// kq_leaves without its four branches: the same sums by selects. Positions 0 and 2 add the
// value to -0 (-0 + v = v, so the same bits: lo = v, hi = v), 1 and 3 to lo or hi. (The branches
// make the compiler move the values between registers; mmt.cu's mmw_* take this form.)
template <int NT>
__device__ __forceinline__ void kq_leaves_sel(int k, const float (&v)[NT][4], float (&lo)[NT][4], float (&hi)[NT][4]) {
    const bool odd = k & 1, two = k >= 2;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float p = kq_add(odd ? (two ? hi[nt][e] : lo[nt][e]) : -0.0f, v[nt][e]);
            lo[nt][e] = two ? lo[nt][e] : p;
            hi[nt][e] = two ? p : hi[nt][e];
        }
}

// Asks L2 for chunk ch of the warp's 16 rows (the quants plane of Q6_K), every 128-byte line: a
// chunk of a row quad is one contiguous run (kq_blk); lanes 8i .. 8i + 7 take quad i.
__device__ __forceinline__ void mmk_prefetch_chunk(const uint8_t* w, int ty, int row0, int rows, int K, int ch) {
    const int lane = threadIdx.x % WARP, nb = K / QK_K, b0 = ch * KQ_CHUNK;
    if (b0 >= nb || row0 >= rows) return;
    const int bs = ty == FMT_Q6_K ? 192 : ty == FMT_Q5_K ? 176 : 144;
    const int span = 4 * (min(b0 + KQ_CHUNK, nb) - b0) * bs;
    const uint8_t* p = w + kq_blk(min(row0 + 4 * (lane >> 3), rows - 1) & ~3, nb, b0) * bs;
    for (int o = (lane & 7) * 128; o < span; o += 1024) prefetch_l2(p + o);
}

// The job of a block of `block_rows` rows (grid y) and its first row in it (past the job's
// rows: padding, the whole block).
__device__ __forceinline__ int kq_job(const MatvecJobs& jobs, int block_rows, int* row0) {
    const int grow = blockIdx.y * block_rows;
    int j = 0;
#pragma unroll
    for (int u = 1; u < 4; ++u)
        if (u < jobs.njobs && grow >= jobs.start_of(u)) j = u;
    *row0 = grow - jobs.start_of(j);
    return j;
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


// Up to this many column tiles, kq45_superblock folds the sub-block scales into the MMA operand
// (see there). H200, llama-glimmer, same call (2026-11-30), aggregate tokens/s at 8 / 16 / 32
// streams and pp512: the scales by multiply-adds 480.3 / 776.1 / 1313.4 / 3513; folded for
// every width 494.2 / 768.8 / 1270.4 / 3287; folded from 4 tiles on (mmt) 478.5 / 770.2 /
// 1249.3 / 3274 (mmt_silu_4 126 -> 137 us: twice the MMAs, which the tiles' issue slots pay
// for). Again for mmt_8 alone (2026-11-30, same call): pp512 3307 against 3851 (255 registers,
// 72 bytes of spills). So only the one-tile kernels (mmk_1, mmk_silu_1: 8-column groups) folded
// them, until the one-tile kernels' work went to mmv_* (staged weights, mvk_1's division of the
// work): there the folded form's two chains of 8 dependent MMAs per super-block cost more than
// the 4 multiply-adds after each of 8 independent MMAs (Q4_K loop of mmv_1: 18 -> 10 MMAs, ~450
// -> ~370 instructions issued a super-block). H200, llama-glimmer, one call (2026-12-03,
// aggregate tg64 tokens/s, two rounds, both with mmv_copy's 32-bit addresses): 8 streams 1,019.43
// / 1,013.26 folded -> 1,070.67 / 1,066.33 not, 4 streams (mmk_1) 487.10 / 483.61 -> 502.89 /
// 501.76, one stream (mvk_1, not affected) 178.17 / 175.79 -> 176.50 / 177.01; the even and odd
// sub-blocks' folded MMAs in four chains of 4 instead: 998.39 / 999.71. The same integer sums
// either way, so the same bits (quick parity 692 ok on each build, groups identical to solo).
// KQ_SCALED_MAX_NT=1 restores the folded one-tile kernels.
#ifndef KQ_SCALED_MAX_NT
#define KQ_SCALED_MAX_NT 0
#endif

// ---------------------------------------------------------------------------------------------
// One super-block of the lane's two rows (g and g + 8 of a 16-row MMA tile) against NT tiles of
// 8 columns, shared by mmk.cu and mmt.cu (which differ in where weights and activations come
// from, so both come through functors). Each of the lane's outputs (nt, e) gets its
// super-block value v_b of common.cuh through emit(nt, e, v).
//   qs(gi, r):  Q4_K/Q5_K: the lane's 8 qs bytes (32 gi + 8t ..) of row g (r = 0) or g + 8;
//   xq(nt, s):  the lane's B fragment of sub-block s (Q4_K/Q5_K: uint2, values 8t .. 8t + 7 of
//               the 32; Q6_K: int, values 4t .. 4t + 3 of the 16) of column g of tile nt;
//   xbs(nt):    the lane's 4 bytes (4t ..) of column g's split sums (Q4_K/Q5_K);
//   dx(nt, j):  the Q8_K scale of output column 2t + j of tile nt.
// Q4_K/Q5_K: each sub-block s (32 values) is one mma.m16n8k32 s8 whose k slots 4t..4t+3 and
// 16+4t..16+4t+3 hold values 8t..8t+7 of the sub-block (any k order gives the same integer
// sums): lane t's 8 qs bytes of each row per pair of sub-blocks (their low and high nibbles).
// isc += sc_s * (the MMA's sums), exact. The mins: im = sum_s m_s * xsum_s is two
// mma.m16n8k16 s8 with A = the row's 8 mins (at k 0..7, then at k 8..15) and B = the column's 8
// sums split as lo + 64 hi (quantize_q8_k's bs), im = r_lo + 64 r_hi.
// HM (mmw_*, whose activation regions hold the split sums as halves): the mins by one f16
// mma.m16n8k16 a column tile instead, A = the row's 8 mins at k 0..7 and 64 x them at k 8..15,
// B = the column's 8 lo at k 0..7 and 8 hi at k 8..15 (xbs(nt): the lane's uint2, halves lo 2t,
// lo 2t + 1, hi 2t, hi 2t + 1), so r = sum m lo + 64 sum m hi = im. Every input is a small integer
// (m <= 63, 64 m <= 4032, lo <= 63, |hi| <= 64, all exact halves), every product and partial sum
// an integer below 2^22, so the f32 result is im exactly and the value's bits are the same.
// Per super-block at 4 column tiles: 4 f16 MMAs for 8 int8 ones, 16 multiply-adds and 16
// int-to-float conversions fewer (mmw_silu_pair_4: 4,256 -> 4,192 static instructions). H200,
// llama-glimmer, one call alternated (2026-12-04 11:25, quick parity 792 / 792, groups of 1-32
// bit-identical to solo): aggregate tg128 tokens/s at 16 / 32 streams 1,662.88 / 2,586.87 and
// 1,611.60 / 2,543.76 before, 1,679.26 / 2,631.57 and 1,666.45 / 2,612.42 with it.
template <int NT, bool Q5, bool HM = false, class QS, class XQ, class XBS, class DX, class EMIT>
__device__ __forceinline__ void kq45_superblock(const uint4& ha, const uint4& hb, QS qs, const uint2& xa,
                                                const uint2& xb, XQ xq, XBS xbs, DX dx, EMIT emit) {
    const int t = threadIdx.x & 3;
    uint32_t sa_lo, sa_hi, ma_lo, ma_hi, sb_lo, sb_hi, mb_lo, mb_hi;
    unpack_scales_k4(ha.y, ha.z, ha.w, &sa_lo, &sa_hi, &ma_lo, &ma_hi);
    unpack_scales_k4(hb.y, hb.z, hb.w, &sb_lo, &sb_hi, &mb_lo, &mb_hi);
    int isc[NT][4];
    // With at most KQ_SCALED_MAX_NT column tiles (none by default, see there), the sub-block
    // scales go into the A operand instead of 4 multiply-adds per MMA result: sc = lo + 8 hi
    // (lo, hi < 8), and q * lo and q * hi (< 256, as q < 32) are the bytes of an unsigned MMA
    // operand (one 32-bit multiply per 4 bytes: no byte carries into the next), so isc = sum_s
    // lo_s (q.x)_s + 8 sum_s hi_s (q.x)_s is two MMA chains over the 8 sub-blocks, exact as
    // before. Per sub-block: 8 multiplies for the two rows' A, then 2 MMAs per tile (instead of 1
    // MMA and 4 dependent multiply-adds).
    constexpr bool SCALED = NT <= KQ_SCALED_MAX_NT;
    int acc_hi[SCALED ? NT : 1][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) isc[nt][0] = isc[nt][1] = isc[nt][2] = isc[nt][3] = 0;
#pragma unroll
    for (int nt = 0; nt < (SCALED ? NT : 1); ++nt) acc_hi[nt][0] = acc_hi[nt][1] = acc_hi[nt][2] = acc_hi[nt][3] = 0;
#pragma unroll
    for (int gi = 0; gi < 4; ++gi) {
        // A registers: row g k 4t.., row g + 8 k 4t.., row g k 16 + 4t.., row g + 8 k 16 + 4t..
        const uint2 qa = qs(gi, 0), qb = qs(gi, 1);
        const uint32_t qw[4] = {qa.x, qb.x, qa.y, qb.y};
        const uint32_t hw[4] = {xa.x, xb.x, xa.y, xb.y};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int s = 2 * gi + h;
            int A[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                A[k] = (int)((qw[k] >> (4 * h)) & 0x0F0F0F0F);
                if (Q5) A[k] |= (int)(((hw[k] >> s) & 0x01010101) << 4);
            }
            const int sca = byte_u(sa_lo, sa_hi, s), scb = byte_u(sb_lo, sb_hi, s);
            if constexpr (SCALED) {
                const int la = sca & 7, ha = sca >> 3, lb = scb & 7, hb = scb >> 3;
                const int L0 = A[0] * la, L1 = A[1] * lb, L2 = A[2] * la, L3 = A[3] * lb;
                const int H0 = A[0] * ha, H1 = A[1] * hb, H2 = A[2] * ha, H3 = A[3] * hb;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const uint2 x = xq(nt, s);
                    mmk_k32u(isc[nt], L0, L1, L2, L3, (int)x.x, (int)x.y);
                    mmk_k32u(acc_hi[nt], H0, H1, H2, H3, (int)x.x, (int)x.y);
                }
            } else {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const uint2 x = xq(nt, s);
                    int d[4] = {0, 0, 0, 0};
                    mmk_k32(d, A[0], A[1], A[2], A[3], (int)x.x, (int)x.y);
                    isc[nt][0] += sca * d[0];
                    isc[nt][1] += sca * d[1];
                    isc[nt][2] += scb * d[2];
                    isc[nt][3] += scb * d[3];
                }
            }
        }
    }
    if constexpr (SCALED)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) isc[nt][e] += 8 * acc_hi[nt][e];
    const float2 dma = __half22float2(*(const __half2*)&ha.x), dmb = __half22float2(*(const __half2*)&hb.x);
    if constexpr (HM) {
        const uint32_t a0 = mins_h2(ma_lo, ma_hi, t), a1 = mins_h2(mb_lo, mb_hi, t);
        const uint32_t a2 = h2_times64(a0), a3 = h2_times64(a1);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const uint2 bs = xbs(nt);
            float r[4];
            mmh_k16(r, a0, a1, a2, a3, bs.x, bs.y);
            const float dx0 = dx(nt, 0), dx1 = dx(nt, 1);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float2 dm = e < 2 ? dma : dmb;
                emit(nt, e, kq_value_q45f(dm.x, dm.y, isc[nt][e], r[e], (e & 1) ? dx1 : dx0));
            }
        }
    } else {
        // im = sum_s m_s xsum_s: A_lo holds the mins at k 0..7, A_hi at k 8..15.
        const int alo0 = t == 0 ? (int)ma_lo : t == 1 ? (int)ma_hi : 0;
        const int alo1 = t == 0 ? (int)mb_lo : t == 1 ? (int)mb_hi : 0;
        const int ahi0 = t == 2 ? (int)ma_lo : t == 3 ? (int)ma_hi : 0;
        const int ahi1 = t == 2 ? (int)mb_lo : t == 3 ? (int)mb_hi : 0;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int bs = xbs(nt);
            int rl[4] = {0, 0, 0, 0}, rh[4] = {0, 0, 0, 0};
            mmk_k16(rl, alo0, alo1, bs);
            mmk_k16(rh, ahi0, ahi1, bs);
            const float dx0 = dx(nt, 0), dx1 = dx(nt, 1);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float2 dm = e < 2 ? dma : dmb;
                const int im = rl[e] + 64 * rh[e];
                emit(nt, e, kq_value_q45(dm.x, dm.y, isc[nt][e], im, (e & 1) ? dx1 : dx0));
            }
        }
    }
}

// Q6_K (the planes of matvec.rs' repack): value 32qq + v (v < 32) of half h is in ql byte
// 64h + 32 (qq & 1) + v, nibble qq >> 1, its high bits bit pair qq of qh byte 32h + v.
// ql(h, p, u, r): the lane's ql word (bytes 64h + 32p + 16u + 4t ..) of row g (r = 0) or g + 8,
// qh(h, u, r) its qh word (bytes 128 + 32h + 16u + 4t ..); sva/svb the rows' 16 int8 scales,
// da/db their d. Each sub-block (16 values) is one mma.m16n8k16 s8 on (q - 32): lane t's slots
// hold values 4t..4t+3; isc += sc_s * (the MMA's sums).
template <int NT, class QL, class QH, class XQ, class DX, class EMIT>
__device__ __forceinline__ void kq6_superblock(QL ql, QH qh, const uint4& sva, const uint4& svb, float da, float db,
                                               XQ xq, DX dx, EMIT emit) {
    int isc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) isc[nt][0] = isc[nt][1] = isc[nt][2] = isc[nt][3] = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int qq = 0; qq < 4; ++qq)
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int s = 8 * h + 2 * qq + u, p = qq & 1, nib = 4 * (qq >> 1);
                const int A0 = (int)__vsub4(((ql(h, p, u, 0) >> nib) & 0x0F0F0F0F) |
                                                (((qh(h, u, 0) >> (2 * qq)) & 0x03030303) << 4),
                                            0x20202020);
                const int A1 = (int)__vsub4(((ql(h, p, u, 1) >> nib) & 0x0F0F0F0F) |
                                                (((qh(h, u, 1) >> (2 * qq)) & 0x03030303) << 4),
                                            0x20202020);
                const int sca = byte_s(sva, s), scb = byte_s(svb, s);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    int d[4] = {0, 0, 0, 0};
                    mmk_k16(d, A0, A1, xq(nt, s));
                    isc[nt][0] += sca * d[0];
                    isc[nt][1] += sca * d[1];
                    isc[nt][2] += scb * d[2];
                    isc[nt][3] += scb * d[3];
                }
            }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const float dx0 = dx(nt, 0), dx1 = dx(nt, 1);
#pragma unroll
        for (int e = 0; e < 4; ++e) emit(nt, e, kq_value_q6(e < 2 ? da : db, isc[nt][e], (e & 1) ? dx1 : dx0));
    }
}
