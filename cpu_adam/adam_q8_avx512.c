/* The q8 step with AVX-512 F/BW/VL/DQ and VBMI (its byte lookups); bf16
 * copies rounded with integer operations. Built for that ISA whatever the
 * compiler's default; called only when cpuid says the CPU has it. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,f16c")

#define ADAM_AVX512_NATIVE_BF16 0
#include "adam_avx512_body.h"

#define ADAM_AVX512_Q8 adam_update_q8_avx512
/* the conversions of q8 state (no bf16 in them: compiled here only) */
#define ADAM_AVX512_Q8_CODEC 1
#define ADAM_AVX512_Q8_DECODE adam_q8_decode_avx512
#define ADAM_AVX512_Q8_ENCODE adam_q8_encode_avx512
#include "adam_avx512_q8.h"
