// v7 (2026-11-29, not adopted): the one-column kernels streaming the weights through shared
// memory with cp.async (see README.md beside this file for the measurements). Included by
// lab.cu after matvec.cu; needs the rpu/ustart fields of MatvecJobs (added in lab.cu's copy).
// One column (v7): the weights stream through shared memory. Each warp takes a run of `per_warp`
// consecutive units (a unit: rpu rows of one matrix; the launch sizes the grid so every warp
// resident at once has work, and no warp has more than one unit more than another) and walks
// its units' steps in order: step t of a unit is round t of v6's row-aligned order (lane l takes
// item 32t + l of each of the unit's rows). The warp copies the bytes of a step's items (a
// contiguous piece of each row: 8 Q4_K or Q5_K blocks, 16 Q6_K blocks with their scales and d)
// into a stage of its shared memory with cp.async, 16 bytes per lane and copy, coalesced,
// STREAM_S - 1 steps ahead of the step it computes, so the next steps' weights are in flight
// while the current one is computed (v6 had none in flight during its arithmetic, and
// short-lived warps). The arithmetic is v6's, item by item (the same functions on the same
// bytes, each row's per-lane sum in increasing item order, the same warp sum), so the bits
// equal v6's and the decode-group kernel's (batch invariance).
// A stage holds STREAM_U4 16-byte pieces per warp; a row's step takes stream_slot pieces (Q4_K
// 72, Q5_K 88, Q6_K 211: 192 of quants, 16 of scales, 3 holding its d values), so a unit has as
// many rows as one stage holds (stream_rows, at most 4). Float and Q8_0 rows (no matrix of the
// Glimmer models) load their items directly at compute time, 4 rows per unit.
#ifndef STREAM_S
#define STREAM_S 3
#define STREAM_U4 216
#define STREAM_WPB 4
#endif

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// 16-byte pieces of one row's step (0: loaded at compute time).
__host__ __device__ constexpr int stream_slot(int ty) {
    return ty == FMT_Q4_K ? 72 : ty == FMT_Q5_K ? 88 : ty == FMT_Q6_K ? 211 : 0;
}
// Rows per unit of format ty when a stage holds u4 pieces (matvec.rs mirrors this).
__host__ __device__ constexpr int stream_rows(int ty, int u4) {
    return stream_slot(ty) == 0 ? 4 : (u4 / stream_slot(ty) < 4 ? u4 / stream_slot(ty) : 4);
}

// Where a warp is in its run of units: unit u, step t of T; the unit's matrix, rows and format.
struct Cursor {
    int u, t, T, n; // unit, step, steps of the unit, items per row
    int j, ty, rows, row0, nr;
    const uint8_t* w;
};

// The units of a launch: the jobs' units in order (matvec), or (silu) gate unit g at 2g and the
// up unit of the same rows at 2g + 1.
struct UnitMap {
    const uint8_t* w[4];
    int rows[4], ty[4], rpu[4], ustart[5];
    int njobs, silu;
};

__device__ __forceinline__ void cursor_at(Cursor& c, const UnitMap& m, int u, int K) {
    c.u = u;
    c.t = 0;
    int j = 0, g;
    if (m.silu) {
        j = u & 1;
        g = u >> 1;
    } else {
#pragma unroll
        for (int t = 1; t < 4; ++t)
            if (t < m.njobs && u >= m.ustart[t]) j = t;
        g = u - m.ustart[j];
    }
    c.j = j;
    c.ty = m.ty[j];
    c.rows = m.rows[j];
    c.w = m.w[j];
    c.row0 = g * m.rpu[j];
    c.nr = min(m.rpu[j], c.rows - c.row0);
    c.n = items_per_row(c.ty, K);
    c.T = (c.n + WARP - 1) / WARP;
}

__device__ __forceinline__ void cursor_next(Cursor& c, const UnitMap& m, int K) {
    if (++c.t == c.T) cursor_at(c, m, c.u + 1, K);
}

// n16 16-byte pieces from src to dst, lane l taking pieces l, l + 32, ..
__device__ __forceinline__ void copy_pieces(uint4* dst, const uint8_t* src, int n16) {
    for (int p = threadIdx.x % WARP; p < n16; p += WARP) cp_async16(dst + p, src + 16 * (size_t)p);
}

// Copies the warp's bytes of step c (nothing past the run's end) into the stage; one commit group
// per step, empty or not. Q6_K's d values are copied from the 16-byte piece holding the first
// (the repacked matrix has 16 bytes of padding after its last d, so the pieces stay inside it).
template <int U4>
__device__ __forceinline__ void stream_issue(const Cursor& c, int u_end, uint4* stage, int K) {
    if (c.u < u_end) {
        const int nb = K / QK_K;
        if (c.ty == FMT_Q4_K || c.ty == FMT_Q5_K) {
            const int bs = c.ty == FMT_Q4_K ? 144 : 176, b0 = 8 * c.t, nblk = min(8, nb - b0);
#pragma unroll
            for (int r = 0; r < 4; ++r)
                if (r < c.nr && r < stream_rows(c.ty, U4))
                    copy_pieces(stage + r * stream_slot(c.ty), c.w + ((size_t)(c.row0 + r) * nb + b0) * bs,
                                nblk * bs / 16);
        } else if (c.ty == FMT_Q6_K) {
            const int b0 = 16 * c.t, nblk = min(16, nb - b0);
#pragma unroll
            for (int r = 0; r < stream_rows(FMT_Q6_K, U4); ++r)
                if (r < c.nr) {
                    const size_t e0 = (size_t)(c.row0 + r) * nb + b0; // first block, plane-wide
                    uint4* slot = stage + r * 211;
                    copy_pieces(slot, c.w + e0 * 192, nblk * 12);
                    copy_pieces(slot + 192, c.w + (size_t)c.rows * nb * 192 + e0 * 16, nblk);
                    const size_t d0 = (size_t)c.rows * nb * 208 + e0 * 2;
                    copy_pieces(slot + 208, c.w + (d0 & ~(size_t)15), (int)(((d0 & 15) + 2 * nblk + 15) / 16));
                }
        }
    }
    cp_async_commit();
}

// acc[r] += this lane's item of step c of row r, from the stage (K-quants) or memory.
template <int U4>
__device__ __forceinline__ void stream_compute(const Cursor& c, const uint4* stage, const Act& a, float (&acc)[4]) {
    const int lane = threadIdx.x % WARP, it = c.t * WARP + lane;
    if (it >= c.n) return;
    if (c.ty == FMT_Q4_K || c.ty == FMT_Q5_K) {
        const X64 x = load_x64<1>(a, 0, (it >> 2) * QK_K + 64 * (it & 3));
        const int g = lane & 3;
        if (c.ty == FMT_Q4_K) {
#pragma unroll
            for (int r = 0; r < stream_rows(FMT_Q4_K, U4); ++r)
                if (r < c.nr) {
                    const uint4* blk = stage + r * 72 + (lane >> 2) * 9;
                    RawQ45 raw;
                    raw.hdr = blk[0];
                    raw.qa = blk[1 + 2 * g];
                    raw.qb = blk[2 + 2 * g];
                    float v = 0.0f;
                    v += q45_dot(unpack_q45<false>(raw, it), x);
                    acc[r] += v;
                }
        } else {
#pragma unroll
            for (int r = 0; r < stream_rows(FMT_Q5_K, U4); ++r)
                if (r < c.nr) {
                    const uint4* blk = stage + r * 88 + (lane >> 2) * 11;
                    RawQ45 raw;
                    raw.hdr = blk[0];
                    raw.ha = blk[1];
                    raw.hb = blk[2];
                    raw.qa = blk[3 + 2 * g];
                    raw.qb = blk[4 + 2 * g];
                    float v = 0.0f;
                    v += q45_dot(unpack_q45<true>(raw, it), x);
                    acc[r] += v;
                }
        }
    } else if (c.ty == FMT_Q6_K) {
        const int nb = a.K / QK_K, lb = lane >> 1, half = lane & 1;
#pragma unroll
        for (int r = 0; r < stream_rows(FMT_Q6_K, U4); ++r)
            if (r < c.nr) {
                const uint4* slot = stage + r * 211;
                const uint4* q = slot + lb * 12;
                RawQ6 raw;
                raw.l0 = q[4 * half];
                raw.l1 = q[4 * half + 1];
                raw.l2 = q[4 * half + 2];
                raw.l3 = q[4 * half + 3];
                raw.h0 = q[8 + 2 * half];
                raw.h1 = q[9 + 2 * half];
                raw.sc = ((const uint2*)(slot + 192))[2 * lb + half];
                const int dsh = (int)(((size_t)(c.row0 + r) * nb + 16 * c.t) & 7); // d0 & 15, in halves
                raw.d = __half2float(((const __half*)(slot + 208))[dsh + lb]);
                float v[1] = {0.0f};
                dot_q6<1>(raw, it, a, v);
                acc[r] += v[0];
            }
    } else {
#pragma unroll
        for (int r = 0; r < 4; ++r)
            if (r < c.nr) {
                float v[1] = {0.0f};
                switch (c.ty) {
                case FMT_Q8_0: item_fmt<1, FMT_Q8_0>(c.w, c.row0 + r, c.rows, it, a, v); break;
                case FMT_F16: item_fmt<1, FMT_F16>(c.w, c.row0 + r, c.rows, it, a, v); break;
                case FMT_BF16: item_fmt<1, FMT_BF16>(c.w, c.row0 + r, c.rows, it, a, v); break;
                default: item_fmt<1, FMT_F32>(c.w, c.row0 + r, c.rows, it, a, v); break;
                }
                acc[r] += v[0];
            }
    }
}

// One warp's run of units u0 .. u1 - 1. y[j]: job j's output (matvec); silu: y[0] gets
// silu(gate) * up, the gate unit's sums held until its up unit ends.
template <int S, int U4>
__device__ __forceinline__ void stream_warp(const UnitMap& m, float* const (&y)[4], int u0, int u1, const Act& a,
                                            uint4 (*sm)[U4]) {
    if (u0 >= u1) return;
    const int K = a.K, lane = threadIdx.x % WARP;
    Cursor ci, cc;
    cursor_at(ci, m, u0, K);
    cursor_at(cc, m, u0, K);
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        stream_issue<U4>(ci, u1, sm[s], K);
        cursor_next(ci, m, K);
    }
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, gate[4];
    int stage = 0;
#pragma unroll 1
    while (cc.u < u1) {
        cp_async_wait<S - 2>();
        __syncwarp(); // every lane's copies of this step landed; every lane done with the last
        stream_issue<U4>(ci, u1, sm[(stage + S - 1) % S], K);
        cursor_next(ci, m, K);
        stream_compute<U4>(cc, sm[stage], a, acc);
        if (cc.t == cc.T - 1) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const float v = warp_sum(acc[r]);
                acc[r] = 0.0f;
                if (!m.silu) {
                    if (r < cc.nr && lane == 0) y[cc.j][cc.row0 + r] = v;
                } else if (cc.j == 0) {
                    gate[r] = v;
                } else {
                    const float g = gate[r];
                    if (r < cc.nr && lane == 0) y[0][cc.row0 + r] = g / (1.0f + expf(-g)) * v;
                }
            }
        }
        cursor_next(cc, m, K);
        stage = stage + 1 == S ? 0 : stage + 1;
    }
    cp_async_wait<0>();
}

template <int S, int U4, int WPB>
__device__ __forceinline__ void stream_matvec(const MatvecJobs& jobs, const Act& a, int per_warp) {
    __shared__ uint4 sm[WPB][S][U4];
    const int warp = threadIdx.x / WARP;
    UnitMap m;
    float* y[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        m.w[j] = jobs.w[j];
        m.rows[j] = jobs.rows[j];
        m.ty[j] = jobs.ty[j];
        m.rpu[j] = jobs.rpu[j];
        m.ustart[j] = jobs.ustart[j];
        y[j] = jobs.y[j];
    }
    m.ustart[4] = jobs.ustart[4];
    m.njobs = jobs.njobs;
    m.silu = 0;
    const int u0 = (blockIdx.x * WPB + warp) * per_warp;
    stream_warp<S, U4>(m, y, u0, min(u0 + per_warp, jobs.ustart[jobs.njobs]), a, sm[warp]);
}

// Gate unit g and up unit g (rows g * rpu ..) are units 2g and 2g + 1; per_warp is even.
template <int S, int U4, int WPB>
__device__ __forceinline__ void stream_silu(const uint8_t* wg, int tyg, const uint8_t* wu, int tyu, float* y, int rows,
                                            int rpu, const Act& a, int per_warp) {
    __shared__ uint4 sm[WPB][S][U4];
    const int warp = threadIdx.x / WARP;
    UnitMap m;
    m.w[0] = wg;
    m.w[1] = wu;
    m.ty[0] = tyg;
    m.ty[1] = tyu;
    m.rows[0] = m.rows[1] = rows;
    m.rpu[0] = m.rpu[1] = rpu;
    m.njobs = 2;
    m.silu = 1;
    float* const ys[4] = {y, y, y, y};
    const int u0 = (blockIdx.x * WPB + warp) * per_warp;
    stream_warp<S, U4>(m, ys, u0, min(u0 + per_warp, 2 * ((rows + rpu - 1) / rpu)), a, sm[warp]);
}

extern "C" __global__ void __launch_bounds__(STREAM_WPB * WARP) matvec_1(MatvecJobs jobs, ACT_ARGS, int per_warp) {
    stream_matvec<STREAM_S, STREAM_U4, STREAM_WPB>(jobs, ACT, per_warp);
}
extern "C" __global__ void __launch_bounds__(STREAM_WPB * WARP) matvec_silu_1(SILU_ARGS, int rpu, ACT_ARGS, int per_warp) {
    stream_silu<STREAM_S, STREAM_U4, STREAM_WPB>(wg, tyg, wu, tyu, y, rows, rpu, ACT, per_warp);
}
