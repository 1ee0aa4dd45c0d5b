/* AVX-512 F/BW/VL kernels; bf16 results are rounded with integer operations.
 * Built for that ISA whatever the compiler's default; called only when cpuid
 * says the CPU has it. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c")

#define ADAM_AVX512_NATIVE_BF16 0
#define ADAM_AVX512_UPDATE adam_update_avx512
#define ADAM_AVX512_BF16S adam_update_bf16s_avx512
#define ADAM_AVX512_SUMSQ adam_sumsq_avx512
#define ADAM_AVX512_SUMSQ_PART adam_sumsq_part_avx512
#define ADAM_AVX512_BF16_DECODE adam_bf16_decode_avx512
#define ADAM_AVX512_BF16_ENCODE adam_bf16_encode_avx512
#include "adam_avx512_body.h"
