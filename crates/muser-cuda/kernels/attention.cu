// The f16 KV cache and attention over it (SPEC section 3: KV store, attention over the sliding
// ring and the full plane, split over the sequence for long contexts).
//
// Cache layout per layer: K and V are [slots][n_kv * D] f16. A sliding layer keeps a ring
// (position p in slot p % slots), a full layer a plane (slot = p).
//
// attn_rows_{D}: grid (n_kv * chunks, n_rows, splits), 128 threads. Row t is at position
// pos[t] of its own cache tab[t] (per row: K and V addresses and the slot count of this layer):
// the rows of a decode group, each the next token of its own sequence, or the rows of a prefill
// chunk, all on one cache. A block takes one KV head, one row and one split of the positions that
// row sees; it serves G of the n_head / n_kv query heads that share the KV head (fewer per block
// when more blocks are needed to fill the GPU), so each K/V row is read once per chunk of heads.
// Positions go in tiles of 32 through shared memory (K, V converted to f32, K rows padded so the
// 32 lanes of a score read different banks); softmax is online (running max and sum per head).
// The block writes its unnormalised output, max and sum; attn_rows_combine (grid (n_head,
// n_rows)) merges the row's splits. Each row is split by its own position only (`solo_split`,
// with the launch's `solo` and `min_tiles`: a decode row as it would be alone, a prefill row in
// splits of at least 512 positions, at most 8), and
// the grid's extra splits of shorter rows do nothing, so a row's output depends on neither the
// group nor the chunk it came in. Head dims: 64, 128, 256 (template), G * D <= 4096.
// (Until 2026-12-07 a prefill chunk took attn_partial, whose plan was the chunk's.)
// Measured on the H200 (2026-11-29), Muse Glimmer, 52 layers, each call synchronized (~8 us of
// that is the synchronization): decode at depth ~150 1.49 ms per token (split plan v1, 128
// positions per split and no head chunks: 3.2 ms); decode at depth 8192 costs per token
// 3.0 ms more than at depth 0 (tg 71.0 vs 90.4 tokens/s), for 0.27 GB of K/V: attention is far from
// bandwidth-bound there (next: QK and PV on the tensor cores, mma over the 16 heads of a group);
// prefill of a 512-token chunk 29 ms.

#define ATT_T 32

extern "C" __global__ void kv_store(const float* __restrict__ k, const float* __restrict__ v, __half* __restrict__ kc,
                                    __half* __restrict__ vc, int n, int width, int pos0, int slots, int ring) { pdl_wait();
    const long long idx = (long long)blockIdx.x * 256 + threadIdx.x;
    if (idx >= (long long)n * width) return;
    const int t = idx / width, e = idx % width;
    const int p = pos0 + t;
    const long long s = ring ? p % slots : p;
    kc[s * width + e] = __float2half_rn(k[idx]);
    vc[s * width + e] = __float2half_rn(v[idx]);
}

// Per row t (decode groups): K, V addresses and slots of one layer's cache.
struct RowKv {
    unsigned long long k, v, slots;
};

extern "C" __global__ void kv_store_rows(const float* __restrict__ k, const float* __restrict__ v,
                                         const RowKv* __restrict__ tab, const int* __restrict__ pos, int n, int width,
                                         int ring) { pdl_wait();
    const long long idx = (long long)blockIdx.x * 256 + threadIdx.x;
    if (idx >= (long long)n * width) return;
    const int t = idx / width, e = idx % width;
    const int p = pos[t], slots = (int)tab[t].slots;
    const long long s = ring ? p % slots : p;
    ((__half*)tab[t].k)[s * width + e] = __float2half_rn(k[idx]);
    ((__half*)tab[t].v)[s * width + e] = __float2half_rn(v[idx]);
}

// The attention prologue of a decode group (Backend::qkv_rows): per row t, every head of q and
// k normed in place (qw, kw non-null: rmsnorm_heads's arithmetic) and rotated (n_rot > 0: rope's
// arithmetic at pos[t]), then the row's k and v stored at pos[t] of its cache tab[t]
// (kv_store_rows's conversion). One warp per head, q heads then k heads of each row (a k head's
// warp also stores the v head); 4 warps per block. Replaces five launches per layer. What depends
// only on the weights and the positions (uploaded before the step) comes before pdl_wait: the
// norm weights and the rotation's cosines and sines (double-precision pow and sincos, most of
// the kernel's time), for heads up to 256 wide. H200, llama-glimmer, 2026-11-30 (with
// residual_norm's weights loaded before its wait too; same bits, 676/676 checks): tg128 151.10 /
// 151.15 tokens/s, against 148.14 / 148.15 with both kernels kept out of PDL (full dependencies)
// and 143.06 / 143.78 (another call) before the pre-wait loads. Tried and dropped:
// attn_rows_mma_128 asking L2 for its split's K/V rows before the wait (tg64 at depth 8192
// 113.02 / 112.99 against 113.59 / 113.53).
#define QKV_PW 8 // norm weights per lane held from before the wait: head_dim <= 256
#define QKV_PR 4 // rotated pairs per lane: n_rot <= 256
// The warp's head (row t, head h of the row's q heads then k heads; live: the warp has one) and,
// when held, the lane's norm weights, position and rotation factors, then pdl_wait.
struct QkvPre {
    float wv[QKV_PW], cs[QKV_PR], sn[QKV_PR];
    int t, h, p;
    bool live, held;
};
__device__ __forceinline__ QkvPre pdl_wait_qkv(const float* __restrict__ qw, const float* __restrict__ kw,
                                               int head_dim, int n_rot, float freq_base, const int* __restrict__ pos,
                                               int n_rows, int n_head, int n_kv) {
    const int wid = blockIdx.x * 4 + threadIdx.x / WARP, lane = threadIdx.x % WARP, per = n_head + n_kv;
    QkvPre r;
    r.live = wid < n_rows * per;
    r.t = r.live ? wid / per : 0;
    r.h = wid % per;
    r.held = head_dim <= QKV_PW * WARP && n_rot <= 2 * QKV_PR * WARP;
    r.p = 0;
#pragma unroll
    for (int u = 0; u < QKV_PR; ++u) r.cs[u] = r.sn[u] = 0.0f; // shuffled by qkv_rows_regs
    const float* w = r.h >= n_head ? kw : qw;
    if (r.live && r.held) {
        r.p = pos[r.t];
#pragma unroll
        for (int u = 0; u < QKV_PW; ++u) {
            const int i = lane + u * WARP;
            r.wv[u] = w && i < head_dim ? w[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < QKV_PR; ++u) {
            const int i = lane + u * WARP;
            if (i < n_rot / 2) rope_cs(i, n_rot, r.p, freq_base, &r.cs[u], &r.sn[u]);
        }
    }
    pdl_wait();
    return r;
}

// qkv_rows' register path (`regs`, unless MUSER_CUDA_QKV_REGS=0): the warp's head (and a k head's
// v) loaded once, lane l holding values l + 32 u (u < QKV_PW) as the memory path's loops take
// them, then the QK norm (the same sums in the same order), the rotation and the stores from
// registers: one round trip to L2 where the memory path makes three (norm, rotation, KV store:
// each reads what the step before wrote). The rotation pairs must lie in a lane or a lane pair:
// GPT-J pairs (2i, 2i + 1) are lanes l, l ^ 1 of one slot (their factors come from the lane
// that computed them before the wait, by shuffle); NeoX pairs (i, i + n_rot / 2) are slots u and
// u + n_rot / 64 of one lane when n_rot is a multiple of 64. Each pair is rotated by rope_vals,
// as rope_rot rotates it in memory: the same bits (muser check compares both paths bit for bit).
__device__ __forceinline__ bool qkv_regs_fit(int n_rot, int neox) {
    return n_rot == 0 || !neox || n_rot % 64 == 0; // held: n_rot <= 256
}

// The NeoX pairs of slots u and u + H (u < H) in one lane; cs, sn: the lane's factors of pairs
// lane + 32 u.
template <int H>
__device__ __forceinline__ void qkv_rot_neox(float (&x)[QKV_PW], const float (&cs)[QKV_PR], const float (&sn)[QKV_PR]) {
#pragma unroll
    for (int u = 0; u < H; ++u) {
        rope_vals(x[u], x[u + H], cs[u], sn[u], &x[u], &x[u + H]);
    }
}

__device__ __forceinline__ void qkv_rows_regs(const QkvPre& pre, float* __restrict__ q, float* __restrict__ k,
                                              const float* __restrict__ v, const float* __restrict__ qw,
                                              const float* __restrict__ kw, float eps, int n_head, int n_kv,
                                              int head_dim, int n_rot, int neox, const RowKv* __restrict__ tab,
                                              int ring) {
    const int lane = threadIdx.x % WARP, t = pre.t, h = pre.h, hk = h - n_head;
    const bool is_k = h >= n_head;
    const float* w = is_k ? kw : qw;
    float* x = is_k ? k + ((size_t)t * n_kv + hk) * head_dim : q + ((size_t)t * n_head + h) * head_dim;
    const float* vx = is_k ? v + ((size_t)t * n_kv + hk) * head_dim : v;
    float xr[QKV_PW], vr[QKV_PW];
#pragma unroll
    for (int u = 0; u < QKV_PW; ++u) {
        const int i = lane + u * WARP;
        xr[u] = i < head_dim ? x[i] : 0.0f;
        vr[u] = is_k && i < head_dim ? vx[i] : 0.0f;
    }
    if (w) {
        float ss = 0.0f;
#pragma unroll
        for (int u = 0; u < QKV_PW; ++u)
            if (lane + u * WARP < head_dim) ss += xr[u] * xr[u];
        const float inv = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
#pragma unroll
        for (int u = 0; u < QKV_PW; ++u)
            if (lane + u * WARP < head_dim) xr[u] = xr[u] * inv * pre.wv[u];
    }
    if (n_rot > 0) {
        if (neox) {
            switch (n_rot / 64) {
            case 1: qkv_rot_neox<1>(xr, pre.cs, pre.sn); break;
            case 2: qkv_rot_neox<2>(xr, pre.cs, pre.sn); break;
            case 3: qkv_rot_neox<3>(xr, pre.cs, pre.sn); break;
            default: qkv_rot_neox<4>(xr, pre.cs, pre.sn); break;
            }
        } else {
            // Value i = lane + 32 u is x[2 j + (lane & 1)] of pair j = lane / 2 + 16 u, whose factors
            // lane j % 32 holds in slot j / 32.
#pragma unroll
            for (int u = 0; u < QKV_PW; ++u) {
                const int src = lane / 2 + 16 * (u & 1);
                const float cf = __shfl_sync(0xffffffffu, pre.cs[u >> 1], src);
                const float sf = __shfl_sync(0xffffffffu, pre.sn[u >> 1], src);
                const float other = __shfl_xor_sync(0xffffffffu, xr[u], 1);
                if (lane + u * WARP < n_rot) {
                    float y0, y1;
                    rope_vals((lane & 1) ? other : xr[u], (lane & 1) ? xr[u] : other, cf, sf, &y0, &y1);
                    xr[u] = (lane & 1) ? y1 : y0;
                }
            }
        }
    }
    if (w || n_rot > 0)
#pragma unroll
        for (int u = 0; u < QKV_PW; ++u)
            if (lane + u * WARP < head_dim) x[lane + u * WARP] = xr[u];
    if (is_k) {
        const int width = n_kv * head_dim, slots = (int)tab[t].slots;
        const long long s = ring ? pre.p % slots : pre.p;
        const size_t off = (size_t)s * width + (size_t)hk * head_dim;
#pragma unroll
        for (int u = 0; u < QKV_PW; ++u) {
            const int i = lane + u * WARP;
            if (i < head_dim) {
                ((__half*)tab[t].k)[off + i] = __float2half_rn(xr[u]);
                ((__half*)tab[t].v)[off + i] = __float2half_rn(vr[u]);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(128) qkv_rows(float* __restrict__ q, float* __restrict__ k,
                                                           const float* __restrict__ v, const float* __restrict__ qw,
                                                           const float* __restrict__ kw, float eps, int n_rows,
                                                           int n_head, int n_kv, int head_dim, int n_rot,
                                                           float freq_base, int neox, const RowKv* __restrict__ tab,
                                                           const int* __restrict__ pos, int ring, int regs) {
    const QkvPre pre = pdl_wait_qkv(qw, kw, head_dim, n_rot, freq_base, pos, n_rows, n_head, n_kv);
    if (!pre.live) return;
    if (regs && pre.held && qkv_regs_fit(n_rot, neox)) {
        qkv_rows_regs(pre, q, k, v, qw, kw, eps, n_head, n_kv, head_dim, n_rot, neox, tab, ring);
        return;
    }
    const int lane = threadIdx.x % WARP, t = pre.t, h = pre.h, hk = h - n_head;
    const bool is_k = h >= n_head;
    const float* w = is_k ? kw : qw;
    const bool held = pre.held;
    const float(&wv)[QKV_PW] = pre.wv;
    const float(&cs)[QKV_PR] = pre.cs;
    const float(&sn)[QKV_PR] = pre.sn;
    int p = pre.p;
    float* x = is_k ? k + ((size_t)t * n_kv + hk) * head_dim : q + ((size_t)t * n_head + h) * head_dim;
    if (!held) p = pos[t];
    if (w) {
        float ss = 0.0f;
        for (int i = lane; i < head_dim; i += WARP) ss += x[i] * x[i];
        const float inv = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
        if (held) {
#pragma unroll
            for (int u = 0; u < QKV_PW; ++u) {
                const int i = lane + u * WARP;
                if (i < head_dim) x[i] = x[i] * inv * wv[u];
            }
        } else {
            for (int i = lane; i < head_dim; i += WARP) x[i] = x[i] * inv * w[i];
        }
        __syncwarp();
    }
    if (n_rot > 0) {
        if (held) {
#pragma unroll
            for (int u = 0; u < QKV_PR; ++u) {
                const int i = lane + u * WARP;
                if (i < n_rot / 2) rope_rot(x, i, n_rot, neox, cs[u], sn[u]);
            }
        } else {
            for (int i = lane; i < n_rot / 2; i += WARP) rope_pair(x, i, n_rot, p, freq_base, neox);
        }
        __syncwarp();
    }
    if (is_k) {
        const int width = n_kv * head_dim, slots = (int)tab[t].slots;
        const long long s = ring ? p % slots : p;
        const size_t off = (size_t)s * width + (size_t)hk * head_dim;
        const float* vx = v + ((size_t)t * n_kv + hk) * head_dim;
        for (int i = lane; i < head_dim; i += WARP) {
            ((__half*)tab[t].k)[off + i] = __float2half_rn(x[i]);
            ((__half*)tab[t].v)[off + i] = __float2half_rn(vx[i]);
        }
    }
}

// How a row that sees `count` positions is split when it is alone in its batch: (n_splits,
// split_len) of `row_split(count, solo, min_tiles)` in backend.rs, in the same integer
// arithmetic; solo = ceil(2 * SMs / n_kv), the splits a one-row batch asks for: one split per
// tile of ATT_T positions up to T = min_tiles splits, and past T splits at least T tiles each.
// SPLIT_FLOOR in min_tiles: past T splits, floor(tiles / T) of them instead of the ceiling.
// SPLIT_LONG (a prefill row's plan): every split at least T tiles, up to solo splits.
#define SPLIT_FLOOR 256
#define SPLIT_LONG 512
__device__ __forceinline__ int2 solo_split(int count, int solo, int min_tiles) {
    const int T = max(1, min_tiles & (SPLIT_FLOOR - 1)), tiles = (count + ATT_T - 1) / ATT_T;
    const int past = (min_tiles & SPLIT_FLOOR) ? tiles / T : (tiles + T - 1) / T;
    int n = max(1, (min_tiles & SPLIT_LONG) ? min(solo, past) : min(solo, min(tiles, max(T, past))));
    const int len = ((count + n - 1) / n + ATT_T - 1) / ATT_T * ATT_T;
    n = max(1, (count + len - 1) / len);
    return make_int2(n, len);
}

// Shared memory of one block: q [G][D], K tile [T][D + 4], V tile [T][D], scores [G][T],
// max / sum / rescale [G] each.
// One block: query heads h0 .. h0 + G - 1 (sharing KV head kvh) of one row, over positions
// start .. end - 1 of the cache; writes the unnormalised output, max and sum of split `split` of
// `n_splits` (the stride of the partials).
template <int D>
__device__ void attn_block(const float* __restrict__ qrow, const __half* __restrict__ kc, const __half* __restrict__ vc,
                           float* __restrict__ o_part, float2* __restrict__ ml_part, int row, int n_head, int n_kv,
                           int G, int kvh, int h0, int split, int n_splits, int start, int end, int slots, int ring,
                           float scale) {
    constexpr int OUTS = 4096 / 128;
    constexpr int KP = D + 4;
    extern __shared__ float4 smem4[];
    float* smem = (float*)smem4;
    const int width = n_kv * D;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    float* qs = smem;
    float* kt = qs + G * D;
    float* vt = kt + ATT_T * KP;
    float* sc = vt + ATT_T * D;
    float* mrow = sc + G * ATT_T;
    float* lrow = mrow + G;
    float* alpha = lrow + G;

    for (int e = tid; e < G * D; e += 128) qs[e] = qrow[e];
    for (int g = tid; g < G; g += 128) {
        mrow[g] = -INFINITY;
        lrow[g] = 0.0f;
    }
    float acc[OUTS];
#pragma unroll
    for (int k = 0; k < OUTS; ++k) acc[k] = 0.0f;
    __syncthreads();

    // K and V rows of a tile as 16-byte pieces (8 halves), TP per thread, loaded into registers
    // one tile ahead: the next tile's loads are in flight while this one is computed.
    constexpr int TP = ATT_T * D / 8 / 128;
    uint4 kr[TP], vr[TP];
    auto load_tile = [&](int j0) {
#pragma unroll
        for (int i = 0; i < TP; ++i) {
            const int e = tid + 128 * i, jj = e / (D / 8), dd = 8 * (e % (D / 8));
            const int j = j0 + jj;
            kr[i] = vr[i] = make_uint4(0u, 0u, 0u, 0u);
            if (j < end) {
                const long long s = ring ? j % slots : j;
                const size_t off = (size_t)s * width + (size_t)kvh * D + dd;
                kr[i] = *(const uint4*)(kc + off);
                vr[i] = *(const uint4*)(vc + off);
            }
        }
    };
    load_tile(start);
    for (int j0 = start; j0 < end; j0 += ATT_T) {
        // K and V rows j0 .. j0 + T (zeros past the end) to shared memory as f32.
#pragma unroll
        for (int i = 0; i < TP; ++i) {
            const int e = tid + 128 * i, jj = e / (D / 8), dd = 8 * (e % (D / 8));
            const __half2* kh = (const __half2*)&kr[i];
            const __half2* vh = (const __half2*)&vr[i];
            float4* kd = (float4*)(kt + jj * KP + dd);
            float4* vd = (float4*)(vt + jj * D + dd);
            const float2 k0 = __half22float2(kh[0]), k1 = __half22float2(kh[1]), k2 = __half22float2(kh[2]),
                         k3 = __half22float2(kh[3]);
            const float2 v0 = __half22float2(vh[0]), v1 = __half22float2(vh[1]), v2 = __half22float2(vh[2]),
                         v3 = __half22float2(vh[3]);
            kd[0] = make_float4(k0.x, k0.y, k1.x, k1.y);
            kd[1] = make_float4(k2.x, k2.y, k3.x, k3.y);
            vd[0] = make_float4(v0.x, v0.y, v1.x, v1.y);
            vd[1] = make_float4(v2.x, v2.y, v3.x, v3.y);
        }
        __syncthreads();
        if (j0 + ATT_T < end) load_tile(j0 + ATT_T);
        // Scores: one (head, position) per thread and step; a warp shares the head.
        for (int e = tid; e < G * ATT_T; e += 128) {
            const int g = e / ATT_T, jj = e % ATT_T;
            float s = -INFINITY;
            if (j0 + jj < end) {
                const float4* qa = (const float4*)(qs + g * D);
                const float4* ka = (const float4*)(kt + jj * KP);
                float d0 = 0.0f;
#pragma unroll 8
                for (int d = 0; d < D / 4; ++d) {
                    const float4 a = qa[d], b = ka[d];
                    d0 += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
                }
                s = d0 * scale;
            }
            sc[e] = s;
        }
        __syncthreads();
        // Online softmax: a warp per head, a lane per position.
        for (int g = warp; g < G; g += 4) {
            const float s = sc[g * ATT_T + lane];
            const float m_old = mrow[g];
            const float m_new = fmaxf(m_old, warp_max(s));
            const float pr = s == -INFINITY ? 0.0f : expf(s - m_new);
            sc[g * ATT_T + lane] = pr;
            const float ps = warp_sum(pr);
            if (lane == 0) {
                const float a = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                lrow[g] = lrow[g] * a + ps;
                mrow[g] = m_new;
                alpha[g] = a;
            }
        }
        __syncthreads();
        // acc[g][d] = acc * alpha_g + sum_j p[g][j] V[j][d].
#pragma unroll
        for (int k = 0; k < OUTS; ++k) {
            const int e = tid + 128 * k;
            if (e < G * D) {
                const int g = e / D, d = e % D;
                const float* pr = sc + g * ATT_T;
                float a = acc[k] * alpha[g];
#pragma unroll 8
                for (int jj = 0; jj < ATT_T; ++jj) a += pr[jj] * vt[jj * D + d];
                acc[k] = a;
            }
        }
        __syncthreads();
    }
    const size_t base = ((size_t)row * n_head + (size_t)h0) * n_splits + split;
#pragma unroll
    for (int k = 0; k < OUTS; ++k) {
        const int e = tid + 128 * k;
        if (e < G * D) {
            const int g = e / D, d = e % D;
            o_part[(base + (size_t)g * n_splits) * D + d] = acc[k];
        }
    }
    for (int g = tid; g < G; g += 128) ml_part[base + (size_t)g * n_splits] = make_float2(mrow[g], lrow[g]);
}

// A decode group: row t at position pos[t] of its own cache tab[t]; grid (n_kv * chunks,
// n_rows, the most splits any row can get). Splits past the row's own count do nothing:
// attn_rows_combine reads only the row's own splits.
template <int D>
__device__ void attn_rows_partial(const float* __restrict__ q, const RowKv* __restrict__ tab, const int* __restrict__ pos,
                                  float* __restrict__ o_part, float2* __restrict__ ml_part, int n_head, int n_kv, int G,
                                  int window, int ring, float scale, int solo, int min_tiles) {
    const int n_chunks = n_head / n_kv / G;
    const int kvh = blockIdx.x / n_chunks, h0 = kvh * (n_head / n_kv) + (blockIdx.x % n_chunks) * G;
    const int row = blockIdx.y, split = blockIdx.z, n_splits = gridDim.z;
    const int p = pos[row];
    const int lo = window > 0 ? max(0, p - window + 1) : 0;
    const int2 plan = solo_split(p + 1 - lo, solo, min_tiles);
    if (split >= plan.x) return;
    const int start = lo + split * plan.y;
    const int end = min(p + 1, start + plan.y);
    const RowKv c = tab[row];
    attn_block<D>(q + (size_t)row * n_head * D + (size_t)h0 * D, (const __half*)c.k, (const __half*)c.v, o_part,
                  ml_part, row, n_head, n_kv, G, kvh, h0, split, n_splits, start, end, (int)c.slots, ring, scale);
}

#define MMA_VP 136 // V rows in shared memory: 128 halves + 8 of padding
#define MMA_SP 136 // the warps' outputs in shared memory for their merge: rows of 128 floats + 8

// One split's term of a split merge (merge_splits, attn_cluster_finish): the splits in order,
// empty ones (max -inf) skipped, M the largest max of the row's splits.
__device__ __forceinline__ void merge_term(float2 ml, float ov, float M, float& num, float& den) {
    if (ml.x == -INFINITY) return;
    const float w = expf(ml.x - M);
    num += w * ov;
    den += w * ml.y;
}

// The in-cluster split merge of attn_rows_mma_fin{C}_128. A decode row at short context has a
// few splits per KV head (solo_split: one per 32-position tile up to 8), each a block whose
// partial went through global memory to a second launch (attn_rows_combine) that merged them.
// Here the C blocks of one (KV head, row) form a thread-block cluster: each leaves its split's
// (o, m, l) in its own shared memory, and after a cluster barrier block r merges query heads
// 16 r / C .. 16 (r + 1) / C - 1 of the KV head (16 / C x 128 outputs, 8 / C Q8_K blocks) reading
// the splits from the other blocks' shared memory (distributed shared memory), with
// merge_splits' arithmetic in split order, so each output has attn_rows_combine's bits; then the
// gate, the output and its Q8_K quantization for the attn_output matmul, as attn_rows_combine.
struct FinArgs {
    float* out;
    const float* gate;
    int8_t* xq;
    float2* xds;
    int8_t* xbs;
};
// Thread-block clusters are Hopper's (sm_90): before it the cluster kernel compiles to a trap
// (the host never launches it there: backend.rs, rows_cluster).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define CLUSTER_DIMS_8
#define CLUSTER_ASM(...) __trap()
#else
#define CLUSTER_DIMS_8 __cluster_dims__(1, 1, 8)
#define CLUSTER_ASM(...) asm volatile(__VA_ARGS__)
#endif
__device__ __forceinline__ void cluster_barrier() {
    CLUSTER_ASM("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Where `p` (in this block's shared memory) is in the shared memory of the cluster's block `rank`.
__device__ __forceinline__ uint32_t cluster_addr(const void* p, int rank) {
    uint32_t r = 0;
    CLUSTER_ASM("mapa.shared::cluster.u32 %0, %1, %2;"
                : "=r"(r)
                : "r"((uint32_t)__cvta_generic_to_shared(p)), "r"(rank));
    return r;
}
__device__ __forceinline__ float ld_cluster(uint32_t a) {
    float v = 0.0f;
    CLUSTER_ASM("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ float2 ld_cluster2(uint32_t a) {
    float2 v = make_float2(0.0f, 0.0f);
    CLUSTER_ASM("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(a) : "memory");
    return v;
}
// so: [16 heads][MMA_SP] f32, the block's split (o); sml: its (m, l) per head; ns: the row's
// splits (at most C). 128 threads, thread d value d of each head. Every thread of every block of
// the cluster calls it.
template <int C>
__device__ __forceinline__ void attn_cluster_finish(const float* so, const float2* sml, int ns, int row, int n_head,
                                                    int h0, const FinArgs& fa) {
    constexpr int D = 128, HB = 16 / C; // heads merged per block
    __shared__ __align__(16) float fin[HB * D];
    const int r = blockIdx.z, d = threadIdx.x; // the cluster's rank of the block: its z (1 x 1 x C)
    cluster_barrier(); // every split's state is in its block's shared memory
#pragma unroll
    for (int hh = 0; hh < HB; ++hh) {
        const int g = HB * r + hh;
        float2 ml[C];
        float ov[C];
#pragma unroll
        for (int s = 0; s < C; ++s) {
            ml[s] = make_float2(-INFINITY, 0.0f);
            ov[s] = 0.0f;
            if (s < ns) {
                ml[s] = ld_cluster2(cluster_addr(sml + g, s));
                ov[s] = ld_cluster(cluster_addr(so + g * MMA_SP + d, s));
            }
        }
        float M = -INFINITY;
#pragma unroll
        for (int s = 0; s < C; ++s) M = fmaxf(M, ml[s].x);
        float num = 0.0f, den = 0.0f;
#pragma unroll
        for (int s = 0; s < C; ++s) merge_term(ml[s], ov[s], M, num, den);
        float o = num / den;
        const size_t i = ((size_t)row * n_head + h0 + g) * D + d;
        if (fa.gate) o *= 1.0f / (1.0f + expf(-fa.gate[i]));
        fa.out[i] = o;
        fin[hh * D + d] = o;
    }
    cluster_barrier(); // no block reads another's shared memory past here; fin is complete
    if (!fa.xq) return;
    const int lane = threadIdx.x % WARP;
    // Q8_K blocks j of the block's HB / 2: warp j % 4 (C = 1: two each).
    for (int j = threadIdx.x / WARP; j < HB / 2; j += 4) {
        const float* src = fin + 256 * j + 8 * lane;
        const float4 a = *(const float4*)src, b = *(const float4*)(src + 4);
        const float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        q8k_warp(f, (row * n_head + h0 + HB * r) / 2 + j, lane, fa.xq, fa.xds, fa.xbs, n_head * D, 0);
    }
}

// Tensor-core decode attention (decode groups; head dim 128, at most 16 query heads per KV
// head: Muse Glimmer and llama-glimmer have 16). A block takes one (KV head, row, split) as
// attn_rows_partial does with all the group's heads (no head chunks), so the split plan and the
// partials' layout are the same and attn_rows_combine merges them. Its 4 warps take steps of 16
// positions in turn, each with its own online softmax, merged at the end:
//   S = Q K^T with mma.m16n8k16 (f16 in, f32 sums): A = Q (16 heads x 128 dims, rows past G
//       zero), B = K read straight from the cache, each lane 64 contiguous bytes of one position
//       (the k order inside each 16-wide step is permuted, identically for Q and K: lane quad c
//       holds dims 32c .. 32c + 31);
//   P = exp(S * scale - m), rounded to f16, reused in registers as the A operand of O += P V,
//       with V staged through shared memory (rows padded to 272 bytes) and ldmatrix.trans.
// f16 Q and P are the only roundings the f32 kernel does not make (relative 2^-11).
__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *(const uint32_t*)&h;
}
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t u4_word(const uint4 (&v)[4], int w) {
    const uint4 x = v[w >> 2];
    const int c = w & 3;
    return c == 0 ? x.x : c == 1 ? x.y : c == 2 ? x.z : x.w;
}

// a * ka + b * kb with one rounding order (the warps' merge in attn_rows_mma).
__device__ __forceinline__ float merge_pair(float a, float b, float ka, float kb) {
    return __fmaf_rn(a, ka, __fmul_rn(b, kb));
}

// W warps per block (4 or 8). The block's split is cut into steps of 16 positions over nw parts
// (part w takes the steps at start + 16 w, + 16 nw, ...), and the parts' states are merged by
// halves. Part w is warp w, except in attn_rows_mma48_128 (W = 4, S = 8 slots), whose warp w
// plays parts w and w + 4 in turn when nw = 8. nw depends only on the row's own plan: 8 where it
// has 16 splits or more of 16 * 8 positions or more (and the block has 8 merge slots), else 4,
// so a row gets the bits of the 4-warp
// kernel whenever its plan is small, whichever kernel its group launched (backend.rs:
// rows_wide). H200, llama-glimmer, tg64 at depth 8192 (32 splits of 256 positions), 4 / 8 warps
// in one call: 150.31 / 150.05 against 152.91 / 152.79 tokens/s; 8 warps for every row cost
// tg128 at depth 0 1.5% (165.97 -> 163.50) and 8 streams 3% (919.31 -> 890.24) (69.6 KB of
// shared memory and 57 K registers per block), and 8 warps from 128-position splits cost tg64 at
// depth 2048 (9 splits) 0.8% (157.98 -> 156.67).
// C > 0 (attn_rows_mma_fin{C}_128, clusters of C blocks along z): the row's splits are merged
// inside the cluster (attn_cluster_finish) instead of by attn_rows_combine; a block past the
// row's splits runs an empty range and takes its share of the merge.
//
// early (decode steps, whose only new position is each row's own p, stored by the kernel before):
// the block's first two steps of K and V (positions before p) are asked for before pdl_wait, so
// their DRAM latency overlaps the kernels before; position p is loaded after the wait. With early
// 0 (prefill, whose rows also see the chunk's other new positions) everything waits first. The
// loads are the same bytes either way, so the bits are too. Before the wait a block reads only
// what no kernel of the step writes (the positions, the cache table, the K/V of earlier steps:
// a decode step starts after the host has read the step before's logits). A block past its
// row's splits then returns without waiting; split 0 of every row waits, so the grid still ends
// after the kernel before it (common.cuh, pdl_wait).
template <int W, int C, int S = W>
__device__ __forceinline__ bool pdl_wait_attn_rows_mma(const float* __restrict__ q, const RowKv* __restrict__ tab,
                                                       const int* __restrict__ pos, float* __restrict__ o_part,
                                                       float2* __restrict__ ml_part, int n_head, int n_kv, int window,
                                                       int ring, float scale, int solo, int min_tiles, int early,
                                                       const FinArgs& fa, int split, int n_splits, bool waited) {
    if (!early && !waited) pdl_wait();
    constexpr int D = 128;
    const int G = n_head / n_kv;
    const int kvh = blockIdx.x, h0 = kvh * G;
    const int row = blockIdx.y;
    const int p = pos[row];
    const int lo = window > 0 ? max(0, p - window + 1) : 0;
    const int2 plan = solo_split(p + 1 - lo, solo, min_tiles);
    const bool active = split < plan.x;
    constexpr bool FIN = C > 0;
    if (!FIN && !active) return false;
    const int start = active ? lo + split * plan.y : 0;
    const int end = active ? min(p + 1, start + plan.y) : 0;
    const int nw = S == 8 && plan.x >= 16 && plan.y >= 16 * 8 ? 8 : 4;
    // Passes: a 4-warp block that runs a row on 8 (S = 8 > W, attn_rows_mma48_128) plays two
    // warps' parts in turn, warp w those of w and then w + 4; each part's state goes to its slot
    // of the merge, so the row gets the 8-warp kernel's bits.
    const int passes = nw > W ? nw / W : 1;
    const RowKv c = tab[row];
    const __half* kc = (const __half*)c.k;
    const __half* vc = (const __half*)c.v;
    const int slots = (int)c.slots, width = n_kv * D;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, qd = lane >> 2, qc = lane & 3;

    extern __shared__ float4 smem4[];
    // Two V stages per warp: stage b of warp w at (2 w + b) * 16 rows.
    __half* vs0 = (__half*)smem4 + 2 * warp * 16 * MMA_VP;
    float o[16][4];
#pragma unroll
    for (int t = 0; t < 16; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    // The step at j0 + 16 nw is asked for before the step at j0 is computed: its K into registers,
    // its V into the warp's other shared-memory stage (cp.async; positions past the end read as
    // zeros, so 0 * P stays 0).
    // Positions j < lim of a step (lim = p before the wait: position p is the kernel before's).
    const auto load_k = [&](uint4 (&kr)[2][4], int j0, int lim) {
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            const int j = j0 + 8 * t + qd;
#pragma unroll
            for (int i = 0; i < 4; ++i) kr[t][i] = make_uint4(0u, 0u, 0u, 0u);
            if (j < end && j < lim) {
                const long long sl = ring ? j % slots : j;
                const uint4* src = (const uint4*)(kc + (size_t)sl * width + (size_t)kvh * D + 32 * qc);
#pragma unroll
                for (int i = 0; i < 4; ++i) kr[t][i] = src[i];
            }
        }
    };
    const auto load_v = [&](__half* vs, int j0, int lim) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int e = lane + 32 * i, jj = e >> 4, col = (e & 15) * 8, j = j0 + jj;
            const long long sl = j < end ? (ring ? j % slots : j) : 0;
            const __half* src = vc + (size_t)sl * width + (size_t)kvh * D + col;
            if (j < lim || j >= end)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(
                                 (unsigned)__cvta_generic_to_shared(vs + jj * MMA_VP + col)),
                             "l"(src), "r"(j < end ? 16 : 0));
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    // After the wait: position p of a step loaded before it (its K into kr, its V row copied in a
    // group of its own); whether the step holds p.
    const auto fix_p = [&](uint4 (&kr)[2][4], __half* vs, int j0) {
        if (p < j0 || p >= j0 + 16 || p >= end) return false;
        const long long sl = ring ? p % slots : p;
#pragma unroll
        for (int t = 0; t < 2; ++t)
            if (j0 + 8 * t + qd == p) {
                const uint4* src = (const uint4*)(kc + (size_t)sl * width + (size_t)kvh * D + 32 * qc);
#pragma unroll
                for (int i = 0; i < 4; ++i) kr[t][i] = src[i];
            }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int e = lane + 32 * i, jj = e >> 4, col = (e & 15) * 8;
            if (j0 + jj == p)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                                 (unsigned)__cvta_generic_to_shared(vs + jj * MMA_VP + col)),
                             "l"(vc + (size_t)sl * width + (size_t)kvh * D + col));
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        return true;
    };
    early = early && !waited;
    const int lim0 = early ? p : 0x7fffffff;
    uint4 kr[2][4], kn[2][4];
    int stage = 0;
    // The warp's steps: those of part warp + W ps (ps < passes) at its first step, + 16 nw, ...
    const auto first = [&](int ps) { return start + 16 * (warp + W * ps); };
    // The step after j0 (of pass ps) in the warp's order, or end.
    const auto next = [&](int j0, int ps) {
        if (j0 + 16 * nw < end) return j0 + 16 * nw;
        return ps + 1 < passes ? min(first(ps + 1), end) : end;
    };
    const int s0 = first(0), s1 = next(s0, 0);
    if (warp < nw && s0 < end) {
        load_k(kr, s0, lim0);
        load_v(vs0, s0, lim0);
        if (s1 < end) {
            load_k(kn, s1, lim0);
            load_v(vs0 + 16 * MMA_VP, s1, lim0);
        }
    }
    bool fixed = false; // a group of position p's V rows is in flight (the first step waits for all)
    if (early) {
        pdl_wait();
        if (warp < nw && s0 < end) {
            fixed = fix_p(kr, vs0, s0);
            if (s1 < end) fixed |= fix_p(kn, vs0 + 16 * MMA_VP, s1);
        }
    }

    // Q as A fragments, step s: a0/a2 = row qd, dims 32qc + 4s + {0,1} / {2,3}; a1/a3 = row qd + 8.
    uint32_t qa[8][4];
    const float* qrow = q + (size_t)row * n_head * D + (size_t)h0 * D;
#pragma unroll
    for (int s = 0; s < 8; ++s)
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            const int h = qd + 8 * rr;
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (h < G) x = *(const float4*)(qrow + (size_t)h * D + 32 * qc + 4 * s);
            qa[s][rr] = pack_half2(x.x, x.y);
            qa[s][2 + rr] = pack_half2(x.z, x.w);
        }

    float* so = (float*)smem4;                     // [S][16 heads][MMA_SP]
    float2* sml = (float2*)(so + S * 16 * MMA_SP); // [S][16]
    // Slot of part v: its own index, except with passes (S > W), where the first pass's parts take
    // slots W .. S - 1 (past every warp's V stages) and the last pass's take slot v - W, the
    // warp's own V stages (written once its last step is done).
    const auto slot = [](int v) { return S > W ? (v + W) % S : v; };
    // The part's state into its slot: (o, m, l) per head.
    const auto leave = [&](int v) {
#pragma unroll
        for (int t = 0; t < 16; ++t)
#pragma unroll
            for (int rr = 0; rr < 2; ++rr)
                *(float2*)(so + (slot(v) * 16 + qd + 8 * rr) * MMA_SP + 8 * t + 2 * qc) =
                    make_float2(o[t][2 * rr], o[t][2 * rr + 1]);
        if (qc == 0) {
            sml[v * 16 + qd] = make_float2(m[0], l[0]);
            sml[v * 16 + qd + 8] = make_float2(m[1], l[1]);
        }
    };
    for (int ps = 0; ps < passes; ++ps) {
        if (ps > 0) { // the first pass's part, then a fresh state
            leave(warp + W * (ps - 1));
#pragma unroll
            for (int t = 0; t < 16; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
            m[0] = m[1] = -INFINITY;
            l[0] = l[1] = 0.0f;
        }
        for (int j0 = first(ps); warp < nw && j0 < end; j0 += 16 * nw, stage ^= 1) {
            __half* vs = vs0 + stage * 16 * MMA_VP;
            const int jn = next(j0, ps);
            const bool more = jn < end;
            if (more && j0 != s0) { // the second step's loads went out with the first's
                load_k(kn, jn, 0x7fffffff);
                load_v(vs0 + (stage ^ 1) * 16 * MMA_VP, jn, 0x7fffffff);
            }
            // S: element (row qd + 8 (e >> 1), column 2qc + (e & 1)) of n-tile t is position
            // j0 + 8t + 2qc + (e & 1).
            float sc[2][4];
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                sc[t][0] = sc[t][1] = sc[t][2] = sc[t][3] = 0.0f;
#pragma unroll
                for (int s = 0; s < 8; ++s) mma_f16(sc[t], qa[s], u4_word(kr[t], 2 * s), u4_word(kr[t], 2 * s + 1));
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int j = j0 + 8 * t + 2 * qc + (e & 1);
                    sc[t][e] = j < end ? sc[t][e] * scale : -INFINITY;
                }
            }
            // Online softmax per row (the quad of lanes holding a row agrees on m and l).
            uint32_t pa[4];
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
                float mx = fmaxf(fmaxf(sc[0][2 * rr], sc[0][2 * rr + 1]), fmaxf(sc[1][2 * rr], sc[1][2 * rr + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(m[rr], mx);
                const bool none = m_new == -INFINITY;
                const float alpha = none || m[rr] == -INFINITY ? (none ? 1.0f : 0.0f) : expf(m[rr] - m_new);
                float pv[4];
#pragma unroll
                for (int t = 0; t < 2; ++t)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float sv = sc[t][2 * rr + e];
                        pv[2 * t + e] = sv == -INFINITY ? 0.0f : expf(sv - m_new);
                    }
                float rs = pv[0] + pv[1] + pv[2] + pv[3];
                rs += __shfl_xor_sync(0xffffffffu, rs, 1);
                rs += __shfl_xor_sync(0xffffffffu, rs, 2);
                l[rr] = l[rr] * alpha + rs;
                m[rr] = m_new;
#pragma unroll
                for (int t = 0; t < 16; ++t) {
                    o[t][2 * rr] *= alpha;
                    o[t][2 * rr + 1] *= alpha;
                }
                // A fragment of P: a0 / a1 = rows qd / qd + 8 at k = 2qc + e (n-tile 0), a2 / a3 at k + 8.
                pa[rr] = pack_half2(pv[0], pv[1]);
                pa[2 + rr] = pack_half2(pv[2], pv[3]);
            }
            // This step's V (the next step's copy may still be in flight).
            if (more && !(fixed && j0 == s0)) asm volatile("cp.async.wait_group 1;" ::: "memory");
            else asm volatile("cp.async.wait_group 0;" ::: "memory");
            __syncwarp();
            // O += P V: ldmatrix.trans gives the B fragments of two n-tiles (8 dims each) at a time.
            const uint32_t vbase = (uint32_t)__cvta_generic_to_shared(vs);
#pragma unroll
            for (int t2 = 0; t2 < 16; t2 += 2) {
                const int mtx = lane >> 3, r = lane & 7;
                const uint32_t addr =
                    vbase + (uint32_t)((((mtx & 1) * 8 + r) * MMA_VP + 8 * (t2 + (mtx >> 1))) * 2);
                uint32_t b0, b1, b2, b3;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                             : "r"(addr));
                mma_f16(o[t2], pa, b0, b1);
                mma_f16(o[t2 + 1], pa, b2, b3);
            }
            __syncwarp();
            if (more) {
#pragma unroll
                for (int t = 0; t < 2; ++t)
#pragma unroll
                    for (int i = 0; i < 4; ++i) kr[t][i] = kn[t][i];
            }
        }
    }

    // Merge the warps' states (nw = 8: ((0 4) (2 6)) ((1 5) (3 7)); nw = 4: (0 2) (1 3), each pair
    // the online-softmax merge) in one round: every warp leaves its state in its own slot of
    // shared memory (the V rows are free now), then each warp merges 16 / W heads of all the
    // slots along that tree and writes them. A lane's two values of a row (columns 2qc, 2qc + 1
    // of an n-tile) go as one float2, and rows are MMA_SP floats apart, so each half-warp's 16
    // float2 fall in 16 different bank pairs (rows of 128 floats: 8-way bank conflicts).
    __syncthreads();
    if (warp < nw) leave(warp + W * (passes - 1));
    __syncthreads();
    constexpr int HPW = 16 / W, LPH = 32 / HPW; // heads per warp, lanes per head
    const int hh = warp * HPW + lane / LPH, li = lane % LPH;
    // The tree's factors for head hh: round r (half = S / 2 >> r) merges part w + half into w.
    float ms[S], ls[S], ka[S - 1], kb[S - 1];
#pragma unroll
    for (int w = 0; w < S; ++w) {
        const float2 v = w < nw ? sml[w * 16 + hh] : make_float2(-INFINITY, 0.0f);
        ms[w] = v.x;
        ls[w] = v.y;
    }
    int node = 0;
#pragma unroll
    for (int half = S / 2; half >= 1; half /= 2)
#pragma unroll
        for (int w = 0; w < half; ++w, ++node) {
            if (2 * half > nw) continue;
            const float M = fmaxf(ms[w], ms[w + half]);
            ka[node] = ms[w] == -INFINITY ? 0.0f : expf(ms[w] - M);
            kb[node] = ms[w + half] == -INFINITY ? 0.0f : expf(ms[w + half] - M);
            ls[w] = merge_pair(ls[w], ls[w + half], ka[node], kb[node]);
            ms[w] = M;
        }
    // The lane's values of head hh: float2 columns 2 li + 2 LPH i.
    float2 res[D / (2 * LPH)];
#pragma unroll
    for (int i = 0; i < D / (2 * LPH); ++i) {
        const int dd = 2 * li + 2 * LPH * i;
        float2 v[S];
#pragma unroll
        for (int w = 0; w < S; ++w)
            v[w] = w < nw ? *(const float2*)(so + (slot(w) * 16 + hh) * MMA_SP + dd) : make_float2(0.0f, 0.0f);
        int nd = 0;
#pragma unroll
        for (int half = S / 2; half >= 1; half /= 2)
#pragma unroll
            for (int w = 0; w < half; ++w, ++nd) {
                if (2 * half > nw) continue;
                v[w].x = merge_pair(v[w].x, v[w + half].x, ka[nd], kb[nd]);
                v[w].y = merge_pair(v[w].y, v[w + half].y, ka[nd], kb[nd]);
            }
        res[i] = v[0];
    }
    if constexpr (FIN) {
        // The block's split into slot 0 (once every warp has read the slots).
        __syncthreads();
#pragma unroll
        for (int i = 0; i < D / (2 * LPH); ++i) *(float2*)(so + hh * MMA_SP + 2 * li + 2 * LPH * i) = res[i];
        if (li == 0) sml[hh] = make_float2(ms[0], ls[0]);
        attn_cluster_finish<FIN ? C : 1>(so, sml, plan.x, row, n_head, h0, fa);
        return true;
    }
    if (hh >= G) return true;
    const size_t at = ((size_t)row * n_head + (size_t)h0 + hh) * n_splits + split;
#pragma unroll
    for (int i = 0; i < D / (2 * LPH); ++i) *(float2*)(o_part + at * D + 2 * li + 2 * LPH * i) = res[i];
    if (li == 0) ml_part[at] = make_float2(ms[0], ls[0]);
    return true;
}
#define MMA_ROWS_ARGS const float* __restrict__ q, const RowKv* __restrict__ tab, const int* __restrict__ pos, \
    float* __restrict__ o_part, float2* __restrict__ ml_part, int n_head, int n_kv, int window, int ring, float scale, \
    int solo, int min_tiles, int early
#define MMA_ROWS_PASS q, tab, pos, o_part, ml_part, n_head, n_kv, window, ring, scale, solo, min_tiles, early
// Without clusters a block takes splits z, z + Z, .. (Z = gridDim.z) of its (KV head, row) in
// turn, `solo` splits in all (the partials' stride): the grid is sized to one wave of the GPU
// (backend.rs: attn_loop_splits) instead of one block per split the longest row could have, most
// of them empty at short depths. A split's arithmetic does not depend on the block that runs it,
// so neither do the bits. The first split past the row's plan ends the block (its later ones
// are past it too); the first active split waits for the kernel before (or loads early).
template <int W, int S = W>
__device__ __forceinline__ void pdl_wait_attn_rows_mma_loop(MMA_ROWS_ARGS) {
    bool waited = false;
    for (int s = blockIdx.z; s < solo; s += gridDim.z) {
        if (waited) __syncthreads(); // the previous split's merge has read the shared memory
        if (!pdl_wait_attn_rows_mma<W, 0, S>(MMA_ROWS_PASS, FinArgs{}, s, solo, waited)) return;
        waited = true;
    }
}
extern "C" __global__ void __launch_bounds__(128) attn_rows_mma_128(MMA_ROWS_ARGS) {
    pdl_wait_attn_rows_mma_loop<4>(MMA_ROWS_PASS);
}
extern "C" __global__ void __launch_bounds__(256) attn_rows_mma8_128(MMA_ROWS_ARGS) {
    pdl_wait_attn_rows_mma_loop<8>(MMA_ROWS_PASS);
}
// 4 warps with the 8-warp kernel's bits for rows it would run on 8 (two passes a warp), so two
// blocks share an SM: the decode groups' kernel for such rows (backend.rs: rows_wide4).
extern "C" __global__ void __launch_bounds__(128) attn_rows_mma48_128(MMA_ROWS_ARGS) {
    pdl_wait_attn_rows_mma_loop<4, 8>(MMA_ROWS_PASS);
}
// Grid (n_kv, n_rows, C): every row of the launch has at most C splits (backend.rs:
// rows_cluster), 16 query heads of 128 per KV head. o_part / ml_part are not used.
#define FIN_ARGS float *__restrict__ out, const float *__restrict__ gate, int8_t *__restrict__ xq, \
    float2 *__restrict__ xds, int8_t *__restrict__ xbs
#define FIN_PASS FinArgs{out, gate, xq, xds, xbs}
extern "C" __global__ void CLUSTER_DIMS_8 __launch_bounds__(128) attn_rows_mma_fin8_128(MMA_ROWS_ARGS, FIN_ARGS) {
    pdl_wait_attn_rows_mma<4, 8>(MMA_ROWS_PASS, FIN_PASS, blockIdx.z, gridDim.z, false);
}

#define ROWS_ARGS const float* __restrict__ q, const RowKv* __restrict__ tab, const int* __restrict__ pos, \
    float* __restrict__ o_part, float2* __restrict__ ml_part, int n_head, int n_kv, int G, int window, int ring, \
    float scale, int solo, int min_tiles
#define ROWS_PASS q, tab, pos, o_part, ml_part, n_head, n_kv, G, window, ring, scale, solo, min_tiles
extern "C" __global__ void __launch_bounds__(128) attn_rows_64(ROWS_ARGS) { pdl_wait(); attn_rows_partial<64>(ROWS_PASS); }
extern "C" __global__ void __launch_bounds__(128) attn_rows_128(ROWS_ARGS) { pdl_wait(); attn_rows_partial<128>(ROWS_PASS); }
extern "C" __global__ void __launch_bounds__(128) attn_rows_256(ROWS_ARGS) { pdl_wait(); attn_rows_partial<256>(ROWS_PASS); }

// Value d of a (row, head)'s output from its first ns partials (at base, stride D values each):
// sum_s e^(m_s - M) o_s[d] / sum_s e^(m_s - M) l_s in split order, skipping empty splits (max -inf).
// B > 1 (attn_rows_combine): the splits' loads go out B at a time (the sums stay in split order,
// so the bits are those of B = 1): one at a time, a row of 32 splits (depth 8192) was a chain of
// 64 L2 round trips, 19.6 us per launch on the H200 (Nsight Compute). B = 8: the rows of a
// 512-token prompt have at most 8 splits (batches of 16 cost pp512 1.3%).
// A row of at most MERGE_B splits (every decode row up to 2,048 positions) loads them in one
// batch: one L2 round trip instead of two, the same maximum and the terms in the same order.
template <int MERGE_B>
__device__ __forceinline__ float merge_splits(const float* __restrict__ o_part, const float2* __restrict__ ml_part,
                                              size_t base, int ns, int D, int d) {
    if (MERGE_B > 1 && ns <= MERGE_B) {
        float2 ml[MERGE_B];
        float ov[MERGE_B];
#pragma unroll
        for (int i = 0; i < MERGE_B; ++i) {
            ml[i] = i < ns ? ml_part[base + i] : make_float2(-INFINITY, 0.0f);
            ov[i] = i < ns ? o_part[(base + i) * D + d] : 0.0f;
        }
        float M = -INFINITY, num = 0.0f, den = 0.0f;
#pragma unroll
        for (int i = 0; i < MERGE_B; ++i) M = fmaxf(M, ml[i].x);
#pragma unroll
        for (int i = 0; i < MERGE_B; ++i) merge_term(ml[i], ov[i], M, num, den);
        return num / den;
    }
    float M = -INFINITY;
    for (int s0 = 0; s0 < ns; s0 += MERGE_B) {
        float mb[MERGE_B];
#pragma unroll
        for (int i = 0; i < MERGE_B; ++i) mb[i] = s0 + i < ns ? ml_part[base + s0 + i].x : -INFINITY;
#pragma unroll
        for (int i = 0; i < MERGE_B; ++i) M = fmaxf(M, mb[i]);
    }
    float num = 0.0f, den = 0.0f;
    for (int s0 = 0; s0 < ns; s0 += MERGE_B) {
        float2 ml[MERGE_B];
        float ov[MERGE_B];
#pragma unroll
        for (int i = 0; i < MERGE_B; ++i) {
            ml[i] = s0 + i < ns ? ml_part[base + s0 + i] : make_float2(-INFINITY, 0.0f);
            ov[i] = s0 + i < ns ? o_part[(base + s0 + i) * D + d] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < MERGE_B; ++i) merge_term(ml[i], ov[i], M, num, den);
    }
    return num / den;
}

// out[row][h][d] = sum_s e^(m_s - M) o_s[d] / sum_s e^(m_s - M) l_s over row t's own splits (solo_split of the positions it sees,
// in split order, so a row gets the bits of its one-row attention), times sigmoid(gate) when a
// gate is given (sigmoid_gate's arithmetic). Launch: grid (n_head, n_rows), D threads; or, with
// q non-null (256 a multiple of D, n_head * D of 256), grid (n_head * D / 256, n_rows) and 256
// threads, and the block also writes its 256 outputs' Q8_K quantization (q8k_warp: the bits of
// quantize_q8_k, row-major) for the attn_output matmul, which then skips its quantizer; with
// xblob also in mmw's layout of nt-tile columns (q8k_warp).
extern "C" __global__ void attn_rows_combine(const float* __restrict__ o_part, const float2* __restrict__ ml_part,
                                             float* __restrict__ out, const float* __restrict__ gate,
                                             const int* __restrict__ pos, int n_head, int n_splits, int D,
                                             int window, int solo, int min_tiles, int8_t* __restrict__ q,
                                             float2* __restrict__ ds, int8_t* __restrict__ bs,
                                             uint8_t* __restrict__ xblob, int nt) { pdl_wait();
    // blockDim.x / D heads per block (1, or with q the 256 / D heads of one Q8_K block).
    const int hpb = blockDim.x / D, h = blockIdx.x * hpb + threadIdx.x / D, row = blockIdx.y, d = threadIdx.x % D;
    const int p = pos[row];
    const int lo = window > 0 ? max(0, p - window + 1) : 0;
    const int ns = solo_split(p + 1 - lo, solo, min_tiles).x;
    const size_t base = ((size_t)row * n_head + h) * n_splits;
    const size_t i = ((size_t)row * n_head + h) * D + d;
    float o = merge_splits<8>(o_part, ml_part, base, ns, D, d);
    if (gate) o *= 1.0f / (1.0f + expf(-gate[i]));
    out[i] = o;
    if (!q) return;
    // The block's 256 outputs quantized for the attn_output matmul (backend.rs: quantize_for).
    q8k_block256(o, row * gridDim.x + blockIdx.x, q, ds, bs, n_head * D, xblob, nt);
}
