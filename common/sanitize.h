/* Code the sanitizer build (ZO_SANITIZE: AddressSanitizer and UBSan)
 * leaves uninstrumented: arithmetic over buffers the function sized itself,
 * where the checks cost time and find nothing (the host shim's wmma
 * fragments and GEMM stand-in, test_ops' double-loop references). What
 * reads or writes the memory of the code under test stays checked. */
#ifndef ZO_COMMON_SANITIZE_H
#define ZO_COMMON_SANITIZE_H

#if defined(__GNUC__) || defined(__clang__)
#define ZO_UNCHECKED __attribute__((no_sanitize("address", "undefined")))
#else
#define ZO_UNCHECKED
#endif

#endif
