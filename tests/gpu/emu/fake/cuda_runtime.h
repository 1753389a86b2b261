/* Host emulation of the CUDA device API used by kernels/cuda: one fiber (ucontext) per CUDA
 * thread, all on the launching thread, blocks run one after another (so __shared__ can be a
 * function-static); __syncthreads and warp shuffles are barriers at which a fiber yields
 * until its block's (warp's) live threads have all arrived. For desk-checking index math. */
#pragma once
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <climits>
#include <cfloat>
#include <algorithm>
#include <functional>
#include <mutex>
#include <vector>
#include <tuple>
#include <type_traits>

#include "common/dtype.h" /* the half and bfloat16 conversions behind __half2float & co. */

typedef int cudaError_t;
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
typedef struct emu_graph *cudaGraph_t;
typedef struct emu_graph *cudaGraphExec_t;
typedef int cudaDataType;
/* error codes as the toolkit's driver_types.h numbers them */
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
};
enum { cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2 };
enum { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1, cudaStreamCaptureModeRelaxed = 2 };
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
enum cudaDeviceAttr { cudaDevAttrMemoryClockRate = 36, cudaDevAttrGlobalMemoryBusWidth = 37 };
enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor, multiProcessorCount;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
/* The runtime API kernels/cuda calls, defined by emu_rt.cc (an emulated device: one, named
 * "medley CPU emulator", whose memory is the host's and whose streams run at once or are
 * recorded while capturing). extern "C" with the toolkit's names, so C code compiled against
 * the real cuda_runtime_api.h (backend_cuda.c) calls them too. */
extern "C" {
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int ordinal);
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int ordinal);
cudaError_t cudaGetDevice(int *ordinal);
cudaError_t cudaSetDevice(int ordinal);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t err);
const char *cudaGetErrorName(cudaError_t err);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t ev);
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t ev);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
}
extern dim3 threadIdx, blockIdx; /* the running fiber's, set by the scheduler (emu.cc) */
extern dim3 blockDim, gridDim;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static
template <class T> static inline T __ldg(const T *p) { return *p; }
static inline float emu_expf(float x) { return expf(x); }
#define __expf emu_expf
/* round-to-nearest single operations: the host's own (no FMA is formed without -mfma) */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
struct alignas(16) uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
#define __align__(n) __attribute__((aligned(n)))
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(8) float2 { float x, y; };
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
using std::min;
using std::max;
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
/* round to nearest even (the default rounding mode, as lrintf) */
static inline int __float2int_rn(float f) { return (int)lrintf(f); }
/* four signed 8-bit products of a and b summed into c */
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
typedef uint16_t __half;
typedef uint16_t __nv_bfloat16;
static inline __half __ushort_as_half(uint16_t h) { return h; }
static inline uint16_t __half_as_ushort(__half h) { return h; }
static inline float __half2float(__half h) { return md_fp16_to_fp32(h); }
static inline __half __float2half_rn(float f) { return md_fp32_to_fp16(f); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return md_fp32_to_bf16(f); }
static inline uint16_t __bfloat16_as_ushort(__nv_bfloat16 b) { return b; }

/* A barrier of fibers: arrive_and_wait yields until `expected` have arrived (threads that
 * returned no longer count: arrive_and_drop). */
struct emu_bar {
    int expected = 0, arrived = 0;
    unsigned gen = 0;
    void arrive_and_wait();
    void arrive_and_drop();
};
/* per-block synchronisation state */
struct emu_block {
    emu_bar *block_bar;
    std::vector<emu_bar *> warp_bar;
    std::vector<std::vector<uint64_t>> warp_buf;
    std::vector<std::vector<int>> warp_mma; /* 2 x 32 lanes x 8 ints per warp, for emu_mma_s8 */
    std::atomic<int> or_acc{0};
};
extern emu_block *emu_cur;
static inline void __syncthreads() { emu_cur->block_bar->arrive_and_wait(); }
static inline int __syncthreads_or(int v) {
    __syncthreads();
    if (v) emu_cur->or_acc.store(1);
    __syncthreads();
    int r = emu_cur->or_acc.load();
    __syncthreads();
    if (threadIdx.x == 0) emu_cur->or_acc.store(0);
    __syncthreads();
    return r;
}
/* A shuffle: every lane publishes its value, waits for the warp, reads its source lane's.
 * Two buffers in turn (as emu_mma_buf), so one barrier a shuffle: a lane writes a buffer
 * again only after the next shuffle's barrier, which every lane passes after reading it. */
template <class T> static inline T emu_shfl(T v, int src_fn(int, int), int arg) {
    extern unsigned *emu_shfl_calls; /* the running fiber's own counter: 0 at its start */
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint64_t *buf = emu_cur->warp_buf[w].data() + ((*emu_shfl_calls)++ & 1) * 32;
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    buf[lane] = bits;
    emu_cur->warp_bar[w]->arrive_and_wait();
    int s = src_fn(lane, arg);
    uint64_t r = buf[s >= 0 && s < 32 ? s : lane];
    T out;
    memcpy(&out, &r, sizeof out);
    return out;
}
static inline int emu_xor(int l, int o) { return l ^ o; }
static inline int emu_idx(int l, int o) { return o; }
static inline int emu_up(int l, int o) { return l >= o ? l - o : l; }
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o) { return emu_shfl(v, emu_xor, o); }
template <class T> static inline T __shfl_sync(unsigned, T v, int o) { return emu_shfl(v, emu_idx, o); }
template <class T> static inline T __shfl_up_sync(unsigned, T v, int o) { return emu_shfl(v, emu_up, o); }
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_cur->warp_bar[threadIdx.x >> 5]->arrive_and_wait(); }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    extern std::mutex emu_atomic_mu;
    std::lock_guard<std::mutex> g(emu_atomic_mu);
    unsigned long long old = *p;
    *p = old + v;
    return old;
}
/* mma.sync.aligned.m16n8k{16,32}.row.col.s32.s8.s8.s32 for the calling warp, as the PTX ISA's
 * "Matrix Fragments for mma.m16n8k16 / m16n8k32 with integer type" place the elements:
 * groupID g = lane >> 2, threadID_in_group t = lane % 4; A (16 x K, row) K/8 registers of
 * 4 bytes (low byte first), B (K x 8, col) K/16, C and D 4 int32. Element i of A: row g
 * for i < 4 (K = 16) or i < 4 || 8 <= i < 12 (K = 32), else g + 8; column 4t + (i & 3),
 * + 16 for i >= 8. Element i of B: row 4t + (i & 3), + 16 for i >= 4; column g. Element i
 * of C/D: row g (i < 2) or g + 8, column 2t + (i & 1). Every lane publishes its fragments,
 * then computes its own four outputs. */
/* The calling lane's warp's fragment buffer for the next mma: two buffers in turn, so one
 * barrier a call: a lane writes a buffer again only after the next call's barrier, which
 * every lane passes after reading it. One counter for every mma form, so that calls of
 * different forms alternate too. */
static inline int *emu_mma_buf() {
    extern unsigned *emu_mma_calls; /* the running fiber's own counter: 0 at its start */
    return emu_cur->warp_mma[threadIdx.x >> 5].data() + ((*emu_mma_calls)++ & 1) * 32 * 8;
}
template <int K> static inline void emu_mma_s8(int *d, const int *a, const int *b, const int *c) {
    static_assert(K == 16 || K == 32, "m16n8k16 or m16n8k32");
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int *buf = emu_mma_buf();
    for (int r = 0; r < K / 8; r++) buf[lane * 8 + r] = a[r];
    for (int r = 0; r < K / 16; r++) buf[lane * 8 + 4 + r] = b[r];
    emu_cur->warp_bar[w]->arrive_and_wait();
    int A[16][32], B[32][8];
    for (int L = 0; L < 32; L++) {
        int g = L >> 2, t = L & 3;
        for (int i = 0; i < K / 2; i++) { /* A: K/8 registers x 4 bytes */
            int v = (int8_t)(buf[L * 8 + i / 4] >> (8 * (i & 3)));
            int up = K == 16 ? i >= 4 : (i >= 4 && i < 8) || i >= 12;
            A[g + (up ? 8 : 0)][4 * t + (i & 3) + (i >= 8 ? 16 : 0)] = v;
        }
        for (int i = 0; i < K / 4; i++) { /* B: K/16 registers x 4 bytes */
            int v = (int8_t)(buf[L * 8 + 4 + i / 4] >> (8 * (i & 3)));
            B[4 * t + (i & 3) + (i >= 4 ? 16 : 0)][g] = v;
        }
    }
    int g = lane >> 2, t = lane & 3, out[4];
    for (int i = 0; i < 4; i++) {
        int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1), s = c[i];
        for (int kk = 0; kk < K; kk++) s += A[row][kk] * B[kk][col];
        out[i] = s;
    }
    for (int i = 0; i < 4; i++) d[i] = out[i];
}
/* mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, d += a . b, as the PTX
 * ISA's "Matrix Fragments for mma.m16n8k16 with floating point type" place the elements:
 * A (16 x 16, row) 4 registers of two 16-bit values (low half first): register r holds row
 * g (r even) or g + 8 (r odd), columns 2t, 2t + 1, + 8 for r >= 2; B (16 x 8, col) 2
 * registers: rows 2t, 2t + 1 (+ 8 for the second), column g; C/D 4 floats: row g (i < 2)
 * or g + 8, column 2t + (i & 1). Products are exact in f32; sums run in k order. */
static inline float emu_h16_to_f(uint32_t h, int bf) {
    if (bf) {
        uint32_t u = (h & 0xffffu) << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return md_fp16_to_fp32((uint16_t)h);
}
template <int BF> static inline void emu_mma_h16(float *d, const uint32_t *a, const uint32_t *b) {
    int lane = threadIdx.x & 31;
    int *buf = emu_mma_buf();
    for (int r = 0; r < 4; r++) buf[lane * 8 + r] = (int)a[r];
    for (int r = 0; r < 2; r++) buf[lane * 8 + 4 + r] = (int)b[r];
    emu_cur->warp_bar[threadIdx.x >> 5]->arrive_and_wait();
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        int g = L >> 2, t = L & 3;
        for (int r = 0; r < 4; r++)
            for (int hh = 0; hh < 2; hh++)
                A[g + (r & 1) * 8][2 * t + hh + (r >= 2 ? 8 : 0)] =
                    emu_h16_to_f((uint32_t)buf[L * 8 + r] >> (16 * hh), BF);
        for (int r = 0; r < 2; r++)
            for (int hh = 0; hh < 2; hh++)
                B[2 * t + hh + r * 8][g] = emu_h16_to_f((uint32_t)buf[L * 8 + 4 + r] >> (16 * hh), BF);
    }
    int g = lane >> 2, t = lane & 3;
    float out[4];
    for (int i = 0; i < 4; i++) {
        int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        float s = d[i];
        for (int kk = 0; kk < 16; kk++) s += A[row][kk] * B[kk][col];
        out[i] = s;
    }
    for (int i = 0; i < 4; i++) d[i] = out[i];
}
extern std::mutex emu_atomic_mu;
static inline int atomicMin(int *p, int v) {
    std::lock_guard<std::mutex> g(emu_atomic_mu);
    int old = *p;
    if (v < old) *p = v;
    return old;
}
/* Run f() as a kernel over grid x block (blocks sequentially). */
void emu_launch(dim3 grid, dim3 block, std::function<void()> f);

/* A launch NAME<<<grid, block, smem, stream>>>(args) as strip.py --launchers rewrites it:
 * emu_launch_k(emu_cfg(grid, block, smem, stream), "NAME", NAME, args). The arguments are evaluated
 * and copied at the launch, as CUDA does (a graph replays the values it captured); the
 * kernel runs at once on the emulator, or is recorded when the stream is capturing
 * (emu_rt.cc). */
struct emu_cfg_t {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
};
static inline emu_cfg_t emu_cfg(dim3 g, dim3 b, size_t smem = 0, cudaStream_t s = nullptr) {
    return {g, b, smem, s};
}
/* One argument of a launch for the launch log (emu_log.h): its bits and what they are. */
struct emu_arg {
    uint64_t v;
    int kind; /* EMU_ARG_VALUE, EMU_ARG_PTR, or EMU_ARG_WORD (8 bytes of a struct argument) */
};
enum { EMU_ARG_VALUE, EMU_ARG_PTR, EMU_ARG_WORD };
extern int emu_log_on; /* emu_log_start .. emu_log_stop: arguments are kept only then */
template <class T> static inline void emu_arg_push(std::vector<emu_arg> &out, const T &a) {
    if constexpr (std::is_pointer_v<T>) {
        out.push_back({(uint64_t)(uintptr_t)a, EMU_ARG_PTR});
    } else if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>) {
        uint64_t v = 0;
        memcpy(&v, &a, sizeof a);
        out.push_back({v, EMU_ARG_VALUE});
    } else { /* a struct by value (gemv_segs): its words, padding cleared */
        T c = a;
#if defined(__has_builtin)
#if __has_builtin(__builtin_clear_padding)
        __builtin_clear_padding(&c); /* else padding bytes may differ between equal launches */
#endif
#endif
        const unsigned char *b = (const unsigned char *)&c;
        for (size_t i = 0; i < sizeof c; i += 8) {
            uint64_t v = 0;
            memcpy(&v, b + i, sizeof c - i < 8 ? sizeof c - i : 8);
            out.push_back({v, EMU_ARG_WORD});
        }
    }
}
void emu_submit(const emu_cfg_t &c, const char *name, std::function<void()> kernel,
                std::vector<emu_arg> args);
template <class F, class... A>
static inline void emu_launch_k(const emu_cfg_t &c, const char *name, F f, A... a) {
    std::tuple<A...> t(a...);
    std::vector<emu_arg> args;
    if (emu_log_on)
        (emu_arg_push(args, a), ...);
    emu_submit(
        c, name, [f, t] { std::apply(f, t); }, std::move(args));
}
