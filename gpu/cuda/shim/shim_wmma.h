/* nvcuda::wmma on the host (ZO_CUDA_SHIM): the 16x16x16 shape with 16-bit
 * operands and fp32 accumulators, as attention_tc.cu uses it. The layout of
 * a fragment is the shim's own: every lane holds the whole tile, element
 * (r, c) at x[r * 16 + c], and load / store / fill / mma_sync are done by
 * every lane alike (on a GPU they are warp-collective; here each lane
 * redoes the warp's work, so the results every lane sees agree; a store
 * waits for the warp's earlier loads, as the warp-collective one does). Code that
 * loops over x[i] for i < num_elements stays valid; code that assumes the
 * GPU's per-lane layout does not, and none here does. mma_sync sums the k
 * products in fp32 in order k = 0 .. 15 (a tensor core's order is its own:
 * the results agree to fp32 rounding, not bit for bit). */
#ifndef ZO_GPU_CUDA_SHIM_WMMA_H
#define ZO_GPU_CUDA_SHIM_WMMA_H

#include "gpu/cuda/shim/cuda_shim.h" /* defines: __half, __nv_bfloat16, their conversions */

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the shim has the 16x16x16 shape only");
    enum { num_elements = 256 };
    T x[256];
};

static inline float shim_wmma_f(float v) { return v; }
static inline float shim_wmma_f(__half v) { return __half2float(v); }
static inline float shim_wmma_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename Use, typename T, typename Layout, typename V>
ZO_UNCHECKED inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, V v)
{
    for (int i = 0; i < 256; i++) f.x[i] = v;
}

/* Operand tiles: (r, c) of the tile at p[r * ldm + c] (row_major) or p[c * ldm + r] (col_major). */
template <typename Use, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &f, const T *p, unsigned ldm)
{
    const bool row = std::is_same<Layout, row_major>::value;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r * 16 + c] = row ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm,
                             layout_t l)
{
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}

/* Waits for the warp first: a lane's store must not land before every lane
 * has done its loads of the tile (an accumulator loaded from memory, added
 * to and stored back would otherwise be added to once per lane). */
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                              layout_t l)
{
    __syncwarp();
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            if (l == mem_row_major) p[(size_t)r * ldm + c] = f.x[r * 16 + c];
            else p[(size_t)c * ldm + r] = f.x[r * 16 + c];
        }
}

/* d = a b + c, d and c may be the same fragment. Fragments only: unchecked
 * (ZO_UNCHECKED). */
template <typename T, typename LA, typename LB>
ZO_UNCHECKED inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c)
{
    if constexpr (std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value) {
        static_assert(sizeof(T) == 2, "16-bit operands");
        zo_shim_mma16_16(d.x, reinterpret_cast<const uint16_t *>(a.x), reinterpret_cast<const uint16_t *>(b.x),
                         c.x, std::is_same<T, __nv_bfloat16>::value);
    } else {
        float fa[256], fb[256], out[256];
        for (int i = 0; i < 256; i++) fa[i] = shim_wmma_f(a.x[i]), fb[i] = shim_wmma_f(b.x[i]);
        zo_shim_mma16(out, fa, fb, c.x);
        for (int i = 0; i < 256; i++) d.x[i] = out[i];
    }
}

} // namespace wmma
} // namespace nvcuda

#endif
