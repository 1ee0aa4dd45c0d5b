/* The CUDA vocabulary of gpu/cuda/<family>.cu on the host (ZO_CUDA_SHIM, C++17):
 * the kernel sources compile with g++ with their bodies unchanged, and a
 * launch runs the kernel before it returns, every CUDA thread of a block a
 * fiber of its own on the calling OS thread (cuda_shim.cc, the runtime:
 * the fibers' stacks start at staggered offsets, so that their frames do
 * not all fall in the same cache sets).
 *
 * What it gives:
 * - qualifiers: __global__, __device__, __host__, __launch_bounds__ vanish; __forceinline__ is
 *   always_inline; __shared__ is a static thread-local (blocks run one after
 *   another, so a static __shared__ array is the running block's shared
 *   memory); dynamic shared memory through ZO_EXTERN_SHARED (kernels.cuh);
 * - threadIdx, blockIdx, blockDim, gridDim (the running fiber's), dim3;
 * - __syncthreads: a barrier of the block's live threads (a thread that
 *   returned counts as arrived); __syncwarp and the warp shuffles: per-warp
 *   slots and a warp barrier; a full-mask one while a lane of the warp has
 *   returned (or does not exist) is the launch's error, as it is undefined
 *   on a GPU;
 * - atomics (atomicCAS, atomicOr, atomicAdd, atomicMax, atomicExch);
 * - the explicitly rounded intrinsics (__fmul_rn, __fadd_rn, __fsub_rn,
 *   __fdiv_rn, __fsqrt_rn): single IEEE operations, provided the including
 *   file is compiled with -ffp-contract=off (gpu/CMakeLists.txt does);
 * - __half and __nv_bfloat16 with common/dtype.h's round-to-nearest-even
 *   conversions (the very same functions, so the very same bits);
 * - min, max, rsqrtf beside <math.h>;
 * - cudaGetLastError, cudaPeekAtLastError, cudaGetErrorString,
 *   cudaGetErrorName, cudaFuncSetAttribute, cudaMemcpyAsync,
 *   cudaMallocFromPoolAsync and cudaFreeAsync (host memory).
 *
 * Kernels, launchers and the types above are renamed or kept internal so
 * that nothing here shares a symbol with the real CUDA backend in one
 * program: gpu/cuda/shim/<family>.cc include a .cu inside namespace
 * zo_shim_kernels, and cuda_impl.h's functions are renamed shim_*
 * (shim_names.h). */
#ifndef ZO_GPU_CUDA_SHIM_H
#define ZO_GPU_CUDA_SHIM_H

#ifndef __cplusplus
#error "cuda_shim.h is C++: C callers include gpu/cuda/shim/shim_api.h"
#endif
#ifndef ZO_CUDA_SHIM
#error "cuda_shim.h needs ZO_CUDA_SHIM (zo_cuda_shim defines it)"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "gpu/cuda/shim/cuda_shim_types.h" /* defines: cudaError_t, cudaStream_t, ... */

extern "C" {
#include "common/dtype.h" /* defines: zo_f32_to_f16, zo_f16_to_f32, zo_f32_to_bf16, zo_bf16_to_f32 */
#include "common/sanitize.h" /* defines: ZO_UNCHECKED */
}

/* ---- qualifiers ----------------------------------------------------------------- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
/* a hint to nvcc's register allocation; nothing to the host */
#define __launch_bounds__(...)
/* Thread-local: each OS thread runs its own launches (fibers share it). */
#define __shared__ static __thread
/* The shim's own arithmetic on buffers it sized itself (a wmma fragment's
 * products, the host GEMM's sums over its copies of the operands) is
 * ZO_UNCHECKED (common/sanitize.h): it was a third of test_ops' time in the
 * sanitizer build. What reads or writes a kernel's memory (a fragment's
 * load and store, the GEMM's operands and C) stays checked. */

/* ---- dimensions and the built-in indices ---------------------------------------- */

#define dim3 zo_shim_dim3
#define uint3 zo_shim_uint3

struct zo_shim_uint3 {
    unsigned x, y, z;
};

struct zo_shim_dim3 {
    unsigned x, y, z;
    constexpr zo_shim_dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

/* Set by the runtime: the running fiber's thread, its block, the launch's shape. */
extern __thread zo_shim_uint3 zo_shim_threadIdx, zo_shim_blockIdx, zo_shim_blockDim,
    zo_shim_gridDim;
#define threadIdx zo_shim_threadIdx
#define blockIdx zo_shim_blockIdx
#define blockDim zo_shim_blockDim
#define gridDim zo_shim_gridDim
#define warpSize 32

/* ---- the runtime's entry points (cuda_shim.cc) ---------------------------------- */

extern "C" {
void zo_shim_syncthreads(void);
/* One warp exchange: this lane's 8 bytes in, the source lane's out (kind: below). */
unsigned long long zo_shim_shfl(unsigned mask, unsigned long long v, int kind, int arg, int width);
void *zo_shim_dynamic_smem(void);
/* A 16-byte vector load or store at addr, off a 16-byte boundary: the
 * launch's error (does not return). */
[[noreturn]] void zo_shim_vec_fault(const void *addr);
/* out = a b + c over 16 x 16 fp32 row-major tiles, each sum c + a_0 b_0 +
 * ... + a_15 b_15 in that order, one rounding an operation (nvcuda::wmma's
 * mma_sync, shim_wmma.h): the widest vectors the CPU has, the same bits. */
void zo_shim_mma16(float *out, const float *a, const float *b, const float *c);
/* The same with a and b 16-bit (bf16 != 0: bfloat16, else half), d may be c. */
void zo_shim_mma16_16(float *d, const uint16_t *a, const uint16_t *b, const float *c, int bf16);
/* The tensor cores' accumulation the shim models for 16-bit operands
 * (ZO_SHIM_TC_ACCUM, cuda_shim.cc): 0 IEEE fp32 (the default), else the
 * products a block step takes (rz[:B[:G]]). */
int zo_shim_tc_block(void);
/* The same chosen by a test (block 0: IEEE), over the environment's. */
void zo_shim_tc_accum_set(int block, int guard);
/* c + a[0] b[0] + ... + a[15] b[15 ldb] as the tensor cores' accumulation
 * above sums it (IEEE: in that order, one rounding an operation). */
float zo_shim_tc_dot16(float c, const float *a, const float *b, int ldb);
cudaError_t zo_shim_take_last_error(int clear, char *detail, size_t cap);
cudaError_t zo_shim_func_set_attribute(const void *kernel, cudaFuncAttribute attr, int value);
cudaError_t zo_shim_memcpy(void *dst, const void *src, size_t bytes);
cudaError_t zo_shim_malloc(void **p, size_t bytes);
void zo_shim_free(void *p);
const char *zo_shim_error_string(cudaError_t e);
const char *zo_shim_error_name(cudaError_t e);
}

enum { ZO_SHIM_SHFL_IDX, ZO_SHIM_SHFL_XOR, ZO_SHIM_SHFL_UP, ZO_SHIM_SHFL_DOWN, ZO_SHIM_SYNCWARP };

/* ---- barriers and warp shuffles --------------------------------------------------- */

static inline void __syncthreads(void) { zo_shim_syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    (void)zo_shim_shfl(mask, 0, ZO_SHIM_SYNCWARP, 0, 32);
}

template <class T>
static inline T zo_shim_shfl_as(unsigned mask, T v, int kind, int arg, int width)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                  "a warp shuffle moves a scalar of at most 8 bytes");
    unsigned long long bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = zo_shim_shfl(mask, bits, kind, arg, width);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

template <class T>
static inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32)
{
    return zo_shim_shfl_as(mask, v, ZO_SHIM_SHFL_IDX, src_lane, width);
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    return zo_shim_shfl_as(mask, v, ZO_SHIM_SHFL_XOR, lane_mask, width);
}
template <class T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    return zo_shim_shfl_as(mask, v, ZO_SHIM_SHFL_UP, (int)delta, width);
}
template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    return zo_shim_shfl_as(mask, v, ZO_SHIM_SHFL_DOWN, (int)delta, width);
}

/* ---- atomics: the fibers of a launch share one OS thread and never switch
 * inside one, so a plain read-modify-write would do; the __atomic builtins
 * also keep host threads that share memory correct. -------------------------------- */

template <class T>
static inline T atomicCAS(T *a, T compare, T val)
{
    static_assert(std::is_integral<T>::value && (sizeof(T) == 4 || sizeof(T) == 8),
                  "atomicCAS takes int, unsigned or unsigned long long");
    __atomic_compare_exchange_n(a, &compare, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return compare; /* the old value, whether or not it was swapped */
}

template <class T>
static inline T atomicOr(T *a, T v)
{
    static_assert(std::is_integral<T>::value, "atomicOr takes integers");
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);
}

template <class T>
static inline T atomicExch(T *a, T v)
{
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);
}

template <class T>
static inline T atomicMax(T *a, T v)
{
    static_assert(std::is_integral<T>::value, "atomicMax takes integers");
    T old = __atomic_load_n(a, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(a, &old, v, false, __ATOMIC_SEQ_CST,
                                                   __ATOMIC_SEQ_CST)) {
    }
    return old;
}

template <class T>
static inline T atomicAdd(T *a, T v)
{
    if constexpr (std::is_integral<T>::value) {
        return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
    } else { /* float, double: a compare-and-swap loop on the bits */
        static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomicAdd takes float or double");
        using U = typename std::conditional<sizeof(T) == 4, uint32_t, uint64_t>::type;
        U *ua = reinterpret_cast<U *>(a), old = __atomic_load_n(ua, __ATOMIC_SEQ_CST), nw;
        T o, n;
        do {
            memcpy(&o, &old, sizeof o);
            n = o + v;
            memcpy(&nw, &n, sizeof nw);
        } while (!__atomic_compare_exchange_n(ua, &old, nw, false, __ATOMIC_SEQ_CST,
                                              __ATOMIC_SEQ_CST));
        return o;
    }
}

/* ---- arithmetic ------------------------------------------------------------------- */

/* One IEEE single operation each, rounded to nearest even: exact as long as
 * the compiler fuses nothing (-ffp-contract=off on every shim source). */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }

/* A float's bits and back (the q8 optimizer state compares magnitudes as
 * bit patterns). */
static inline unsigned __float_as_uint(float x)
{
    unsigned u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float __uint_as_float(unsigned u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }

/* CUDA's integer and floating min/max overloads. */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b)
{
    return a < b ? a : b;
}
static inline unsigned long long max(unsigned long long a, unsigned long long b)
{
    return a > b ? a : b;
}
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

/* ---- 16-bit floating types: storage plus common/dtype.h's conversions ------------- */

#define __half zo_shim_half
#define __nv_bfloat16 zo_shim_bfloat16

struct zo_shim_half {
    uint16_t bits;
};
struct zo_shim_bfloat16 {
    uint16_t bits;
};
static_assert(sizeof(zo_shim_half) == 2 && sizeof(zo_shim_bfloat16) == 2, "16-bit storage");

static inline float __half2float(zo_shim_half h) { return zo_f16_to_f32(h.bits); }
static inline zo_shim_half __float2half_rn(float f) { return zo_shim_half{zo_f32_to_f16(f)}; }
static inline float __bfloat162float(zo_shim_bfloat16 h) { return zo_bf16_to_f32(h.bits); }
static inline zo_shim_bfloat16 __float2bfloat16_rn(float f)
{
    return zo_shim_bfloat16{zo_f32_to_bf16(f)};
}

/* ---- the runtime API the launchers call ----------------------------------------- */

static inline cudaError_t cudaGetLastError(void) { return zo_shim_take_last_error(1, NULL, 0); }
static inline cudaError_t cudaPeekAtLastError(void) { return zo_shim_take_last_error(0, NULL, 0); }
static inline const char *cudaGetErrorString(cudaError_t e) { return zo_shim_error_string(e); }
static inline const char *cudaGetErrorName(cudaError_t e) { return zo_shim_error_name(e); }

/* Only cudaFuncAttributeMaxDynamicSharedMemorySize is kept: the limit the
 * kernel's later launches are held to (48 KiB until raised). */
template <class K>
static inline cudaError_t cudaFuncSetAttribute(K *kernel, cudaFuncAttribute attr, int value)
{
    return zo_shim_func_set_attribute(reinterpret_cast<const void *>(kernel), attr, value);
}

/* Host memory on both sides; done before it returns. Overlapping ranges are
 * an error (undefined for cudaMemcpy). */
static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes,
                                          cudaMemcpyKind kind, cudaStream_t st)
{
    (void)kind;
    (void)st;
    return zo_shim_memcpy(dst, src, bytes);
}

/* Stream-ordered scratch (gemm.cu's rounded operands, attention_gemm.cu's
 * scores, the fused attention backwards' D): host memory from malloc, every
 * byte 0xff (nan as floats), as memory never written holds anything on a
 * GPU; the pool argument is ignored (NULL in the shim), one pool of the
 * process counts the bytes held and their high-water mark
 * (zo_shim_pool_peak, shim_api.h). cudaFreeAsync frees at once: the
 * launches before it are done. */
static inline cudaError_t cudaMallocFromPoolAsync(void **p, size_t bytes, cudaMemPool_t pool, cudaStream_t st)
{
    (void)pool;
    (void)st;
    return zo_shim_malloc(p, bytes);
}

static inline cudaError_t cudaFreeAsync(void *p, cudaStream_t st)
{
    (void)st;
    zo_shim_free(p);
    return cudaSuccess;
}

/* ---- launches ------------------------------------------------------------------ */

namespace zo_shim {
using body_fn = void (*)(void *);
/* Runs body(arg) as every thread of every block of the grid, blocks in
 * order (x fastest), after checking what a GPU would refuse; a failure is
 * left as the last error (cudaGetLastError) with a message naming `name`. */
void launch(const char *name, const void *kernel, zo_shim_dim3 grid, zo_shim_dim3 block,
            size_t smem, body_fn body, void *arg);
template <class F>
void invoke(void *f)
{
    (*static_cast<F *>(f))();
}
} // namespace zo_shim

/* kernel<<<grid, block, smem, stream>>>(args...): the arguments are
 * converted to the kernel's parameter types once, as a launch does, and
 * every thread gets its own copy. Written through ZO_LAUNCH (kernels.cuh). */
template <class... P, class... A>
static inline void zo_shim_launch(const char *name, void (*kernel)(P...), zo_shim_dim3 grid,
                                  zo_shim_dim3 block, size_t smem, cudaStream_t stream,
                                  A &&...args)
{
    (void)stream; /* the launch runs now: stream order holds trivially */
    static_assert(sizeof...(P) == sizeof...(A), "a kernel launch with the wrong argument count");
    std::tuple<typename std::decay<P>::type...> params(std::forward<A>(args)...);
    auto body = [&params, kernel]() { std::apply(kernel, params); };
    zo_shim::launch(name, reinterpret_cast<const void *>(kernel), grid, block, smem,
                    &zo_shim::invoke<decltype(body)>, &body);
}

#endif
