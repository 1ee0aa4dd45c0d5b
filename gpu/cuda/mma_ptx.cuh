/* Two warp-level PTX instructions behind device functions: the tensor-core
 * product mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32
 * and the shared-memory fragment load ldmatrix.sync.aligned.m8n8.x4{.trans}
 * .shared.b16. On a GPU (__CUDA_ARCH__) they are inline asm; under the host
 * shim (ZO_CUDA_SHIM), which has no PTX, an emulation that follows the PTX
 * ISA's documented per-lane layouts: each lane writes what it holds to a
 * per-warp scratch, the warp waits, each lane computes its own results from
 * the scratch, the warp waits again (the scratch is then free for the next
 * call). tests/test_cuda_shim.c checks the emulation against plain matrix
 * products with fragments it builds itself from the documented layouts.
 *
 * Layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
 * type"; g = lane / 4, q = lane % 4; a 32-bit register holds two 16-bit
 * elements, the first in its low half):
 *   A (16 x 16, row): a[0] = A[g][2q, 2q+1], a[1] = A[g+8][2q, 2q+1],
 *                     a[2] = A[g][2q+8, 2q+9], a[3] = A[g+8][2q+8, 2q+9];
 *   B (16 x 8, col):  b[0] = B[2q, 2q+1][g], b[1] = B[2q+8, 2q+9][g];
 *   C, D (16 x 8 fp32): c[0], c[1] = C[g][2q, 2q+1], c[2], c[3] = C[g+8][2q, 2q+1].
 * ldmatrix .x4: lane l gives the address of row l % 8 of matrix l / 8 (16
 * bytes, 16-byte aligned, shared memory); r[i] of lane l holds row l / 4,
 * elements 2 (l % 4) and 2 (l % 4) + 1 of matrix i, or with .trans those of
 * the transposed matrix: elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4)
 * of matrix i as stored. mma_pack and mma_unpack move two floats into one
 * register of 16-bit elements (rounded to nearest even) and back;
 * cp_async16, cp_async_commit and cp_async_wait_all are cp.async's copy of
 * 16 bytes into shared memory, done at once under the shim. */
#ifndef ZO_GPU_CUDA_MMA_PTX_CUH
#define ZO_GPU_CUDA_MMA_PTX_CUH

#ifdef ZO_CUDA_SHIM

/* The running fiber's warp in its block and its lane. */
static inline int mma_shim_warp(void)
{
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    return (int)(t / 32u);
}
static inline int mma_shim_lane(void)
{
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    return (int)(t % 32u);
}

/* Per warp of a block (at most 32): the operands as matrices, the row
 * addresses of an ldmatrix. Thread-local, as the running block is. */
struct mma_shim_scratch {
    float a[16][16], b[16][8], c[16][8];
    const void *rows[32];
};
static __thread mma_shim_scratch mma_shim_warps[32];

static inline float mma_shim_lo(unsigned r, bool bf16)
{
    return bf16 ? zo_bf16_to_f32((uint16_t)(r & 0xffffu)) : zo_f16_to_f32((uint16_t)(r & 0xffffu));
}
static inline float mma_shim_hi(unsigned r, bool bf16)
{
    return bf16 ? zo_bf16_to_f32((uint16_t)(r >> 16)) : zo_f16_to_f32((uint16_t)(r >> 16));
}

/* d = A B + c over one m16n8k16 tile; T (__nv_bfloat16 or __half) the
 * operands' type. Sums in fp32, k = 0 .. 15 in order after c (a tensor
 * core's order is its own: the results agree to fp32 rounding), or as the
 * hardware sums them (ZO_SHIM_TC_ACCUM, cuda_shim.h). */
template <typename T>
static inline void mma_m16n8k16(float d[4], const unsigned a[4], const unsigned b[2], const float c[4])
{
    const bool bf16 = std::is_same<T, __nv_bfloat16>::value;
    mma_shim_scratch &s = mma_shim_warps[mma_shim_warp()];
    const int lane = mma_shim_lane(), g = lane / 4, q = lane % 4;
    for (int h = 0; h < 2; h++) { /* h: the column half (a[0..1], then a[2..3]) */
        s.a[g][2 * q + 8 * h] = mma_shim_lo(a[2 * h], bf16);
        s.a[g][2 * q + 8 * h + 1] = mma_shim_hi(a[2 * h], bf16);
        s.a[g + 8][2 * q + 8 * h] = mma_shim_lo(a[2 * h + 1], bf16);
        s.a[g + 8][2 * q + 8 * h + 1] = mma_shim_hi(a[2 * h + 1], bf16);
        s.b[2 * q + 8 * h][g] = mma_shim_lo(b[h], bf16);
        s.b[2 * q + 8 * h + 1][g] = mma_shim_hi(b[h], bf16);
    }
    s.c[g][2 * q] = c[0], s.c[g][2 * q + 1] = c[1];
    s.c[g + 8][2 * q] = c[2], s.c[g + 8][2 * q + 1] = c[3];
    __syncwarp();
    float out[4];
    const bool hw = zo_shim_tc_block() > 0; /* the hardware's accumulation (ZO_SHIM_TC_ACCUM) */
    for (int i = 0; i < 4; i++) {
        const int r = g + 8 * (i / 2), n = 2 * q + i % 2;
        float acc = s.c[r][n];
        if (hw) acc = zo_shim_tc_dot16(acc, s.a[r], &s.b[0][n], 8);
        else
            for (int k = 0; k < 16; k++) acc += s.a[r][k] * s.b[k][n];
        out[i] = acc;
    }
    __syncwarp(); /* every lane's reads are done: the scratch is free */
    for (int i = 0; i < 4; i++) d[i] = out[i];
}

/* Two 16-bit elements of shared memory as one register, the first low. */
static inline unsigned mma_shim_pair(const void *p0, const void *p1)
{
    uint16_t lo, hi;
    memcpy(&lo, p0, 2);
    memcpy(&hi, p1, 2);
    return (unsigned)lo | (unsigned)hi << 16;
}

static inline void mma_shim_ldmatrix(unsigned r[4], const void *row, bool trans)
{
    if ((uintptr_t)row % 16 != 0) zo_shim_vec_fault(row);
    mma_shim_scratch &s = mma_shim_warps[mma_shim_warp()];
    const int lane = mma_shim_lane(), g = lane / 4, q = lane % 4;
    s.rows[lane] = row;
    __syncwarp();
    for (int i = 0; i < 4; i++) {
        const char *const *m = reinterpret_cast<const char *const *>(s.rows + 8 * i); /* matrix i's rows */
        if (!trans) r[i] = mma_shim_pair(m[g] + 4 * q, m[g] + 4 * q + 2);
        else r[i] = mma_shim_pair(m[2 * q] + 2 * g, m[2 * q + 1] + 2 * g);
    }
    __syncwarp();
}

static inline void ldmatrix_x4(unsigned r[4], const void *row) { mma_shim_ldmatrix(r, row, false); }
static inline void ldmatrix_x4_trans(unsigned r[4], const void *row) { mma_shim_ldmatrix(r, row, true); }

/* cp.async of 16 bytes: done at once here (a GPU finishes it by the
 * thread's next cp_async_wait_all); both addresses 16-byte aligned. */
static inline void cp_async16(void *smem, const void *gmem)
{
    if ((uintptr_t)smem % 16 != 0) zo_shim_vec_fault(smem);
    if ((uintptr_t)gmem % 16 != 0) zo_shim_vec_fault(gmem);
    memcpy(smem, gmem, 16);
}
static inline void cp_async_commit(void) {}
static inline void cp_async_wait_all(void) {}

/* lo and hi rounded to T (to nearest even) in one register, lo in the low half. */
template <typename T>
static inline unsigned mma_pack(float lo, float hi)
{
    if (std::is_same<T, __nv_bfloat16>::value) return (unsigned)zo_f32_to_bf16(lo) | (unsigned)zo_f32_to_bf16(hi) << 16;
    return (unsigned)zo_f32_to_f16(lo) | (unsigned)zo_f32_to_f16(hi) << 16;
}

/* The two elements of a register of T as floats, the low half first. */
template <typename T>
static inline void mma_unpack(unsigned r, float *lo, float *hi)
{
    const bool bf16 = std::is_same<T, __nv_bfloat16>::value;
    *lo = mma_shim_lo(r, bf16);
    *hi = mma_shim_hi(r, bf16);
}

#else /* nvcc */

template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]);

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float d[4], const unsigned a[4], const unsigned b[2],
                                                            const float c[4])
{
#ifdef __CUDA_ARCH__
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                   "f"(c[2]), "f"(c[3]));
#endif
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float d[4], const unsigned a[4], const unsigned b[2],
                                                     const float c[4])
{
#ifdef __CUDA_ARCH__
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                   "f"(c[2]), "f"(c[3]));
#endif
}

__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const void *row)
{
#ifdef __CUDA_ARCH__
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned r[4], const void *row)
{
#ifdef __CUDA_ARCH__
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
#endif
}

/* cp.async.cg of 16 bytes global -> shared (the L2 only), in the thread's
 * current group; cp_async_commit closes the group, cp_async_wait_all waits
 * for all the thread's groups (other threads' copies are visible after a
 * barrier that follows every thread's wait). */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
#ifdef __CUDA_ARCH__
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" : : "r"(a), "l"(gmem) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit(void)
{
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;\n" : : : "memory");
#endif
}

__device__ __forceinline__ void cp_async_wait_all(void)
{
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group 0;\n" : : : "memory");
#endif
}

/* lo and hi rounded to T (to nearest even) in one register, lo in the low half. */
template <typename T>
__device__ __forceinline__ unsigned mma_pack(float lo, float hi);

template <>
__device__ __forceinline__ unsigned mma_pack<__nv_bfloat16>(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* .x (lo) in the low half */
    return *reinterpret_cast<const unsigned *>(&v);
}

template <>
__device__ __forceinline__ unsigned mma_pack<__half>(float lo, float hi)
{
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned *>(&v);
}

/* The two elements of a register of T as floats, the low half first. */
template <typename T>
__device__ __forceinline__ void mma_unpack(unsigned r, float *lo, float *hi);

template <>
__device__ __forceinline__ void mma_unpack<__nv_bfloat16>(unsigned r, float *lo, float *hi)
{
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&r));
    *lo = f.x, *hi = f.y;
}

template <>
__device__ __forceinline__ void mma_unpack<__half>(unsigned r, float *lo, float *hi)
{
    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&r));
    *lo = f.x, *hi = f.y;
}

#endif /* ZO_CUDA_SHIM */

#endif
