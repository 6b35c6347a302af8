// K-quant matrices (Q4_K, Q5_K, Q6_K) times many activation columns (prefill chunks, wide decode
// groups) on the integer tensor cores, with the weights and activations of each super-block
// staged in shared memory. Same arithmetic as mmk.cu (kq_mma.cuh's kq45_superblock and
// kq6_superblock: one mma.m16n8k32 per 32-value sub-block of Q4_K/Q5_K, two m16n8k16 for the
// mins, one m16n8k16 per 16-value sub-block of Q6_K) and the canonical order of common.cuh, so
// every column gets the bits mvk_1 gives it alone. What differs is how the work is laid out:
//
// Launch: 128 threads (4 warps) per block; a block takes MMT_ROWS = 64 rows (warp w rows 16w ..
// 16w + 15) and BN = 8 * NT columns, NT = 4 (mmt_4: wide decode groups) or 8 (mmt_8: groups and
// integer-tile prefill chunks of 64 columns or more) (grid x: column tiles, grid y: row blocks over the jobs' rows,
// each job padded to 64 rows). Every warp runs the whole of K for its 16 rows in order,
// so each output's chunk trees are added in place (no reduction between warps), and all four
// warps share the block's activation tile. Per super-block, the block copies the 64 rows'
// weights and the BN columns' int8 activations, scales and split sums to shared memory with
// cp.async (two stages: the next super-block's copy runs under this one's MMAs; MmtPlan);
// strides are padded so the fragment loads are free of bank conflicts.

#define MMT_WARPS 4
#define MMT_ROWS (16 * MMT_WARPS)

// Shared-memory row strides (bytes): 8-byte fragment loads (Q4_K/Q5_K weights, their
// activations) want a stride of 8 or 24 words mod 32, 4-byte ones (Q6_K) 4 mod 8 words.
template <int FMT>
struct MmtFmt;
template <>
struct MmtFmt<FMT_Q4_K> {
    static constexpr int BS = 144, CH = 9, WS = 160, XS = 288;
};
template <>
struct MmtFmt<FMT_Q5_K> {
    static constexpr int BS = 176, CH = 11, WS = 224, XS = 288;
};
// Q6_K, repacked (matvec.rs): 12 chunks of ql+qh (plane A) and 1 of scales (plane B) per row;
// d (plane C) is read from global memory.
template <>
struct MmtFmt<FMT_Q6_K> {
    static constexpr int BS = 192, CH = 13, WS = 208, XS = 272;
};

// Bytes of one stage: the weights of MMT_ROWS rows, then BN activation rows, BN (d, sum) and BN
// split sums.
template <int FMT, int NT>
__host__ __device__ constexpr int mmt_stage_bytes() {
    return MMT_ROWS * MmtFmt<FMT>::WS + 8 * NT * (MmtFmt<FMT>::XS + 8 + 16);
}
template <int NT>
__host__ __device__ constexpr int mmt_stage_max() {
    return mmt_stage_bytes<FMT_Q5_K, NT>() > mmt_stage_bytes<FMT_Q6_K, NT>() ? mmt_stage_bytes<FMT_Q5_K, NT>()
                                                                             : mmt_stage_bytes<FMT_Q6_K, NT>();
}

// The block's copies of one super-block, planned once per launch. Weights: thread t copies
// the 16-byte pieces c = t % 2, t % 2 + 2, .. of row t / 2 (the two threads of a row read 32
// contiguous bytes per instruction, and a warp's 32 stores hit every bank group of the padded
// rows once per wavefront), so its pieces are one offset from w and one place in the stage plus
// constants; a row's blocks lie 4 blocks apart (kq_blk), so super-block sb0 + db is that offset
// plus 4 db blocks (Q6_K's scales plane, one piece per row by threads 0 .. 63: 4 db x 16
// bytes). Activations: thread t copies piece t % 16 of columns t / 16 + 8 j, one address plus a
// step per 8 columns. Rows past the matrix and columns past the tile are not copied: their
// outputs are never stored, and stale stage bytes only reach those outputs (integer MMAs, whose
// other outputs they cannot touch). Offsets are 32-bit (matvec.rs: mmt_fits).
template <int FMT, int NT>
struct MmtPlan {
    using F = MmtFmt<FMT>;
    static constexpr int WCH = FMT == FMT_Q6_K ? 12 : F::CH; // pieces of a row's block (Q6_K: plane A)
    static constexpr int BS = FMT == FMT_Q6_K ? 192 : F::BS;
    uint32_t woff;      // bytes from w to the thread's first piece at super-block sb0
    uint32_t soff;      // Q6_K, threads 0 .. 63: the row's scales at super-block sb0
    uint32_t wdst;      // the first piece's place in the stage
    int wok;            // bit 0: the thread's row exists; bit 1: its scales piece (Q6_K)
    const int8_t* xq;   // column t / 16's piece t % 16 at super-block sb0
    size_t xstep;       // 8 columns further
    int nx;             // this thread's activation pieces (columns t / 16 + 8 j < ncols)
    int xbstep;         // bytes per super-block of one piece (256 row-major, 64 k-major)
    const float2* ds;   // threads < ncols: their column's (d, sum) at super-block sb0
    const int8_t* bs;   // and its split sums

    __device__ __forceinline__ MmtPlan(int row0, int rows, const KAct& a, int sb0) {
        const int t = threadIdx.x, r = t >> 1, nb = a.K / QK_K;
        wok = row0 + r < rows;
        woff = wok ? (uint32_t)(kq_blk(row0 + r, nb, sb0) * BS + 16 * (t & 1)) : 0;
        wdst = r * F::WS + 16 * (t & 1);
        soff = 0;
        if (FMT == FMT_Q6_K && t < MMT_ROWS && row0 + t < rows) {
            wok |= 2;
            soff = (uint32_t)(kq_rows(rows) * nb * 192 + kq_blk(row0 + t, nb, sb0) * 16);
        }
        const int c = t >> 4, u = t & 15;
        xq = a.xq + (size_t)c * a.K +
             (a.kmajor ? ((size_t)(u & 3) * (a.K >> 6) + 4 * sb0 + (u >> 2)) * 16 : (size_t)sb0 * QK_K + 16 * u);
        xstep = (size_t)8 * a.K;
        nx = c < a.ncols ? (a.ncols - 1 - c) / 8 + 1 : 0;
        xbstep = a.kmajor ? 64 : QK_K;
        ds = a.xds + (size_t)t * (a.K / 32) + 8 * sb0;
        bs = a.xbs + ((size_t)t * nb + sb0) * 16;
    }

    // Super-block sb0 + db of the block's rows and columns into stage st, committed.
    __device__ __forceinline__ void copy(uint8_t* st, const uint8_t* __restrict__ w, int db, int ncols) const {
        const int t = threadIdx.x;
        if (wok & 1) {
            const uint8_t* src = w + (woff + (uint32_t)db * 4 * BS);
#pragma unroll
            for (int j = 0; j < (WCH + 1) / 2; ++j)
                if (2 * j + (t & 1) < WCH) cp_async16(st + wdst + 32 * j, src + 32 * j);
        }
        if (FMT == FMT_Q6_K && (wok & 2)) cp_async16(st + t * F::WS + 192, w + (soff + (uint32_t)db * 64));
        constexpr int BN = 8 * NT;
        uint8_t* sx = st + MMT_ROWS * F::WS + (t >> 4) * F::XS + 16 * (t & 15);
        const int8_t* x = xq + (size_t)db * xbstep;
#pragma unroll
        for (int j = 0; j < NT; ++j)
            if (j < nx) cp_async16(sx + 8 * j * F::XS, x + j * xstep);
        if (t < ncols) {
            uint8_t* sd = st + MMT_ROWS * F::WS + BN * F::XS;
            cp_async8(sd + 8 * t, ds + 8 * db);
            if (FMT != FMT_Q6_K) cp_async16(sd + BN * 8 + 16 * t, bs + 16 * db);
        }
        cp_async_commit();
    }
};

// Adds the super-block values v (position k of their chunk) to the lane's trees, and hands each
// output's chunk value to chunk(nt, e, value) when the chunk is complete (last: the range's last
// super-block).
template <int NT, class CHUNK>
__device__ __forceinline__ void mmt_leaves(int k, bool last, const float (&v)[NT][4], float (&lo)[NT][4],
                                           float (&hi)[NT][4], CHUNK chunk) {
    kq_leaves<NT>(k, v, lo, hi);
    if (k == KQ_CHUNK - 1 || last)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) chunk(nt, e, k >= 2 ? kq_add(lo[nt][e], hi[nt][e]) : lo[nt][e]);
}

// mmt_leaves on kq_leaves_sel (the mmw_* kernels' chunk tree unless MMW_LEAVES_SELECT=0).
// H200, lab run 28 (ws.cu,
// 2026-12-02, every output bit-identical to mmt_*'s): gate+up+SiLU Q4_K at 32 / 24 / 48 columns
// 95.76 / 84.57 / 166.27 -> 91.94 / 80.72 / 159.84 us; ffn_down Q4_K in 7 splits 53.37 -> 52.62,
// q+k+v 21.41 -> 21.33, attn_output 18.57 -> 18.23, Q6_K unchanged.
template <int NT, class CHUNK>
__device__ __forceinline__ void mmt_leaves_sel(int k, bool last, const float (&v)[NT][4], float (&lo)[NT][4],
                                               float (&hi)[NT][4], CHUNK chunk) {
    kq_leaves_sel<NT>(k, v, lo, hi);
    const bool two = k >= 2;
    if (k == KQ_CHUNK - 1 || last)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) chunk(nt, e, two ? kq_add(lo[nt][e], hi[nt][e]) : lo[nt][e]);
}

#ifndef MMW_LEAVES_SELECT
#define MMW_LEAVES_SELECT 1
#endif
template <int NT, class CHUNK>
__device__ __forceinline__ void mmw_leaves(int k, bool last, const float (&v)[NT][4], float (&lo)[NT][4],
                                           float (&hi)[NT][4], CHUNK chunk) {
    if constexpr (MMW_LEAVES_SELECT) mmt_leaves_sel<NT>(k, last, v, lo, hi, chunk);
    else mmt_leaves<NT>(k, last, v, lo, hi, chunk);
}

// Super-block b (position k of its chunk; last: the range's last) of the warp's 16 rows x BN
// columns from the stage (kq45_superblock's arithmetic); each complete chunk's value goes to
// chunk(nt, e, value).
template <int NT, bool Q5, class CHUNK>
__device__ __forceinline__ void mmt_q45(const uint8_t* st, int k, bool last, CHUNK chunk, float (&lo)[NT][4],
                                        float (&hi)[NT][4]) {
    using F = MmtFmt<Q5 ? FMT_Q5_K : FMT_Q4_K>;
    constexpr int QS = Q5 ? 48 : 16, BN = 8 * NT;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane >> 2, t = lane & 3;
    const uint8_t* ba = st + (16 * warp + g) * F::WS;
    const uint8_t* bb = ba + 8 * F::WS;
    const uint8_t* sx = st + MMT_ROWS * F::WS;
    const float2* sd = (const float2*)(sx + BN * F::XS);
    const int8_t* sbs = (const int8_t*)(sx + BN * (F::XS + 8));
    const uint4 ha = *(const uint4*)ba, hb = *(const uint4*)bb;
    float v[NT][4];
    uint2 xa = make_uint2(0, 0), xb = make_uint2(0, 0);
    if (Q5) {
        xa = *(const uint2*)(ba + 16 + 8 * t);
        xb = *(const uint2*)(bb + 16 + 8 * t);
    }
    kq45_superblock<NT, Q5>(
        ha, hb, [&](int gi, int r) { return *(const uint2*)((r ? bb : ba) + QS + 32 * gi + 8 * t); }, xa, xb,
        [&](int nt, int s) { return *(const uint2*)(sx + (8 * nt + g) * F::XS + 32 * s + 8 * t); },
        [&](int nt) { return *(const int*)(sbs + (8 * nt + g) * 16 + 4 * t); },
        [&](int nt, int j) { return sd[8 * nt + 2 * t + j].x; }, [&](int nt, int e, float x) { v[nt][e] = x; });
    mmt_leaves<NT>(k, last, v, lo, hi, chunk);
}

// Q6_K: the stage holds ql[128] qh[64] scales[16] per row (kq6_superblock's arithmetic); da, db
// the super-block's d of rows g and g + 8.
template <int NT, class CHUNK>
__device__ __forceinline__ void mmt_q6(const uint8_t* st, float da, float db, int k, bool last, CHUNK chunk,
                                       float (&lo)[NT][4], float (&hi)[NT][4]) {
    using F = MmtFmt<FMT_Q6_K>;
    constexpr int BN = 8 * NT;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane >> 2, t = lane & 3;
    const uint8_t* ba = st + (16 * warp + g) * F::WS;
    const uint8_t* bb = ba + 8 * F::WS;
    const uint8_t* sx = st + MMT_ROWS * F::WS;
    const float2* sd = (const float2*)(sx + BN * F::XS);
    const uint4 sva = *(const uint4*)(ba + 192), svb = *(const uint4*)(bb + 192);
    float v[NT][4];
    kq6_superblock<NT>(
        [&](int h, int p, int u, int r) {
            return *(const uint32_t*)((r ? bb : ba) + 64 * h + 32 * p + 16 * u + 4 * t);
        },
        [&](int h, int u, int r) { return *(const uint32_t*)((r ? bb : ba) + 128 + 32 * h + 16 * u + 4 * t); },
        sva, svb, da, db,
        [&](int nt, int s) { return *(const int*)(sx + (8 * nt + g) * F::XS + 16 * s + 4 * t); },
        [&](int nt, int j) { return sd[8 * nt + 2 * t + j].x; }, [&](int nt, int e, float x) { v[nt][e] = x; });
    mmt_leaves<NT>(k, last, v, lo, hi, chunk);
}

// The chunks of super-blocks sb0 .. sb1 - 1 (sb0 a multiple of KQ_CHUNK; sb1 a multiple of it or
// the row's end) of the block's rows row0 .. of a format-FMT matrix, every super-block in order
// through two stages of `smem`: chunk(nt, e, chunk index, value) for each of the lane's outputs
// (rows 16w + g (+ 8 for e >= 2), columns 8nt + 2t + (e & 1)) and chunks, in order.
template <int FMT, int NT, class CHUNK>
__device__ __forceinline__ void mmt_rows(const uint8_t* __restrict__ w, int row0, int rows, const KAct& a,
                                         uint8_t* smem, int sb0, int sb1, CHUNK chunk) {
    constexpr int SB = mmt_stage_max<NT>();
    const int nb = a.K / QK_K;
    const int lane = threadIdx.x % WARP, g = lane >> 2;
    const int ra = min(row0 + 16 * (threadIdx.x / WARP) + g, rows - 1), rb = min(ra + 8, rows - 1);
    const __half* dp = (const __half*)(w + kq_rows(rows) * nb * 208);
    float lo[NT][4], hi[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) lo[nt][e] = hi[nt][e] = 0.0f;
    const MmtPlan<FMT, NT> plan(row0, rows, a, sb0);
    plan.copy(smem, w, 0, a.ncols);
    // One loop iteration per super-block, its place in the chunk tree a warp-uniform branch (an
    // unrolled chunk made the loop ~4x longer than the instruction cache: Nsight Compute on
    // mmt_silu_4 found 35% of warp samples waiting for instructions).
#pragma unroll 1
    for (int b = sb0; b < sb1; ++b) {
        uint8_t* cur = smem + ((b - sb0) & 1) * SB;
        if (b + 1 < sb1) {
            uint8_t* nxt = smem + ((b + 1 - sb0) & 1) * SB;
            plan.copy(nxt, w, b + 1 - sb0, a.ncols);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); // stage b is in shared memory for every warp
        const int k = (b - sb0) % KQ_CHUNK; // sb0 is a multiple of KQ_CHUNK
        const auto done = [&](int nt, int e, float c) { chunk(nt, e, b / KQ_CHUNK, c); };
        if (FMT == FMT_Q6_K) {
            const float da = __half2float(dp[kq_blk(ra, nb, b)]), db = __half2float(dp[kq_blk(rb, nb, b)]);
            mmt_q6<NT>(cur, da, db, k, b == sb1 - 1, done, lo, hi);
        } else {
            mmt_q45<NT, FMT == FMT_Q5_K>(cur, k, b == sb1 - 1, done, lo, hi);
        }
        __syncthreads(); // every warp is done with stage b before it is refilled
    }
}

template <int NT, class CHUNK>
__device__ __forceinline__ void mmt_dispatch(int ty, const uint8_t* w, int row0, int rows, const KAct& a,
                                             uint8_t* smem, int sb0, int sb1, CHUNK chunk) {
    if (ty == FMT_Q6_K) mmt_rows<FMT_Q6_K, NT>(w, row0, rows, a, smem, sb0, sb1, chunk);
    else if (ty == FMT_Q5_K) mmt_rows<FMT_Q5_K, NT>(w, row0, rows, a, smem, sb0, sb1, chunk);
    else mmt_rows<FMT_Q4_K, NT>(w, row0, rows, a, smem, sb0, sb1, chunk);
}

// y[nt][e] = the lane's outputs over the whole row: the chunks added in order (common.cuh).
template <int NT>
__device__ __forceinline__ void mmt_sum(int ty, const uint8_t* w, int row0, int rows, const KAct& a,
                                        float (&y)[NT][4], uint8_t* smem) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) y[nt][e] = 0.0f;
    mmt_dispatch<NT>(ty, w, row0, rows, a, smem, 0, a.K / QK_K,
                     [&](int nt, int e, int, float c) { y[nt][e] = kq_add(y[nt][e], c); });
}

// y[c][r] of the lane's outputs: rows 16 w + g and + 8 (mmw_* on Q6_K, q6: the rows of
// mmw_q6, 16 w + 4 (g / 2) + g % 2 and + 2).
template <int NT>
__device__ __forceinline__ void mmt_store(float* y, int rows, int row0, int c0, int ncols, const float (&v)[NT][4],
                                          bool q6 = false) {
    const int lane = threadIdx.x % WARP, g = lane >> 2, t = lane & 3;
    const int r0 = row0 + 16 * (threadIdx.x / WARP) + (q6 ? 4 * (g >> 1) + (g & 1) : g);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = r0 + (e < 2 ? 0 : q6 ? 2 : 8), c = 8 * nt + 2 * t + (e & 1);
            if (r < rows && c < ncols) y[(size_t)(c0 + c) * rows + r] = v[nt][e];
        }
}

// The two stages: static up to 4 column tiles (48,640 bytes), dynamic beyond (the launch asks
// for 2 * mmt_stage_max<NT>() bytes; matvec.rs mmt_smem).
template <int NT>
__device__ __forceinline__ uint8_t* mmt_stages() {
    if constexpr (NT <= 4) {
        __shared__ __align__(16) uint8_t smem[2 * mmt_stage_max<NT>()];
        return smem;
    } else {
        extern __shared__ __align__(16) uint8_t dsmem[];
        return dsmem;
    }
}

template <int NT>
__device__ __forceinline__ void mmt_kernel(const MatvecJobs& jobs, const KAct& act) {
    uint8_t* smem = mmt_stages<NT>();
    int row0;
    const int j = kq_job(jobs, MMT_ROWS, &row0);
    const int rows = jobs.rows_of(j);
    if (row0 >= rows) return; // padding after the matrix's last row (the whole block)
    const KAct a = mmk_slice(act, 8 * NT);
    float y[NT][4];
    mmt_sum<NT>(jobs.ty_of(j), jobs.w_of(j), row0, rows, a, y, smem);
    mmt_store<NT>(jobs.y_of(j), rows, row0, blockIdx.x * 8 * NT, a.ncols, y);
}

// y[c][r] = silu(G[r] . x[c]) * (U[r] . x[c]), as mmk_silu_kernel.
template <int NT>
__device__ __forceinline__ void mmt_silu_kernel(const uint8_t* wg, int tyg, const uint8_t* wu, int tyu, float* y,
                                                int rows, const KAct& act) {
    uint8_t* smem = mmt_stages<NT>();
    const int row0 = blockIdx.y * MMT_ROWS;
    if (row0 >= rows) return;
    const KAct a = mmk_slice(act, 8 * NT);
    float gs[NT][4], us[NT][4];
    // Gate, then up, through one copy of the code (two inlined copies overflow the instruction
    // cache).
    // With 8 tiles the gate's outputs wait in shared memory past the stages (mmt_smem), not in
    // registers, while the up matrix runs.
    float* park = (float*)(smem + 2 * mmt_stage_max<NT>()) + threadIdx.x;
#pragma unroll 1
    for (int m = 0; m < 2; ++m) {
        float y[NT][4];
        mmt_sum<NT>(m ? tyu : tyg, m ? wu : wg, row0, rows, a, y, smem);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (m) us[nt][e] = y[nt][e];
                else if (NT > 4) park[(4 * nt + e) * 128] = y[nt][e];
                else gs[nt][e] = y[nt][e];
            }
    }
    if (NT > 4)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) gs[nt][e] = park[(4 * nt + e) * 128];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) gs[nt][e] = gs[nt][e] / (1.0f + expf(-gs[nt][e])) * us[nt][e];
    mmt_store<NT>(y, rows, row0, blockIdx.x * 8 * NT, a.ncols, gs);
}

// K split over the grid's z (decode groups whose launches have fewer 64-row blocks than the GPU
// has SMs: ffn_down, attn_output and q+k+v+gate at 32 columns; the host decides, `mmt_splits`).
// Split s of S takes chunks C s / S .. C (s + 1) / S of the row (C chunks in all). Split 0 adds
// its chunks in order as mmt_4 does and leaves that running sum in chunk slot 0 of `cv`; the
// other splits leave each chunk's value in its slot. The block that completes a tile's count
// adds the later chunks to the running sum in order (the canonical order: the bits of mmt_4)
// and sets the count back to 0 for the next launch. cv: [tiles][C][4 NT][128] floats (the
// outputs of a block, 4 NT per thread; the host sizes it for NT = 4), cnt: [tiles].
#ifndef MMT_MERGE
#define MMT_MERGE 4
#endif
// The merge of a K split's chunks (mmt_split_kernel, mmw_split_kernel), by the block that
// completed the tile's count: split 0's running sum from chunk slot 0, then the later splits'
// chunks first_end .. C - 1 added in order. slot(chunk, nt, e): the thread's slot of an output.
template <int NT, class SLOT>
__device__ __forceinline__ void mmt_merge(int C, int first_end, SLOT slot, float (&y)[NT][4]) {
    // Chunk by chunk in order, the 4 NT outputs' loads of MMT_MERGE chunks in flight together
    // (output by output, the loads of one output's chunks were a chain of L2 round trips in the
    // tile's tail: 22% of ffn_down's warp samples at 32 columns waited on these adds).
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) y[nt][e] = __ldcg(slot(0, nt, e));
    // MMT_MERGE chunks' loads in flight at once (7 splits of ffn_down's 20 chunks leave 19 to add).
#pragma unroll 1
    for (int ch0 = first_end; ch0 < C; ch0 += MMT_MERGE) {
        float c[MMT_MERGE][NT][4];
#pragma unroll
        for (int i = 0; i < MMT_MERGE; ++i)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) c[i][nt][e] = ch0 + i < C ? __ldcg(slot(ch0 + i, nt, e)) : 0.0f;
#pragma unroll
        for (int i = 0; i < MMT_MERGE; ++i)
            if (ch0 + i < C)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) y[nt][e] = kq_add(y[nt][e], c[i][nt][e]);
    }
}

// The end of a K split's block: split 0 leaves its running sum in chunk slot 0; the block that
// completes the tile's count merges every chunk (mmt_merge), sets the count back to 0 for the
// next launch and returns true (its y is then the output); the others return false.
template <int NT, class SLOT>
__device__ __forceinline__ bool mmt_split_end(int s, int C, int first_end, unsigned* cnt, int tile, SLOT slot,
                                              float (&y)[NT][4]) {
    __shared__ bool last;
    if (s == 0)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) *slot(0, nt, e) = y[nt][e];
    __threadfence(); // this block's values are visible before its count
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(cnt + tile, 1u) == gridDim.z - 1;
    __syncthreads();
    if (!last) return false;
    __threadfence(); // the other splits' values are read after their counts
    mmt_merge<NT>(C, first_end, slot, y);
    if (threadIdx.x == 0) cnt[tile] = 0;
    return true;
}

template <int NT>
__device__ __forceinline__ void mmt_split_kernel(const MatvecJobs& jobs, const KAct& act, float* __restrict__ cv,
                                                 unsigned* __restrict__ cnt) {
    __shared__ __align__(16) uint8_t smem[2 * mmt_stage_max<NT>()];
    int row0;
    const int j = kq_job(jobs, MMT_ROWS, &row0);
    const int rows = jobs.rows_of(j);
    if (row0 >= rows) return; // padding after the matrix's last row (every split of the tile)
    const KAct a = mmk_slice(act, 8 * NT);
    const int nb = a.K / QK_K, C = (nb + KQ_CHUNK - 1) / KQ_CHUNK, S = gridDim.z, s = blockIdx.z;
    const int c0 = C * s / S, c1 = C * (s + 1) / S, first_end = C / S;
    const int tile = blockIdx.y * gridDim.x + blockIdx.x;
    float* tcv = cv + (size_t)tile * C * (4 * NT * 128) + threadIdx.x; // the thread's slots
    const auto slot = [&](int chunk, int nt, int e) { return tcv + (chunk * (4 * NT) + 4 * nt + e) * 128; };
    float y[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) y[nt][e] = 0.0f;
    mmt_dispatch<NT>(jobs.ty_of(j), jobs.w_of(j), row0, rows, a, smem, KQ_CHUNK * c0, min(KQ_CHUNK * c1, nb),
                     [&](int nt, int e, int chunk, float c) {
                         if (s == 0) y[nt][e] = kq_add(y[nt][e], c);
                         else *slot(chunk, nt, e) = c;
                     });
    if (mmt_split_end<NT>(s, C, first_end, cnt, tile, slot, y))
        mmt_store<NT>(jobs.y_of(j), rows, row0, blockIdx.x * 8 * NT, a.ncols, y);
}

// Each block's first weights asked of L2 before waiting for the previous kernel (only the
// first column tile asks): the first chunk of its split (grid z, mmt_split_4; 0 unsplit).
__device__ __forceinline__ void pdl_wait_prefetch_mmt(const MatvecJobs& jobs, int K) {
    int row0;
    const int j = kq_job(jobs, MMT_ROWS, &row0);
    const int ch = kq_chunks(K) * blockIdx.z / gridDim.z;
    if (blockIdx.x == 0 && row0 < jobs.rows_of(j))
        for (int wp = 0; wp < MMT_ROWS / 16; ++wp)
            mmk_prefetch_chunk(jobs.w_of(j), jobs.ty_of(j), row0 + 16 * wp, jobs.rows_of(j), K, ch);
    pdl_wait();
}
__device__ __forceinline__ void pdl_wait_prefetch_mmt_silu(const uint8_t* wg, int tyg, int rows, int K) {
    if (blockIdx.x == 0)
        for (int wp = 0; wp < MMT_ROWS / 16; ++wp)
            mmk_prefetch_chunk(wg, tyg, blockIdx.y * MMT_ROWS + 16 * wp, rows, K, 0);
    pdl_wait();
}

// At most 168 registers, so three blocks share an SM (H200, llama-glimmer, same call: 32 streams
// 1047 against 849 tokens/s with the 209 registers the silu kernel takes unbounded; pp512 3184
// against 3179).
extern "C" __global__ void __launch_bounds__(128, 3) mmt_4(MatvecJobs jobs, KACT_ARGS) {
    pdl_wait_prefetch_mmt(jobs, K);
    mmt_kernel<4>(jobs, KACT);
}
extern "C" __global__ void __launch_bounds__(128, 3) mmt_split_4(MatvecJobs jobs, KACT_ARGS, float* __restrict__ cv,
                                                                  unsigned* __restrict__ cnt) {
    pdl_wait_prefetch_mmt(jobs, K);
    mmt_split_kernel<4>(jobs, KACT, cv, cnt);
}
extern "C" __global__ void __launch_bounds__(128, 3) mmt_silu_4(MMK_SILU_ARGS, KACT_ARGS) {
    pdl_wait_prefetch_mmt_silu(wg, tyg, rows, K);
    mmt_silu_kernel<4>(wg, tyg, wu, tyu, y, rows, KACT);
}
// 3 column tiles (24 columns) per block: decode groups of 17-24 and 33-48 columns (matvec.rs
// mmt_tile_nt), whose 32-column tiles would run a quarter or more of their MMAs on no column.
extern "C" __global__ void __launch_bounds__(128, 3) mmt_3(MatvecJobs jobs, KACT_ARGS) {
    pdl_wait_prefetch_mmt(jobs, K);
    mmt_kernel<3>(jobs, KACT);
}
extern "C" __global__ void __launch_bounds__(128, 3) mmt_split_3(MatvecJobs jobs, KACT_ARGS, float* __restrict__ cv,
                                                                  unsigned* __restrict__ cnt) {
    pdl_wait_prefetch_mmt(jobs, K);
    mmt_split_kernel<3>(jobs, KACT, cv, cnt);
}
extern "C" __global__ void __launch_bounds__(128, 3) mmt_silu_3(MMK_SILU_ARGS, KACT_ARGS) {
    pdl_wait_prefetch_mmt_silu(wg, tyg, rows, K);
    mmt_silu_kernel<3>(wg, tyg, wu, tyu, y, rows, KACT);
}

// 8 column tiles (64 columns) per block for prefill chunks: each warp 16 rows x 64 columns, so
// every A fragment, weight copy and loop step serves twice the MMAs of mmt_4; the accumulators
// need up to 255 registers (2 blocks per SM) and the stages dynamic shared memory.
extern "C" __global__ void __launch_bounds__(128, 2) mmt_8(MatvecJobs jobs, KACT_ARGS) {
    pdl_wait_prefetch_mmt(jobs, K);
    mmt_kernel<8>(jobs, KACT);
}
extern "C" __global__ void __launch_bounds__(128, 2) mmt_silu_8(MMK_SILU_ARGS, KACT_ARGS) {
    pdl_wait_prefetch_mmt_silu(wg, tyg, rows, K);
    mmt_silu_kernel<8>(wg, tyg, wu, tyu, y, rows, KACT);
}
// ---------------------------------------------------------------------------------------------
// mmw_*: the tiles above with their stages filled by the copy engine (Hopper's bulk copies), for
// decode groups of 9-63 columns (matvec.rs `mmw_route`, `mmw_narrow_min`).
// Same blocks (64 rows, 4 warps, 8 NT columns), same arithmetic (mmt_q45's kq45_superblock and
// chunk trees), so the same bits as mmt_* and mvk_1. What differs is the copies: mmt_*'s
// threads each copy pieces of every stage with cp.async and meet at two barriers a super-block
// (~100 of a warp's ~684 instructions a super-block, and the waits Nsight Compute found). Here a
// stage is 17 (Q6_K: 33) bulk copies: the 16 row quads' 4 blocks of the super-block (one
// contiguous run each in the resident layout, kq_blk; Q6_K's quants and scales planes, a run
// each), 4 quads (8 copies) by the warp that reads them, and the column tile's activation, which `mmw_pack` lays out beforehand as
// the stage wants it (mmw_xb: 8 NT columns x 256 int8 with their 16-byte pieces swizzled so the
// fragment loads are free of bank conflicts, then the columns' Q8_K scales and split sums).
// Three stages, each with an mbarrier counting the 4 warps' copies and their bytes ("full") and
// one counting the 4 warps done with it ("empty"). H200, lab run 25 (scripts/matvec_lab/ws.cu,
// 32 columns, bit-identical, one warp refilling a stage once all were done with it): gate+up
// 122.4 -> 97.9 us, ffn_down in 7 splits 68.8 -> 53.6, attn_output in 3 splits 26.0 -> 18.2.
// Each warp refilling its own rows (mmw_issue_own, lab run 31): 32 streams 2,407-2,418 ->
// 2,557-2,561 tokens/s, 64 streams 2,822 -> 3,137-3,153.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define MMW_ASM(...) __trap()
#else
#define MMW_ASM(...) asm volatile(__VA_ARGS__)
#endif

#ifndef MMW_STAGES
#define MMW_STAGES 3
#endif
// Blocks of an SM the mmw_* kernels are built for (their register bound: 168 at 3).
#ifndef MMW_BLOCKS
#define MMW_BLOCKS 3
#endif
// A stage's weights: 64 rows' blocks; Q6_K's 16 quads of the quants plane 784 bytes apart (16 of
// padding, so mmw_q6's fragment loads are free of bank conflicts), then their 16 scales each.
#define MMW_Q6_QUAD 784
template <int FMT>
__host__ __device__ constexpr int mmw_wbytes() {
    return FMT == FMT_Q6_K ? 16 * MMW_Q6_QUAD + MMT_ROWS * 16 : MMT_ROWS * MmtFmt<FMT>::BS;
}
// A stage: the weights (Q6_K, the largest), then the activation region.
__host__ __device__ constexpr int mmw_stage(int nt) { return mmw_wbytes<FMT_Q6_K>() + mmw_xb(nt); }
// Q4_K runs of the plain, split and pair kernels take their super-blocks two a stage, in
// MMW_Q4_PAIR_STAGES stages of two super-blocks' weights and activation regions: one wait, one
// refill (the copies, their addresses, the barriers) per two super-blocks instead of one, and
// four super-blocks in flight instead of three, in about the shared memory of three Q6_K stages.
// MMW_Q4_PAIR=0: one a stage, as the other formats.
#ifndef MMW_Q4_PAIR
#define MMW_Q4_PAIR 1
#endif
#define MMW_Q4_PAIR_STAGES 2
__host__ __device__ constexpr int mmw_stage_q4pair(int nt) { return 2 * (mmw_wbytes<FMT_Q4_K>() + mmw_xb(nt)); }
__host__ __device__ constexpr int mmw_max(int a, int b) { return a > b ? a : b; }
// Where the mbarriers start: after the larger of the two stage sets.
__host__ __device__ constexpr int mmw_bars_at(int nt) {
    return mmw_max(MMW_STAGES * mmw_stage(nt), MMW_Q4_PAIR ? MMW_Q4_PAIR_STAGES * mmw_stage_q4pair(nt) : 0);
}
// The dynamic shared memory of a launch: the stages and 2 S mbarriers (matvec.rs mmw_smem).
__host__ __device__ constexpr int mmw_smem(int nt) { return mmw_bars_at(nt) + 16 * MMW_STAGES; }

// A run's stage geometry: P super-blocks a stage in S stages of ST bytes; a stage holds P
// super-blocks' weights (each row quad's P blocks runs side by side, QB bytes a quad; Q6_K's
// planes as mmw_q6 reads them) in its first WB bytes, then their P activation regions.
template <int FMT, int NT, bool PAIRED>
struct MmwGeo {
    static constexpr int P = PAIRED && MMW_Q4_PAIR && FMT == FMT_Q4_K ? 2 : 1;
    static constexpr int S = P == 2 ? MMW_Q4_PAIR_STAGES : MMW_STAGES;
    static constexpr int BS = FMT == FMT_Q6_K ? 192 : MmtFmt<FMT>::BS;
    static constexpr int QB = FMT == FMT_Q6_K ? MMW_Q6_QUAD : P * 4 * BS;
    static constexpr int WB = P * mmw_wbytes<FMT>();
    static constexpr int ST = P == 2 ? mmw_stage_q4pair(NT) : mmw_stage(NT);
};

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    MMW_ASM("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    MMW_ASM("{\n.reg .pred done;\nwait_%=:\n"
            "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
            "@!done bra wait_%=;\n}\n" ::"r"(bar),
            "r"(parity)
            : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    MMW_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
    MMW_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Adds bytes to the barrier's current phase without arriving.
__device__ __forceinline__ void mbar_add_tx(uint32_t bar, uint32_t bytes) {
    MMW_ASM("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Orders this thread's shared-memory accesses before the copy engine's (cp.async.bulk) after it.
__device__ __forceinline__ void fence_proxy_async() { MMW_ASM("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    MMW_ASM("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
            "l"(src), "r"(bytes), "r"(bar)
            : "memory");
}

// Each warp copies its own 16 rows' blocks of a stage's pn super-blocks (quads 4 w .. 4 w + 3,
// which no other warp reads: lanes 0..3 a quad each, Q6_K's scales lanes 4..7) into a stage as
// soon as it is done with the stage, arriving on the full barrier with their bytes; the activation region,
// which every warp reads, is copied by the last warp done with the stage (mmw_done), which adds
// its bytes to the barrier before it arrives (mmw_issue_act). Quads past the matrix's padded
// rows are not copied: their outputs are never stored, and integer MMAs keep stale bytes to
// those outputs.
template <int FMT, int NT, bool PAIRED>
__device__ __forceinline__ void mmw_issue_own(uint32_t st, uint32_t full, const uint8_t* __restrict__ w, int row0,
                                              int rows, int nb, int b, int pn) {
    using G = MmwGeo<FMT, NT, PAIRED>;
    constexpr bool Q6 = FMT == FMT_Q6_K;
    constexpr int BS = G::BS, QB = G::QB;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int quads = min(MMT_ROWS / 4, (int)(kq_rows(rows) - row0) / 4);
    const int mine = max(0, min(4, quads - 4 * warp)), q = 4 * warp + (lane & 3);
    if (lane == 0) mbar_expect(full, (uint32_t)(mine * 4 * (pn * BS + (Q6 ? 16 : 0))));
    __syncwarp();
    if ((lane & 3) < mine) {
        // A quad's pn blocks runs (super-blocks b ..) are contiguous in the resident layout.
        if (lane < 4) bulk_copy(st + q * QB, w + kq_blk(row0 + 4 * q, nb, b) * BS, pn * 4 * BS, full);
        else if (Q6 && lane < 8)
            bulk_copy(st + 16 * MMW_Q6_QUAD + q * 64, w + kq_rows(rows) * nb * 192 + kq_blk(row0 + 4 * q, nb, b) * 16,
                      64, full);
    }
}
template <int FMT, int NT, bool PAIRED>
__device__ __forceinline__ void mmw_issue_act(uint32_t st, uint32_t full, const uint8_t* __restrict__ xt, int b,
                                              int pn) {
    if (threadIdx.x % WARP == 0) {
        mbar_add_tx(full, (uint32_t)(pn * mmw_xb(NT)));
        bulk_copy(st + MmwGeo<FMT, NT, PAIRED>::WB, xt + (size_t)b * mmw_xb(NT), pn * mmw_xb(NT), full);
    }
    __syncwarp();
}
// The warps done with each stage (mod 4: the one that makes it a multiple of 4 was the last).
__shared__ unsigned mmw_done[MMW_STAGES];

// The first stages of a run of n super-blocks from sb0 (uses q0 .. q0 + S - 1 of the stages, P
// super-blocks each), by every warp (its own rows; warp 0 the activation).
template <int FMT, int NT, bool PAIRED>
__device__ __forceinline__ void mmw_prime(uint32_t s0, uint32_t bars, const uint8_t* __restrict__ w, int row0,
                                          int rows, int nb, const uint8_t* __restrict__ xt, int q0, int sb0, int n,
                                          int warp) {
    using G = MmwGeo<FMT, NT, PAIRED>;
    for (int i = 0; i < G::S && G::P * i < n; ++i) {
        const int s = (q0 + i) % G::S, b = sb0 + G::P * i, pn = min(G::P, n - G::P * i);
        if (warp == 0) mmw_issue_act<FMT, NT, PAIRED>(s0 + s * G::ST, bars + 8 * s, xt, b, pn);
        mmw_issue_own<FMT, NT, PAIRED>(s0 + s * G::ST, bars + 8 * s, w, row0, rows, nb, b, pn);
    }
}

// After the warp's use q of stage s (the i-th of the run, its first super-block b; n super-blocks
// in the run): the use completes a phase of the stage's empty barrier and 4 counts of mmw_done.
// Then the super-blocks S uses on into the stage when there are any: the warp's own rows now,
// the activation by the last warp done with the stage (its wait returns at once and orders the
// other warps' reads before the copy).
template <int FMT, int NT, bool PAIRED>
__device__ __forceinline__ void mmw_refill(uint32_t s0, uint32_t bars, const uint8_t* __restrict__ w, int row0,
                                           int rows, int nb, const uint8_t* __restrict__ xt, int q, int i, int n,
                                           int b) {
    using G = MmwGeo<FMT, NT, PAIRED>;
    const int s = q % G::S;
    fence_proxy_async();
    unsigned last = 0;
    if (threadIdx.x % WARP == 0) {
        mbar_arrive(bars + 8 * (MMW_STAGES + s));
        last = (atomicAdd(&mmw_done[s], 1u) & (MMT_WARPS - 1)) == MMT_WARPS - 1;
    }
    const int next = G::P * (i + G::S);
    if (next < n) {
        const int pn = min(G::P, n - next);
        if (__shfl_sync(0xffffffffu, last, 0)) {
            mbar_wait(bars + 8 * (MMW_STAGES + s), (q / G::S) & 1);
            fence_proxy_async();
            mmw_issue_act<FMT, NT, PAIRED>(s0 + s * G::ST, bars + 8 * s, xt, b + G::P * G::S, pn);
        }
        mmw_issue_own<FMT, NT, PAIRED>(s0 + s * G::ST, bars + 8 * s, w, row0, rows, nb, b + G::P * G::S, pn);
    }
}

// Column c's piece p (16 values) of a super-block is piece p ^ mmw_swz(c) of its 256 bytes
// (mmw_pack): the 8 columns of an MMA tile get 8 different pieces, so the 8-byte fragment loads
// of a half-warp (Q4_K, Q5_K: pieces 2 s and 2 s + 1 of columns 0..3 or 4..7) and the 4-byte ones
// of a warp (Q6_K: piece s of columns 0..7) fall in different banks.

// mmt_q45 on an mmw stage: row 16 w + g is block g & 3 of quad 4 w + g / 4, row + 8 two quads
// on; column c's piece p of 16 values is at piece p ^ mmw_swz(c) of its 256 bytes (mmw_pack).
// wst: the super-block's blocks in the stage (quads QB bytes apart), sx: its activation region.
template <int NT, bool Q5, int QB, class CHUNK>
__device__ __forceinline__ void mmw_q45(const uint8_t* wst, const uint8_t* sx, int k, bool last, CHUNK chunk,
                                        float (&lo)[NT][4], float (&hi)[NT][4]) {
    constexpr int BS = Q5 ? 176 : 144, QS = Q5 ? 48 : 16, BN = 8 * NT;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane >> 2, t = lane & 3;
    const uint8_t* ba = wst + (4 * warp + (g >> 2)) * QB + (g & 3) * BS;
    const uint8_t* bb = ba + 2 * QB;
    const float* sd = (const float*)(sx + BN * 256);
    const uint8_t* sbs = sx + BN * 260;
    const uint4 ha = *(const uint4*)ba, hb = *(const uint4*)bb;
    float v[NT][4];
    uint2 xa = make_uint2(0, 0), xb = make_uint2(0, 0);
    if (Q5) {
        xa = *(const uint2*)(ba + 16 + 8 * t);
        xb = *(const uint2*)(bb + 16 + 8 * t);
    }
    const int swz = mmw_swz(g), half = 8 * (t & 1), p0 = t >> 1;
    kq45_superblock<NT, Q5, true>(
        ha, hb, [&](int gi, int r) { return *(const uint2*)((r ? bb : ba) + QS + 32 * gi + 8 * t); }, xa, xb,
        [&](int nt, int s) { return *(const uint2*)(sx + (8 * nt + g) * 256 + (((2 * s + p0) ^ swz) << 4) + half); },
        [&](int nt) { return *(const uint2*)(sbs + (8 * nt + g) * 32 + 8 * t); },
        [&](int nt, int j) { return sd[8 * nt + 2 * t + j]; }, [&](int nt, int e, float x) { v[nt][e] = x; });
    mmw_leaves<NT>(k, last, v, lo, hi, chunk);
}

// mmt_q6 on an mmw stage. Rows of the warp's MMA: row g is row g % 2 of quad 4 w + g / 2, row
// g + 8 row 2 + g % 2 of it (mmt_store's q6 rows), so the 8 rows of a fragment load lie in 4
// quads (784 bytes apart) and 2 rows of each: 32 banks.
template <int NT, class CHUNK>
__device__ __forceinline__ void mmw_q6(const uint8_t* st, float da, float db, int k, bool last, CHUNK chunk,
                                       float (&lo)[NT][4], float (&hi)[NT][4]) {
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane >> 2, t = lane & 3;
    const int quad = 4 * warp + (g >> 1);
    const uint8_t* ba = st + quad * MMW_Q6_QUAD + (g & 1) * 192;
    const uint8_t* bb = ba + 2 * 192;
    const uint8_t* sc = st + 16 * MMW_Q6_QUAD + quad * 64 + (g & 1) * 16;
    const uint8_t* sx = st + mmw_wbytes<FMT_Q6_K>();
    const float* sd = (const float*)(sx + 8 * NT * 256);
    const uint4 sva = *(const uint4*)sc, svb = *(const uint4*)(sc + 32);
    const int swz = mmw_swz(g);
    float v[NT][4];
    kq6_superblock<NT>(
        [&](int h, int p, int u, int r) {
            return *(const uint32_t*)((r ? bb : ba) + 64 * h + 32 * p + 16 * u + 4 * t);
        },
        [&](int h, int u, int r) { return *(const uint32_t*)((r ? bb : ba) + 128 + 32 * h + 16 * u + 4 * t); },
        sva, svb, da, db, [&](int nt, int s) { return *(const int*)(sx + (8 * nt + g) * 256 + ((s ^ swz) << 4) + 4 * t); },
        [&](int nt, int j) { return sd[8 * nt + 2 * t + j]; }, [&](int nt, int e, float x) { v[nt][e] = x; });
    mmw_leaves<NT>(k, last, v, lo, hi, chunk);
}

// The stages' barriers, initialized by thread 0: full[s] and empty[s] expect one arrival per
// warp (full's with the bytes of its copies).
template <int NT>
__device__ __forceinline__ uint32_t mmw_init(uint8_t* smem) {
    const uint32_t bars = (uint32_t)__cvta_generic_to_shared(smem) + mmw_bars_at(NT);
    if (threadIdx.x == 0) {
        for (int i = 0; i < MMW_STAGES; ++i) {
            mbar_init(bars + 8 * i, MMT_WARPS);
            mbar_init(bars + 8 * (MMW_STAGES + i), MMT_WARPS);
            mmw_done[i] = 0u;
        }
        MMW_ASM("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    return bars;
}

// mmt_rows through the mmw stages: the chunks of super-blocks sb0 .. sb1 - 1 (sb0 a multiple of
// KQ_CHUNK) of the block's rows, chunk(nt, e, chunk index, value) in order. The run's super-blocks
// go P to a stage use (MmwGeo): use i (super-blocks sb0 + P i ..) is use (q0 + i) / S of stage
// (q0 + i) % S, whose full and empty barriers complete one phase for it; q0: the uses the block
// made of its stages before (silu's up matrix follows the gate, P = 1). Ends with every warp done
// with every stage.
template <int FMT, int NT, bool PAIRED, class CHUNK>
__device__ __forceinline__ void mmw_rows(const uint8_t* __restrict__ w, int row0, int rows, int K,
                                         const uint8_t* __restrict__ xt, uint8_t* smem, uint32_t bars, int q0,
                                         int sb0, int sb1, CHUNK chunk) {
    using G = MmwGeo<FMT, NT, PAIRED>;
    const int nb = K / QK_K, warp = threadIdx.x / WARP, n = sb1 - sb0, g = (threadIdx.x % WARP) >> 2;
    const uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem);
    // Q6_K: the d of the lane's two rows (mmw_q6's) from plane C, each super-block's loaded one
    // ahead (the waits' memory clobbers would otherwise leave the load's latency in every
    // iteration).
    const __half* dp = (const __half*)(w + kq_rows(rows) * nb * 208);
    const int ra = min(row0 + 16 * warp + 4 * (g >> 1) + (g & 1), rows - 1), rb = min(ra + 2, rows - 1);
    __half da = __float2half(0.0f), db = da;
    if (FMT == FMT_Q6_K && n > 0) {
        da = dp[kq_blk(ra, nb, sb0)];
        db = dp[kq_blk(rb, nb, sb0)];
    }
    float lo[NT][4], hi[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) lo[nt][e] = hi[nt][e] = 0.0f;
    mmw_prime<FMT, NT, PAIRED>(s0, bars, w, row0, rows, nb, xt, q0, sb0, n, warp);
    const int uses = (n + G::P - 1) / G::P;
#pragma unroll 1
    for (int i = 0; i < uses; ++i) {
        const int q = q0 + i, s = q % G::S, b0 = sb0 + G::P * i;
        const uint8_t* st = smem + s * G::ST;
        __half na = da, nb_ = db;
        if (FMT == FMT_Q6_K && i + 1 < n) {
            na = dp[kq_blk(ra, nb, b0 + 1)];
            nb_ = dp[kq_blk(rb, nb, b0 + 1)];
        }
        mbar_wait(bars + 8 * s, (q / G::S) & 1);
        if constexpr (FMT == FMT_Q6_K) {
            const auto done = [&](int nt, int e, float c) { chunk(nt, e, b0 / KQ_CHUNK, c); };
            mmw_q6<NT>(st, __half2float(da), __half2float(db), i % KQ_CHUNK, i == n - 1, done, lo, hi);
            da = na;
            db = nb_;
        } else {
            const int pn = min(G::P, n - G::P * i);
#pragma unroll 1
            for (int p = 0; p < pn; ++p) {
                const int ii = G::P * i + p, b = b0 + p;
                const auto done = [&](int nt, int e, float c) { chunk(nt, e, b / KQ_CHUNK, c); };
                mmw_q45<NT, FMT == FMT_Q5_K, G::QB>(st + p * 4 * G::BS, st + G::WB + p * mmw_xb(NT), ii % KQ_CHUNK,
                                                    ii == n - 1, done, lo, hi);
            }
        }
        __syncwarp();
        mmw_refill<FMT, NT, PAIRED>(s0, bars, w, row0, rows, nb, xt, q, i, n, b0);
    }
    __syncthreads();
}

// PAIRED: the run starts on fresh stages (q0 = 0), so Q4_K may take its super-blocks two a stage
// (MmwGeo); mmw_silu_kernel's up matrix continues the gate's stages, so both take one a stage.
template <int NT, bool PAIRED, class CHUNK>
__device__ __forceinline__ void mmw_dispatch(int ty, const uint8_t* w, int row0, int rows, int K, const uint8_t* xt,
                                             uint8_t* smem, uint32_t bars, int q0, int sb0, int sb1, CHUNK chunk) {
    if (ty == FMT_Q6_K) mmw_rows<FMT_Q6_K, NT, PAIRED>(w, row0, rows, K, xt, smem, bars, q0, sb0, sb1, chunk);
    else if (ty == FMT_Q5_K) mmw_rows<FMT_Q5_K, NT, PAIRED>(w, row0, rows, K, xt, smem, bars, q0, sb0, sb1, chunk);
    else mmw_rows<FMT_Q4_K, NT, PAIRED>(w, row0, rows, K, xt, smem, bars, q0, sb0, sb1, chunk);
}

template <int NT, bool PAIRED>
__device__ __forceinline__ void mmw_sum(int ty, const uint8_t* w, int row0, int rows, int K, const uint8_t* xt,
                                        uint8_t* smem, uint32_t bars, int q0, float (&y)[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) y[nt][e] = 0.0f;
    mmw_dispatch<NT, PAIRED>(ty, w, row0, rows, K, xt, smem, bars, q0, 0, K / QK_K,
                     [&](int nt, int e, int, float c) { y[nt][e] = kq_add(y[nt][e], c); });
}

// This column tile's activation regions (mmw_pack's output for the launch's columns).
template <int NT>
__device__ __forceinline__ const uint8_t* mmw_tile(const uint8_t* xblob, int K) {
    return xblob + (size_t)blockIdx.x * (K / QK_K) * mmw_xb(NT);
}

#define MMW_ACT_ARGS const uint8_t* __restrict__ xblob, int K, int ncols

template <int NT>
__device__ __forceinline__ void mmw_kernel(const MatvecJobs& jobs, const uint8_t* xblob, int K, int ncols) {
    extern __shared__ __align__(128) uint8_t mmw_smem_buf[];
    int row0;
    const int j = kq_job(jobs, MMT_ROWS, &row0);
    const int rows = jobs.rows_of(j);
    if (row0 >= rows) return;
    const uint32_t bars = mmw_init<NT>(mmw_smem_buf);
    float y[NT][4];
    mmw_sum<NT, true>(jobs.ty_of(j), jobs.w_of(j), row0, rows, K, mmw_tile<NT>(xblob, K), mmw_smem_buf, bars, 0, y);
    mmt_store<NT>(jobs.y_of(j), rows, row0, blockIdx.x * 8 * NT, min(8 * NT, ncols - (int)blockIdx.x * 8 * NT), y,
                  jobs.ty_of(j) == FMT_Q6_K);
}

// silu(gate) * up of the block's outputs, stored (mmt_store) in this column tile of y.
template <int NT>
__device__ __forceinline__ void mmw_silu_store(float (&gs)[NT][4], const float (&us)[NT][4], float* y, int rows,
                                               int row0, int ncols, int tyg) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) gs[nt][e] = gs[nt][e] / (1.0f + expf(-gs[nt][e])) * us[nt][e];
    mmt_store<NT>(y, rows, row0, blockIdx.x * 8 * NT, min(8 * NT, ncols - (int)blockIdx.x * 8 * NT), gs,
                  tyg == FMT_Q6_K);
}

// Gate and up must lay their rows out alike (both Q6_K or neither: mmt_store's rows).
template <int NT>
__device__ __forceinline__ void mmw_silu_kernel(const uint8_t* wg, int tyg, const uint8_t* wu, int tyu, float* y,
                                                int rows, const uint8_t* xblob, int K, int ncols) {
    extern __shared__ __align__(128) uint8_t mmw_smem_buf[];
    const int row0 = blockIdx.y * MMT_ROWS;
    if (row0 >= rows) return;
    const uint32_t bars = mmw_init<NT>(mmw_smem_buf);
    const uint8_t* xt = mmw_tile<NT>(xblob, K);
    float gs[NT][4], us[NT][4];
    mmw_sum<NT, false>(tyg, wg, row0, rows, K, xt, mmw_smem_buf, bars, 0, gs);
    mmw_sum<NT, false>(tyu, wu, row0, rows, K, xt, mmw_smem_buf, bars, K / QK_K, us);
    mmw_silu_store<NT>(gs, us, y, rows, row0, ncols, tyg);
}

// mmw_silu_kernel with gate and up in blocks of their own (grid y: 2 per 64 rows, gate then
// up): 2 x 312 blocks of half the work for Glimmer's 19968 rows instead of 312 for the 396
// places of 3 blocks per SM (a wave 79% full). Each block leaves its values in its slot of cv
// (thread-major, as mmw_split_kernel's chunk slots); the block that completes the pair's count
// reads the other's and stores silu(gate) * up, with mmw_silu_kernel's arithmetic, so its bits,
// and sets the count back to 0 for the next launch.
template <int NT>
__device__ __forceinline__ void mmw_silu_pair_kernel(const uint8_t* wg, int tyg, const uint8_t* wu, int tyu, float* y,
                                                     int rows, const uint8_t* xblob, int K, int ncols,
                                                     float* __restrict__ cv, unsigned* __restrict__ cnt) {
    extern __shared__ __align__(128) uint8_t mmw_smem_buf[];
    const int rb = blockIdx.y >> 1, up = blockIdx.y & 1, row0 = rb * MMT_ROWS;
    if (row0 >= rows) return;
    const uint32_t bars = mmw_init<NT>(mmw_smem_buf);
    float v[NT][4];
    mmw_sum<NT, true>(up ? tyu : tyg, up ? wu : wg, row0, rows, K, mmw_tile<NT>(xblob, K), mmw_smem_buf, bars, 0, v);
    const int pair = rb * gridDim.x + blockIdx.x;
    float* slots = cv + (size_t)pair * 2 * (4 * NT * 128) + threadIdx.x;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) slots[(up * 4 * NT + 4 * nt + e) * 128] = v[nt][e];
    __shared__ bool last;
    __threadfence(); // this block's values are visible before its count
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(cnt + pair, 1u) == 1;
    __syncthreads();
    if (!last) return;
    __threadfence(); // the other block's values are read after its count
    float gs[NT][4], us[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float o = __ldcg(slots + ((up ^ 1) * 4 * NT + 4 * nt + e) * 128);
            gs[nt][e] = up ? o : v[nt][e];
            us[nt][e] = up ? v[nt][e] : o;
        }
    if (threadIdx.x == 0) cnt[pair] = 0;
    mmw_silu_store<NT>(gs, us, y, rows, row0, ncols, tyg);
}

// K split over grid z: mmt_split_kernel's slots, counts and merge, so its bits.
template <int NT>
__device__ __forceinline__ void mmw_split_kernel(const MatvecJobs& jobs, const uint8_t* xblob, int K, int ncols,
                                                 float* __restrict__ cv, unsigned* __restrict__ cnt) {
    extern __shared__ __align__(128) uint8_t mmw_smem_buf[];
    int row0;
    const int j = kq_job(jobs, MMT_ROWS, &row0);
    const int rows = jobs.rows_of(j);
    if (row0 >= rows) return;
    const uint32_t bars = mmw_init<NT>(mmw_smem_buf);
    const int nb = K / QK_K, C = (nb + KQ_CHUNK - 1) / KQ_CHUNK, S = gridDim.z, s = blockIdx.z;
    const int c0 = C * s / S, c1 = C * (s + 1) / S, first_end = C / S;
    const int tile = blockIdx.y * gridDim.x + blockIdx.x;
    float* tcv = cv + (size_t)tile * C * (4 * NT * 128) + threadIdx.x;
    const auto slot = [&](int chunk, int nt, int e) { return tcv + (chunk * (4 * NT) + 4 * nt + e) * 128; };
    float y[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) y[nt][e] = 0.0f;
    mmw_dispatch<NT, true>(jobs.ty_of(j), jobs.w_of(j), row0, rows, K, mmw_tile<NT>(xblob, K), mmw_smem_buf, bars, 0,
                     KQ_CHUNK * c0, min(KQ_CHUNK * c1, nb), [&](int nt, int e, int chunk, float c) {
                         if (s == 0) y[nt][e] = kq_add(y[nt][e], c);
                         else *slot(chunk, nt, e) = c;
                     });
    if (mmt_split_end<NT>(s, C, first_end, cnt, tile, slot, y))
        mmt_store<NT>(jobs.y_of(j), rows, row0, blockIdx.x * 8 * NT, min(8 * NT, ncols - (int)blockIdx.x * 8 * NT), y,
                      jobs.ty_of(j) == FMT_Q6_K);
}

// Each block's first stages (their weights, which no kernel writes) asked of the copy engine
// before the wait for the previous kernel would be the next step; today the wait comes first.
// The kernels of 8 NT columns: NT = 4 and 3, and 2 for decode groups of 9-16 columns, which
// matvec.rs `mmw_narrow_min` routes here instead of mmv_* (one 8-column tile was slower than
// mmv_1: lab README run 32).
extern "C" __global__ void __launch_bounds__(128, MMW_BLOCKS) mmw_4(MatvecJobs jobs, MMW_ACT_ARGS) {
    pdl_wait();
    mmw_kernel<4>(jobs, xblob, K, ncols);
}
extern "C" __global__ void __launch_bounds__(128, MMW_BLOCKS) mmw_split_4(MatvecJobs jobs, MMW_ACT_ARGS, float* __restrict__ cv,
                                                                  unsigned* __restrict__ cnt) {
    pdl_wait();
    mmw_split_kernel<4>(jobs, xblob, K, ncols, cv, cnt);
}
extern "C" __global__ void __launch_bounds__(128, MMW_BLOCKS) mmw_silu_4(MMK_SILU_ARGS, MMW_ACT_ARGS) {
    pdl_wait();
    mmw_silu_kernel<4>(wg, tyg, wu, tyu, y, rows, xblob, K, ncols);
}
extern "C" __global__ void __launch_bounds__(128, MMW_BLOCKS) mmw_silu_pair_4(MMK_SILU_ARGS, MMW_ACT_ARGS,
                                                                      float* __restrict__ cv,
                                                                      unsigned* __restrict__ cnt) {
    pdl_wait();
    mmw_silu_pair_kernel<4>(wg, tyg, wu, tyu, y, rows, xblob, K, ncols, cv, cnt);
}
extern "C" __global__ void __launch_bounds__(128, MMW_BLOCKS) mmw_3(MatvecJobs jobs, MMW_ACT_ARGS) {
    pdl_wait();
    mmw_kernel<3>(jobs, xblob, K, ncols);
}
extern "C" __global__ void __launch_bounds__(128, MMW_BLOCKS) mmw_split_3(MatvecJobs jobs, MMW_ACT_ARGS, float* __restrict__ cv,
                                                                  unsigned* __restrict__ cnt) {
    pdl_wait();
    mmw_split_kernel<3>(jobs, xblob, K, ncols, cv, cnt);
}
extern "C" __global__ void __launch_bounds__(128, MMW_BLOCKS) mmw_silu_3(MMK_SILU_ARGS, MMW_ACT_ARGS) {
    pdl_wait();
    mmw_silu_kernel<3>(wg, tyg, wu, tyu, y, rows, xblob, K, ncols);
}
extern "C" __global__ void __launch_bounds__(128, MMW_BLOCKS) mmw_silu_pair_3(MMK_SILU_ARGS, MMW_ACT_ARGS,
                                                                      float* __restrict__ cv,
                                                                      unsigned* __restrict__ cnt) {
    pdl_wait();
    mmw_silu_pair_kernel<3>(wg, tyg, wu, tyu, y, rows, xblob, K, ncols, cv, cnt);
}
extern "C" __global__ void __launch_bounds__(128, MMW_BLOCKS) mmw_2(MatvecJobs jobs, MMW_ACT_ARGS) {
    pdl_wait();
    mmw_kernel<2>(jobs, xblob, K, ncols);
}
extern "C" __global__ void __launch_bounds__(128, MMW_BLOCKS) mmw_split_2(MatvecJobs jobs, MMW_ACT_ARGS, float* __restrict__ cv,
                                                                  unsigned* __restrict__ cnt) {
    pdl_wait();
    mmw_split_kernel<2>(jobs, xblob, K, ncols, cv, cnt);
}
extern "C" __global__ void __launch_bounds__(128, MMW_BLOCKS) mmw_silu_2(MMK_SILU_ARGS, MMW_ACT_ARGS) {
    pdl_wait();
    mmw_silu_kernel<2>(wg, tyg, wu, tyu, y, rows, xblob, K, ncols);
}
extern "C" __global__ void __launch_bounds__(128, MMW_BLOCKS) mmw_silu_pair_2(MMK_SILU_ARGS, MMW_ACT_ARGS,
                                                                      float* __restrict__ cv,
                                                                      unsigned* __restrict__ cnt) {
    pdl_wait();
    mmw_silu_pair_kernel<2>(wg, tyg, wu, tyu, y, rows, xblob, K, ncols, cv, cnt);
}

// The activation regions of mmw_* from the row-major Q8_K activation of `ncols` columns: block
// (super-block b, tile T) writes region (T, b) of 8 nt columns (nt = 2 to 4; columns past ncols
// zero): thread i copies 16-byte pieces i, i + 128, .. of the values, then the scales and split
// sums. 128 threads.
extern "C" __global__ void __launch_bounds__(128) mmw_pack(const int8_t* __restrict__ xq,
                                                           const float2* __restrict__ xds,
                                                           const int8_t* __restrict__ xbs, int K, int ncols, int nt,
                                                           uint8_t* __restrict__ xblob) {
    pdl_wait();
    const int nb = K / QK_K, b = blockIdx.x, T = blockIdx.y, bn = 8 * nt;
    uint8_t* r = xblob + ((size_t)T * nb + b) * mmw_xb(nt);
    for (int i = threadIdx.x; i < bn * 16; i += blockDim.x) {
        const int cc = i >> 4, p = i & 15, c = T * bn + cc;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (c < ncols) v = __ldg((const uint4*)(xq + (size_t)c * K + b * QK_K) + p);
        *(uint4*)(r + cc * 256 + ((p ^ mmw_swz(cc)) << 4)) = v;
    }
    for (int cc = threadIdx.x; cc < bn; cc += blockDim.x) {
        const int c = T * bn + cc;
        const bool in = c < ncols;
        *(float*)(r + bn * 256 + 4 * cc) = in ? xds[(size_t)c * (K / 32) + 8 * b].x : 0.0f;
        __half* hs = (__half*)(r + bn * 260 + 32 * cc);
        for (int j = 0; j < 16; ++j)
            hs[mmw_bs_at(j & 7, j >= 8)] = __int2half_rn(in ? (int)xbs[((size_t)c * nb + b) * 16 + j] : 0);
    }
}
