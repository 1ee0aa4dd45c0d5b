/* The runtime's clock, its memory accounting per tier and small helpers
 * every layer uses. */
#include "offload/offload_impl.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"


void offload_count(offload_acct *a, offload_tier t, int64_t delta)
{
    pthread_mutex_lock(&a->mu);
    a->use[t] = (uint64_t)((int64_t)a->use[t] + delta);
    if (a->use[t] > a->peak[t]) a->peak[t] = a->use[t];
    pthread_mutex_unlock(&a->mu);
}

void offload_add_time(offload_acct *a, offload_time_part p, double seconds)
{
    pthread_mutex_lock(&a->mu);
    a->time[p] += seconds;
    pthread_mutex_unlock(&a->mu);
}

void offload_add_bytes(offload_acct *a, offload_bytes_kind k, uint64_t n)
{
    pthread_mutex_lock(&a->mu);
    a->bytes[k] += n;
    pthread_mutex_unlock(&a->mu);
}

zo_status offload_host_alloc(const offload_env *env, size_t bytes, int pinned, void **out)
{
    *out = NULL;
    if (!bytes) return ZO_OK;
    if (pinned) {
        zo_status st = gpu_host_alloc(env->dev, bytes, out);
        if (st != ZO_OK) return zo_error_wrap(st, "offload: pinned host memory (%zu bytes)", bytes);
    } else {
        *out = malloc(bytes);
        if (!*out) return zo_error(ZO_ERR_NOMEM, "offload: out of host memory (%zu bytes)", bytes);
    }
    offload_count(env->acct, OFFLOAD_CPU, (int64_t)bytes);
    return ZO_OK;
}

void offload_host_free(const offload_env *env, void *p, size_t bytes, int pinned)
{
    if (!p) return;
    if (pinned) gpu_host_free(env->dev, p);
    else free(p);
    offload_count(env->acct, OFFLOAD_CPU, -(int64_t)bytes);
}

zo_status offload_timed_wait(const offload_env *env, gpu_event_t ev, offload_time_part part)
{
    double t0 = zo_now();
    zo_status st = gpu_event_synchronize(ev);
    offload_add_time(env->acct, part, zo_now() - t0);
    return st;
}

int offload_block_of(const offload_geom *g, size_t a)
{
    int lo = 0, hi = g->nb - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (g->off[mid] <= a) lo = mid;
        else hi = mid - 1;
    }
    while (lo < g->nb - 1 && g->off[lo + 1] <= a) lo++;
    return lo;
}

void offload_to_dtype(const offload_geom *g, void *dst, const float *src, size_t n)
{
    if (g->dtype == ZO_DTYPE_F32) memcpy(dst, src, n * sizeof(float));
    else zo_convert(dst, g->dtype, src, ZO_DTYPE_F32, n);
}
