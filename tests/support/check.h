/* Comparing computed values with a reference: every test that checks arrays
 * against an independent implementation counts mismatches the same way and
 * prints the first few and the largest difference. */
#ifndef ZO_TESTS_SUPPORT_CHECK_H
#define ZO_TESTS_SUPPORT_CHECK_H

#include <stddef.h>

/* The elements of got[0..n) outside atol + rtol * |want| (nan never
 * matches; an infinity only the same infinity); prints the first 5 and a summary line; returns their count. */
int check_close_f64(const char *what, const double *got, const double *want, size_t n,
                    double atol, double rtol);
/* The same with extra[i] (>= 0) added to element i's tolerance. */
int check_close_f64_each(const char *what, const double *got, const double *want, size_t n, double atol,
                         double rtol, const double *extra);
int check_close_f32(const char *what, const float *got, const float *want, size_t n,
                    double atol, double rtol);

/* The same with atol relative to the largest |want|: atol * max|want| +
 * rtol * |want| (two backends, whose values' scale varies by tensor). */
int check_close_scaled_f32(const char *what, const float *got, const float *want, size_t n,
                           double atol, double rtol);

#endif
