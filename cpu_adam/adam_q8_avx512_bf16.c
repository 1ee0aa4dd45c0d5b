/* The q8 step again, converting a bf16 copy with AVX512-BF16's
 * vcvtneps2bf16; chosen when cpuid reports avx512bf16. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,f16c,avx512bf16")

#define ADAM_AVX512_NATIVE_BF16 1
#include "adam_avx512_body.h"

#define ADAM_AVX512_Q8 adam_update_q8_avx512_bf16
#include "adam_avx512_q8.h"
