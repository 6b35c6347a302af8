// Matvec lab, runs 4 and 5 (issue 6): the decode-group kernels on the integer tensor cores (matvec_mma,
// matvec_silu_mma, v8 of matvec.cu) against the dp4a group kernels (matvec_cols,
// matvec_silu_cols) at the Glimmer shapes, and the bit check of batch invariance: for every
// column count in NS and every column, the group kernel's output must equal bit for bit what
// matvec_1 (matvec_silu_1) gives that column alone (row-major activation, one column), while the
// group kernels read the k-major layout of the whole group. Build and run: bash
// scripts/matvec_lab/run_mma.sh (nvcc, sm_90). SYNTAX_ONLY=1 lets g++ check the host code.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <random>
#include <string>
#include <algorithm>
#include <cuda_runtime.h>
#ifndef SYNTAX_ONLY
#include "common.cuh"
#include "matvec.cu"
#define LAUNCH(k, grid, block, ...) k<<<grid, block>>>(__VA_ARGS__)
#else
#include <cstdint>
#include <cuda_fp16.h>
#define FMT_Q4_K 4
#define FMT_Q5_K 5
struct MatvecJobs { const uint8_t* w[4]; float* y[4]; int rows[4]; int ty[4]; int start[5]; int njobs; };
#define ACT_ARGS const int8_t* xq, const float2* xds, const float* xf, int K, int ncols, int kmajor
#define SILU_ARGS const uint8_t* wg, int tyg, const uint8_t* wu, int tyu, float* y, int rows
void matvec_1(MatvecJobs, ACT_ARGS); void matvec_cols(MatvecJobs, ACT_ARGS); void matvec_mma(MatvecJobs, ACT_ARGS);
void matvec_silu_1(SILU_ARGS, ACT_ARGS); void matvec_silu_cols(SILU_ARGS, ACT_ARGS); void matvec_silu_mma(SILU_ARGS, ACT_ARGS);
#define LAUNCH(k, grid, block, ...) ((void)(grid), (void)(block), k(__VA_ARGS__))
#endif

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); exit(1); } } while (0)

static std::mt19937_64 rng(12345);
static uint16_t f2h(float f) { __half h = __float2half(f); uint16_t u; memcpy(&u, &h, 2); return u; }

static std::vector<uint8_t> make_matrix(int ty, int rows, int K) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> dd(0.0005f, 0.004f);
    const size_t nb = K / 256, bs = ty == FMT_Q4_K ? 144 : 176;
    std::vector<uint8_t> v((size_t)rows * nb * bs);
    for (auto& b : v) b = (uint8_t)byte(rng);
    for (size_t i = 0; i < (size_t)rows * nb; ++i) {
        const uint16_t d = f2h(dd(rng)), m = f2h(dd(rng));
        memcpy(&v[i * bs], &d, 2);
        memcpy(&v[i * bs + 2], &m, 2);
    }
    return v;
}

struct Mat { int ty, rows; size_t bytes; std::vector<uint8_t*> copies; std::vector<float*> y0, y1; };
struct Spec { const char* name; int K; std::vector<std::pair<int, int>> mats; bool silu; bool timed; };

static const int NCMAX = 64, KMAX = 19968;
struct Acts { int8_t *rm, *km; float2* ds; float* xf; };

// Column c's activation, alone and row-major (the one-column kernels' input).
static void run_one(const Spec& sp, std::vector<Mat>& m, const Acts& x, int c, int copy) {
    const int K = sp.K;
    const int8_t* xq = x.rm + (size_t)c * K;
    const float2* xds = x.ds + (size_t)c * (K / 32);
    if (sp.silu) {
        LAUNCH(matvec_silu_1, (m[0].rows + 15) / 16, 128, m[0].copies[copy], m[0].ty, m[1].copies[copy], m[1].ty,
               m[0].y0[0] + (size_t)c * m[0].rows, m[0].rows, xq, xds, x.xf, K, 1, 0);
        return;
    }
    MatvecJobs j{};
    int total = 0;
    for (size_t i = 0; i < m.size(); ++i) {
        j.w[i] = m[i].copies[copy]; j.y[i] = m[i].y0[0] + (size_t)c * m[i].rows; j.rows[i] = m[i].rows; j.ty[i] = m[i].ty;
        j.start[i] = total; total += (m[i].rows + 3) / 4 * 4;
    }
    j.njobs = (int)m.size(); j.start[m.size()] = total;
    LAUNCH(matvec_1, (total + 15) / 16, 128, j, xq, xds, x.xf, K, 1, 0);
}

// The group kernel (mma or the dp4a one) for columns 0 .. n - 1 into y1, the activation k-major
// (km, as the dp4a kernel reads it) or row-major.
static void run_group(const Spec& sp, std::vector<Mat>& m, const Acts& x, int n, bool mma, int copy, bool km = true) {
    const int K = sp.K, pad = mma ? 16 : 4;
    const int8_t* xq = km ? x.km : x.rm;
    const int kmf = km ? 1 : 0;
    const int ncg = (n + 7) / 8, row_warps = std::max(4 / ncg, 1);
    int mcg = (std::min(n, 32) + 7) / 8; if (mcg == 3) mcg = 4;
    const dim3 mblock(128 * mcg);
    if (sp.silu) {
        const int rows = m[0].rows;
        if (mma)
            LAUNCH(matvec_silu_mma, dim3((n + 31) / 32, (rows + 15) / 16), mblock, m[0].copies[copy], m[0].ty,
                   m[1].copies[copy], m[1].ty, m[0].y1[0], rows, xq, x.ds, x.xf, K, n, kmf);
        else
            LAUNCH(matvec_silu_cols, (rows + row_warps * 4 - 1) / (row_warps * 4), 32 * ncg * row_warps, m[0].copies[copy],
                   m[0].ty, m[1].copies[copy], m[1].ty, m[0].y1[0], rows, x.km, x.ds, x.xf, K, n, 1);
        return;
    }
    MatvecJobs j{};
    int total = 0;
    for (size_t i = 0; i < m.size(); ++i) {
        j.w[i] = m[i].copies[copy]; j.y[i] = m[i].y1[0]; j.rows[i] = m[i].rows; j.ty[i] = m[i].ty;
        j.start[i] = total; total += (m[i].rows + pad - 1) / pad * pad;
    }
    j.njobs = (int)m.size(); j.start[m.size()] = total;
    if (mma) LAUNCH(matvec_mma, dim3((n + 31) / 32, (total + 15) / 16), mblock, j, xq, x.ds, x.xf, K, n, kmf);
    else LAUNCH(matvec_cols, (total + row_warps * 4 - 1) / (row_warps * 4), 32 * ncg * row_warps, j, x.km, x.ds, x.xf, K, n, 1);
}

template <typename F>
static float time_it(F&& launch, int ncopies, int reps) {
    for (int i = 0; i < 2; ++i) launch(i % ncopies);
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

int main() {
    cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0));
    printf("device %s, %d SMs\n", p.name, p.multiProcessorCount);
    // The activation of 64 columns of up to KMAX values: int8 row-major and k-major, (d, d * sum).
    Acts x;
    {
        std::vector<int8_t> q((size_t)NCMAX * KMAX);
        std::uniform_int_distribution<int> qi(-127, 127);
        std::uniform_real_distribution<float> df(0.001f, 0.01f);
        for (auto& e : q) e = (int8_t)qi(rng);
        std::vector<float2> ds((size_t)NCMAX * KMAX / 32);
        for (size_t b = 0; b < ds.size(); ++b) {
            int s = 0;
            for (int i = 0; i < 32; ++i) s += q[32 * b + i];
            const float d = df(rng);
            ds[b] = make_float2(d, d * (float)s);
        }
        CK(cudaMalloc(&x.rm, q.size())); CK(cudaMalloc(&x.km, q.size()));
        CK(cudaMalloc(&x.ds, ds.size() * 8)); CK(cudaMalloc(&x.xf, (size_t)NCMAX * KMAX * 4));
        CK(cudaMemset(x.xf, 0, (size_t)NCMAX * KMAX * 4));
        CK(cudaMemcpy(x.rm, q.data(), q.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(x.ds, ds.data(), ds.size() * 8, cudaMemcpyHostToDevice));
    }
    const int NS[] = {2, 3, 5, 8, 9, 16, 17, 24, 31, 32, 33, 48, 64};
    const int NT[] = {8, 16, 32, 64};
    const Spec specs[] = {
        {"odd q4k 37x512", 512, {{FMT_Q4_K, 37}}, false, false},
        {"odd q5k 5x256", 256, {{FMT_Q5_K, 5}}, false, false},
        {"jobs q5k 21x768 + q4k 40x768", 768, {{FMT_Q5_K, 21}, {FMT_Q4_K, 40}}, false, false},
        {"silu q5k/q4k 1000x2560", 2560, {{FMT_Q5_K, 1000}, {FMT_Q4_K, 1000}}, true, false},
        {"silu q4k 19x256", 256, {{FMT_Q4_K, 19}, {FMT_Q4_K, 19}}, true, false},
        {"q4k ffn_gate 19968x6656", 6656, {{FMT_Q4_K, 19968}}, false, true},
        {"q4k ffn_down 6656x19968", 19968, {{FMT_Q4_K, 6656}}, false, true},
        {"q4k q+k+gate 4096+256+4096 x6656", 6656, {{FMT_Q4_K, 4096}, {FMT_Q4_K, 256}, {FMT_Q4_K, 4096}}, false, true},
        {"q4k attn_out 6656x4096", 4096, {{FMT_Q4_K, 6656}}, false, true},
        {"q4k silu gate+up 19968x6656", 6656, {{FMT_Q4_K, 19968}, {FMT_Q4_K, 19968}}, true, true},
        {"q5k output (part) 50512x6656", 6656, {{FMT_Q5_K, 50512}}, false, true},
    };
    int fails = 0;
    for (const Spec& sp : specs) {
        const int K = sp.K;
        // k-major copy of the activation at this K (xq16's layout in matvec.cu)
        {
            std::vector<int8_t> rm((size_t)NCMAX * K), km((size_t)NCMAX * K);
            std::vector<int8_t> all((size_t)NCMAX * KMAX);
            CK(cudaMemcpy(all.data(), x.rm, all.size(), cudaMemcpyDeviceToHost));
            for (int c = 0; c < NCMAX; ++c)
                for (int v = 0; v < K; ++v) {
                    const size_t dst = (size_t)c * K + ((size_t)((v >> 4) & 3) * (K >> 6) + (v >> 6)) * 16 + (v & 15);
                    km[dst] = all[(size_t)c * K + v];
                }
            CK(cudaMemcpy(x.km, km.data(), km.size(), cudaMemcpyHostToDevice));
        }
        size_t bytes = 0;
        for (auto& mm : sp.mats) bytes += make_matrix(mm.first, 1, K).size() * (size_t)mm.second;
        int copies = sp.timed ? (int)std::max<size_t>(1, (400u << 20) / bytes) : 1;
        copies = std::min(copies, 8);
        std::vector<Mat> m;
        for (auto& mm : sp.mats) {
            Mat t{mm.first, mm.second, 0, {}, {}, {}};
            std::vector<uint8_t> h = make_matrix(mm.first, mm.second, K);
            t.bytes = h.size();
            for (int c = 0; c < copies; ++c) {
                uint8_t* d; CK(cudaMalloc(&d, h.size()));
                CK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
                t.copies.push_back(d);
            }
            float *a, *b;
            CK(cudaMalloc(&a, (size_t)NCMAX * t.rows * 4)); CK(cudaMalloc(&b, (size_t)NCMAX * t.rows * 4));
            t.y0.push_back(a); t.y1.push_back(b);
            m.push_back(t);
        }
        const int nout = sp.silu ? 1 : (int)m.size();
        for (int c = 0; c < NCMAX; ++c) run_one(sp, m, x, c, 0);
        CK(cudaDeviceSynchronize());
        CK(cudaGetLastError());
        std::vector<std::vector<float>> ref(nout);
        for (int i = 0; i < nout; ++i) {
            ref[i].resize((size_t)NCMAX * m[i].rows);
            CK(cudaMemcpy(ref[i].data(), m[i].y0[0], ref[i].size() * 4, cudaMemcpyDeviceToHost));
        }
        std::string bits;
        for (int kind = 0; kind < 3; ++kind) {
            bits += kind == 0 ? " cols " : kind == 1 ? " mma " : " mma-rowmajor ";
            for (int n : NS) {
                if (kind == 0 && n != 8 && n != 33) continue; // the shipped kernel: a sanity check
                for (int i = 0; i < nout; ++i) CK(cudaMemset(m[i].y1[0], 0xFF, (size_t)NCMAX * m[i].rows * 4));
                run_group(sp, m, x, n, kind >= 1, 0, kind < 2);
                CK(cudaDeviceSynchronize());
                CK(cudaGetLastError());
                bool same = true;
                for (int i = 0; i < nout && same; ++i) {
                    std::vector<float> o((size_t)n * m[i].rows);
                    CK(cudaMemcpy(o.data(), m[i].y1[0], o.size() * 4, cudaMemcpyDeviceToHost));
                    for (size_t e = 0; e < o.size(); ++e)
                        if (memcmp(&o[e], &ref[i][e], 4)) {
                            printf("  %s kind %d n=%d: mat %d col %zu row %zu: %.9g vs matvec_1 %.9g\n", sp.name,
                                   kind, n, i, e / m[i].rows, e % m[i].rows, o[e], ref[i][e]);
                            same = false;
                            break;
                        }
                }
                bits += same ? "=" : "X";
                fails += !same;
            }
        }
        printf("%-36s %7.1f MB bits%s\n", sp.name, bytes / 1e6, bits.c_str());
        if (sp.timed) {
            for (int n : NT) {
                const float tc = time_it([&](int k) { run_group(sp, m, x, n, false, k); }, copies, 20);
                const float tm = time_it([&](int k) { run_group(sp, m, x, n, true, k); }, copies, 20);
                const float tr = time_it([&](int k) { run_group(sp, m, x, n, true, k, false); }, copies, 20);
                printf("    n=%2d  cols %8.1f us %6.0f GB/s | mma %8.1f us %6.0f GB/s | mma row-major %8.1f us %6.0f GB/s | x%.2f\n",
                       n, tc, bytes / tc / 1e3, tm, bytes / tm / 1e3, tr, bytes / tr / 1e3, tc / std::min(tm, tr));
            }
            const float t1 = time_it([&](int k) { run_one(sp, m, x, 0, k); }, copies, 20);
            printf("    n= 1  matvec_1 %8.1f us %6.0f GB/s\n", t1, bytes / t1 / 1e3);
        }
        fflush(stdout);
        for (auto& t : m) {
            for (auto d : t.copies) cudaFree(d);
            cudaFree(t.y0[0]); cudaFree(t.y1[0]);
        }
    }
    printf("bit mismatches: %d\n", fails);
    return fails != 0;
}
