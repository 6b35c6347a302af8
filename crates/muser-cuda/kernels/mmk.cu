// K-quant matrices (Q4_K, Q5_K, Q6_K) times 2 to 16 activation columns on the integer tensor
// cores (decode groups, one column per sequence of the group; wider groups and prefill chunks
// run on mmt.cu, same arithmetic; groups of 2 to 8 on mmv_1 / mmv_silu_1 at the end of this
// file, the same tiles with the work divided as in mvk_1), in the canonical order of common.cuh (kq_value_*, kq_add), so
// every column gets the bits matvec_1 gives it alone: a sequence's tokens do not depend on its
// decode group, nor its prompt's KV cache on how the prompt was chunked (batch invariance).
//
// Launch: 128 threads (4 warps) per block; a block takes 16 rows (one MMA tile: rows g and g + 8
// of lane (g, t) = (lane / 4, lane % 4)) and BN = 8 * NT columns (NT = 1, 2: mmk_1, mmk_2).
// Grid x: column tiles (those of one row block run side by side and share its weights in L2),
// grid y: row blocks over the jobs' rows (each job padded to 16 rows). The 4 warps split K into
// contiguous ranges of super-blocks (by windows, MMK_WIN): each puts its super-blocks' values
// into shared memory, and once a window's are all there one thread per output makes the chunk
// trees and adds them to the output's total in chunk order, which is the canonical order.
// Per super-block b, per n-tile of 8 columns, lane (g, t) of a warp: the MMAs of
// kq45_superblock / kq6_superblock (kq_mma.cuh), with the activations read from global memory
// together with the super-block's weights, each v_b = kq_value_*(...) put into shared memory.
// Each warp asks L2 for the first chunk of its range before the wait for the kernel before
// (nothing further ahead: see the note before mmk_window_sum).

#define MMK_ROWS 16
#ifndef MMK_PAIR
#define MMK_PAIR 1
#endif
#define MMK_WARPS 4

// Address of int8 activation value v of column c (v a multiple of 4; 4 or 8 bytes read there
// stay inside one 16-byte chunk of the k-major layout).
// Branch-free (a select), so that a super-block's activation loads can all be issued at once.
__device__ __forceinline__ const int8_t* mmk_x(const KAct& a, int c, int v) {
    const int8_t* col = a.xq + (size_t)c * a.K;
    const size_t km = ((size_t)((v >> 4) & 3) * (a.K >> 6) + (v >> 6)) * 16 + (v & 15);
    return col + (a.kmajor ? km : (size_t)v);
}

// A super-block's activation fragments, split sums and scales are loaded together with its
// weights, before its arithmetic (mmk_q45, mmk_q6). Read inside the MMA loop (and behind a branch on the
// layout), each sub-block's B fragment was its own round trip to L1/L2 after the previous
// sub-block's MMAs: 8 (Q6_K 16) dependent trips per super-block. H200, llama-glimmer, same call
// (2026-11-30): 8 streams 495.3 / 502.9 -> 715.3 tokens/s, 16 streams 764.1 / 777.4 -> 940.7
// (mmk_2 at 229 registers, 2 blocks per SM, still gains), 669/669 checks, groups identical to solo.

// The lane's columns: as B (column g of each n-tile) and as outputs (2t, 2t + 1), clamped to the
// last column (clamped outputs are computed and never stored).
template <int NT>
struct MmkCols {
    int b[NT], o[NT][2];
    __device__ __forceinline__ MmkCols(int ncols) {
        const int lane = threadIdx.x % WARP, g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            b[nt] = min(8 * nt + g, ncols - 1);
            o[nt][0] = min(8 * nt + 2 * t, ncols - 1);
            o[nt][1] = min(8 * nt + 2 * t + 1, ncols - 1);
        }
    }
};

// A Q4_K/Q5_K super-block b's activation fragments for lane (g, t), all loaded at once: per
// n-tile the 8 sub-blocks' B fragments (v), the split sums (s) and the scales of the lane's two
// output columns (d).
template <int NT>
struct MmkX45 {
    uint2 v[NT][8];
    int s[NT];
    float d[NT][2];
    __device__ __forceinline__ MmkX45(const KAct& a, const MmkCols<NT>& cols, int b) {
        const int t = threadIdx.x % 4, nb = a.K / QK_K, nb32 = a.K / 32;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int i = 0; i < 8; ++i) v[nt][i] = *(const uint2*)mmk_x(a, cols.b[nt], b * QK_K + 32 * i + 8 * t);
            s[nt] = *(const int*)(a.xbs + ((size_t)cols.b[nt] * nb + b) * 16 + 4 * t);
            d[nt][0] = a.xds[(size_t)cols.o[nt][0] * nb32 + 8 * b].x;
            d[nt][1] = a.xds[(size_t)cols.o[nt][1] * nb32 + 8 * b].x;
        }
    }
};

// Weight loads: from global memory (evict-first, ld_once) or, SH, from a warp's shared-memory
// stage (mmv_*'s copies).
template <class T, bool SH>
__device__ __forceinline__ T wld(const uint8_t* p) {
    if constexpr (SH) return *(const T*)p;
    else return ld_once<T>(p);
}

// A Q4_K/Q5_K super-block's weights of lane (g, t): ba, bb the blocks of rows g and g + 8.
template <bool Q5, bool SH>
struct W45 {
    uint4 ha, hb;
    uint2 qa[4], qb[4], xa, xb;
    __device__ __forceinline__ W45(const uint8_t* ba, const uint8_t* bb) {
        constexpr int QS = Q5 ? 48 : 16;
        const int t = threadIdx.x & 3;
        ha = wld<uint4, SH>(ba);
        hb = wld<uint4, SH>(bb);
#pragma unroll
        for (int gi = 0; gi < 4; ++gi) {
            qa[gi] = wld<uint2, SH>(ba + QS + 32 * gi + 8 * t);
            qb[gi] = wld<uint2, SH>(bb + QS + 32 * gi + 8 * t);
        }
        xa = xb = make_uint2(0, 0);
        if (Q5) {
            xa = wld<uint2, SH>(ba + 16 + 8 * t);
            xb = wld<uint2, SH>(bb + 16 + 8 * t);
        }
    }
};

// v[nt][e]: the super-block's values of the lane's outputs (kq45_superblock).
template <int NT, bool Q5, bool SH>
__device__ __forceinline__ void mmk_q45_block(const W45<Q5, SH>& w, const MmkX45<NT>& x, float (&v)[NT][4]) {
    kq45_superblock<NT, Q5>(
        w.ha, w.hb, [&](int gi, int r) { return r ? w.qb[gi] : w.qa[gi]; }, w.xa, w.xb,
        [&](int nt, int s) { return x.v[nt][s]; }, [&](int nt) { return x.s[nt]; },
        [&](int nt, int j) { return x.d[nt][j]; }, [&](int nt, int e, float f) { v[nt][e] = f; });
}

template <int NT, bool Q5, class LEAF>
__device__ __forceinline__ void mmk_q45(const uint8_t* __restrict__ w, int row0, int rows, const KAct& a, int b0,
                                        int b1, LEAF leaf) {
    constexpr int BS = Q5 ? 176 : 144;
    const int lane = threadIdx.x % WARP, g = lane >> 2;
    const int nb = a.K / QK_K;
    const uint8_t* wa = w + kq_blk(min(row0 + g, rows - 1), nb, 0) * BS;
    const uint8_t* wb = w + kq_blk(min(row0 + g + 8, rows - 1), nb, 0) * BS;
    const MmkCols<NT> cols(a.ncols);
    // One copy of the super-block's code, its place in the chunk tree a warp-uniform branch.
#pragma unroll 1
    for (int b = b0; b < b1; ++b) {
        // a row's blocks are 4 apart (kq_blk)
        const W45<Q5, false> wt(wa + (size_t)b * 4 * BS, wb + (size_t)b * 4 * BS);
        float v[NT][4];
        {
            const MmkX45<NT> x(a, cols, b);
            mmk_q45_block<NT, Q5>(wt, x, v);
        }
        leaf(b, v);
    }
}

// A Q6_K super-block's weights of lane (g, t) (the planes of matvec.rs' repack): qa, qb the
// quants (plane A) of rows g and g + 8, sa, sb their 16 scales, pa, pb their d.
template <bool SH>
struct W6 {
    uint32_t la[2][2][2], lb[2][2][2], hqa[2][2], hqb[2][2];
    uint4 sva, svb;
    float da, db;
    __device__ __forceinline__ W6(const uint8_t* qa, const uint8_t* qb, const int8_t* sa, const int8_t* sb,
                                  const __half* pa, const __half* pb) {
        const int t = threadIdx.x & 3;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int u = 0; u < 2; ++u) {
#pragma unroll
                for (int p = 0; p < 2; ++p) {
                    la[h][p][u] = wld<unsigned, SH>(qa + 64 * h + 32 * p + 16 * u + 4 * t);
                    lb[h][p][u] = wld<unsigned, SH>(qb + 64 * h + 32 * p + 16 * u + 4 * t);
                }
                hqa[h][u] = wld<unsigned, SH>(qa + 128 + 32 * h + 16 * u + 4 * t);
                hqb[h][u] = wld<unsigned, SH>(qb + 128 + 32 * h + 16 * u + 4 * t);
            }
        sva = *(const uint4*)sa;
        svb = *(const uint4*)sb;
        da = __half2float(*pa);
        db = __half2float(*pb);
    }
};

// A Q6_K super-block b's activation fragments for lane (g, t): per n-tile the 16 sub-blocks'
// B fragments (values 4t .. 4t + 3 of each) and the scales of the lane's two output columns.
template <int NT>
struct MmkX6 {
    int v[NT][16];
    float d[NT][2];
    __device__ __forceinline__ MmkX6(const KAct& a, const MmkCols<NT>& cols, int b) {
        const int t = threadIdx.x % 4, nb32 = a.K / 32;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int s = 0; s < 16; ++s) v[nt][s] = *(const int*)mmk_x(a, cols.b[nt], b * QK_K + 16 * s + 4 * t);
            d[nt][0] = a.xds[(size_t)cols.o[nt][0] * nb32 + 8 * b].x;
            d[nt][1] = a.xds[(size_t)cols.o[nt][1] * nb32 + 8 * b].x;
        }
    }
};

template <int NT, bool SH>
__device__ __forceinline__ void mmk_q6_block(const W6<SH>& w, const MmkX6<NT>& x, float (&v)[NT][4]) {
    kq6_superblock<NT>([&](int h, int p, int u, int r) { return r ? w.lb[h][p][u] : w.la[h][p][u]; },
                       [&](int h, int u, int r) { return r ? w.hqb[h][u] : w.hqa[h][u]; }, w.sva, w.svb, w.da,
                       w.db, [&](int nt, int s) { return x.v[nt][s]; }, [&](int nt, int j) { return x.d[nt][j]; },
                       [&](int nt, int e, float f) { v[nt][e] = f; });
}

// Q6_K, repacked (matvec.rs): plane A ql[128] qh[64], plane B int8 scales [16], plane C d (f16),
// kq_rows(rows) x nb blocks each in the order of kq_blk.
template <int NT, class LEAF>
__device__ __forceinline__ void mmk_q6(const uint8_t* __restrict__ w, int row0, int rows, const KAct& a, int b0,
                                       int b1, LEAF leaf) {
    const int lane = threadIdx.x % WARP, g = lane >> 2;
    const int nb = a.K / QK_K;
    const int ra = min(row0 + g, rows - 1), rb = min(row0 + g + 8, rows - 1);
    const size_t n = kq_rows(rows) * nb;
    const int8_t* scp = (const int8_t*)(w + n * 192);
    const __half* dp = (const __half*)(w + n * 208);
    const MmkCols<NT> cols(a.ncols);
    // As mmk_q45: one copy of the super-block's code.
#pragma unroll 1
    for (int b = b0; b < b1; ++b) {
        float v[NT][4];
        const size_t ia = kq_blk(ra, nb, b), ib = kq_blk(rb, nb, b);
        const W6<false> wt(w + ia * 192, w + ib * 192, scp + ia * 16, scp + ib * 16, dp + ia, dp + ib);
        {
            const MmkX6<NT> x(a, cols, b);
            mmk_q6_block<NT>(wt, x, v);
        }
        leaf(b, v);
    }
}

// Gate and up of one Q4_K super-block row range together (mmk_silu_kernel when both are Q4_K):
// per super-block both matrices' weights are loaded with one set of activation fragments, so a
// warp has twice the weight bytes in flight (4.6 KB) and loads the activations once for both;
// leaf(b, vg, vu) gets both matrices' values. The arithmetic of each is mmk_q45's.
template <int NT, class LEAF>
__device__ __forceinline__ void mmk_q4_pair(const uint8_t* __restrict__ wg, const uint8_t* __restrict__ wu, int row0,
                                            int rows, const KAct& a, int b0, int b1, LEAF leaf) {
    constexpr int BS = 144;
    const int lane = threadIdx.x % WARP, g = lane >> 2;
    const int nb = a.K / QK_K;
    const size_t oa = kq_blk(min(row0 + g, rows - 1), nb, 0) * BS;
    const size_t ob = kq_blk(min(row0 + g + 8, rows - 1), nb, 0) * BS;
    const MmkCols<NT> cols(a.ncols);
#pragma unroll 1
    for (int b = b0; b < b1; ++b) {
        const size_t o = (size_t)b * 4 * BS;
        const W45<false, false> gt(wg + oa + o, wg + ob + o), ut(wu + oa + o, wu + ob + o);
        float vg[NT][4], vu[NT][4];
        {
            const MmkX45<NT> x(a, cols, b);
            mmk_q45_block<NT, false>(gt, x, vg);
            mmk_q45_block<NT, false>(ut, x, vu);
        }
        leaf(b, vg, vu);
    }
}

// Super-blocks per window (a multiple of KQ_CHUNK): the warps split a window's super-blocks
// into 4 contiguous ranges, put every super-block's values in shared memory ([window][8 NT
// columns x 16 rows] floats, 40 KB), meet once, and one thread per output makes the chunk trees
// and adds them to its total in chunk order (the canonical order). Every Glimmer matrix is one
// window at 8 columns; ffn_down is two at 16. (Before: warp w took whole chunks w, w + 4, ..;
// at K = 6656, 26 super-blocks in 7 chunks, the block then waited for two warps of 8
// super-blocks while the others had 6 and 4; by super-blocks the ranges hold 6 or 7.)
#define MMK_WIN(NT) ((NT) == 1 ? 80 : 40)

// No chunk is asked of L2 ahead inside the loop: H200, llama-glimmer, 8 streams (2026-11-30, one
// call, Nsight Compute DRAM bytes of one launch): with each warp asking for the chunk after the
// next whenever it ended a chunk, gate+up read 198 MB from DRAM for its 149.5 MB of weights,
// ffn_down 104 MB for 74.8 (Q4_K) and 185 for 109.0 (Q6_K): lines asked for ~8 us ahead, while
// ~30 MB of other rows streamed through L2, were gone again when the warp came to them. Without
// it 180 / 81 / 116 MB, ffn_down Q6_K 61.3 -> 55.1 us, 8 streams 734.8 / 733.8 -> 777.6 / 772.8
// tokens/s, 16 streams 1048.3 / 1052.6 -> 1058.9 / 1070.5 (asking half a chunk ahead: between).

// Adds the n super-blocks' values of a window (part: [n][16 rows x 8 NT columns]) to the thread's
// outputs y[i] (output threadIdx.x + 128 i), chunk by chunk in order: lo = v0 (+ v1), hi = v2 (+
// v3), chunk = lo (+ hi), as kq_leaves.
template <int NT>
__device__ __forceinline__ void mmk_window_sum(const float* part, int n, float (&y)[NT]) {
    constexpr int S = MMK_ROWS * 8 * NT;
#pragma unroll
    for (int i = 0; i < NT; ++i) {
        const float* pv = part + threadIdx.x + 128 * i;
#pragma unroll 1
        for (int c0 = 0; c0 < n; c0 += KQ_CHUNK) {
            const int m = min(KQ_CHUNK, n - c0);
            float c = pv[c0 * S];
            if (m > 1) c = kq_add(c, pv[(c0 + 1) * S]);
            if (m > 2) {
                float hi = pv[(c0 + 2) * S];
                if (m > 3) hi = kq_add(hi, pv[(c0 + 3) * S]);
                c = kq_add(c, hi);
            }
            y[i] = kq_add(y[i], c);
        }
    }
}

// Writes super-block values v (the lane's outputs) at window slot k of part.
template <int NT>
__device__ __forceinline__ void mmk_put(float* part, int k, const float (&v)[NT][4]) {
    const int lane = threadIdx.x % WARP, g = lane >> 2, t = lane & 3;
    constexpr int S = MMK_ROWS * 8 * NT;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[k * S + (8 * nt + 2 * t + (e & 1)) * MMK_ROWS + g + (e < 2 ? 0 : 8)] = v[nt][e];
}

// y[i] = output p = threadIdx.x + 128 i of the block (row p % 16, column p / 16 of the tile) of
// a matrix of format ty, in the canonical order (see MMK_WIN).
template <int NT>
__device__ __forceinline__ void mmk_rows(int ty, const uint8_t* w, int row0, int rows, const KAct& a, float (&y)[NT],
                                         float* part) {
    const int warp = threadIdx.x / WARP, nb = a.K / QK_K;
    constexpr int W = MMK_WIN(NT);
#pragma unroll
    for (int i = 0; i < NT; ++i) y[i] = 0.0f;
#pragma unroll 1
    for (int w0 = 0; w0 < nb; w0 += W) {
        const int n = min(W, nb - w0);
        const int b0 = w0 + n * warp / MMK_WARPS, b1 = w0 + n * (warp + 1) / MMK_WARPS;
        if (b0 < b1 && b0 % KQ_CHUNK != 0) mmk_prefetch_chunk(w, ty, row0, rows, a.K, b0 / KQ_CHUNK + 1);
        const auto leaf = [&](int b, const float(&v)[NT][4]) { mmk_put<NT>(part, b - w0, v); };
        if (ty == FMT_Q6_K) mmk_q6<NT>(w, row0, rows, a, b0, b1, leaf);
        else if (ty == FMT_Q5_K) mmk_q45<NT, true>(w, row0, rows, a, b0, b1, leaf);
        else mmk_q45<NT, false>(w, row0, rows, a, b0, b1, leaf);
        __syncthreads(); // the window's values are written
        mmk_window_sum<NT>(part, n, y);
        __syncthreads(); // and read: part is free for the next window (or mmk_silu_kernel's up)
    }
}

// mmk_rows for gate and up (both Q4_K) in one pass (mmk_q4_pair): windows of MMK_WIN(NT) / 2
// super-blocks, part holding the gate's window then the up's; the same trees and order.
template <int NT>
__device__ __forceinline__ void mmk_rows_pair(const uint8_t* wg, const uint8_t* wu, int row0, int rows,
                                              const KAct& a, float (&yg)[NT], float (&yu)[NT], float* part) {
    const int warp = threadIdx.x / WARP, nb = a.K / QK_K;
    constexpr int W = MMK_WIN(NT) / 2, S = MMK_ROWS * 8 * NT;
    float* pu = part + W * S;
#pragma unroll
    for (int i = 0; i < NT; ++i) yg[i] = yu[i] = 0.0f;
#pragma unroll 1
    for (int w0 = 0; w0 < nb; w0 += W) {
        const int n = min(W, nb - w0);
        const int b0 = w0 + n * warp / MMK_WARPS, b1 = w0 + n * (warp + 1) / MMK_WARPS;
        if (b0 < b1 && b0 % KQ_CHUNK != 0) {
            mmk_prefetch_chunk(wg, FMT_Q4_K, row0, rows, a.K, b0 / KQ_CHUNK + 1);
            mmk_prefetch_chunk(wu, FMT_Q4_K, row0, rows, a.K, b0 / KQ_CHUNK + 1);
        }
        mmk_q4_pair<NT>(wg, wu, row0, rows, a, b0, b1,
                        [&](int b, const float(&vg)[NT][4], const float(&vu)[NT][4]) {
                            mmk_put<NT>(part, b - w0, vg);
                            mmk_put<NT>(pu, b - w0, vu);
                        });
        __syncthreads(); // the window's values are written
        mmk_window_sum<NT>(part, n, yg);
        mmk_window_sum<NT>(pu, n, yu);
        __syncthreads(); // and read: part is free for the next window
    }
}

// y[c][r] of the thread's outputs (see mmk_rows).
template <int NT>
__device__ __forceinline__ void mmk_store(float* y, int rows, int row0, int c0, int ncols, const float (&v)[NT]) {
#pragma unroll
    for (int i = 0; i < NT; ++i) {
        const int p = threadIdx.x + 128 * i, r = row0 + p % MMK_ROWS, c = p / MMK_ROWS;
        if (r < rows && c < ncols) y[(size_t)(c0 + c) * rows + r] = v[i];
    }
}

// The chunk of each warp's first super-block (in the first window, mmk_rows) asked of L2
// before waiting for the previous kernel (the weights do not depend on it); only the first
// column tile asks.
__device__ __forceinline__ int mmk_first_chunk(int K, int nt) {
    const int nb = K / QK_K, n = min(MMK_WIN(nt), nb);
    return n * (threadIdx.x / WARP) / MMK_WARPS / KQ_CHUNK;
}
__device__ __forceinline__ void pdl_wait_prefetch_mmk(const MatvecJobs& jobs, int K, int nt) {
    int row0;
    const int j = kq_job(jobs, MMK_ROWS, &row0);
    if (blockIdx.x == 0) mmk_prefetch_chunk(jobs.w_of(j), jobs.ty_of(j), row0, jobs.rows_of(j), K, mmk_first_chunk(K, nt));
    pdl_wait();
}
__device__ __forceinline__ void pdl_wait_prefetch_mmk_silu(const uint8_t* wg, int tyg, int rows, int K, int nt) {
    if (blockIdx.x == 0) mmk_prefetch_chunk(wg, tyg, blockIdx.y * MMK_ROWS, rows, K, mmk_first_chunk(K, nt));
    pdl_wait();
}

template <int NT>
__device__ __forceinline__ void mmk_kernel(const MatvecJobs& jobs, const KAct& act) {
    __shared__ float part[MMK_WIN(NT) * MMK_ROWS * 8 * NT];
    int row0;
    const int j = kq_job(jobs, MMK_ROWS, &row0);
    const int rows = jobs.rows_of(j);
    if (row0 >= rows) return; // padding after the matrix's last row (the whole block)
    const KAct a = mmk_slice(act, 8 * NT);
    float y[NT];
    mmk_rows<NT>(jobs.ty_of(j), jobs.w_of(j), row0, rows, a, y, part);
    mmk_store<NT>(jobs.y_of(j), rows, row0, blockIdx.x * 8 * NT, a.ncols, y);
}

// y[c][r] = silu(G[r] . x[c]) * (U[r] . x[c]), the two sums each in the canonical order and the
// float expression of matvec.cu's silu_warp.
template <int NT>
__device__ __forceinline__ void mmk_silu_kernel(const uint8_t* wg, int tyg, const uint8_t* wu, int tyu, float* y,
                                                int rows, const KAct& act) {
    __shared__ float part[MMK_WIN(NT) * MMK_ROWS * 8 * NT];
    const int row0 = blockIdx.y * MMK_ROWS;
    if (row0 >= rows) return;
    const KAct a = mmk_slice(act, 8 * NT);
    float gs[NT], us[NT];
    if (MMK_PAIR && tyg == FMT_Q4_K && tyu == FMT_Q4_K) {
        mmk_rows_pair<NT>(wg, wu, row0, rows, a, gs, us, part);
    } else {
    // Gate, then up, through one copy of the code (two inlined copies overflow the instruction
    // cache).
#pragma unroll 1
    for (int m = 0; m < 2; ++m) {
        float y[NT];
        mmk_rows<NT>(m ? tyu : tyg, m ? wu : wg, row0, rows, a, y, part);
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            if (m) us[i] = y[i];
            else gs[i] = y[i];
        }
    }
    }
#pragma unroll
    for (int i = 0; i < NT; ++i) gs[i] = gs[i] / (1.0f + expf(-gs[i])) * us[i];
    mmk_store<NT>(y, rows, row0, blockIdx.x * 8 * NT, a.ncols, gs);
}

extern "C" __global__ void __launch_bounds__(128) mmk_1(MatvecJobs jobs, KACT_ARGS) {
    pdl_wait_prefetch_mmk(jobs, K, 1);
    mmk_kernel<1>(jobs, KACT);
}
extern "C" __global__ void __launch_bounds__(128) mmk_2(MatvecJobs jobs, KACT_ARGS) {
    pdl_wait_prefetch_mmk(jobs, K, 2);
    mmk_kernel<2>(jobs, KACT);
}
extern "C" __global__ void __launch_bounds__(128) mmk_silu_1(MMK_SILU_ARGS, KACT_ARGS) {
    pdl_wait_prefetch_mmk_silu(wg, tyg, rows, K, 1);
    mmk_silu_kernel<1>(wg, tyg, wu, tyu, y, rows, KACT);
}
extern "C" __global__ void __launch_bounds__(128) mmk_silu_2(MMK_SILU_ARGS, KACT_ARGS) {
    pdl_wait_prefetch_mmk_silu(wg, tyg, rows, K, 2);
    mmk_silu_kernel<2>(wg, tyg, wu, tyu, y, rows, KACT);
}

// ---------------------------------------------------------------------------------------------
// mmv_1 / mmv_silu_1 (2 to 8 columns) and mmv_2 / mmv_silu_2 (9 to 16): mmk_1's and mmk_2's
// tiles and arithmetic with mvk_1's division of the work. mmk_* give each block 16 whole rows, so
// at the Glimmer shapes a launch runs 0.79 (attn_output, ffn_down: 416 blocks), 1.03
// (q+k+v+gate: 544) or 2.36 (gate+up: 1248) waves of 4 blocks per SM, and the SMs of a partial
// wave have fewer loads in flight or none. H200, llama-glimmer (2026-11-30), aggregate tg128
// tokens/s, mmk / mmv in the same calls: 8 streams 853-856 / 878-879, 12 streams 1008-1016 /
// 1070-1078, 16 streams 1227-1229 / 1335-1338 (3-4 streams: mmv 2% slower, so they stay on mmk).
// Tried and dropped (same calls; patches in the dev logs): each warp's next super-block loaded
// into registers before the current one's arithmetic, gate and up as separate tasks (168
// registers, 3 blocks per SM): 8 streams 819-824 against 881-890; mmv_1 capped at 96 registers
// for 5 blocks per SM (spills): 819 against 872-883.
// Here the launch's work is a list of tasks (16-row block, chunk of KQ_CHUNK super-blocks), cut
// into one contiguous range per warp of a grid that fills the GPU once (mvk_span, common.cuh).
// A warp runs each task's super-blocks through the arithmetic of mmk_q45 / mmk_q6 / mmk_q4_pair
// (one super-block of the 16 rows per step), their weights copied ahead into the warp's ring of
// shared-memory slots (MmvStage, below; gate+up pairs that are not both Q4_K read them from
// global memory), and makes the chunk's tree in registers (kq_leaves). A row block whose tasks all lie in the warp's range is summed there,
// its chunks in order from 0; the chunk values of a row block shared with other warps (at most
// the first and the last of the range) go to cv, and a count per row block finds the warp that
// completes it (release atomic, acquire fence, as mvk_warp), which adds its chunks in order.
// Every output gets the canonical order's bits (common.cuh): those of mmk_1 and mvk_1.
// cv: [row blocks][chunks][M][128] floats, M = 1 (2: gate, up), lane l's 4 outputs at 4l;
// cnt: one u32 per row block, zero between launches (the completing warp zeroes it).

// The value of chunk ch of the lane's 4 NT outputs (rows g, g + 8 x columns 8nt + 2t, + 1 of
// the 16-row block at row0; output 4 nt + e is kq45_superblock's (nt, e)) of a format-FMT matrix
// (Q4_K/Q5_K/Q6_K): the super-blocks' values through the chunk's tree.
template <int NT>
__device__ __forceinline__ void mmv_tree(int n, const float (&lo)[NT][4], const float (&hi)[NT][4],
                                         float (&c)[4 * NT]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[4 * nt + e] = n > 2 ? kq_add(lo[nt][e], hi[nt][e]) : lo[nt][e];
}

template <int FMT, int NT>
__device__ __forceinline__ void mmv_chunk(const uint8_t* __restrict__ w, int row0, int rows, const KAct& a, int ch,
                                          float (&c)[4 * NT]) {
    const int b0 = ch * KQ_CHUNK, b1 = min(b0 + KQ_CHUNK, a.K / QK_K);
    float lo[NT][4] = {}, hi[NT][4] = {};
    const auto leaf = [&](int b, const float(&v)[NT][4]) { kq_leaves<NT>(b - b0, v, lo, hi); };
    if (FMT == FMT_Q6_K) mmk_q6<NT>(w, row0, rows, a, b0, b1, leaf);
    else mmk_q45<NT, FMT == FMT_Q5_K>(w, row0, rows, a, b0, b1, leaf);
    mmv_tree<NT>(b1 - b0, lo, hi, c);
}

// Any of the three formats (the gate+up pairs that are not both Q4_K: one matrix at a time).
template <int NT>
__device__ __forceinline__ void mmv_chunk_any(int ty, const uint8_t* __restrict__ w, int row0, int rows,
                                              const KAct& a, int ch, float (&c)[4 * NT]) {
    if (ty == FMT_Q6_K) mmv_chunk<FMT_Q6_K, NT>(w, row0, rows, a, ch, c);
    else if (ty == FMT_Q5_K) mmv_chunk<FMT_Q5_K, NT>(w, row0, rows, a, ch, c);
    else mmv_chunk<FMT_Q4_K, NT>(w, row0, rows, a, ch, c);
}

// ---------------------------------------------------------------------------------------------
// Staged weights (mmv_*): each warp copies the super-blocks of its range into its own ring of
// `stages` shared-memory slots with cp.async, in the order it reads them, `stages` - 1
// super-blocks ahead, the first ones before the wait for the kernel before (the weights do not
// depend on it); each super-block's activation is loaded from global memory before the wait for
// its slot. A slot is the super-block of the 16-row block: Q4_K/Q5_K row r's block at r * BS
// (the 4 quads' runs back to back: 8-byte fragment loads in 2 wavefronts, the fewest); Q6_K row
// r's quants at r * MMV_Q6_ROW (16 bytes of padding: conflict-free 4-byte loads), then the rows'
// 16-byte scales, then their d. The arithmetic and its order are mmk_*'s, so every output keeps
// its bits. H200, llama-glimmer, aggregate tg128 tokens/s, weights read from global memory
// (ld_once) / 2 / 3 stages, same call (2026-11-30): 8 streams 890.7 / 920.3 / 894.3, 16 streams
// 1349.7 / 1201.5 / 1347.5 (matvec.rs: mmv_stages). Nsight Compute, gate+up at 8 streams (no
// graph): 63.8 -> 62.9 us with 2 stages and copies of divided-out addresses (27% more
// instructions issued, 8.2 -> 5.9 cycles between a warp's instructions, 40% of them waiting on
// L1TEX before); the copies' addresses are now one base per quad.
#define MMV_Q6_ROW 208
#define MMV_Q6_SC (16 * MMV_Q6_ROW)
#define MMV_Q6_D (MMV_Q6_SC + 16 * 16)
#define MMV_SLOT_ONE (MMV_Q6_D + 16 * 2) // 3,616 bytes: the largest single matrix's slot (Q6_K)
#define MMV_SLOT_PAIR (2 * 16 * 144)     // gate and up, Q4_K

// The staged kernels' dynamic shared memory: 4 warps x stages slots.
extern __shared__ __align__(16) uint8_t mmv_smem[];

// Copies super-block b of the 16 rows at row0 of a format-FMT matrix into slot dst. A quad's
// super-block is one run of 4 blocks (kq_blk); lane l copies its 16-byte pieces l and l + 32, so
// each copy instruction reads 512 contiguous bytes. (Copies by row, two lanes a row reading 32
// bytes each: H200, 8 streams 762.7 / 759.1 tokens/s against 889.0 / 892.1 unstaged in the same
// call, 2026-11-30.) Q6_K: also the quads' scales (lanes 0-15, row
// l) and d (lanes 16-19, quad l - 16). Quads past the matrix's last copy its last (their rows'
// outputs are never stored).
template <int FMT>
__device__ __forceinline__ void mmv_copy(uint8_t* dst, const uint8_t* __restrict__ w, int row0, int rows, int nb,
                                         int b) {
    constexpr int BS = FMT == FMT_Q6_K ? 192 : FMT == FMT_Q5_K ? 176 : 144, RUN = BS / 4; // pieces per run
    constexpr int QD = FMT == FMT_Q6_K ? 4 * MMV_Q6_ROW : 4 * BS;                       // slot bytes per quad
    const int lane = threadIdx.x % WARP, q0 = row0 >> 2;
    const int ql = (int)(kq_rows(rows) >> 2) - 1 - q0; // the matrix's last quad, counted from q0
    // Block numbers in 32 bits (a matrix holds fewer than 2^30 blocks; Glimmer's LM head 5.3
    // million): super-block b of quad q0 is block bq, that of quad q0 + q is 4 nb q blocks
    // further (kq_blk). Computed in 64 bits for every quad, the addresses took ~100 of the ~490
    // instructions a Q4_K super-block of mmv_1 issued (now ~450); H200, llama-glimmer, one call
    // (2026-12-03), 8 streams 985.56 / 973.32 -> 1,019.43 / 1,013.26 tokens/s, same bits.
    const unsigned bq = ((unsigned)q0 * (unsigned)nb + (unsigned)b) * 4u, qs = 4u * (unsigned)nb;
    const uint8_t* src0 = w + (size_t)bq * BS + 16 * lane; // the lane's first piece of quad q0
    // The slot offsets of pieces l and l + 32 of a run (Q6_K: rows padded to MMV_Q6_ROW).
    const int e = lane + 32;
    const int d0 = FMT == FMT_Q6_K ? lane / 12 * MMV_Q6_ROW + 16 * (lane % 12) : 16 * lane;
    const int d1 = FMT == FMT_Q6_K ? e / 12 * MMV_Q6_ROW + 16 * (e % 12) : 16 * e;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const uint8_t* src = q == 0 ? src0 : src0 + (unsigned)min(q, ql) * qs * BS;
        cp_async16(dst + q * QD + d0, src);
        if (e < RUN) cp_async16(dst + q * QD + d1, src + 16 * 32);
    }
    if (FMT == FMT_Q6_K) {
        const size_t n = kq_rows(rows) * nb;
        // the first block of the lane's quad
        const unsigned blk = bq + (unsigned)min((lane >> 2) & 3, ql) * qs;
        if (lane < 16) cp_async16(dst + MMV_Q6_SC + 16 * lane, w + n * 192 + (size_t)(blk + (lane & 3)) * 16);
        else if (lane < 20) {
            const unsigned bd = bq + (unsigned)min(lane & 3, ql) * qs;
            cp_async8(dst + MMV_Q6_D + 8 * (lane & 3), w + n * 208 + (size_t)bd * 2);
        }
    }
}

// A warp's ring of `stages` slots of `slot` bytes (offsets in mmv_smem) and its two cursors:
// the next super-block to copy (row block rb, super-block b; n left: the range's tasks cover
// its super-blocks in this order) and the next slot to read. Every issue() commits one group,
// empty past the range, so the wait in next() always leaves stages - 1 groups in flight.
struct MmvStage {
    uint32_t base, end, slot, put, take;
    int stages, rb, b, n;
    __device__ __forceinline__ MmvStage(int slot_, int stages_, int nb, int nch, int t0, int t1)
        : slot(slot_), stages(stages_) {
        base = put = take = (uint32_t)((threadIdx.x / WARP) * stages_ * slot_);
        end = base + stages_ * slot_;
        rb = t0 / nch;
        b = (t0 - rb * nch) * KQ_CHUNK;
        const int rb1 = t1 / nch;
        n = (rb1 - rb) * nb + min((t1 - rb1 * nch) * KQ_CHUNK, nb) - b;
    }
    // copy(dst, row block, super-block)
    template <class COPY>
    __device__ __forceinline__ void issue(COPY copy, int nb) {
        if (n > 0) {
            copy(mmv_smem + put, rb, b);
            --n;
            if (++b == nb) {
                b = 0;
                ++rb;
            }
        }
        put = put + slot == end ? base : put + slot;
        cp_async_commit();
    }
    template <class COPY>
    __device__ __forceinline__ void prologue(COPY copy, int nb) {
#pragma unroll 1
        for (int i = 1; i < stages; ++i) issue(copy, nb);
    }
    // The slot of the next super-block, once every lane's copies have landed; the copy
    // stages - 1 ahead is issued first, into the slot read last (release()d).
    template <class COPY>
    __device__ __forceinline__ const uint8_t* next(COPY copy, int nb) {
        issue(copy, nb);
        if (stages == 2) cp_async_wait<1>();
        else if (stages == 3) cp_async_wait<2>();
        else cp_async_wait<3>();
        __syncwarp();
        const uint8_t* s = mmv_smem + take;
        take = take + slot == end ? base : take + slot;
        return s;
    }
    // The slot's reads are done (the next issue() may overwrite it). Where a chunk function calls
    // it sets how long the slot's values may stay in shared memory: before the arithmetic, they
    // are all loaded into registers first; after it, the compiler may load them where they are
    // used. ptxas (sm_90), spill bytes stored / loaded, before -> after the arithmetic:
    // mmv_silu_1 24 / 76 -> 0, mmv_silu_2 156 / 288 -> 60 / 136, mmv_2 16 / 16 -> 128 / 344 (so
    // mmv_2's single matrices release before it). H200, llama-glimmer, same call (2026-11-30):
    // 16 streams 1349.0 / 1351.7 -> 1377.5 / 1373.8 tokens/s, 8 streams 916.3 / 915.6 -> 914.9 /
    // 913.9.
    __device__ __forceinline__ void release() { __syncwarp(); }
};

// Q4_K/Q5_K groups of up to MMV_X_AHEAD column tiles (0: none) issue each super-block's
// activation loads before the previous super-block's arithmetic (xa holds the current one's,
// loaded when the chunk starts). Otherwise they are issued just before the wait for the
// super-block's slot, and as the weights are in shared memory by then, the round trip to L2 is
// what the first MMA waits for: Nsight Compute, H200, 8 streams (2026-12-02), 15% of
// `mmv_silu_1`'s warp samples and 25% of a Q4_K ffn_down `mmv_1`'s on that one instruction
// (long scoreboard). Loaded ahead (one binary each, alternated in one call, 2026-12-02, tg128
// aggregate tokens/s): 8 streams 969.45 against 959.43 / 962.83, 6 streams 756.93 against
// 750.01 / 752.59; so that wait was mostly hidden by the SM's other warps. Two column tiles
// would spill (168 registers already). (Asking L1 for the next super-block's lines instead,
// `prefetch.global.L1`, one line a lane: 8 streams 815, 16 streams 1,188 against 956 / 1,391.)
#ifndef MMV_X_AHEAD
#define MMV_X_AHEAD 1
#endif

// mmv_chunk from the warp's stage.
template <int FMT, int NT, class COPY>
__device__ __forceinline__ void mmv_chunk_staged(MmvStage& st, COPY copy, const KAct& a, int ch,
                                                 float (&c)[4 * NT]) {
    constexpr bool AHEAD = NT <= MMV_X_AHEAD && FMT != FMT_Q6_K;
    const int nb = a.K / QK_K, g = (threadIdx.x % WARP) >> 2;
    const int b0 = ch * KQ_CHUNK, b1 = min(b0 + KQ_CHUNK, nb);
    const MmkCols<NT> cols(a.ncols);
    float lo[NT][4] = {}, hi[NT][4] = {};
    MmkX45<NT> xa(a, cols, b0); // (the compiler drops its loads where AHEAD is false)
#pragma unroll 1
    for (int b = b0; b < b1; ++b) {
        float v[NT][4];
        if (FMT == FMT_Q6_K) {
            const MmkX6<NT> x(a, cols, b);
            const uint8_t* s = st.next(copy, nb);
            const W6<true> wt(s + g * MMV_Q6_ROW, s + (g + 8) * MMV_Q6_ROW, (const int8_t*)(s + MMV_Q6_SC) + 16 * g,
                              (const int8_t*)(s + MMV_Q6_SC) + 16 * (g + 8), (const __half*)(s + MMV_Q6_D) + g,
                              (const __half*)(s + MMV_Q6_D) + g + 8);
            if constexpr (NT > 1) st.release();
            mmk_q6_block<NT>(wt, x, v);
            if constexpr (NT == 1) st.release();
        } else {
            constexpr bool Q5 = FMT == FMT_Q5_K;
            constexpr int BS = Q5 ? 176 : 144;
            const MmkX45<NT> x(a, cols, AHEAD ? min(b + 1, b1 - 1) : b);
            const uint8_t* s = st.next(copy, nb);
            const W45<Q5, true> wt(s + g * BS, s + (g + 8) * BS);
            if constexpr (NT > 1) st.release();
            mmk_q45_block<NT, Q5>(wt, AHEAD ? xa : x, v);
            if constexpr (AHEAD) xa = x;
            if constexpr (NT == 1) st.release();
        }
        kq_leaves<NT>(b - b0, v, lo, hi);
    }
    mmv_tree<NT>(b1 - b0, lo, hi, c);
}

// mmv_chunk_pair from the warp's stage (gate's 16 rows, then up's).
template <int NT, class COPY>
__device__ __forceinline__ void mmv_chunk_pair_staged(MmvStage& st, COPY copy, const KAct& a, int ch,
                                                      float (&c)[2][4 * NT]) {
    constexpr bool AHEAD = NT <= MMV_X_AHEAD;
    const int nb = a.K / QK_K, g = (threadIdx.x % WARP) >> 2;
    const int b0 = ch * KQ_CHUNK, b1 = min(b0 + KQ_CHUNK, nb);
    const MmkCols<NT> cols(a.ncols);
    float lg[NT][4] = {}, hg[NT][4] = {}, lu[NT][4] = {}, hu[NT][4] = {};
    MmkX45<NT> xa(a, cols, b0); // as in mmv_chunk_staged
#pragma unroll 1
    for (int b = b0; b < b1; ++b) {
        float vg[NT][4], vu[NT][4];
        {
            const MmkX45<NT> x(a, cols, AHEAD ? min(b + 1, b1 - 1) : b);
            const uint8_t* s = st.next(copy, nb);
            const W45<false, true> gt(s + g * 144, s + (g + 8) * 144);
            const W45<false, true> ut(s + 16 * 144 + g * 144, s + 16 * 144 + (g + 8) * 144);
            mmk_q45_block<NT, false>(gt, AHEAD ? xa : x, vg);
            mmk_q45_block<NT, false>(ut, AHEAD ? xa : x, vu);
            if constexpr (AHEAD) xa = x;
            st.release();
        }
        kq_leaves<NT>(b - b0, vg, lg, hg);
        kq_leaves<NT>(b - b0, vu, lu, hu);
    }
    mmv_tree<NT>(b1 - b0, lg, hg, c[0]);
    mmv_tree<NT>(b1 - b0, lu, hu, c[1]);
}

// The lane's 4 NT outputs v (rows row0 + g, + 8; columns 8nt + 2t, + 1) into y[c][r].
template <int NT>
__device__ __forceinline__ void mmv_store(float* y, int rows, int row0, int ncols, const float (&v)[4 * NT]) {
    const int lane = threadIdx.x % WARP, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = row0 + g + (e < 2 ? 0 : 8), c = 8 * nt + 2 * t + (e & 1);
            if (r < rows && c < ncols) y[(size_t)c * rows + r] = v[4 * nt + e];
        }
}

// The rounds of one warp over tasks [t0, t1) (task = row block x nch + chunk): body(rb, ch, c)
// makes chunk ch's values c[M][4 NT] of row block rb, store(rb, y) writes a row block's sums.
template <int M, int NT, class BODY, class STORE>
__device__ __forceinline__ void mmv_warp(int t0, int t1, int nch, BODY body, STORE store, float* __restrict__ cv,
                                         unsigned* __restrict__ cnt) {
    constexpr int V = 4 * NT, S = 128 * M * NT; // outputs per lane; cv floats per chunk
    const int lane = threadIdx.x % WARP;
    float y[M][V];
    int rb = t0 / nch, ch = t0 - rb * nch;
#pragma unroll 1
    for (int t = t0; t < t1; ++t) {
        float c[M][V];
        body(rb, ch, c);
        const int first = rb * nch;
        if (first >= t0 && first + nch <= t1) {
#pragma unroll
            for (int m = 0; m < M; ++m)
#pragma unroll
                for (int e = 0; e < V; ++e) y[m][e] = kq_add(ch == 0 ? 0.0f : y[m][e], c[m][e]);
            if (ch == nch - 1) store(rb, y);
        } else {
            float* cr = cv + ((size_t)rb * nch + ch) * S + 4 * lane;
#pragma unroll
            for (int m = 0; m < M; ++m)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    *(float4*)(cr + 128 * (NT * m + nt)) =
                        make_float4(c[m][4 * nt], c[m][4 * nt + 1], c[m][4 * nt + 2], c[m][4 * nt + 3]);
            if (ch == nch - 1 || t == t1 - 1) { // the end of this warp's part of the row block
                const int n = min(first + nch, t1) - max(first, t0);
                // The lanes' chunk values ordered before lane 0's count (release, cumulative over
                // the warp barrier); the completing warp's reads after it (acquire).
                __syncwarp();
                int last = 0;
                if (lane == 0) {
                    last = atom_add_release(&cnt[rb], (unsigned)n) == (unsigned)(nch - n);
                    if (last) fence_acquire();
                }
                last = __shfl_sync(0xffffffffu, last, 0);
                if (last) {
                    __syncwarp();
                    const float* cb = cv + (size_t)rb * nch * S + 4 * lane;
                    float s[M][V] = {};
                    // The chunks in order, their loads 4 at a time (one L2 round trip per 4).
#pragma unroll 1
                    for (int k0 = 0; k0 < nch; k0 += 4) {
                        float4 v[4][M * NT];
#pragma unroll
                        for (int i = 0; i < 4; ++i)
#pragma unroll
                            for (int u = 0; u < M * NT; ++u)
                                v[i][u] = k0 + i < nch ? __ldcg((const float4*)(cb + (size_t)(k0 + i) * S + 128 * u))
                                                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                        for (int i = 0; i < 4; ++i)
                            if (k0 + i < nch)
#pragma unroll
                                for (int u = 0; u < M * NT; ++u) {
                                    const float f[4] = {v[i][u].x, v[i][u].y, v[i][u].z, v[i][u].w};
                                    const int m = u / NT, o = 4 * (u % NT);
#pragma unroll
                                    for (int e = 0; e < 4; ++e)
                                        s[m][o + e] = kq_add(k0 + i == 0 ? 0.0f : s[m][o + e], f[e]);
                                }
                    }
                    store(rb, s);
                    if (lane == 0) cnt[rb] = 0u; // zero again for the next launch
                }
            }
        }
        if (++ch == nch) {
            ch = 0;
            ++rb;
        }
    }
}

// The warp's range of the gate+up tasks (mvk_range over 16-row blocks), its first task's weights
// asked of L2, then the wait for the kernel before.
__device__ __forceinline__ int2 pdl_wait_prefetch_mmv_silu(const uint8_t* wg, int tyg, const uint8_t* wu, int tyu,
                                                           int rows, int K) {
    const int nch = kq_chunks(K);
    int t0, t1;
    mvk_range((unsigned)((rows + MMK_ROWS - 1) / MMK_ROWS) * nch, &t0, &t1);
    if (t0 < t1) {
        const int rb = t0 / nch;
        mmk_prefetch_chunk(wg, tyg, MMK_ROWS * rb, rows, K, t0 - rb * nch);
        mmk_prefetch_chunk(wu, tyu, MMK_ROWS * rb, rows, K, t0 - rb * nch);
    }
    pdl_wait();
    return make_int2(t0, t1);
}

// A row block's gate+up sums v[0] (gate), v[1] (up) of the lane's outputs into y[c][r] as
// silu(G[r] . x[c]) * (U[r] . x[c]), mmk_silu_kernel's float expression.
template <int NT>
__device__ __forceinline__ void mmv_silu_store(float* y, int rows, int row0, int ncols, const float (&v)[2][4 * NT]) {
    float o[4 * NT];
#pragma unroll
    for (int e = 0; e < 4 * NT; ++e) o[e] = v[0][e] / (1.0f + expf(-v[0][e])) * v[1][e];
    mmv_store<NT>(y, rows, row0, ncols, o);
}

// Gate+up pairs that are not both Q4_K (unstaged): gate's chunk, then up's, weights read from
// global memory.
template <int NT>
__device__ __forceinline__ void mmv_silu_any(const uint8_t* wg, int tyg, const uint8_t* wu, int tyu, float* y,
                                             int rows, const KAct& a, int2 range, float* cv, unsigned* cnt) {
    mmv_warp<2, NT>(range.x, range.y, kq_chunks(a.K), [&](int rb, int ch, float(&c)[2][4 * NT]) {
        mmv_chunk_any<NT>(tyg, wg, MMK_ROWS * rb, rows, a, ch, c[0]);
        mmv_chunk_any<NT>(tyu, wu, MMK_ROWS * rb, rows, a, ch, c[1]);
    }, [&](int rb, const float(&v)[2][4 * NT]) { mmv_silu_store<NT>(y, rows, MMK_ROWS * rb, a.ncols, v); }, cv, cnt);
}

// A warp's staged rounds over a format-FMT job (rows from global row st0): its first copies,
// the wait for the kernel before, then its tasks.
template <int FMT, int NT, class STORE>
__device__ __forceinline__ void mmv_staged_rounds(MmvStage& st, const uint8_t* __restrict__ w, int st0, int rows,
                                                  const KAct& a, const MvkSpan& sp, STORE store, float* cv,
                                                  unsigned* cnt) {
    const int nch = kq_chunks(a.K), nb = a.K / QK_K;
    const auto copy = [&](uint8_t* d, int rb, int b) { mmv_copy<FMT>(d, w, MMK_ROWS * rb - st0, rows, nb, b); };
    st.prologue(copy, nb);
    pdl_wait();
    mmv_warp<1, NT>(sp.t0, sp.t1, nch, [&](int rb, int ch, float(&c)[1][4 * NT]) {
        mmv_chunk_staged<FMT, NT>(st, copy, a, ch, c[0]);
    }, store, cv, cnt);
}

// The staged kernels' entry (stages 2 to 4): the warp's span, its
// first super-blocks' copies, the wait for the kernel before, then its rounds. Dynamic shared
// memory: 4 warps x stages x MMV_SLOT_ONE bytes.
template <int NT>
__device__ __forceinline__ void pdl_wait_staged_mmv(const MatvecJobs& jobs, const KAct& a, float* cv, unsigned* cnt,
                                                    int stages) {
    const int nch = kq_chunks(a.K), nb = a.K / QK_K;
    const MvkSpan sp = mvk_span(jobs, nch, MMK_ROWS);
    const uint8_t* w = jobs.w_of(sp.j);
    float* yj = jobs.y_of(sp.j);
    const int ty = jobs.ty_of(sp.j), rows = jobs.rows_of(sp.j), st0 = jobs.start_of(sp.j);
    MmvStage st(MMV_SLOT_ONE, stages, nb, nch, sp.t0, sp.t1);
    const auto store = [&](int rb, const float(&v)[1][4 * NT]) {
        mmv_store<NT>(yj, rows, MMK_ROWS * rb - st0, a.ncols, v[0]);
    };
    if (ty == FMT_Q6_K) mmv_staged_rounds<FMT_Q6_K, NT>(st, w, st0, rows, a, sp, store, cv, cnt);
    else if (ty == FMT_Q5_K) mmv_staged_rounds<FMT_Q5_K, NT>(st, w, st0, rows, a, sp, store, cv, cnt);
    else mmv_staged_rounds<FMT_Q4_K, NT>(st, w, st0, rows, a, sp, store, cv, cnt);
}

// As pdl_wait_staged_mmv for gate+up; staged when both are Q4_K (4 warps x stages x
// MMV_SLOT_PAIR bytes), otherwise mmv_silu_any.
template <int NT>
__device__ __forceinline__ void pdl_wait_staged_mmv_silu(const uint8_t* wg, int tyg, const uint8_t* wu, int tyu,
                                                         float* y, int rows, const KAct& a, float* cv, unsigned* cnt,
                                                         int stages) {
    if (!MMK_PAIR || tyg != FMT_Q4_K || tyu != FMT_Q4_K) {
        const int2 range = pdl_wait_prefetch_mmv_silu(wg, tyg, wu, tyu, rows, a.K);
        mmv_silu_any<NT>(wg, tyg, wu, tyu, y, rows, a, range, cv, cnt);
        return;
    }
    const int nch = kq_chunks(a.K), nb = a.K / QK_K;
    int t0, t1;
    mvk_range((unsigned)((rows + MMK_ROWS - 1) / MMK_ROWS) * nch, &t0, &t1);
    MmvStage st(MMV_SLOT_PAIR, stages, nb, nch, t0, t1);
    const auto copy = [&](uint8_t* d, int rb, int b) {
        mmv_copy<FMT_Q4_K>(d, wg, MMK_ROWS * rb, rows, nb, b);
        mmv_copy<FMT_Q4_K>(d + 16 * 144, wu, MMK_ROWS * rb, rows, nb, b);
    };
    st.prologue(copy, nb);
    pdl_wait();
    mmv_warp<2, NT>(t0, t1, nch, [&](int rb, int ch, float(&c)[2][4 * NT]) {
        mmv_chunk_pair_staged<NT>(st, copy, a, ch, c);
    }, [&](int rb, const float(&v)[2][4 * NT]) { mmv_silu_store<NT>(y, rows, MMK_ROWS * rb, a.ncols, v); }, cv, cnt);
}

// The grid must have at least njobs warps (matvec.rs: mmv_blocks). mmv_1: up to 8 columns,
// mmv_2: up to 16.
extern "C" __global__ void __launch_bounds__(128, 4) mmv_1(MatvecJobs jobs, KACT_ARGS, float* __restrict__ cv,
                                                          unsigned* __restrict__ cnt, int stages) {
    pdl_wait_staged_mmv<1>(jobs, KACT, cv, cnt, stages);
}
extern "C" __global__ void __launch_bounds__(128, 3) mmv_2(MatvecJobs jobs, KACT_ARGS, float* __restrict__ cv,
                                                          unsigned* __restrict__ cnt, int stages) {
    pdl_wait_staged_mmv<2>(jobs, KACT, cv, cnt, stages);
}
extern "C" __global__ void __launch_bounds__(128, 4) mmv_silu_1(MMK_SILU_ARGS, KACT_ARGS, float* __restrict__ cv,
                                                               unsigned* __restrict__ cnt, int stages) {
    pdl_wait_staged_mmv_silu<1>(wg, tyg, wu, tyu, y, rows, KACT, cv, cnt, stages);
}
extern "C" __global__ void __launch_bounds__(128, 3) mmv_silu_2(MMK_SILU_ARGS, KACT_ARGS, float* __restrict__ cv,
                                                               unsigned* __restrict__ cnt, int stages) {
    pdl_wait_staged_mmv_silu<2>(wg, tyg, wu, tyu, y, rows, KACT, cv, cnt, stages);
}
