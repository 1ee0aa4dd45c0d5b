/* Counting mismatches against a reference. */
#include "tests/support/check.h"

#include <math.h>
#include <stdio.h>

/* Element i of a float or double array, as double. */
static double at(const void *p, int f32, size_t i)
{
    return f32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

static int close_count(const char *what, const void *got, const void *want, int f32, size_t n,
                       double atol, double rtol, int scaled, const double *extra)
{
    double scale = 0.0, maxd = 0.0;
    if (scaled)
        for (size_t i = 0; i < n; i++)
            if (fabs(at(want, f32, i)) > scale) scale = fabs(at(want, f32, i));
    double abs_tol = scaled ? atol * scale : atol;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double g = at(got, f32, i), w = at(want, f32, i), d = fabs(g - w);
        if (d > maxd || isnan(d)) maxd = d;
        if (!(d <= abs_tol + rtol * fabs(w) + (extra ? extra[i] : 0.0)) && !(isinf(w) && g == w)) { /* the same infinity matches */
            if (bad < 5) printf("  %s[%zu]: got %.8g want %.8g\n", what, i, g, w);
            bad++;
        }
    }
    if (bad && scaled)
        printf("  %s: %d of %zu mismatched, max diff %.3g (scale %.3g)\n", what, bad, n, maxd,
               scale);
    else if (bad)
        printf("  %s: %d of %zu mismatched, max diff %.3g\n", what, bad, n, maxd);
    return bad;
}

int check_close_f64(const char *what, const double *got, const double *want, size_t n,
                    double atol, double rtol)
{
    return close_count(what, got, want, 0, n, atol, rtol, 0, NULL);
}

int check_close_f64_each(const char *what, const double *got, const double *want, size_t n, double atol,
                         double rtol, const double *extra)
{
    return close_count(what, got, want, 0, n, atol, rtol, 0, extra);
}

int check_close_f32(const char *what, const float *got, const float *want, size_t n,
                    double atol, double rtol)
{
    return close_count(what, got, want, 1, n, atol, rtol, 0, NULL);
}

int check_close_scaled_f32(const char *what, const float *got, const float *want, size_t n,
                           double atol, double rtol)
{
    return close_count(what, got, want, 1, n, atol, rtol, 1, NULL);
}
