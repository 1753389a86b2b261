/* Host emulation of the CUDA device API used by kernels/cuda: one std::thread per CUDA
 * thread, blocks run one after another (so __shared__ can be a function-static), warps
 * synchronised by a barrier per warp for shuffles. For desk-checking index math only. */
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <climits>
#include <cfloat>
#include <algorithm>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>
typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef int cudaDataType;
enum { cudaSuccess = 0 };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
extern thread_local dim3 threadIdx, blockIdx;
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
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
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
extern "C" float md_fp16_to_fp32(uint16_t h);
extern "C" uint16_t md_fp32_to_fp16(float f);
extern "C" uint16_t md_fp32_to_bf16(float f);
static inline __half __ushort_as_half(uint16_t h) { return h; }
static inline uint16_t __half_as_ushort(__half h) { return h; }
static inline float __half2float(__half h) { return md_fp16_to_fp32(h); }
static inline __half __float2half_rn(float f) { return md_fp32_to_fp16(f); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return md_fp32_to_bf16(f); }
static inline uint16_t __bfloat16_as_ushort(__nv_bfloat16 b) { return b; }

/* per-block synchronisation state */
struct emu_block {
    std::barrier<> *block_bar;
    std::vector<std::barrier<> *> warp_bar;
    std::vector<std::vector<uint64_t>> warp_buf;
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
template <class T> static inline T emu_shfl(T v, int src_fn(int, int), int arg) {
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    emu_cur->warp_buf[w][lane] = bits;
    emu_cur->warp_bar[w]->arrive_and_wait();
    int s = src_fn(lane, arg);
    uint64_t r = emu_cur->warp_buf[w][s >= 0 && s < 32 ? s : lane];
    emu_cur->warp_bar[w]->arrive_and_wait();
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
extern std::mutex emu_atomic_mu;
static inline int atomicMin(int *p, int v) {
    std::lock_guard<std::mutex> g(emu_atomic_mu);
    int old = *p;
    if (v < old) *p = v;
    return old;
}
/* Run f() as a kernel over grid x block (blocks sequentially). */
void emu_launch(dim3 grid, dim3 block, std::function<void()> f);
