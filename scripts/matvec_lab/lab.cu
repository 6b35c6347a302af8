// Matvec lab (issue 5): times the one-column kernels of matvec.cu at the Glimmer shapes against
// v6 (matvec_v6.cu, the kernels before the streaming version, compiled in namespace v6) and
// checks that every variant's outputs equal v6's bit for bit. Build and run on the device with
// scripts/matvec_lab/run.sh. Variants (run 3): v6's warp code with R rows per warp, at least M
// blocks of 4 warps per SM (__launch_bounds__), P = 2: the next round's weights loaded before
// the current round's arithmetic (Q4_K/Q5_K). Runs 1 and 2 timed the v7 streaming kernels
// (stream_v7.cu, templates stream_matvec<STAGES, PIECES_PER_STAGE, WARPS_PER_BLOCK>).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <random>
#include <string>
#include <cuda_runtime.h>
#include "common.cuh"
namespace v6 {
#include "v6_ns.cu"
}
#include "matvec.cu"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); exit(1); } } while (0)

// v6's rows with the next round's weights loaded before the current round's arithmetic (PF = 2):
// each row still sums its items in increasing order, so the bits are v6's.
template <int R, bool Q5>
__device__ __forceinline__ void rows_pf(const uint8_t* __restrict__ w, int row0, int nr, int rows, const Act& a,
                                        float (&acc)[R][1]) {
    const int n = a.K / 64, lane = threadIdx.x % WARP;
    constexpr int FMT = Q5 ? FMT_Q5_K : FMT_Q4_K;
#pragma unroll 1
    for (int it = lane; it < n; it += 2 * WARP) {
        const bool has1 = it + WARP < n;
        RawQ45 r0[R], r1[R];
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (r < nr) {
                r0[r] = raw_load<FMT>(w, row0 + r, rows, it, a);
                if (has1) r1[r] = raw_load<FMT>(w, row0 + r, rows, it + WARP, a);
            }
        const X64 x0 = load_x64<1>(a, 0, (it >> 2) * QK_K + 64 * (it & 3));
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (r < nr) {
                float v = 0.0f;
                v += q45_dot(unpack_q45<Q5>(r0[r], it), x0);
                acc[r][0] += v;
            }
        if (has1) {
            const int i1 = it + WARP;
            const X64 x1 = load_x64<1>(a, 0, (i1 >> 2) * QK_K + 64 * (i1 & 3));
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (r < nr) {
                    float v = 0.0f;
                    v += q45_dot(unpack_q45<Q5>(r1[r], i1), x1);
                    acc[r][0] += v;
                }
        }
    }
}
template <int R, int PF>
__device__ __forceinline__ void lab_warp(const MatvecJobs& jobs, int grow, const Act& a) {
    if (PF == 1) { matvec_warp<1, R>(jobs, grow, a, 0); return; }
    if (grow >= jobs.start[jobs.njobs]) return;
    int j = 0;
    for (int t = 1; t < 4; ++t) if (t < jobs.njobs && grow >= jobs.start[t]) j = t;
    const int rows = jobs.rows[j], row0 = grow - jobs.start[j];
    const int nr = min(R, rows - row0);
    if (nr <= 0) return;
    float acc[R][1];
    for (int r = 0; r < R; ++r) acc[r][0] = 0.0f;
    if (jobs.ty[j] == FMT_Q4_K) rows_pf<R, false>(jobs.w[j], row0, nr, rows, a, acc);
    else if (jobs.ty[j] == FMT_Q5_K) rows_pf<R, true>(jobs.w[j], row0, nr, rows, a, acc);
    else rows_dot<1, R>(jobs.ty[j], jobs.w[j], row0, nr, rows, a, acc);
    for (int r = 0; r < R; ++r) {
        const float v = warp_sum(acc[r][0]);
        if (r < nr && threadIdx.x % WARP == 0) jobs.y[j][row0 + r] = v;
    }
}
template <int R, int MINB, int PF>
__global__ void __launch_bounds__(128, MINB) lab_mv(MatvecJobs jobs, ACT_ARGS) {
    lab_warp<R, PF>(jobs, (blockIdx.x * 4 + threadIdx.x / WARP) * R, ACT);
}
template <int R, int MINB, int PF>
__global__ void __launch_bounds__(128, MINB) lab_silu(SILU_ARGS, ACT_ARGS) {
    silu_warp<1, R>(wg, tyg, wu, tyu, y, rows, (blockIdx.x * 4 + threadIdx.x / WARP) * R, ACT, 0);
}
// The bandwidth roof: each thread xors 4 x 16 bytes per round of a contiguous range.
__global__ void read_roof(const uint4* __restrict__ p, size_t n, unsigned* out) {
    unsigned x = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
        x ^= a.x ^ b.y ^ c.z ^ d.w ^ a.w ^ b.x ^ c.y ^ d.z;
    }
    for (; i < n; i += stride) x ^= p[i].x;
    if (x == 0x12345678u) *out = x;
}

static int g_sms;
static std::mt19937_64 rng(12345);

static uint16_t f2h(float f) { __half h = __float2half(f); return *(uint16_t*)&h; }

// One matrix in the device layout (GGUF blocks for Q4_K/Q5_K; planes for Q6_K/Q8_0).
static std::vector<uint8_t> make_matrix(int ty, int rows, int K) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> dd(0.0005f, 0.004f);
    size_t nb = K / 256;
    std::vector<uint8_t> v;
    if (ty == FMT_Q4_K || ty == FMT_Q5_K) {
        size_t bs = ty == FMT_Q4_K ? 144 : 176;
        v.resize(rows * nb * bs);
        for (auto& b : v) b = byte(rng);
        for (size_t i = 0; i < rows * nb; ++i) {
            uint16_t d = f2h(dd(rng)), m = f2h(dd(rng));
            memcpy(&v[i * bs], &d, 2);
            memcpy(&v[i * bs + 2], &m, 2);
        }
    } else if (ty == FMT_Q6_K) {
        v.resize(rows * nb * 210);
        for (auto& b : v) b = byte(rng);
        uint8_t* dc = &v[rows * nb * 208];
        for (size_t i = 0; i < rows * nb; ++i) { uint16_t d = f2h(dd(rng)); memcpy(dc + 2 * i, &d, 2); }
    } else if (ty == FMT_Q8_0) {
        v.resize((size_t)rows * K + (size_t)rows * (K / 32) * 2);
        for (auto& b : v) b = byte(rng);
        uint8_t* dc = &v[(size_t)rows * K];
        for (size_t i = 0; i < (size_t)rows * (K / 32); ++i) { uint16_t d = f2h(dd(rng)); memcpy(dc + 2 * i, &d, 2); }
    } else { // F16
        v.resize((size_t)rows * K * 2);
        std::uniform_real_distribution<float> w(-0.05f, 0.05f);
        for (size_t i = 0; i < (size_t)rows * K; ++i) { uint16_t h = f2h(w(rng)); memcpy(&v[2 * i], &h, 2); }
    }
    return v;
}

struct Mat { int ty, rows; size_t bytes; std::vector<uint8_t*> copies; };
struct Case { std::string name; int K; std::vector<Mat> mats; bool silu; bool timed; };

static Mat upload(int ty, int rows, int K, int copies) {
    Mat m{ty, rows, 0, {}};
    std::vector<uint8_t> h = make_matrix(ty, rows, K);
    m.bytes = h.size();
    for (int c = 0; c < copies; ++c) {
        uint8_t* d; CK(cudaMalloc(&d, h.size()));
        CK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
        m.copies.push_back(d);
    }
    return m;
}

struct ActBufs { int8_t* xq; float2* xds; float* xf; };

template <typename F>
static float time_it(F&& launch, int ncopies, int reps) {
    for (int i = 0; i < 3; ++i) launch(i % ncopies);
    CK(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    cudaEventCreate(&a); cudaEventCreate(&b);
    cudaEventRecord(a);
    for (int i = 0; i < reps; ++i) launch(i % ncopies);
    cudaEventRecord(b);
    CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b);
    CK(cudaGetLastError());
    return ms * 1000.0f / reps;
}

static int total_rows(const Case& c) { int t = 0; for (auto& m : c.mats) t += m.rows; return t; }

// Outputs: one float buffer per matrix.
static void run_v6(const Case& c, int copy, const ActBufs& x, std::vector<float*>& y) {
    if (c.silu) {
        const Mat &g = c.mats[0], &u = c.mats[1];
        v6::matvec_silu_1<<<(g.rows + 15) / 16, 128>>>(g.copies[copy], g.ty, u.copies[copy], u.ty, y[0], g.rows,
                                                        x.xq, x.xds, x.xf, c.K, 1, 0);
        return;
    }
    v6::MatvecJobs j{};
    int total = 0;
    for (size_t i = 0; i < c.mats.size(); ++i) {
        j.w[i] = c.mats[i].copies[copy]; j.y[i] = y[i]; j.rows[i] = c.mats[i].rows; j.ty[i] = c.mats[i].ty;
        j.start[i] = total; total += (c.mats[i].rows + 3) / 4 * 4;
    }
    j.njobs = c.mats.size(); j.start[c.mats.size()] = total;
    v6::matvec_1<<<(total + 15) / 16, 128>>>(j, x.xq, x.xds, x.xf, c.K, 1, 0);
}

template <int R, int MINB, int PF>
static void run_rv(const Case& c, int copy, const ActBufs& x, std::vector<float*>& y, int) {
    if (c.silu) {
        const Mat &g = c.mats[0], &u = c.mats[1];
        lab_silu<R, MINB, PF><<<(g.rows + 4 * R - 1) / (4 * R), 128>>>(g.copies[copy], g.ty, u.copies[copy], u.ty, y[0],
                                                                     g.rows, x.xq, x.xds, x.xf, c.K, 1, 0);
        return;
    }
    MatvecJobs j{};
    int total = 0;
    for (size_t i = 0; i < c.mats.size(); ++i) {
        j.w[i] = c.mats[i].copies[copy]; j.y[i] = y[i]; j.rows[i] = c.mats[i].rows; j.ty[i] = c.mats[i].ty;
        j.start[i] = total; total += (c.mats[i].rows + 3) / 4 * 4;
    }
    j.njobs = c.mats.size(); j.start[c.mats.size()] = total;
    lab_mv<R, MINB, PF><<<(total + 4 * R - 1) / (4 * R), 128>>>(j, x.xq, x.xds, x.xf, c.K, 1, 0);
}

struct Variant { const char* name; void (*fn)(const Case&, int, const ActBufs&, std::vector<float*>&, int); };
#define V(R, M, P) Variant{"R" #R "M" #M "P" #P, [](const Case& c, int k, const ActBufs& x, std::vector<float*>& y, int r) { run_rv<R, M, P>(c, k, x, y, r); }}

int main() {
    cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0)); g_sms = p.multiProcessorCount;
    printf("device %s, %d SMs, L2 %d MB\n", p.name, g_sms, p.l2CacheSize >> 20);
    const Variant variants[] = {V(4, 1, 1), V(4, 5, 1), V(2, 1, 1), V(2, 6, 1), V(2, 8, 1), V(1, 8, 1), V(2, 4, 2), V(2, 6, 2), V(4, 1, 2), V(1, 8, 2)};
    const int nv = sizeof(variants) / sizeof(variants[0]);
    for (int v = 0; v < nv; ++v) {
        int r = 0; cudaFuncAttributes fa{};
        (void)r; (void)fa;
    }
    // Activation buffers large enough for K = 19968 (one column).
    const int KMAX = 19968;
    ActBufs x;
    {
        std::vector<int8_t> q(KMAX); std::vector<float2> ds(KMAX / 32); std::vector<float> xf(KMAX);
        std::uniform_int_distribution<int> qi(-127, 127); std::uniform_real_distribution<float> df(0.001f, 0.01f), f(-1, 1);
        for (auto& e : q) e = qi(rng);
        for (int b = 0; b < KMAX / 32; ++b) { int s = 0; for (int i = 0; i < 32; ++i) s += q[32 * b + i]; float d = df(rng); ds[b] = make_float2(d, d * s); }
        for (auto& e : xf) e = f(rng);
        CK(cudaMalloc(&x.xq, KMAX)); CK(cudaMalloc(&x.xds, KMAX / 32 * 8)); CK(cudaMalloc(&x.xf, KMAX * 4));
        CK(cudaMemcpy(x.xq, q.data(), KMAX, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(x.xds, ds.data(), KMAX / 32 * 8, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(x.xf, xf.data(), KMAX * 4, cudaMemcpyHostToDevice));
    }
    struct Spec { const char* name; int K; std::vector<std::pair<int, int>> mats; bool silu; bool timed; };
    const Spec specs[] = {
        {"q4k ffn_gate 19968x6656", 6656, {{FMT_Q4_K, 19968}}, false, true},
        {"q4k ffn_down 6656x19968", 19968, {{FMT_Q4_K, 6656}}, false, true},
        {"q4k attn_q 4096x6656", 6656, {{FMT_Q4_K, 4096}}, false, true},
        {"q4k attn_out 6656x4096", 4096, {{FMT_Q4_K, 6656}}, false, true},
        {"q4k q+k+v6+gate x6656", 6656, {{FMT_Q4_K, 4096}, {FMT_Q4_K, 256}, {FMT_Q6_K, 256}, {FMT_Q4_K, 4096}}, false, true},
        {"q6k ffn_down 6656x19968", 19968, {{FMT_Q6_K, 6656}}, false, true},
        {"q6k ffn_gate 19968x6656", 6656, {{FMT_Q6_K, 19968}}, false, true},
        {"q5k output 202048x6656", 6656, {{FMT_Q5_K, 202048}}, false, true},
        {"q6k output 202048x6656", 6656, {{FMT_Q6_K, 202048}}, false, true},
        {"q4k silu gate+up 19968x6656", 6656, {{FMT_Q4_K, 19968}, {FMT_Q4_K, 19968}}, true, true},
        {"q5k q6k silu 1000x2560", 2560, {{FMT_Q5_K, 1000}, {FMT_Q6_K, 1000}}, true, false},
        {"odd q4k 37x512", 512, {{FMT_Q4_K, 37}}, false, false},
        {"odd q5k 5x256", 256, {{FMT_Q5_K, 5}}, false, false},
        {"odd q6k 13x768 + q4k 3x768", 768, {{FMT_Q6_K, 13}, {FMT_Q4_K, 3}}, false, false},
        {"odd q8_0 33x96", 96, {{FMT_Q8_0, 33}}, false, false},
        {"odd f16 19x64 + q6k... f16 only", 64, {{FMT_F16, 19}}, false, false},
        {"q8_0 4096x6656", 6656, {{FMT_Q8_0, 4096}}, false, true},
    };
    unsigned* roof_out; CK(cudaMalloc(&roof_out, 4));
    printf("\n| case | MB | v6 us | v6 GB/s | roof GB/s |");
    for (int v = 0; v < nv; ++v) printf(" %s GB/s |", variants[v].name);
    printf(" bits |\n");
    for (const Spec& sp : specs) {
        Case c{sp.name, sp.K, {}, sp.silu, sp.timed};
        size_t bytes = 0;
        for (auto& m : sp.mats) bytes += make_matrix(m.first, 1, sp.K).size() * (size_t)m.second;
        int copies = sp.timed ? (int)std::max<size_t>(1, (400u << 20) / bytes) : 1;
        if (copies > 8) copies = 8;
        for (auto& m : sp.mats) c.mats.push_back(upload(m.first, m.second, sp.K, copies));
        std::vector<float*> y0, y1;
        for (auto& m : c.mats) {
            float *a, *b; CK(cudaMalloc(&a, m.rows * 4)); CK(cudaMalloc(&b, m.rows * 4)); y0.push_back(a); y1.push_back(b);
        }
        int nout = c.silu ? 1 : (int)c.mats.size();
        run_v6(c, 0, x, y0);
        CK(cudaDeviceSynchronize());
        std::vector<std::vector<float>> ref(nout);
        for (int i = 0; i < nout; ++i) { ref[i].resize(c.mats[i].rows); CK(cudaMemcpy(ref[i].data(), y0[i], c.mats[i].rows * 4, cudaMemcpyDeviceToHost)); }
        std::string bits;
        std::vector<float> us(nv, 0.0f);
        for (int v = 0; v < nv; ++v) {
            for (int i = 0; i < nout; ++i) CK(cudaMemset(y1[i], 0xFF, c.mats[i].rows * 4));
            variants[v].fn(c, 0, x, y1, 0);
            CK(cudaDeviceSynchronize());
            bool same = true;
            for (int i = 0; i < nout; ++i) {
                std::vector<float> o(c.mats[i].rows);
                CK(cudaMemcpy(o.data(), y1[i], o.size() * 4, cudaMemcpyDeviceToHost));
                if (memcmp(o.data(), ref[i].data(), o.size() * 4) != 0) {
                    same = false;
                    for (size_t r = 0; r < o.size(); ++r) if (memcmp(&o[r], &ref[i][r], 4)) { printf("  %s %s: mat %d row %zu: %g vs v6 %g\n", sp.name, variants[v].name, i, r, o[r], ref[i][r]); break; }
                }
            }
            bits += same ? "=" : "X";
            if (sp.timed) us[v] = time_it([&](int k) { variants[v].fn(c, k, x, y1, 0); }, copies, 30);
        }
        float us6 = 0, usr = 0;
        if (sp.timed) {
            us6 = time_it([&](int k) { run_v6(c, k, x, y0); }, copies, 30);
            // roof: read the first matrix's copies
            const Mat& m0 = c.mats[0];
            size_t n16 = m0.bytes / 16;
            usr = time_it([&](int k) { read_roof<<<g_sms * 8, 512>>>((const uint4*)m0.copies[k], n16, roof_out); }, copies, 30);
            usr = usr * (float)bytes / (float)m0.bytes; // scale to the case's bytes
        }
        printf("| %s | %.1f | %.1f | %.0f | %.0f |", sp.name, bytes / 1e6, us6, sp.timed ? bytes / us6 / 1e3 : 0, sp.timed ? bytes / usr / 1e3 : 0);
        for (int v = 0; v < nv; ++v) printf(" %.0f |", sp.timed ? bytes / us[v] / 1e3 : 0);
        printf(" %s |\n", bits.c_str());
        fflush(stdout);
        for (auto& m : c.mats) for (auto d : m.copies) cudaFree(d);
        for (auto a : y0) cudaFree(a);
        for (auto a : y1) cudaFree(a);
    }
    // occupancy of the variants
    printf("\nresident blocks per SM:");
#define OCC(R, M, P) { int r; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r, lab_mv<R, M, P>, 128, 0); cudaFuncAttributes fa; cudaFuncGetAttributes(&fa, lab_mv<R, M, P>); printf(" R%dM%dP%d: %d warps, %d regs, %d B local;", R, M, P, r * 4, fa.numRegs, (int)fa.localSizeBytes); }
    OCC(4, 1, 1) OCC(4, 5, 1) OCC(2, 1, 1) OCC(2, 6, 1) OCC(2, 8, 1) OCC(1, 8, 1) OCC(2, 4, 2) OCC(2, 6, 2) OCC(4, 1, 2) OCC(1, 8, 2)
    printf("\n");
    return 0;
}
