/* test_cuda_emu.cc — kernels/cuda's arithmetic checked without a GPU: the .cu files, with
 * their host launchers stripped (strip.py, at build time), compile as host C++ against
 * fake/cuda_runtime.h, whose emulator runs one fiber per CUDA thread (__syncthreads
 * and warp shuffles on barriers, blocks one after another). Compared with the CPU backend
 * (attention over paged f32/f16 caches at head_dim 64/128/256 and GQA 8/2, 8/1, 6/3, 9/3
 * with 1..64 splits; RMSNorm; RoPE normal and NeoX, partial), with engine/weights/quant.c and the
 * gguf package's fixtures (dequantization of every type, GEMV at 1/3/8 tokens), with a
 * reference of cuBLAS's definition (GemmEx argument order), the fused cuda_matmul_n (gemm.cu's
 * own host code on emulated launchers) with the unfused ops and with BF16 weight copies, and
 * with the host sampler (argmax ties and NaN, every filter, the same token for the same u;
 * token masks and logit_bias);
 * the fused rope_kv kernel bit for bit against k_rope + k_kv_write, and against the CPU
 * backend's rope_kv. What it cannot see: real scheduling, memory-model races beyond
 * barriers, cuBLAS itself, speed.
 * Written by a desk-check of the CUDA backend before its first GPU run (2026-12-02).
 *
 *   build/tests/test_cuda_emu [dequant|gemv|mmq|matmul_n|elementwise|attention|attention_tc|rope|
 *                              sample|samplehost] */
#include "gen/dequant.cc"
/* gemm.cu launches its GEMV kernels through GEMV_LAUNCH (stripped with its <<<>>>): here they
 * run on the emulator, counted, so the host code choosing them runs as written. */
static int emu_gemv_launches;
#define GEMV_LAUNCH(kernel, grid, stream, ...)                                                     \
    (emu_gemv_launches++, emu_launch(dim3(grid), dim3(GEMV_WARPS * 32), [&] { kernel(__VA_ARGS__); }))
static int emu_qx_launches, emu_mmq_launches, emu_mmt_launches; /* mmq: k_mmq and k_mmq_tc */
#define MMQ_LAUNCH(kernel, grid, stream, ...)                                                      \
    (emu_mmq_launches++, emu_launch(dim3(grid), dim3(MMQ_THREADS), [&] { kernel(__VA_ARGS__); }))
#define MMT_LAUNCH(kernel, grid, stream, ...)                                                      \
    (emu_mmq_launches++, emu_mmt_launches++,                                                       \
     emu_launch(dim3(grid), dim3(MMT_THREADS), [&] { kernel(__VA_ARGS__); }))
#define QX_LAUNCH(grid, stream, ...)                                                               \
    (emu_qx_launches++, emu_launch(dim3(grid), dim3(QX_WARPS * 32), [&] { k_quant_x(__VA_ARGS__); }))
#include "gen/gemm.cc"
#include "gen/elementwise.cc"
#include "gen/attention.cc"
#include "gen/sample.cc"
#include <cstdio>
#include <cstdlib>
#include <string>
extern "C" {
#include "engine/weights/gguf.h"
#include "engine/weights/quant.h"
#include "kernels/backend.h"
#include "kernels/cuda/step_plan.h"
#include "common/util.h"
#include "engine/sampler.h"
/* kernels/cpu/matmul_scalar.c: the CPU backend's activation quantization (the reference) */
void cpu_quant_q8_32_scalar(const float *x, int cols, int8_t *q, float *d, float *s);
}

static int fails = 0;
#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand() {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* ---- dequant against the gguf package fixtures ---- */
static void test_dequant() {
    const char *names[] = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"};
    for (auto nm : names) {
        std::string path = std::string(MEDLEY_FIXTURES "/gguf/dequant_") + nm + ".bin";
        char *buf; size_t len; md_err e = {};
        if (md_read_file(path.c_str(), 0, &buf, &len, &e)) { printf("%s\n", e.msg); fails++; continue; }
        uint32_t hdr[3]; memcpy(hdr, buf + 4, 12);
        int type = hdr[0]; uint32_t n = hdr[1];
        size_t off = 16 + (hdr[2] ? (size_t)n * 4 : 0);
        const uint8_t *raw = (const uint8_t *)buf + off;
        off += md_type_row_bytes(type, n);
        const float *ref = (const float *)(buf + off);
        std::vector<float> y(n);
        int64_t ng = n / 32;
        QT_DISPATCH(type, emu_launch(dim3(cuda_blocks(ng, 128)), dim3(128), [&] { k_dequant<QT>(raw, y.data(), CUDA_F32, ng); }));
        int bad = 0;
        for (uint32_t i = 0; i < n; i++)
            if (!(fabsf(y[i] - ref[i]) <= 1e-6f * fabsf(ref[i]) + 1e-12f)) bad++;
        CHECK(bad == 0, "dequant %s: %d of %u differ", nm, bad, n);
        /* get_rows over the same data viewed as rows of 256 */
        int dim = 256; int64_t rows = n / dim;
        if (rows >= 2) {
            int32_t ids[3] = {1, 0, (int32_t)rows - 1};
            std::vector<float> o(3 * dim);
            size_t rb = md_type_row_bytes(type, dim);
            QT_DISPATCH(type, emu_launch(dim3(cuda_blocks(3 * dim / 32, 128)), dim3(128), [&] {
                k_get_rows<QT>(raw, rb, rows, dim, ids, 3, o.data(), nullptr); }));
            int bad2 = 0;
            for (int t = 0; t < 3; t++) for (int j = 0; j < dim; j++)
                if (o[t * dim + j] != y[(size_t)ids[t] * dim + j]) bad2++;
            CHECK(bad2 == 0, "get_rows %s: %d differ", nm, bad2);
        }
        printf("dequant %-5s n=%u: %s\n", nm, n, bad ? "MISMATCH" : "matches gguf package");
        free(buf);
    }
}

/* ---- x quantized for the quantized GEMV: k_quant_x against the CPU backend's ---- */
static bool is_quant(int type) { return type != MD_TYPE_F32 && type != MD_TYPE_F16 && type != MD_TYPE_BF16; }

/* k_quant_x on the emulator: x [m][k] into q [m][k] + d [m][k/32] (one buffer, as gemm.cu). */
static void quant_x(const float *x, int m, int k, std::vector<uint8_t> &buf) {
    buf.assign(qx_bytes(m, k) + 64, 0);
    int8_t *q = (int8_t *)buf.data();
    float *d = (float *)(buf.data() + (size_t)m * k);
    int64_t nb = (int64_t)m * (k / 32);
    emu_launch(dim3(cuda_blocks(nb, QX_WARPS)), dim3(QX_WARPS * 32), [&] { k_quant_x(x, q, d, nb); });
}
/* x as the quantized GEMV sees it: q * d per element */
static std::vector<float> x_seen(const float *x, int m, int k) {
    std::vector<uint8_t> buf;
    quant_x(x, m, k, buf);
    const int8_t *q = (const int8_t *)buf.data();
    const float *d = (const float *)(buf.data() + (size_t)m * k);
    std::vector<float> xs((size_t)m * k);
    for (size_t i = 0; i < xs.size(); i++) xs[i] = q[i] * d[i / 32];
    return xs;
}

static void test_quant_x() {
    const int m = 3, k = 256, nb = m * k / 32;
    std::vector<float> x((size_t)m * k);
    for (auto &v : x) v = 3.0f * frand();
    for (int i = 0; i < 32; i++) x[32 + i] = 0.0f;            /* block 1: zeros */
    x[70] = 0.5f, x[71] = -0.5f;                               /* ties at amax/254 steps */
    std::vector<uint8_t> buf;
    quant_x(x.data(), m, k, buf);
    const int8_t *q = (const int8_t *)buf.data();
    const float *d = (const float *)(buf.data() + (size_t)m * k);
    std::vector<int8_t> cq((size_t)m * k);
    std::vector<float> cd(nb), cs(nb);
    for (int r = 0; r < m; r++)
        cpu_quant_q8_32_scalar(x.data() + (size_t)r * k, k, cq.data() + (size_t)r * k, cd.data() + r * (k / 32), cs.data() + r * (k / 32));
    CHECK(memcmp(q, cq.data(), cq.size()) == 0, "quant_x: int8 differ from cpu_quant_q8_32");
    CHECK(memcmp(d, cd.data(), cd.size() * 4) == 0, "quant_x: scales differ from cpu_quant_q8_32");
    CHECK(d[1] == 0.0f, "quant_x: a zero block has scale %g", d[1]);
    /* a NaN or an infinity: the block's scale is NaN (products come out NaN), others intact */
    x[5] = NAN;
    x[100] = INFINITY;
    quant_x(x.data(), m, k, buf);
    d = (const float *)(buf.data() + (size_t)m * k);
    CHECK(std::isnan(d[0]) && std::isnan(d[3]) && d[2] == cd[2], "quant_x: non-finite blocks %g %g, block 2 %g (want %g)", d[0], d[3], d[2], cd[2]);
    printf("quant_x: int8 and scales equal cpu_quant_q8_32's bit for bit; NaN/inf blocks get a NaN scale\n");
}

/* ---- GEMV every type vs double reference ---- */
static void test_gemv() {
    const int types[] = {MD_TYPE_F32, MD_TYPE_F16, MD_TYPE_BF16, MD_TYPE_Q4_0, MD_TYPE_Q4_1, MD_TYPE_Q8_0, MD_TYPE_Q4_K, MD_TYPE_Q6_K};
    const int n = 12, k = 512;
    for (int type : types) {
        std::vector<float> wf((size_t)n * k), wd((size_t)n * k);
        size_t rb = md_type_row_bytes(type, k);
        std::vector<uint8_t> wq(rb * n + 16);
        md_err e = {};
        for (auto &v : wf) v = frand();
        if (type == MD_TYPE_Q4_K || type == MD_TYPE_Q6_K) {
            for (auto &b : wq) b = (uint8_t)(frand() * 127 + 128);
            size_t bb = type == MD_TYPE_Q4_K ? 144 : 210;
            for (size_t b = 0; b < rb * n / bb; b++) {
                uint16_t d = md_fp32_to_fp16(0.01f + 0.001f * (float)(b % 7));
                uint8_t *p = wq.data() + b * bb + (type == MD_TYPE_Q4_K ? 0 : 208);
                memcpy(p, &d, 2);
                if (type == MD_TYPE_Q4_K) memcpy(p + 2, &d, 2);
            }
        } else if (md_quantize(type, wf.data(), wq.data(), (int64_t)n * k, &e)) { printf("%s\n", e.msg); fails++; continue; }
        md_dequantize(type, wq.data(), wd.data(), (int64_t)n * k, &e);
        for (int m : {1, 3, 8}) {
            std::vector<float> x((size_t)m * k), y((size_t)m * n, 7.0f);
            for (auto &v : x) v = frand();
            /* 16-byte aligned copies, as the pool gives */
            float *xa = (float *)aligned_alloc(64, x.size() * 4); memcpy(xa, x.data(), x.size() * 4);
            uint8_t *wa = (uint8_t *)aligned_alloc(64, (rb * n + 63) / 64 * 64); memcpy(wa, wq.data(), rb * n);
            /* quantized weights multiply x quantized by k_quant_x: the reference takes that x */
            std::vector<uint8_t> qx;
            quant_x(xa, m, k, qx);
            const int8_t *xq = (const int8_t *)qx.data();
            const float *xd = (const float *)(qx.data() + (size_t)m * k);
            std::vector<float> xr = is_quant(type) ? x_seen(xa, m, k) : x;
            for (int path = 0; path < 2; path++) {
                if (path == 1 && type != MD_TYPE_F16 && type != MD_TYPE_BF16) continue;
                std::fill(y.begin(), y.end(), 7.0f);
                unsigned grid = cuda_blocks(n, GEMV_WARPS);
                gemv_segs sg = {{wa}, {y.data()}, {n, n, n, n}, {path}, 1}; /* cuda_matmul's one segment */
                QT_DISPATCH(type, emu_launch(dim3(grid), dim3(GEMV_WARPS * 32), [&] { k_gemv_n<QT, CUDA_GEMV_MAX_M>(sg, rb, xa, xq, xd, m, k, 0.0f); }));
                if (m == 1) { /* the one-token instance launch_gemv_n picks: the same bits */
                    std::vector<float> y8 = y;
                    std::fill(y.begin(), y.end(), 7.0f);
                    QT_DISPATCH(type, emu_launch(dim3(grid), dim3(GEMV_WARPS * 32), [&] { k_gemv_n<QT, 1>(sg, rb, xa, xq, xd, m, k, 0.0f); }));
                    CHECK(!memcmp(y.data(), y8.data(), y.size() * 4), "gemv %s m=1 path %d: one-token instance differs", md_type_name(type), path);
                }
                double ss = 0, worst = 0;
                std::vector<double> ref((size_t)m * n);
                for (int r = 0; r < m; r++) for (int j = 0; j < n; j++) {
                    double s = 0;
                    for (int i = 0; i < k; i++) s += (double)xr[r * k + i] * wd[(size_t)j * k + i];
                    ref[r * n + j] = s; ss += s * s;
                }
                double rms = sqrt(ss / (m * n));
                for (int i = 0; i < m * n; i++) worst = std::max(worst, fabs(y[i] - ref[i]));
                CHECK(worst <= 1e-4 * rms, "gemv %s m=%d path %d: worst %.3g rms %.3g", md_type_name(type), m, path, worst, rms);
            }
            free(xa); free(wa);
        }
        printf("gemv %-5s m=1,3,8: checked\n", md_type_name(type));
    }
}

/* ---- attention against the CPU backend on test_cuda_backend's mixed step ---- */
enum { T = 43, S = 3, NB = 64, BT = 16, MAXB = 16, NH = 8, NKV = 2, HD = 64 };
static void test_attention(md_backend *cpu, int f16, int hd, int nh, int nkv) {
    static int32_t tokens[T], tok_seq[T], tok_pos[T], slot[T], seq_len[S], table[S * MAXB], lrows[S];
    int t = 0;
    for (int p = 0; p <= 36; p++, t++) tok_seq[t] = 0, tok_pos[t] = p;
    tok_seq[t] = 1, tok_pos[t++] = 50;
    for (int p = 20; p <= 24; p++, t++) tok_seq[t] = 2, tok_pos[t] = p;
    seq_len[0] = 37, seq_len[1] = 51, seq_len[2] = 25;
    for (int i = 0; i < S * MAXB; i++) table[i] = (i * 5 + 3) % NB;
    for (int i = 0; i < T; i++) {
        slot[i] = table[tok_seq[i] * MAXB + tok_pos[i] / BT] * BT + tok_pos[i] % BT;
        tokens[i] = i;
    }
    lrows[0] = 36, lrows[1] = 37, lrows[2] = 42;
    md_batch b = {T, S, tokens, tok_seq, tok_pos, slot, seq_len, table, MAXB, BT, lrows, S};
    md_reserve r = {64, 4, 512, MAXB * BT, MAXB, nh};
    md_err e = {};
    if (cpu->ops->reserve(cpu, &r, &e) || cpu->ops->batch_prepare(cpu, &b, &e)) { printf("%s\n", e.msg); fails++; return; }
    size_t kvd = (size_t)nkv * hd, n_slots = (size_t)NB * BT;
    std::vector<float> kc(n_slots * kvd), vc(n_slots * kvd), q((size_t)T * nh * hd), k((size_t)T * kvd), v((size_t)T * kvd);
    auto rnd16 = [&](float f) { return f16 ? md_fp16_to_fp32(md_fp32_to_fp16(f)) : f; };
    for (auto &x : kc) x = rnd16(frand());
    for (auto &x : vc) x = rnd16(frand());
    for (auto &x : q) x = frand();
    for (auto &x : k) x = rnd16(frand());
    for (auto &x : v) x = rnd16(frand());
    /* CPU reference */
    md_buf *bq, *bkc, *bvc, *bk, *bv, *bo;
    auto mk = [&](const void *h, size_t n, md_buf **o) { cpu->ops->buf_alloc(cpu, n, o, &e); if (h) cpu->ops->buf_upload(cpu, *o, 0, h, n, &e); };
    mk(q.data(), q.size() * 4, &bq); mk(kc.data(), kc.size() * 4, &bkc); mk(vc.data(), vc.size() * 4, &bvc);
    mk(k.data(), k.size() * 4, &bk); mk(v.data(), v.size() * 4, &bv); mk(nullptr, q.size() * 4, &bo);
    float scale = 1.0f / sqrtf((float)hd);
    if (cpu->ops->kv_write(cpu, bk, bv, bkc, bvc, (int)kvd, MD_TYPE_F32, &e) ||
        cpu->ops->attention(cpu, bq, bkc, bvc, bo, nh, nkv, hd, MD_TYPE_F32, scale, &e)) { printf("%s\n", e.msg); fails++; return; }
    std::vector<float> ref(q.size());
    cpu->ops->buf_download(cpu, bo, 0, ref.data(), ref.size() * 4, &e);
    for (md_buf *m : {bq, bkc, bvc, bk, bv, bo}) cpu->ops->buf_free(cpu, m);
    /* emulated device: cache in f32 or f16 */
    cuda_dtype ct = f16 ? CUDA_F16 : CUDA_F32;
    size_t es = f16 ? 2 : 4;
    std::vector<uint8_t> dk(n_slots * kvd * es), dv(n_slots * kvd * es);
    for (size_t i = 0; i < n_slots * kvd; i++) {
        if (f16) { ((uint16_t *)dk.data())[i] = md_fp32_to_fp16(kc[i]); ((uint16_t *)dv.data())[i] = md_fp32_to_fp16(vc[i]); }
        else { ((float *)dk.data())[i] = kc[i]; ((float *)dv.data())[i] = vc[i]; }
    }
    std::vector<int32_t> dec(3 * T), tiles(4 * cuda_plan_max_tiles(T, S)), dbt(S * 32, -7);
    for (int s = 0; s < S; s++) memcpy(&dbt[s * 32], &table[s * MAXB], MAXB * 4); /* device stride = reserved width 32 */
    cuda_step_plan plan;
    if (cuda_plan_step(&b, dec.data(), tiles.data(), &plan, &e)) { printf("%s\n", e.msg); fails++; return; }
    int n = T * (int)kvd;
    emu_launch(dim3(cuda_blocks(n, 256)), dim3(256), [&] { k_kv_write(dk.data(), dv.data(), ct, k.data(), v.data(), slot, T, (int)kvd); });
    for (int splits : {1, 3, 8, 64}) {
        std::vector<float> out(q.size(), 12345.0f), work(cuda_attn_decode_work_bytes(plan.n_dec, nh, hd, splits) / 4);
        dim3 grid(plan.n_dec, nkv, splits);
        int bits_wide = 0;
        auto dec_k = [&](auto CTc, auto Dc) {
            constexpr int CT = decltype(CTc)::value, D = decltype(Dc)::value;
            /* the kernel launch_dec picks (GM = dec_gm(G)), then the one with MAX_GQA heads
             * in registers: the same bits */
            auto dec_gm_k = [&](auto GMc, float *o) {
                constexpr int GM = decltype(GMc)::value;
                emu_launch(grid, dim3(DEC_WARPS * 32), [&] { k_attn_dec<CT, D, GM>(dk.data(), dv.data(), nkv, BT, q.data(), dec.data(), dbt.data(), 32, nh, scale, splits, work.data(), o); });
                if (splits > 1) /* as cuda_attn_decode: one split writes the output itself */
                    emu_launch(dim3(plan.n_dec, nh), dim3(128), [&] { k_attn_dec_merge(work.data(), dec.data(), nh, hd, splits, o); });
            };
            int gm = dec_gm(nh / nkv);
            if (gm == 1) dec_gm_k(std::integral_constant<int, 1>{}, out.data());
            else if (gm == 2) dec_gm_k(std::integral_constant<int, 2>{}, out.data());
            else if (gm == 4) dec_gm_k(std::integral_constant<int, 4>{}, out.data());
            else dec_gm_k(std::integral_constant<int, MAX_GQA>{}, out.data());
            std::vector<float> wide(out.size(), 12345.0f);
            dec_gm_k(std::integral_constant<int, MAX_GQA>{}, wide.data());
            for (size_t i = 0; i < out.size(); i++) bits_wide += memcmp(&out[i], &wide[i], 4) != 0;
            emu_launch(dim3(plan.n_tiles, nh), dim3(PF_WARPS * 32), [&] { k_attn_pf<CT, D>(dk.data(), dv.data(), nkv, BT, q.data(), tiles.data(), dbt.data(), 32, nh, scale, out.data()); });
        };
        using F32c = std::integral_constant<int, CUDA_F32>; using F16c = std::integral_constant<int, CUDA_F16>;
        if (hd == 64) { if (f16) dec_k(F16c{}, std::integral_constant<int, 2>{}); else dec_k(F32c{}, std::integral_constant<int, 2>{}); }
        else if (hd == 128) { if (f16) dec_k(F16c{}, std::integral_constant<int, 4>{}); else dec_k(F32c{}, std::integral_constant<int, 4>{}); }
        else { if (f16) dec_k(F16c{}, std::integral_constant<int, 8>{}); else dec_k(F32c{}, std::integral_constant<int, 8>{}); }
        double ss = 0, worst = 0; size_t wi = 0;
        for (float x : ref) ss += (double)x * x;
        double rms = sqrt(ss / ref.size());
        for (size_t i = 0; i < ref.size(); i++) { double d = fabs(out[i] - ref[i]); if (!(d <= worst)) { worst = d; wi = i; } }
        CHECK(worst <= 1e-5 * rms, "attention %s hd=%d heads %d/%d splits %d: worst %.3g at %zu (cpu %.6g emu %.6g) rms %.3g",
              f16 ? "f16" : "f32", hd, nh, nkv, splits, worst, wi, ref[wi], out[wi], rms);
        CHECK(bits_wide == 0, "attention %s hd=%d heads %d/%d splits %d: %d outputs differ between %d and %d heads in registers",
              f16 ? "f16" : "f32", hd, nh, nkv, splits, bits_wide, dec_gm(nh / nkv), MAX_GQA);
        printf("attention %s hd=%d heads %d/%d splits %d: worst %.2e, rms %.2e\n", f16 ? "f16" : "f32", hd, nh, nkv, splits, worst, rms);
    }
}

/* ---- prefill attention on the tensor cores against a double-precision reference ----
 * Three sequences over a paged cache whose earlier positions hold context: 40 queries at
 * positions 100..139 (three key tiles of 64, the last partial), 20 at 0..19, one at 70;
 * tiles of up to 16 queries. The reference reads the cache as stored and q unrounded, so
 * the error measured is the kernel's rounding of q and of the probabilities to the cache
 * type; k_attn_pf on the same cache checks the reference. */
static void test_attention_tc(int bf, int hd, int nh, int nkv) {
    const int BTK = 16, NBK = 64, MAXBK = 10, NS = 3;
    const int first[NS] = {100, 0, 70}, count[NS] = {40, 20, 1};
    int table[NS * MAXBK];
    for (int i = 0; i < NS * MAXBK; i++) table[i] = (i * 37 + 5) % NBK; /* distinct blocks */
    size_t kvd = (size_t)nkv * hd, n_slots = (size_t)NBK * BTK;
    std::vector<uint16_t> kc(n_slots * kvd), vc(n_slots * kvd);
    auto to16 = [&](float f) { return bf ? md_fp32_to_bf16(f) : md_fp32_to_fp16(f); };
    auto from16 = [&](uint16_t h) { return (double)emu_h16_to_f(h, bf); };
    for (auto &x : kc) x = to16(2.0f * frand());
    for (auto &x : vc) x = to16(frand());
    std::vector<int32_t> tiles, tok_seq, tok_pos;
    for (int sq = 0; sq < NS; sq++)
        for (int i = 0; i < count[sq]; i++) tok_seq.push_back(sq), tok_pos.push_back(first[sq] + i);
    int T = (int)tok_seq.size();
    for (int sq = 0, t0 = 0; sq < NS; t0 += count[sq], sq++)
        for (int i = 0; i < count[sq]; i += 16) {
            int nq = count[sq] - i < 16 ? count[sq] - i : 16;
            tiles.insert(tiles.end(), {sq, t0 + i, nq, first[sq] + i});
        }
    int n_tiles = (int)tiles.size() / 4;
    std::vector<float> q((size_t)T * nh * hd);
    for (auto &x : q) x = frand();
    float scale = 1.0f / sqrtf((float)hd);
    std::vector<double> ref(q.size());
    int G = nh / nkv;
    for (int tk = 0; tk < T; tk++)
        for (int h = 0; h < nh; h++) {
            int sq = tok_seq[tk], p = tok_pos[tk], kvh = h / G;
            std::vector<double> sc(p + 1);
            std::vector<size_t> at(p + 1); /* key k's K/V row in the cache */
            double mx = -1e300, l = 0;
            for (int k = 0; k <= p; k++) {
                at[k] = ((size_t)(table[sq * MAXBK + k / BTK] * BTK + k % BTK) * nkv + kvh) * hd;
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)q[((size_t)tk * nh + h) * hd + i] * scale * from16(kc[at[k] + i]);
                sc[k] = d;
                mx = d > mx ? d : mx;
            }
            for (int k = 0; k <= p; k++) l += sc[k] = exp(sc[k] - mx);
            for (int i = 0; i < hd; i++) {
                double acc = 0;
                for (int k = 0; k <= p; k++) acc += sc[k] * from16(vc[at[k] + i]);
                ref[((size_t)tk * nh + h) * hd + i] = acc / l;
            }
        }
    double ss = 0;
    for (double x : ref) ss += x * x;
    double rms = sqrt(ss / ref.size());
    auto worst_of = [&](const std::vector<float> &out, size_t *wi) {
        double w = 0;
        for (size_t i = 0; i < out.size(); i++) { double d = fabs(out[i] - ref[i]); if (!(d <= w)) { w = d; *wi = i; } }
        return w;
    };
    std::vector<float> out(q.size(), 12345.0f), old(q.size(), 12345.0f);
    int gw = pf_tc_heads(G);
    auto run = [&](auto CTc, auto HDc) {
        constexpr int CT = decltype(CTc)::value, HDv = decltype(HDc)::value;
        emu_launch(dim3(n_tiles, nh / gw), dim3(gw * 32), [&] { k_attn_pf_tc<CT, HDv>(kc.data(), vc.data(), nkv, BTK, q.data(), tiles.data(), table, MAXBK, nh, scale, out.data()); });
        emu_launch(dim3(n_tiles, nh), dim3(PF_WARPS * 32), [&] { k_attn_pf<CT, HDv / 32>(kc.data(), vc.data(), nkv, BTK, q.data(), tiles.data(), table, MAXBK, nh, scale, old.data()); });
    };
    using F16c = std::integral_constant<int, CUDA_F16>; using BF16c = std::integral_constant<int, CUDA_BF16>;
    if (bf) { if (hd == 64) run(BF16c{}, std::integral_constant<int, 64>{}); else run(BF16c{}, std::integral_constant<int, 128>{}); }
    else { if (hd == 64) run(F16c{}, std::integral_constant<int, 64>{}); else run(F16c{}, std::integral_constant<int, 128>{}); }
    size_t wi = 0, wo = 0;
    double worst = worst_of(out, &wi), worst_old = worst_of(old, &wo);
    /* q and the probabilities rounded to 11 (f16) or 8 (bf16) significant bits */
    double tol = bf ? 2e-2 : 3e-3;
    const char *nm = bf ? "bf16" : "f16";
    CHECK(worst_old <= 1e-5 * rms, "attention_tc reference: k_attn_pf %s hd=%d heads %d/%d worst %.3g (rms %.3g)", nm, hd, nh, nkv, worst_old, rms);
    CHECK(worst <= tol * rms, "attention_tc %s hd=%d heads %d/%d (%d per block): worst %.3g at %zu (ref %.6g tc %.6g) rms %.3g",
          nm, hd, nh, nkv, gw, worst, wi, ref[wi], out[wi], rms);
    printf("attention_tc %s hd=%d heads %d/%d (%d per block), %d queries, %d tiles: worst %.2e of rms %.2e (%.2e relative; k_attn_pf %.2e)\n",
           nm, hd, nh, nkv, gw, T, n_tiles, worst, rms, worst / rms, worst_old / rms);
}

/* ---- rmsnorm, rope, swiglu vs the CPU backend ---- */
static void test_elementwise(md_backend *cpu) {
    md_err e = {};
    const int R = 5, Dm = 576;
    std::vector<float> x(R * Dm), w(Dm), y(R * Dm), ref(R * Dm);
    for (auto &a : x) a = frand() * 3; for (auto &a : w) a = frand();
    md_buf *bx, *bw, *by;
    cpu->ops->buf_alloc(cpu, x.size() * 4, &bx, &e); cpu->ops->buf_upload(cpu, bx, 0, x.data(), x.size() * 4, &e);
    cpu->ops->buf_alloc(cpu, w.size() * 4, &bw, &e); cpu->ops->buf_upload(cpu, bw, 0, w.data(), w.size() * 4, &e);
    cpu->ops->buf_alloc(cpu, x.size() * 4, &by, &e);
    md_tensor tw = {bw, 0, MD_TYPE_F32, Dm, 1, (size_t)Dm * 4};
    cpu->ops->rmsnorm(cpu, bx, &tw, by, R, Dm, 1e-5f, &e);
    cpu->ops->buf_download(cpu, by, 0, ref.data(), ref.size() * 4, &e);
    emu_launch(dim3(R), dim3(256), [&] { k_rmsnorm(x.data(), w.data(), 1e-5f, Dm, y.data(), CUDA_F32); });
    double worst = 0; for (int i = 0; i < R * Dm; i++) worst = std::max(worst, (double)fabsf(y[i] - ref[i]));
    CHECK(worst < 1e-5, "rmsnorm worst %.3g", worst);
    printf("rmsnorm: worst %.2e\n", worst);
    cpu->ops->buf_free(cpu, bx); cpu->ops->buf_free(cpu, bw); cpu->ops->buf_free(cpu, by);
}

static void test_rope(md_backend *cpu) {
    md_err e = {};
    /* the CPU backend's rope reads positions from its prepared batch: reuse the last one
     * (test_attention's: 43 tokens at positions 0..36, 50, 20..24) */
    int32_t pos[T]; int t = 0;
    for (int p = 0; p <= 36; p++) pos[t++] = p; pos[t++] = 50; for (int p = 20; p <= 24; p++) pos[t++] = p;
    const int nh = 3, hd = 64;
    float inv[32]; md_rope_cfg rc = {10000.0f, 1.0f, 0, 0, 0, 0};
    for (int neox = 0; neox < 2; neox++) for (int rot : {64, 32}) {
        md_rope_inv_freq(&rc, rot, inv);
        std::vector<float> x((size_t)T * nh * hd), y;
        for (auto &a : x) a = frand();
        y = x;
        md_buf *bx, *bi;
        cpu->ops->buf_alloc(cpu, x.size() * 4, &bx, &e); cpu->ops->buf_upload(cpu, bx, 0, x.data(), x.size() * 4, &e);
        cpu->ops->buf_alloc(cpu, sizeof inv, &bi, &e); cpu->ops->buf_upload(cpu, bi, 0, inv, sizeof inv, &e);
        cpu->ops->rope(cpu, bx, nh, hd, rot, bi, neox, &e);
        std::vector<float> ref(x.size());
        cpu->ops->buf_download(cpu, bx, 0, ref.data(), ref.size() * 4, &e);
        int64_t n = (int64_t)T * nh * (rot / 2);
        emu_launch(dim3(cuda_blocks(n, 256)), dim3(256), [&] { k_rope(y.data(), pos, T, nh, hd, rot, inv, neox); });
        double worst = 0; for (size_t i = 0; i < x.size(); i++) worst = std::max(worst, (double)fabsf(y[i] - ref[i]));
        CHECK(worst < 1e-5, "rope neox %d rot %d worst %.3g", neox, rot, worst);
        printf("rope neox=%d rot=%d: worst %.2e\n", neox, rot, worst);
        cpu->ops->buf_free(cpu, bx); cpu->ops->buf_free(cpu, bi);
    }
}

/* ---- argmax and inverse-CDF sampling against host arithmetic ---- */
static void test_sample() {
    const int V = 3000;
    std::vector<float> l(V);
    for (auto &a : l) a = 3.0f * frand();
    l[1500] = l[2900] = 9.0f;
    int32_t out[4] = {-5, -5, -5, -5};
    emu_launch(dim3(1), dim3(SAMPLE_THREADS), [&] { k_argmax(l.data(), V, out); });
    CHECK(out[0] == 1500, "argmax %d, want 1500", out[0]);
    l[7] = NAN;
    emu_launch(dim3(1), dim3(SAMPLE_THREADS), [&] { k_argmax(l.data(), V, out); });
    CHECK(out[0] == -1, "argmax with NaN %d, want -1", out[0]);
    l[7] = 0.0f;
    {   /* a row with no finite logit: -1, never INT_MAX (an index far outside the row) */
        std::vector<float> ninf(V, -INFINITY);
        cuda_sample_params pz[2] = {{0.8f, 0, 1.0f, 0.0f, 0.5f, 1.0f}, {0.0f, 0, 1.0f, 0.0f, 0.5f, 1.0f}};
        std::vector<float> two(2 * V, -INFINITY);
        emu_launch(dim3(2), dim3(SAMPLE_THREADS), [&] { k_sample(two.data(), V, pz, nullptr, nullptr, out, nullptr, nullptr, nullptr); });
        CHECK(out[0] == -1 && out[1] == -1, "sample of an all -inf row: %d %d, want -1 -1", out[0], out[1]);
        printf("sample, all -inf rows: %d %d\n", out[0], out[1]);
    }
    /* plain temperature sampling at u: host inverse CDF in index order */
    float us[3] = {0.05f, 0.5f, 0.97f};
    cuda_sample_params P[3];
    for (int i = 0; i < 3; i++) P[i] = {0.8f, 0, 1.0f, 0.0f, us[i], 1.0f};
    std::vector<float> rows(3 * V);
    for (int i = 0; i < 3; i++) memcpy(&rows[i * V], l.data(), V * 4);
    float lp[3];
    emu_launch(dim3(3), dim3(SAMPLE_THREADS), [&] { k_sample(rows.data(), V, P, nullptr, nullptr, out, lp, nullptr, nullptr); });
    double mx = 9.0, z = 0, z1 = 0;
    for (int i = 0; i < V; i++) { z += exp((l[i] - mx) / 0.8); z1 += exp(l[i] - mx); }
    for (int r = 0; r < 3; r++) {
        double c = 0; int want = -1;
        for (int i = 0; i < V; i++) { c += exp((l[i] - mx) / 0.8) / z; if (c > us[r]) { want = i; break; } }
        CHECK(out[r] == want, "sample u=%.2f: %d, host %d", us[r], out[r], want);
        double wl = l[want] - mx - log(z1); /* the raw row's logprob, not the temperature's */
        CHECK(fabs(lp[r] - wl) < 1e-3, "logprob %.5f host %.5f", lp[r], wl);
        printf("sample u=%.2f: token %d (host %d)\n", us[r], out[r], want);
    }
}


/* top-k, top-p, min-p: the kept set and the draw against exact host arithmetic */
static void test_sample_filters() {
    const int V = 1000;
    std::vector<float> l(V);
    for (auto &a : l) a = 3.0f * frand();
    l[17] = l[523] = 9.0f;
    struct { float temp, top_p, min_p; int top_k; } cases[] = {{0.7f, 1.0f, 0.0f, 5}, {1.3f, 0.5f, 0.0f, 0}, {1.0f, 1.0f, 0.05f, 0}, {1.0f, 0.9f, 0.0f, 40}};
    const float us[] = {0.01f, 0.33f, 0.61f, 0.995f};
    for (auto &c : cases) {
        std::vector<double> p(V);
        double mx = 9.0, z = 0, z1 = 0;
        for (int i = 0; i < V; i++) { z += p[i] = exp((l[i] - mx) / c.temp); z1 += exp(l[i] - mx); }
        for (auto &x : p) x /= z;
        std::vector<int> order(V);
        for (int i = 0; i < V; i++) order[i] = i;
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
        int nk = c.top_k > 0 ? c.top_k : V;
        double mass_k = 0, cum = 0;
        for (int i = 0; i < nk; i++) mass_k += p[order[i]];
        int np = 0;
        for (int i = 0; i < nk; i++) { np++; cum += p[order[i]]; if (c.top_p < 1.0f && cum >= c.top_p * mass_k) break; }
        std::vector<int> keep(V, 0);
        double kept = 0;
        for (int i = 0; i < np; i++) if (p[order[i]] >= c.min_p * p[order[0]]) { keep[order[i]] = 1; kept += p[order[i]]; }
        const int R = 4;
        cuda_sample_params P[R];
        for (int r = 0; r < R; r++) P[r] = {c.temp, c.top_k, c.top_p, c.min_p, us[r], 1.0f};
        std::vector<float> rows(R * V);
        for (int r = 0; r < R; r++) memcpy(&rows[r * V], l.data(), V * 4);
        int32_t out[R]; float lp[R];
        emu_launch(dim3(R), dim3(SAMPLE_THREADS), [&] { k_sample(rows.data(), V, P, nullptr, nullptr, out, lp, nullptr, nullptr); });
        for (int r = 0; r < R; r++) {
            double t = us[r] * kept, acc = 0; int want = -1;
            for (int i = 0; i < V; i++) if (keep[i]) { acc += p[i]; if (acc > t) { want = i; break; } }
            CHECK(out[r] >= 0 && out[r] < V && keep[out[r]], "sample k=%d p=%.2f minp=%.2f u=%.3f: token %d not kept", c.top_k, c.top_p, c.min_p, us[r], out[r]);
            CHECK(out[r] == want, "sample k=%d p=%.2f minp=%.2f u=%.3f: token %d, host %d", c.top_k, c.top_p, c.min_p, us[r], out[r], want);
            CHECK(fabs(lp[r] - (l[out[r] >= 0 ? out[r] : 0] - mx - log(z1))) < 1e-4, "logprob %.5f", lp[r]);
        }
        printf("sample top_k=%d top_p=%.2f min_p=%.2f: %d kept, draws %d %d %d %d\n", c.top_k, c.top_p, c.min_p, np, out[0], out[1], out[2], out[3]);
    }
}

/* cuBLAS's column-major GEMM as its documentation defines it: C = alpha op(A) op(B) + beta C,
 * op(A) m x k, op(B) k x n, C m x n; element (i, j) of a matrix with leading dimension ld is
 * at i + j * ld. Called with exactly blas_gemm's arguments to check their order. */
enum { OP_N = 0, OP_T = 1 };
static void ref_gemm(int opA, int opB, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int l = 0; l < K; l++) {
                double a = opA == OP_N ? A[i + (size_t)l * lda] : A[l + (size_t)i * lda];
                double b = opB == OP_N ? B[l + (size_t)j * ldb] : B[j + (size_t)l * ldb];
                s += a * b;
            }
            C[i + (size_t)j * ldc] = (float)(alpha * s + (beta == 0 ? 0 : beta * C[i + (size_t)j * ldc]));
        }
}
static void test_cublas_args() {
    const int m = 11, n = 24, k = 256;
    std::vector<float> wf((size_t)n * k), x((size_t)m * k), y((size_t)m * n, 3.0f), wd((size_t)n * k);
    for (auto &v : wf) v = frand();
    for (auto &v : x) v = frand();
    size_t rb = md_type_row_bytes(MD_TYPE_Q4_0, k);
    std::vector<uint8_t> wq(rb * n);
    md_err e = {};
    md_quantize(MD_TYPE_Q4_0, wf.data(), wq.data(), (int64_t)n * k, &e);
    md_dequantize(MD_TYPE_Q4_0, wq.data(), wd.data(), (int64_t)n * k, &e);
    /* cuda_matmul's quantized path: x -> bf16 scratch, W -> bf16 scratch, then GemmEx(T, N, n, m, k, W, k, X, k, Y, n) */
    std::vector<uint16_t> xs((size_t)m * k), ws((size_t)n * k);
    int64_t nx = (int64_t)m * k, ng = (int64_t)n * k / 32;
    emu_launch(dim3(cuda_blocks(nx, 256)), dim3(256), [&] { k_convert(x.data(), xs.data(), CUDA_BF16, nx); });
    emu_launch(dim3(cuda_blocks(ng, 128)), dim3(128), [&] { k_dequant<MD_TYPE_Q4_0>(wq.data(), ws.data(), CUDA_BF16, ng); });
    std::vector<float> xf(xs.size()), wbf(ws.size());
    for (size_t i = 0; i < xs.size(); i++) xf[i] = md_bf16_to_fp32(xs[i]);
    for (size_t i = 0; i < ws.size(); i++) wbf[i] = md_bf16_to_fp32(ws[i]);
    ref_gemm(OP_T, OP_N, n, m, k, 1.0f, wbf.data(), k, xf.data(), k, 0.0f, y.data(), n);
    double ss = 0, worst = 0;
    for (int r = 0; r < m; r++) for (int j = 0; j < n; j++) {
        double s = 0;
        for (int i = 0; i < k; i++) s += (double)x[r * k + i] * wd[(size_t)j * k + i];
        ss += s * s; worst = std::max(worst, fabs(y[r * n + j] - s));
    }
    double rms = sqrt(ss / (m * n));
    CHECK(worst <= 2e-2 * rms, "cuBLAS argument order: worst %.3g of rms %.3g", worst, rms);
    /* and the F32 Sgemm call: same order, f32 operands */
    ref_gemm(OP_T, OP_N, n, m, k, 1.0f, wd.data(), k, x.data(), k, 0.0f, y.data(), n);
    double w2 = 0;
    for (int r = 0; r < m; r++) for (int j = 0; j < n; j++) {
        double s = 0;
        for (int i = 0; i < k; i++) s += (double)x[r * k + i] * wd[(size_t)j * k + i];
        w2 = std::max(w2, fabs(y[r * n + j] - s));
    }
    CHECK(w2 <= 1e-5 * rms, "Sgemm argument order: worst %.3g", w2);
    printf("cuBLAS GemmEx/Sgemm arguments as gemm.cu passes them: y = x W^T (bf16 worst %.2e, f32 worst %.2e, rms %.2e)\n", worst, w2, rms);
}

/* ---- cuda_matmul_n: gemm.cu's host code (mm_run) on emulated launchers ---- */

/* The launchers mm_run calls, as ctx.cu / elementwise.cu / dequant.cu run them, minus the
 * device: kernels on the emulator, scratch from the host heap, calls counted. Kernels
 * without barriers or shuffles run their threads one after another on this thread
 * (emu_serial), which costs no thread creation. */
static void emu_serial(dim3 grid, dim3 block, const std::function<void()> &f) {
    gridDim = grid, blockDim = block;
    for (unsigned b = 0; b < grid.x; b++)
        for (unsigned t = 0; t < block.x; t++) {
            blockIdx = dim3(b), threadIdx = dim3(t);
            f();
        }
}
static int emu_converts, emu_dequants, emu_swiglus, emu_blas;
extern "C" int cuda_check(cuda_ctx *, const char *, md_err *) { return 0; }
int cuda_scratch(cuda_ctx *c, int which, size_t bytes, void **out, md_err *) {
    if (c->scratch_bytes[which] < bytes) {
        free(c->scratch[which]);
        c->scratch[which] = aligned_alloc(256, (bytes + 255) / 256 * 256);
        c->scratch_bytes[which] = bytes;
        c->scratch_gen++;
    }
    *out = c->scratch[which];
    return 0;
}
extern "C" int cuda_convert(cuda_ctx *, const float *x, void *dst, cuda_dtype t, int64_t n, md_err *) {
    emu_converts++;
    emu_serial(dim3(cuda_blocks(n, 256)), dim3(256), [&] { k_convert(x, dst, t, n); });
    return 0;
}
extern "C" int cuda_dequantize(cuda_ctx *, int gtype, const void *src, void *dst, cuda_dtype t, int64_t n, md_err *) {
    emu_dequants++;
    int64_t ng = n / 32;
    const uint8_t *s = (const uint8_t *)src;
    QT_DISPATCH(gtype, emu_serial(dim3(cuda_blocks(ng, 128)), dim3(128), [&] { k_dequant<QT>(s, dst, t, ng); }));
    return 0;
}
extern "C" int cuda_swiglu(cuda_ctx *, const float *g, const float *u, void *out, cuda_dtype t, int64_t n, md_err *) {
    emu_swiglus++;
    emu_serial(dim3(cuda_blocks(n, 256)), dim3(256), [&] { k_swiglu(g, u, out, t, n); });
    return 0;
}
/* cuBLAS by its definition, with gemm.cu's blas_gemm arguments (see test_cublas_args). */
static int blas_gemm(cuda_ctx *, const void *w, cuda_dtype t, const void *x, float *y, int m, int n, int k, float beta, md_err *) {
    emu_blas++;
    auto wide = [&](const void *p, size_t cnt) {
        std::vector<float> f(cnt);
        for (size_t i = 0; i < cnt; i++)
            f[i] = t == CUDA_F32 ? ((const float *)p)[i] : t == CUDA_BF16 ? md_bf16_to_fp32(((const uint16_t *)p)[i]) : md_fp16_to_fp32(((const uint16_t *)p)[i]);
        return f;
    };
    std::vector<float> wf = wide(w, (size_t)n * k), xf = wide(x, (size_t)m * k);
    ref_gemm(OP_T, OP_N, n, m, k, 1.0f, wf.data(), k, xf.data(), k, beta, y, n);
    return 0;
}

struct emu_w {
    int type, n;
    size_t rb;
    uint8_t *q;            /* 64-byte aligned, as the pool gives */
    std::vector<float> d;  /* engine/weights/quant.c's dequantization */
};
static emu_w *make_w(int type, int n, int k) {
    emu_w *w = new emu_w{type, n, md_type_row_bytes(type, k), nullptr, {}};
    size_t bytes = w->rb * n;
    w->q = (uint8_t *)aligned_alloc(64, (bytes + 16 + 63) / 64 * 64);
    std::vector<float> f((size_t)n * k);
    for (auto &v : f) v = frand();
    md_err e = {};
    if (type == MD_TYPE_Q4_K || type == MD_TYPE_Q6_K) { /* random blocks with sane scales */
        for (size_t i = 0; i < bytes; i++) w->q[i] = (uint8_t)(frand() * 127 + 128);
        size_t bb = type == MD_TYPE_Q4_K ? 144 : 210;
        for (size_t b = 0; b < bytes / bb; b++) {
            uint16_t d = md_fp32_to_fp16(0.01f + 0.001f * (float)(b % 7));
            uint8_t *p = w->q + b * bb + (type == MD_TYPE_Q4_K ? 0 : 208);
            memcpy(p, &d, 2);
            if (type == MD_TYPE_Q4_K) memcpy(p + 2, &d, 2);
        }
    } else if (md_quantize(type, f.data(), w->q, (int64_t)n * k, &e)) { printf("%s\n", e.msg); fails++; }
    w->d.resize((size_t)n * k);
    md_dequantize(type, w->q, w->d.data(), (int64_t)n * k, &e);
    return w;
}

/* One fused call against the unfused launches on the same emulated device (cuda_matmul of
 * each weight, then k_add / k_swiglu: bit for bit, except ACC on cuBLAS, whose beta rounds
 * once where the add rounds twice) and against a double product of the weights as
 * engine/weights/quant.c dequantizes them (1e-4 of rms on the GEMV path; 2e-2 on cuBLAS, whose
 * operands are BF16). want_launches: GEMV launches the fused call must make (-1: cuBLAS
 * path), want_converts: activation conversions. woff: byte offset of weight 0 (2 makes a
 * 16-bit weight unaligned for 16-byte loads). */
static void check_mm_n(std::vector<emu_w *> W, int mode, int m, int k, int want_launches, int want_converts, int woff = 0) {
    const char *mode_name[] = {"SET", "ACC", "SWIGLU"};
    int nw = (int)W.size();
    float *x = (float *)aligned_alloc(64, ((size_t)m * k * 4 + 63) / 64 * 64);
    for (int i = 0; i < m * k; i++) x[i] = frand();
    std::vector<std::vector<float>> init(nw), yf(nw), yu(nw), tmp(nw);
    cuda_ctx ctx = {};
    md_err e = {};
    cuda_mm_w cw[CUDA_MM_MAX];
    std::vector<uint8_t *> moved;
    for (int i = 0; i < nw; i++) {
        init[i].resize((size_t)m * W[i]->n);
        for (auto &v : init[i]) v = 4.0f * frand();
        yf[i] = init[i];
        const void *wp = W[i]->q;
        if (i == 0 && woff) { /* the same rows at an offset */
            uint8_t *p = (uint8_t *)aligned_alloc(64, (W[i]->rb * W[i]->n + woff + 63) / 64 * 64);
            memcpy(p + woff, W[i]->q, W[i]->rb * W[i]->n);
            moved.push_back(p);
            wp = p + woff;
        }
        cw[i] = {wp, W[i]->type, W[i]->rb, W[i]->n, yf[i].data()};
    }
    emu_gemv_launches = emu_converts = emu_swiglus = emu_blas = emu_qx_launches = emu_mmq_launches = 0;
    int rc = mm_run(&ctx, cw, nw, x, m, k, mode, mode == CUDA_MM_ACC ? 1.0f : 0.0f, 0, &e);
    CHECK(rc == 0, "matmul_n: %s", e.msg);
    int launches = emu_gemv_launches, converts = emu_converts, swiglus = emu_swiglus, blas = emu_blas;
    int qx_launches = emu_qx_launches, mmq_launches = emu_mmq_launches;
    /* unfused: one cuda_matmul per weight into tmp, then the add or swiglu kernel */
    for (int i = 0; i < nw; i++) {
        tmp[i].assign((size_t)m * W[i]->n, 0.0f);
        cuda_mm_w one = cw[i];
        one.y = tmp[i].data();
        CHECK(mm_run(&ctx, &one, 1, x, m, k, CUDA_MM_SET, 0.0f, 0, &e) == 0, "matmul: %s", e.msg);
        int64_t n = (int64_t)m * W[i]->n;
        if (mode == CUDA_MM_SET) yu[i] = tmp[i];
        if (mode == CUDA_MM_ACC) {
            yu[i] = init[i];
            emu_serial(dim3(cuda_blocks(n, 256)), dim3(256), [&] { k_add(yu[i].data(), tmp[i].data(), n); });
        }
    }
    if (mode == CUDA_MM_SWIGLU) {
        int64_t n = (int64_t)m * W[0]->n;
        yu[0].resize(n);
        emu_serial(dim3(cuda_blocks(n, 256)), dim3(256), [&] { k_swiglu(tmp[0].data(), tmp[1].data(), yu[0].data(), CUDA_F32, n); });
    }
    int gemv = m <= CUDA_GEMV_MAX_M, n_out = mode == CUDA_MM_SWIGLU ? 1 : nw;
    /* on the GEMV and int8 tiled paths quantized weights see x quantized (k_quant_x, once
     * per call); the tiled path takes calls of quantized weights only, 8 < m <= CUDA_MMQ_MAX_M */
    std::vector<float> xs = x_seen(x, m, k);
    int n_quant = 0;
    for (int i = 0; i < nw; i++) n_quant += is_quant(W[i]->type);
    int any_quant = n_quant > 0, all_quant = n_quant == nw;
    int mmq = !gemv && any_quant && m <= CUDA_MMQ_MAX_M; /* its quantized weights go there */
    int exact = gemv || (mmq && all_quant);              /* no weight on cuBLAS (BF16 inputs) */
    CHECK(qx_launches == ((gemv && any_quant) || mmq), "x quantized %d times", qx_launches);
    CHECK(mmq_launches == (mmq ? n_quant : 0), "%d int8 tiled launches (want %d)", mmq_launches, mmq ? n_quant : 0);
    if (mmq) { /* the others on cuBLAS, the quantized ones never expanded */
        CHECK(blas == nw - n_quant, "%d cuBLAS calls beside the int8 tiled path (want %d)", blas, nw - n_quant);
        if (all_quant) want_converts = 0;
    }
    double ss = 0, worst = 0, worst_u = 0;
    size_t cnt = 0, diff = 0;
    std::vector<double> gs, us, errs; /* SwiGLU: gate, up and the error of each output */
    for (int i = 0; i < n_out; i++)
        for (int t = 0; t < m; t++)
            for (int j = 0; j < W[i]->n; j++) {
                auto dot = [&](const emu_w *w) {
                    const float *xr = (gemv || mmq) && is_quant(w->type) ? xs.data() : x;
                    double s = 0;
                    for (int l = 0; l < k; l++) s += (double)xr[t * k + l] * w->d[(size_t)j * k + l];
                    return s;
                };
                double r = dot(W[i]);
                if (mode == CUDA_MM_ACC) r += init[i][(size_t)t * W[i]->n + j];
                if (mode == CUDA_MM_SWIGLU) {
                    double u = dot(W[1]);
                    gs.push_back(r), us.push_back(u);
                    r = r / (1.0 + exp(-r)) * u;
                }
                size_t at = (size_t)t * W[i]->n + j;
                if (mode == CUDA_MM_SWIGLU) errs.push_back(fabs(yf[i][at] - r));
                ss += r * r, cnt++;
                worst = std::max(worst, fabs(yf[i][at] - r));
                worst_u = std::max(worst_u, (double)fabsf(yf[i][at] - yu[i][at]));
                diff += memcmp(&yf[i][at], &yu[i][at], 4) != 0;
            }
    double rms = sqrt(ss / cnt);
    char types[64] = "";
    for (int i = 0; i < nw; i++) snprintf(types + strlen(types), sizeof types - strlen(types), "%s%s", i ? "," : "", md_type_name(W[i]->type));
    char what[160];
    snprintf(what, sizeof what, "matmul_n %s n=%d [%s]%s m=%d", mode_name[mode], nw, types, woff ? " unaligned" : "", m);
    if (mode == CUDA_MM_SWIGLU && !exact) {
        /* cuBLAS: gate and up each off by up to 2e-2 of their own rms (BF16 inputs), so
         * silu(g) * u is off by up to 2e-2 (1.1 |u| rms(g) + |g| rms(u)) (silu' <= 1.1):
         * the product's large elements carry errors above 2e-2 of its rms */
        double sg = 0, su = 0;
        for (size_t i = 0; i < gs.size(); i++) sg += gs[i] * gs[i], su += us[i] * us[i];
        double rg = sqrt(sg / gs.size()), ru = sqrt(su / us.size()), over = 0;
        for (size_t i = 0; i < errs.size(); i++)
            over = std::max(over, errs[i] / (2e-2 * (1.1 * fabs(us[i]) * rg + fabs(gs[i]) * ru)));
        CHECK(over <= 1.0, "%s: worst %.3g of rms %.3g against the double product, %.2fx the bound", what, worst, rms, over);
    } else
        CHECK(worst <= (exact ? 1e-4 : 2e-2) * rms, "%s: worst %.3g of rms %.3g against the double product", what, worst, rms);
    if (gemv || mode != CUDA_MM_ACC) /* GEMV: each row's sum as cuda_matmul makes it */
        CHECK(diff == 0, "%s: %zu of %zu outputs differ from the unfused ops (worst %.3g)", what, diff, cnt, worst_u);
    else
        CHECK(worst_u <= 1e-6 * rms, "%s: worst %.3g from the unfused ops, rms %.3g", what, worst_u, rms);
    if (mmq)
        CHECK(launches == 0, "%s: %d GEMV launches on the int8 tiled path", what, launches);
    else if (want_launches >= 0)
        CHECK(launches == want_launches, "%s: %d GEMV launches, want %d", what, launches, want_launches);
    else
        CHECK(launches == 0, "%s: %d GEMV launches on the cuBLAS path", what, launches);
    CHECK(converts == want_converts, "%s: x converted %d times, want %d", what, converts, want_converts);
    int fused_swiglu = mode == CUDA_MM_SWIGLU && gemv && W[0]->type == W[1]->type;
    CHECK(swiglus == (mode == CUDA_MM_SWIGLU && !fused_swiglu), "%s: %d swiglu launches", what, swiglus);
    printf("%s: %s %d launch(es), %d conversion(s); worst %.2e vs double, %.2e vs unfused (%zu bits differ), rms %.2e\n",
           what, gemv ? "gemv" : mmq ? "mmq" : "cublas", gemv ? launches : mmq ? mmq_launches : blas, converts, worst, worst_u, diff, rms);
    free(x);
    for (auto *p : moved) free(p);
    free(ctx.scratch[0]);
    free(ctx.scratch[1]);
}

/* The int8 tiled products (8 < m <= CUDA_MMQ_MAX_M, quantized weights without a BF16
 * copy) of every quantized type against the double product with x as k_quant_x leaves it:
 * k_mmq (__dp4a) at m = 9, 20, 32, k_mmq_tc (int8 mma.sync on the emulator's reading of
 * the PTX fragment layouts) at m = 33, 64, 100; row counts below and above a 64-row tile,
 * token counts inside one tile and across two, k in whole 256 steps and with a partial
 * last step (576, the 32-block types). */
static void test_mmq() {
    for (int type : {MD_TYPE_Q4_0, MD_TYPE_Q4_1, MD_TYPE_Q8_0, MD_TYPE_Q4_K, MD_TYPE_Q6_K}) {
        bool kq = type == MD_TYPE_Q4_K || type == MD_TYPE_Q6_K;
        for (int k : {512, 576}) {
            if (kq && k % 256) continue;
            for (int n : {12, 70}) {
                emu_w *w = make_w(type, n, k);
                for (int m : {9, 20, 32, 33, 64, 100}) {
                    if (n == 70 ? m == 20 || m == 33 || m == 100 : m == 64) continue;
                    float *x = (float *)aligned_alloc(64, ((size_t)m * k * 4 + 63) / 64 * 64);
                    for (int i = 0; i < m * k; i++) x[i] = 2.0f * frand();
                    std::vector<float> y((size_t)m * n, 5.0f), xs = x_seen(x, m, k);
                    cuda_ctx ctx = {};
                    md_err e = {};
                    cuda_mm_w one = {w->q, w->type, w->rb, w->n, y.data(), nullptr};
                    emu_mmq_launches = emu_mmt_launches = emu_blas = 0;
                    CHECK(mm_run(&ctx, &one, 1, x, m, k, CUDA_MM_ACC, 1.0f, 0, &e) == 0, "mmq: %s", e.msg);
                    CHECK(emu_mmq_launches == 1 && emu_blas == 0, "mmq %s m=%d: %d tiled launches, %d cuBLAS", md_type_name(type), m, emu_mmq_launches, emu_blas);
                    CHECK(emu_mmt_launches == (m > CUDA_MMQ_DP4A_MAX_M), "mmq %s m=%d: %d tensor-core launches", md_type_name(type), m, emu_mmt_launches);
                    double ss = 0, worst = 0;
                    for (int t = 0; t < m; t++)
                        for (int j = 0; j < n; j++) {
                            double r = 5.0;
                            for (int l = 0; l < k; l++) r += (double)xs[(size_t)t * k + l] * w->d[(size_t)j * k + l];
                            ss += r * r;
                            worst = std::max(worst, fabs(y[(size_t)t * n + j] - r));
                        }
                    double rms = sqrt(ss / (m * n));
                    CHECK(worst <= 1e-5 * rms, "mmq %s n=%d k=%d m=%d: worst %.3g of rms %.3g", md_type_name(type), n, k, m, worst, rms);
                    free(x); free(ctx.scratch[0]); free(ctx.scratch[1]);
                }
                free(w->q); delete w;
            }
        }
        printf("mmq %-5s n=12,70 k=512%s m=9,20,32 (dp4a), 33,64,100 (mma) (ACC): within 1e-5 of rms of the double product\n", md_type_name(type), kq ? "" : ",576");
    }
}

/* A NaN in x reaches every output of a quantized GEMV instead of vanishing in int8 (the
 * engine fails a sequence whose logits are not numbers); the other token's rows are intact. */
static void test_gemv_nan() {
    const int k = 256, m = 2;
    for (int type : {MD_TYPE_Q4_0, MD_TYPE_Q4_1, MD_TYPE_Q8_0, MD_TYPE_Q4_K, MD_TYPE_Q6_K}) {
        emu_w *w = make_w(type, 6, k);
        float *x = (float *)aligned_alloc(64, (size_t)m * k * 4);
        for (int i = 0; i < m * k; i++) x[i] = frand();
        x[k + 77] = NAN; /* token 1 */
        std::vector<float> y((size_t)m * w->n, 0.0f);
        cuda_ctx ctx = {};
        md_err e = {};
        cuda_mm_w one = {w->q, w->type, w->rb, w->n, y.data(), nullptr};
        CHECK(mm_run(&ctx, &one, 1, x, m, k, CUDA_MM_SET, 0.0f, 0, &e) == 0, "matmul: %s", e.msg);
        int nan0 = 0, nan1 = 0;
        for (int j = 0; j < w->n; j++) nan0 += std::isnan(y[j]), nan1 += std::isnan(y[w->n + j]);
        CHECK(nan0 == 0 && nan1 == w->n, "%s: NaN in token 1: %d NaN outputs in token 0, %d of %d in token 1", md_type_name(type), nan0, nan1, w->n);
        free(x); free(ctx.scratch[0]); free(ctx.scratch[1]); free(w->q); delete w;
    }
    printf("gemv of quantized weights: a NaN in x makes its token's outputs NaN, the other token's are numbers\n");
}

static void test_matmul_n() {
    const int k = 256;
    /* Q/K/V-like row counts 5 + 3 + 2: blocks of 4 warps straddle segments */
    for (int type : {MD_TYPE_BF16, MD_TYPE_Q4_0, MD_TYPE_Q4_K}) {
        emu_w *w[3] = {make_w(type, 5, k), make_w(type, 3, k), make_w(type, 2, k)};
        emu_w *up = make_w(type, 5, k);
        auto set = [&](int n) { return std::vector<emu_w *>(w, w + n); };
        for (int n = 1; n <= 3; n++) {
            check_mm_n(set(n), CUDA_MM_SET, 1, k, 1, 0);
            check_mm_n(set(n), CUDA_MM_ACC, 1, k, 1, 0);
        }
        check_mm_n({w[0], up}, CUDA_MM_SWIGLU, 1, k, 1, 0);
        for (int m : {3, 8}) {
            check_mm_n(set(m == 3 ? 3 : 2), CUDA_MM_SET, m, k, 1, 0);
            check_mm_n(set(3), CUDA_MM_ACC, m, k, 1, 0);
            check_mm_n({w[0], up}, CUDA_MM_SWIGLU, m, k, 1, 0);
        }
        /* above CUDA_GEMV_MAX_M: cuBLAS, x converted once for all weights */
        check_mm_n(set(3), CUDA_MM_SET, 9, k, -1, 1);
        check_mm_n(set(2), CUDA_MM_ACC, 9, k, -1, 1);
        check_mm_n({w[0], up}, CUDA_MM_SWIGLU, 9, k, -1, 1);
        if (type == MD_TYPE_BF16) { /* a weight off 16-byte alignment: its rows on the dq32 loop */
            check_mm_n(set(3), CUDA_MM_SET, 3, k, 1, 0, 2);
            check_mm_n({w[0], up}, CUDA_MM_SWIGLU, 3, k, 1, 0, 2);
        }
        for (auto *p : {w[0], w[1], w[2], up}) { free(p->q); delete p; }
    }
    /* mixed types (a Q4_K_M file's Q6_K attn_v and ffn_down): one GEMV launch per type,
     * gate/up of two types unfused; cuBLAS converts x once per activation type */
    emu_w *q = make_w(MD_TYPE_Q4_K, 5, k), *kk = make_w(MD_TYPE_Q4_K, 3, k), *v = make_w(MD_TYPE_Q6_K, 2, k);
    emu_w *g = make_w(MD_TYPE_Q4_K, 5, k), *u = make_w(MD_TYPE_Q6_K, 5, k);
    emu_w *h = make_w(MD_TYPE_F16, 3, k), *b = make_w(MD_TYPE_BF16, 2, k), *f = make_w(MD_TYPE_F32, 3, k);
    for (int m : {1, 8}) {
        check_mm_n({q, kk, v}, CUDA_MM_SET, m, k, 2, 0);
        check_mm_n({v, q, kk}, CUDA_MM_ACC, m, k, 2, 0);
        check_mm_n({g, u}, CUDA_MM_SWIGLU, m, k, 2, 0);
        check_mm_n({h, q, b, f}, CUDA_MM_SET, m, k, 4, 0);
    }
    check_mm_n({q, kk, v}, CUDA_MM_SET, 9, k, -1, 1);
    check_mm_n({g, u}, CUDA_MM_SWIGLU, 9, k, -1, 1);
    check_mm_n({h, q, b, f}, CUDA_MM_ACC, 9, k, -1, 2);
    for (auto *p : {q, kk, v, g, u, h, b, f}) { free(p->q); delete p; }
    /* bad arguments are refused before anything runs */
    cuda_ctx ctx = {};
    md_err e = {};
    emu_w *a = make_w(MD_TYPE_Q4_0, 4, k), *c = make_w(MD_TYPE_Q4_0, 5, k);
    std::vector<float> x(k), y(8);
    cuda_mm_w cw[5];
    for (int i = 0; i < 5; i++) cw[i] = {a->q, a->type, a->rb, a->n, y.data()};
    cw[1] = {c->q, c->type, c->rb, c->n, y.data()};
    emu_gemv_launches = 0;
    CHECK(mm_run(&ctx, cw, 5, x.data(), 1, k, CUDA_MM_SET, 0.0f, 0, &e) == MD_EINVAL, "5 weights accepted");
    CHECK(mm_run(&ctx, cw, 2, x.data(), 1, k, CUDA_MM_SWIGLU, 0.0f, 0, &e) == MD_EINVAL, "SwiGLU of 4 and 5 rows accepted");
    CHECK(mm_run(&ctx, cw, 1, x.data(), 1, k, 7, 0.0f, 0, &e) == MD_EINVAL, "mode 7 accepted");
    cw[0].row_bytes++;
    CHECK(mm_run(&ctx, cw, 2, x.data(), 1, k, CUDA_MM_SET, 0.0f, 0, &e) == MD_EINVAL, "wrong row size accepted");
    cw[0].row_bytes--, cw[0].wtype = 99;
    CHECK(mm_run(&ctx, cw, 2, x.data(), 1, k, CUDA_MM_SET, 0.0f, 0, &e) == MD_EUNSUPP, "type 99 accepted");
    CHECK(emu_gemv_launches == 0, "a refused call launched %d kernels", emu_gemv_launches);
    printf("matmul_n bad arguments refused: %s\n", e.msg);
    cw[0].wtype = a->type, cw[0].w = a->q + 2;
    CHECK(mm_run(&ctx, cw, 2, x.data(), 1, k, CUDA_MM_SET, 0.0f, 0, &e) == MD_EINVAL, "a quantized weight off 4-byte alignment accepted");
    CHECK(emu_gemv_launches == 0, "a refused call launched %d kernels", emu_gemv_launches);
    printf("matmul_n unaligned quantized weight refused: %s\n", e.msg);
    for (auto *p : {a, c}) { free(p->q); delete p; }
}

/* BF16 weight copies (cuda_mm_w.bf16, backend.h weight_shadow) on gemm.cu's host code: on
 * the cuBLAS path a quantized weight with a copy (made by k_dequant, as the backend makes it)
 * is not expanded again and the result equals the expanding call bit for bit; the GEMV path
 * and 16-bit / F32 weights ignore the copy (given garbage here, so reading it would show). */
static void test_matmul_bf16_copies() {
    const int k = 256;
    emu_w *q = make_w(MD_TYPE_Q4_K, 5, k), *v = make_w(MD_TYPE_Q6_K, 3, k), *o = make_w(MD_TYPE_Q4_0, 4, k);
    emu_w *h = make_w(MD_TYPE_F16, 3, k), *b = make_w(MD_TYPE_BF16, 2, k);
    std::vector<emu_w *> W = {q, v, o, h, b};
    std::vector<std::vector<uint16_t>> copy(W.size());
    for (size_t i = 0; i < W.size(); i++) {
        copy[i].assign((size_t)W[i]->n * k, 0x7fc1); /* NaN: must never be read */
        if (W[i]->type == MD_TYPE_F16 || W[i]->type == MD_TYPE_BF16) continue;
        int64_t ng = (int64_t)W[i]->n * k / 32;
        const uint8_t *src = W[i]->q;
        void *dst = copy[i].data();
        QT_DISPATCH(W[i]->type, emu_serial(dim3(cuda_blocks(ng, 128)), dim3(128), [&] { k_dequant<QT>(src, dst, CUDA_BF16, ng); }));
    }
    int worst_bits = 0;
    for (int mode : {CUDA_MM_SET, CUDA_MM_ACC})
        for (int m : {1, 8, 9, 40, 260}) {
            float *x = (float *)aligned_alloc(64, ((size_t)m * k * 4 + 63) / 64 * 64);
            for (int i = 0; i < m * k; i++) x[i] = frand();
            std::vector<std::vector<float>> ya(W.size()), yb(W.size());
            cuda_mm_w a[CUDA_MM_MAX], c[CUDA_MM_MAX];
            /* two calls of up to 4 weights: Q4_K, Q6_K, Q4_0, F16 then BF16 alone */
            for (int part = 0; part < 2; part++) {
                int first = part ? 4 : 0, nw = part ? 1 : 4;
                for (int i = 0; i < nw; i++) {
                    const emu_w *w = W[first + i];
                    ya[first + i].assign((size_t)m * w->n, 1.5f);
                    yb[first + i] = ya[first + i];
                    a[i] = {w->q, w->type, w->rb, w->n, ya[first + i].data(), nullptr};
                    c[i] = {w->q, w->type, w->rb, w->n, yb[first + i].data(), copy[first + i].data()};
                }
                cuda_ctx ctx = {};
                md_err e = {};
                float beta = mode == CUDA_MM_ACC ? 1.0f : 0.0f;
                emu_dequants = emu_gemv_launches = 0;
                CHECK(mm_run(&ctx, a, nw, x, m, k, mode, beta, 0, &e) == 0, "matmul: %s", e.msg);
                int dq_a = emu_dequants, la = emu_gemv_launches;
                emu_dequants = emu_gemv_launches = 0;
                CHECK(mm_run(&ctx, c, nw, x, m, k, mode, beta, 0, &e) == 0, "matmul with copies: %s", e.msg);
                /* 8 < m <= CUDA_MMQ_MAX_M: without copies the quantized weights take the
                 * int8 tiled path (no expansion either), with them cuBLAS reads the copies */
                int expand = m > CUDA_MMQ_MAX_M && part == 0;
                CHECK(dq_a == (expand ? 3 : 0) && emu_dequants == 0, "m=%d: %d expansions without copies, %d with", m, dq_a, emu_dequants);
                CHECK(emu_gemv_launches == la, "m=%d: %d GEMV launches with copies, %d without", m, emu_gemv_launches, la);
                free(ctx.scratch[0]);
                free(ctx.scratch[1]);
            }
            for (size_t i = 0; i < W.size(); i++) {
                if (m > CUDA_GEMV_MAX_M && m <= CUDA_MMQ_MAX_M && is_quant(W[i]->type))
                    continue; /* two different paths: test_mmq checks the tiled one */
                int bits = 0;
                for (size_t j = 0; j < ya[i].size(); j++) bits += memcmp(&ya[i][j], &yb[i][j], 4) != 0;
                worst_bits = std::max(worst_bits, bits);
                CHECK(bits == 0, "%s m=%d mode %d: %d outputs differ with the BF16 copy", md_type_name(W[i]->type), m, mode, bits);
            }
            free(x);
        }
    printf("matmul with BF16 weight copies (Q4_K, Q6_K, Q4_0 + F16, BF16; SET/ACC; m=1,8,9,40,260): no expansion on cuBLAS, "
           "GEMV (m <= 8) and the int8 tiled path (m <= %d, no copy) read the quantized weight, %d outputs differ from the expanding path\n", CUDA_MMQ_MAX_M, worst_bits);
    for (auto *p : W) { free(p->q); delete p; }
}

/* The device draw against the engine's host draw (smp_draw), same logits and u: the
 * engine's claim is that one u picks the same token on either backend. */
/* ---- rope_kv: k_rope_kv against k_rope (q, k) + k_kv_write on the emulator, bit for bit
 * (q, every byte of both caches), and against the CPU backend's rope_kv (f32 cache). Caches
 * f32/f16/bf16, neox and not, full and partial rotary, head_dim 64 (GQA 8/2) and 128 (4/1);
 * tokens scattered over slots. Kernels without barriers: run serially (fast). ---- */
static void test_rope_kv(md_backend *cpu) {
    enum { RT = 43, NSLOT = 64 };
    int32_t pos[RT], slots[RT], tokens[RT], seq[RT], table[4] = {0, 1, 2, 3}, len[1] = {64}, lr[1] = {RT - 1};
    for (int t = 0; t < RT; t++) pos[t] = t < 37 ? t : 13 + t, slots[t] = (t * 37 + 5) % NSLOT, tokens[t] = 1, seq[t] = 0;
    md_batch b = {RT, 1, tokens, seq, pos, slots, len, table, 4, 16, lr, 1};
    struct { int hd, nh, nkv, rot; } shapes[] = {{64, 8, 2, 64}, {64, 8, 2, 32}, {128, 4, 1, 128}, {128, 4, 1, 64}};
    md_rope_cfg rc = {10000.0f, 1.0f, 0, 0, 0, 0};
    int cases = 0;
    for (auto sh : shapes) for (int neox = 0; neox < 2; neox++) for (cuda_dtype ct : {CUDA_F32, CUDA_F16, CUDA_BF16}) {
        int hd = sh.hd, nh = sh.nh, nkv = sh.nkv, rot = sh.rot, kvd = nkv * hd;
        float inv[64];
        md_rope_inv_freq(&rc, rot, inv);
        std::vector<float> q((size_t)RT * nh * hd), k((size_t)RT * kvd), v((size_t)RT * kvd);
        for (auto &a : q) a = frand() * 4; for (auto &a : k) a = frand() * 4; for (auto &a : v) a = frand();
        size_t cb = (size_t)NSLOT * kvd * (ct == CUDA_F32 ? 4 : 2);
        std::vector<uint8_t> kc1(cb, 0xA5), vc1(cb, 0x5A), kc2(cb, 0xA5), vc2(cb, 0x5A);
        /* reference launches: rope q, rope k, store */
        std::vector<float> q1 = q, k1 = k, q2 = q, k2 = k;
        emu_serial(dim3(cuda_blocks((int64_t)RT * nh * (rot / 2), 256)), dim3(256), [&] { k_rope(q1.data(), pos, RT, nh, hd, rot, inv, neox); });
        emu_serial(dim3(cuda_blocks((int64_t)RT * nkv * (rot / 2), 256)), dim3(256), [&] { k_rope(k1.data(), pos, RT, nkv, hd, rot, inv, neox); });
        emu_serial(dim3(cuda_blocks((int64_t)RT * kvd, 256)), dim3(256), [&] { k_kv_write(kc1.data(), vc1.data(), ct, k1.data(), v.data(), slots, RT, kvd); });
        /* the fused launch */
        emu_serial(dim3(cuda_blocks((int64_t)RT * (nh + nkv) * (hd / 2), 256)), dim3(256), [&] {
            k_rope_kv(q2.data(), k2.data(), v.data(), kc2.data(), vc2.data(), ct, pos, slots, RT, nh, nkv, hd, rot, inv, neox); });
        const char *tn = ct == CUDA_F32 ? "f32" : ct == CUDA_F16 ? "f16" : "bf16";
        CHECK(!memcmp(q1.data(), q2.data(), q1.size() * 4), "rope_kv %s hd=%d rot=%d neox=%d: q differs from k_rope's", tn, hd, rot, neox);
        CHECK(kc1 == kc2, "rope_kv %s hd=%d rot=%d neox=%d: k cache differs from k_rope + k_kv_write", tn, hd, rot, neox);
        CHECK(vc1 == vc2, "rope_kv %s hd=%d rot=%d neox=%d: v cache differs from k_kv_write's", tn, hd, rot, neox);
        CHECK(!memcmp(k.data(), k2.data(), k.size() * 4), "rope_kv wrote k");
        double worst = 0;
        if (ct == CUDA_F32) { /* the CPU backend's rope_kv (its own sin/cos: to 1e-5) */
            md_err e = {};
            md_reserve r = {64, 4, 512, 64, 4, nh};
            md_buf *bq, *bk, *bv, *bkc, *bvc, *bi;
            auto mk = [&](const void *h, size_t n, md_buf **o) { cpu->ops->buf_alloc(cpu, n, o, &e); if (h) cpu->ops->buf_upload(cpu, *o, 0, h, n, &e); };
            if (cpu->ops->reserve(cpu, &r, &e) || cpu->ops->batch_prepare(cpu, &b, &e)) { printf("%s\n", e.msg); fails++; continue; }
            mk(q.data(), q.size() * 4, &bq); mk(k.data(), k.size() * 4, &bk); mk(v.data(), v.size() * 4, &bv);
            mk(nullptr, cb, &bkc); mk(nullptr, cb, &bvc); mk(inv, sizeof inv, &bi);
            if (cpu->ops->rope_kv(cpu, bq, bk, bv, bkc, bvc, nh, nkv, hd, rot, bi, neox, MD_TYPE_F32, &e)) { printf("%s\n", e.msg); fails++; continue; }
            std::vector<float> rq(q.size()), rk((size_t)NSLOT * kvd), rv(rk.size());
            cpu->ops->buf_download(cpu, bq, 0, rq.data(), rq.size() * 4, &e);
            cpu->ops->buf_download(cpu, bkc, 0, rk.data(), cb, &e);
            cpu->ops->buf_download(cpu, bvc, 0, rv.data(), cb, &e);
            const float *dk = (const float *)kc2.data(), *dv = (const float *)vc2.data();
            for (size_t i = 0; i < rq.size(); i++) worst = std::max(worst, (double)fabsf(rq[i] - q2[i]));
            for (int t = 0; t < RT; t++) for (int d = 0; d < kvd; d++) {
                size_t o = (size_t)slots[t] * kvd + d;
                worst = std::max(worst, (double)fabsf(rk[o] - dk[o]));
                CHECK(rv[o] == dv[o], "rope_kv f32: v at slot %d dim %d differs from the CPU backend's", slots[t], d);
            }
            CHECK(worst < 1e-5, "rope_kv f32 hd=%d rot=%d neox=%d: worst %.3g vs the CPU backend", hd, rot, neox, worst);
            for (md_buf *m : {bq, bk, bv, bkc, bvc, bi}) cpu->ops->buf_free(cpu, m);
        }
        cases++;
        if (ct == CUDA_F32)
            printf("rope_kv hd=%d heads %d/%d rot=%d neox=%d: f32/f16/bf16 caches bit-equal to k_rope + k_kv_write; vs CPU worst %.2e\n", hd, nh, nkv, rot, neox, worst);
    }
    printf("rope_kv: %d cases\n", cases);
}

static void test_sample_vs_host() {
    const int V = 600;
    std::vector<float> l(V);
    for (auto &a : l) a = 2.5f * frand();
    struct { float temp, top_p, min_p; int top_k; } cases[] = {
        {1.0f, 0.5f, 0.0f, 5}, {0.8f, 0.9f, 0.0f, 20}, {1.0f, 0.7f, 0.0f, 0}, {1.2f, 1.0f, 0.1f, 0}, {1.0f, 1.0f, 0.0f, 8}};
    smp_scratch *sc = smp_scratch_new(V);
    const int R = 8;
    /* 256 threads (8 warps) instead of the kernel's production block: the same code paths
     * (strided loops, two-level reductions and scans), an eighth of the emulation's cost */
    for (auto &c : cases) {
        cuda_sample_params P[R];
        for (int r = 0; r < R; r++) P[r] = {c.temp, c.top_k, c.top_p, c.min_p, (r + 0.5f) / R, 1.0f};
        std::vector<float> rows(R * V);
        for (int r = 0; r < R; r++) memcpy(&rows[r * V], l.data(), V * 4);
        int32_t out[R];
        emu_launch(dim3(R), dim3(256), [&] { k_sample(rows.data(), V, P, nullptr, nullptr, out, nullptr, nullptr, nullptr); });
        int diff = 0;
        printf("device vs smp_draw, T=%.1f top_k=%d top_p=%.2f min_p=%.2f:", c.temp, c.top_k, c.top_p, c.min_p);
        for (int r = 0; r < R; r++) {
            int h = smp_draw(c.temp, c.top_k, c.top_p, c.min_p, (double)P[r].u, l.data(), V, sc);
            printf(" %d/%d", out[r], h);
            diff += out[r] != h;
        }
        printf("%s\n", diff ? "  <- DIFFERENT" : "");
        CHECK(diff == 0, "device and host draws differ on %d of %d u's (top_k %d, top_p %.2f)", diff, R, c.top_k, c.top_p);
    }
    smp_scratch_free(sc);
}

/* Penalties and logprobs on the device against engine/sampler.c's row sampler (the CPU
 * path, smp_sample_row): rows of one sequence history each under different penalties and
 * filters, the entries made by smp_pen_list. The penalised row must equal the host's bit for
 * bit, the token must be the host's, the logprob the host's raw one within 1e-5; a greedy
 * row whose frequency penalty moves the argmax checks the penalties are applied at all. */
static void test_sample_penalties() {
    const int V = 600, R = 8;
    std::vector<float> l(V);
    for (auto &a : l) a = 2.5f * frand() - 1.0f; /* negative logits too: repetition multiplies them */
    int top = 0;
    for (int i = 1; i < V; i++) if (l[i] > l[top]) top = i;
    l[top == 5 ? 6 : 5] = l[V - 1] = l[top] - 0.01f; /* a tie in second place: lower id first */
    /* a prompt and an output with repeats; the output repeats the raw argmax three times */
    std::vector<int32_t> toks;
    for (int i = 0; i < 40; i++) toks.push_back((int32_t)((i * 37) % V));
    int n_prompt = (int)toks.size();
    for (int i = 0; i < 12; i++) toks.push_back((int32_t)((i * 11 + 5) % 50));
    toks.push_back(top); toks.push_back(top); toks.push_back(top);
    int n_out = (int)toks.size() - n_prompt;
    struct { float temp, top_p, min_p; int top_k; float rep, pres, freq; } cases[R] = {
        {0.0f, 1.0f, 0.0f, 0, 1.0f, 0.0f, 2.0f},  /* greedy: the frequency penalty moves the argmax */
        {0.0f, 1.0f, 0.0f, 0, 1.3f, 0.5f, 0.3f},  /* greedy with every penalty */
        {0.0f, 1.0f, 0.0f, 0, 1.0f, 0.0f, 0.0f},  /* no penalty: the logprob alone */
        {0.8f, 1.0f, 0.0f, 0, 1.2f, 0.0f, 0.0f},  /* sampled, repetition over prompt and output */
        {1.0f, 0.9f, 0.0f, 20, 1.0f, -1.5f, 0.7f}, /* negative presence raises seen tokens */
        {1.2f, 1.0f, 0.05f, 0, 1.5f, 0.2f, 0.2f},
        {0.7f, 0.5f, 0.0f, 0, 1.1f, 2.0f, 2.0f},
        {1.0f, 1.0f, 0.0f, 8, 0.8f, 0.0f, -2.0f}, /* repetition below 1 and a negative frequency */
    };
    smp_scratch *sc = smp_scratch_new(V);
    std::vector<md_sample_pen> pen((size_t)R * V);
    md_sample_params hp[R];
    cuda_sample_params P[R];
    int n_pen = 0;
    for (int r = 0; r < R; r++) {
        md_sampling s;
        md_sampling_default(&s);
        s.temperature = cases[r].temp; s.top_k = cases[r].top_k; s.top_p = cases[r].top_p;
        s.min_p = cases[r].min_p; s.repetition_penalty = cases[r].rep;
        s.presence_penalty = cases[r].pres; s.frequency_penalty = cases[r].freq;
        hp[r] = smp_params(&s, (r + 0.5) / R);
        hp[r].u = (float)hp[r].u; /* the device's u is a float */
        hp[r].pen_off = n_pen;
        hp[r].pen_n = smp_pen_list(&s, toks.data(), n_prompt, toks.data() + n_prompt, n_out, V, sc, pen.data() + n_pen);
        n_pen += hp[r].pen_n;
        hp[r].n_top = r == 0 ? 3 : r == 3 ? CUDA_SAMPLE_TOP : r == 5 ? 1 : 0;
        P[r] = {hp[r].temperature, hp[r].top_k, hp[r].top_p, hp[r].min_p, (float)hp[r].u,
                hp[r].repetition, hp[r].presence, hp[r].frequency, hp[r].pen_off, hp[r].pen_n, hp[r].n_top};
    }
    CHECK(hp[2].pen_n == 0 && hp[0].pen_n == 13 && hp[1].pen_n > 40, "penalty entries %d %d %d", hp[0].pen_n, hp[1].pen_n, hp[2].pen_n);
    std::vector<float> rows((size_t)R * V), raw_after(n_pen);
    for (int r = 0; r < R; r++) memcpy(&rows[(size_t)r * V], l.data(), V * 4);
    int32_t out[R], top_tok[R * CUDA_SAMPLE_TOP];
    float lp[R], top_lp[R * CUDA_SAMPLE_TOP];
    emu_launch(dim3(R), dim3(256), [&] {
        k_sample(rows.data(), V, P, reinterpret_cast<const cuda_sample_pen *>(pen.data()), raw_after.data(), out, lp, top_tok, top_lp);
    });
    int moved = 0;
    for (int r = 0; r < R; r++) {
        /* the host's penalised row: the row sampler at temperature 0 only penalises it */
        std::vector<float> pr(l), hr(l);
        md_sample_params g = hp[r];
        g.temperature = 0;
        smp_sample_row(&g, pen.data(), pr.data(), V, sc, nullptr);
        CHECK(memcmp(pr.data(), &rows[(size_t)r * V], V * 4) == 0, "row %d: the device's penalised logits differ from the host's", r);
        float hlp = 0;
        int32_t h = smp_sample_row(&hp[r], pen.data(), hr.data(), V, sc, &hlp);
        CHECK(out[r] == h, "row %d (T %.1f rep %.1f pres %.1f freq %.1f): device token %d, host %d", r, cases[r].temp, cases[r].rep, cases[r].pres, cases[r].freq, out[r], h);
        CHECK(fabsf(lp[r] - hlp) < 1e-5f, "row %d: device logprob %.7f, host %.7f", r, lp[r], hlp);
        printf("penalties row %d (T %.1f rep %.1f pres %.1f freq %.1f, %d entries): token %d/%d, logprob %.6f/%.6f\n", r, cases[r].temp, cases[r].rep, cases[r].pres, cases[r].freq, hp[r].pen_n, out[r], h, lp[r], hlp);
        moved += r == 0 && out[r] != top;
        /* the raw row's alternatives, as smp_top_logprobs lists them; -1 past the last */
        int32_t ht[MD_TOP_LOGPROBS];
        float hl[MD_TOP_LOGPROBS];
        int m = smp_top_logprobs(l.data(), V, hp[r].n_top, ht, hl);
        CHECK(m == hp[r].n_top, "row %d: host listed %d of %d", r, m, hp[r].n_top);
        for (int j = 0; j < CUDA_SAMPLE_TOP; j++) {
            int32_t dt = top_tok[r * CUDA_SAMPLE_TOP + j];
            float dl = top_lp[r * CUDA_SAMPLE_TOP + j];
            if (j < m) {
                CHECK(dt == ht[j], "row %d top %d: device token %d, host %d", r, j, dt, ht[j]);
                CHECK(fabsf(dl - hl[j]) < 1e-5f, "row %d top %d: device logprob %.7f, host %.7f", r, j, dl, hl[j]);
            } else {
                CHECK(dt == -1 && dl == 0.0f, "row %d top %d past the last: %d %g", r, j, dt, dl);
            }
        }
        if (m >= 3)
            printf("  top logprobs: %d %d %d (host %d %d %d; a tie between %d and %d)\n", top_tok[r * CUDA_SAMPLE_TOP], top_tok[r * CUDA_SAMPLE_TOP + 1], top_tok[r * CUDA_SAMPLE_TOP + 2], ht[0], ht[1], ht[2], top == 5 ? 6 : 5, V - 1);
    }
    CHECK(moved == 1, "the greedy row's frequency penalty did not move it off the raw argmax %d", top);
    smp_scratch_free(sc);
}

/* Constrained rows (structured outputs): a grammar's token mask and logit_bias applied on the
 * device by k_constrain, then k_sample, against engine/sampler.c's smp_sample_row with the
 * same constraint (the CPU path). Rows mix masks (a partial last word, most tokens masked,
 * the raw argmax masked), bias entries (a repeated token: adds in order) and unconstrained
 * rows, under greedy, temperature and every filter, penalties and top logprobs: the
 * constrained row must equal the host's bit for bit, the token must be the host's and
 * allowed, the logprob and the top logprobs the host's (the constrained distribution). */
static void test_sample_constrained() {
    const int V = 1000, R = 8, W = (V + 31) / 32;
    std::vector<float> l(V);
    for (auto &a : l) a = 3.0f * frand() - 1.0f;
    int top = 0;
    for (int i = 1; i < V; i++) if (l[i] > l[top]) top = i;
    std::vector<uint32_t> masks((size_t)R * W, 0);
    std::vector<md_sample_bias> bias;
    md_sample_params hp[R];
    cuda_sample_params P[R];
    std::vector<md_sample_pen> pen;
    smp_scratch *sc = smp_scratch_new(V);
    int n_masked = 0;
    struct { float temp, top_p, min_p; int top_k; float rep; int mask, nbias, n_top; } cases[R] = {
        {0.0f, 1.0f, 0.0f, 0, 1.0f, 1, 0, 5},   /* greedy: the raw argmax masked */
        {1.0f, 1.0f, 0.0f, 0, 1.0f, 1, 3, 3},   /* sampled, mask and bias */
        {0.8f, 0.9f, 0.0f, 40, 1.3f, 1, 0, 0},  /* every filter and a penalty */
        {1.0f, 1.0f, 0.1f, 0, 1.0f, 0, 4, 2},   /* bias alone */
        {1.0f, 1.0f, 0.0f, 0, 1.0f, 0, 0, 0},   /* unconstrained */
        {1.2f, 0.5f, 0.0f, 0, 1.0f, 2, 0, 20},  /* a sparse mask: 7 tokens */
        {0.7f, 1.0f, 0.0f, 500, 1.0f, 2, 2, 1}, /* top_k above the allowed count */
        {0.0f, 1.0f, 0.0f, 0, 1.0f, 3, 1, 0},   /* one allowed token, the last of the row */
    };
    int32_t hist[6] = {top, 3, 17, 999, 3, 500};
    for (int r = 0; r < R; r++) {
        md_sampling s;
        md_sampling_default(&s);
        s.temperature = cases[r].temp; s.top_k = cases[r].top_k; s.top_p = cases[r].top_p;
        s.min_p = cases[r].min_p; s.repetition_penalty = cases[r].rep;
        hp[r] = smp_params(&s, (r + 0.37) / R);
        hp[r].u = (float)hp[r].u;
        hp[r].pen_off = (int)pen.size();
        std::vector<md_sample_pen> pl(V);
        hp[r].pen_n = smp_pen_list(&s, hist, 6, nullptr, 0, V, sc, pl.data());
        pen.insert(pen.end(), pl.begin(), pl.begin() + hp[r].pen_n);
        hp[r].n_top = cases[r].n_top;
        P[r] = {hp[r].temperature, hp[r].top_k, hp[r].top_p, hp[r].min_p, (float)hp[r].u,
                hp[r].repetition, hp[r].presence, hp[r].frequency, hp[r].pen_off, hp[r].pen_n, hp[r].n_top, 0, 0, 0};
        if (cases[r].mask) {
            uint32_t *m = &masks[(size_t)n_masked * W];
            for (int t = 0; t < V; t++) {
                int ok = cases[r].mask == 1 ? (t % 3 != 0 && t != top) : cases[r].mask == 2 ? (t % 143 == 5) : t == V - 1;
                if (ok) m[t / 32] |= 1u << (t % 32);
            }
            hp[r].mask = m;
            P[r].mask_row = ++n_masked;
        }
        hp[r].bias = nullptr;
        hp[r].n_bias = cases[r].nbias;
        P[r].bias_off = (int)bias.size();
        P[r].bias_n = cases[r].nbias;
        for (int j = 0; j < cases[r].nbias; j++) /* token 12 twice: the adds happen in order */
            bias.push_back({j < 2 ? 12 : (int32_t)(j * 211 + r) % V, j == 0 ? 7.5f : j == 1 ? -0.3f : 100.0f});
        bias.push_back({V + 5, 50.0f}); /* outside the row: skipped */
        P[r].bias_n += cases[r].nbias ? 1 : 0;
        hp[r].n_bias = P[r].bias_n;
    }
    for (int r = 0; r < R; r++)
        hp[r].bias = hp[r].n_bias ? bias.data() + P[r].bias_off : nullptr;
    std::vector<float> rows((size_t)R * V), raw_after(pen.size() + 1);
    for (int r = 0; r < R; r++) memcpy(&rows[(size_t)r * V], l.data(), V * 4);
    emu_launch(dim3(R), dim3(256), [&] {
        k_constrain(rows.data(), V, P, masks.data(), reinterpret_cast<const cuda_sample_bias *>(bias.data()));
    });
    for (int r = 0; r < R; r++) { /* the constrained row, bit for bit */
        std::vector<float> cr(l);
        int allowed = smp_constrain(&hp[r], cr.data(), V);
        CHECK(allowed > 0, "row %d: the host's mask allows nothing", r);
        CHECK(memcmp(cr.data(), &rows[(size_t)r * V], V * 4) == 0, "row %d: the device's constrained logits differ from the host's", r);
    }
    int32_t out[R], top_tok[R * CUDA_SAMPLE_TOP];
    float lp[R], top_lp[R * CUDA_SAMPLE_TOP];
    emu_launch(dim3(R), dim3(256), [&] {
        k_sample(rows.data(), V, P, reinterpret_cast<const cuda_sample_pen *>(pen.data()), raw_after.data(), out, lp, top_tok, top_lp);
    });
    for (int r = 0; r < R; r++) {
        std::vector<float> hr(l);
        float hlp = 0;
        int32_t h = smp_sample_row(&hp[r], pen.data(), hr.data(), V, sc, &hlp);
        int ok = !hp[r].mask || ((hp[r].mask[out[r] / 32] >> (out[r] % 32)) & 1u);
        CHECK(out[r] >= 0 && out[r] < V && ok, "row %d: device token %d is masked", r, out[r]);
        CHECK(out[r] == h, "row %d (T %.1f mask %d bias %d): device token %d, host %d", r, cases[r].temp, cases[r].mask, cases[r].nbias, out[r], h);
        CHECK(fabsf(lp[r] - hlp) < 1e-5f, "row %d: device logprob %.7f, host %.7f", r, lp[r], hlp);
        std::vector<float> cr(l);
        smp_constrain(&hp[r], cr.data(), V);
        int32_t ht[MD_TOP_LOGPROBS];
        float hl[MD_TOP_LOGPROBS];
        int m = smp_top_logprobs(cr.data(), V, hp[r].n_top, ht, hl);
        for (int j = 0; j < CUDA_SAMPLE_TOP; j++) {
            int32_t dt = top_tok[r * CUDA_SAMPLE_TOP + j];
            float dl = top_lp[r * CUDA_SAMPLE_TOP + j];
            if (j < m) {
                CHECK(dt == ht[j] && fabsf(dl - hl[j]) < 1e-5f, "row %d top %d: device %d %.7f, host %d %.7f", r, j, dt, dl, ht[j], hl[j]);
            } else {
                CHECK(dt == -1, "row %d top %d past the last (%d listed): %d", r, j, m, dt);
            }
        }
        printf("constrained row %d (T %.1f mask %d bias %d): token %d/%d, logprob %.6f/%.6f, %d alternatives\n", r, cases[r].temp, cases[r].mask, cases[r].nbias, out[r], h, lp[r], hlp, m);
    }
    CHECK(out[0] != top && out[7] == V - 1, "the greedy masked rows: %d (raw argmax %d), %d", out[0], top, out[7]);
    smp_scratch_free(sc);
}

int main(int argc, char **argv) {
    md_backend *cpu;
    md_err e = {};
    if (md_backend_cpu_open(2, &cpu, &e)) { printf("%s\n", e.msg); return 1; }
    std::string only = argc > 1 ? argv[1] : "";
    if (only.empty() || only == "dequant") test_dequant();
    if (only.empty() || only == "gemv") { test_quant_x(); test_gemv(); test_gemv_nan(); test_cublas_args(); }
    if (only.empty() || only == "mmq") test_mmq();
    if (only.empty() || only == "matmul_n") {
        test_matmul_n();
        test_matmul_bf16_copies();
    }
    if (only.empty() || only == "elementwise") test_elementwise(cpu);
    if (only.empty() || only == "attention") {
        test_attention(cpu, 0, 64, NH, NKV);
        test_attention(cpu, 1, 64, NH, NKV);
        test_attention(cpu, 1, 128, 8, 1);
        test_attention(cpu, 0, 256, 6, 3);
        test_attention(cpu, 1, 64, 9, 3);
    }
    if (only.empty() || only == "attention" || only == "attention_tc") {
        test_attention_tc(0, 64, 8, 2);
        test_attention_tc(0, 128, 8, 1);
        test_attention_tc(1, 128, 32, 8);
        test_attention_tc(1, 64, 9, 3);
        test_attention_tc(0, 64, 12, 1);
    }
    if (only == "rope") /* the attention section above already made the setup */
        test_attention(cpu, 0, 64, NH, NKV);
    if (only.empty() || only == "rope") {
        test_rope(cpu);
        test_rope_kv(cpu);
    }
    if (only.empty() || only == "samplehost") { test_sample_vs_host(); test_sample_penalties(); test_sample_constrained(); }
    if (only.empty() || only == "sample") { test_sample(); test_sample_filters(); }
    md_backend_free(cpu);
    printf("%s: %d failure(s)\n", fails ? "FAILED" : "ok", fails);
    return fails != 0;
}
