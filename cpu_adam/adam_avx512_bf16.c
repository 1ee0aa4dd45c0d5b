/* The AVX-512 updates again, converting bf16 results with AVX512-BF16's
 * vcvtneps2bf16; chosen when cpuid reports avx512bf16. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,avx512bf16")

#define ADAM_AVX512_NATIVE_BF16 1
#define ADAM_AVX512_UPDATE adam_update_avx512_bf16
#define ADAM_AVX512_BF16S adam_update_bf16s_avx512_bf16
#define ADAM_AVX512_BF16_ENCODE adam_bf16_encode_avx512_bf16
#include "adam_avx512_body.h"
