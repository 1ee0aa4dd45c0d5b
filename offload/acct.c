/* The runtime's clock, its memory accounting per tier and small helpers
 * every layer uses (acct.h). */
#include "offload/acct.h"

#include <stdlib.h>
#include <string.h>

void offload_count(offload_acct *a, offload_tier t, int64_t delta)
{
    pthread_mutex_lock(&a->mu);
    a->use[t] = (uint64_t)((int64_t)a->use[t] + delta);
    if (a->use[t] > a->peak[t]) a->peak[t] = a->use[t];
    pthread_mutex_unlock(&a->mu);
}

/* Every second this thread has added to a time split: a region's inner
 * regions are what it grew by while the region ran. */
static __thread double thread_added;

offload_timer offload_time_begin(void)
{
    return (offload_timer){.t0 = zo_now(), .inner0 = thread_added};
}

void offload_time_end(offload_acct *a, offload_time_part p, offload_timer t)
{
    double s = zo_now() - t.t0 - (thread_added - t.inner0);
    offload_add_time(a, p, s > 0 ? s : 0.0);
}

void offload_add_time(offload_acct *a, offload_time_part p, double seconds)
{
    thread_added += seconds;
    pthread_mutex_lock(&a->mu);
    if (pthread_equal(pthread_self(), a->owner)) a->time[p] += seconds;
    else a->beside[p] += seconds;
    pthread_mutex_unlock(&a->mu);
}

void offload_add_bytes(offload_acct *a, offload_bytes_kind k, uint64_t n)
{
    pthread_mutex_lock(&a->mu);
    a->bytes[k] += n;
    pthread_mutex_unlock(&a->mu);
}

void offload_set_device_busy(offload_acct *a, int busy) { __atomic_store_n(&a->device_busy, busy, __ATOMIC_RELAXED); }

int offload_device_busy(const offload_acct *a) { return __atomic_load_n(&a->device_busy, __ATOMIC_RELAXED); }

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
    offload_timer t0 = offload_time_begin();
    zo_status st = gpu_event_synchronize(ev);
    offload_time_end(env->acct, part, t0);
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

size_t offload_find_nonfinite(const float *p, size_t n)
{
    /* exponent all ones: inf or nan; the loop runs without a branch per
     * value; chunks in order on each thread of the team (a block's weights,
     * gigabytes, want more than one), the first over the team found by min */
    const uint32_t *u = (const uint32_t *)(const void *)p;
    const size_t chunk = 4096;
    size_t chunks = (n + chunk - 1) / chunk, first = n;
#pragma omp parallel for schedule(static) reduction(min : first) if (n >= ((size_t)1 << 22))
    for (size_t c = 0; c < chunks; c++) {
        size_t a = c * chunk, e = n - a < chunk ? n : a + chunk;
        if (a >= first) continue; /* this thread found one earlier */
        uint32_t any = 0;
        for (size_t i = a; i < e; i++) any |= (uint32_t)((u[i] & 0x7f800000u) == 0x7f800000u);
        if (!any) continue;
        for (size_t i = a; i < e; i++)
            if ((u[i] & 0x7f800000u) == 0x7f800000u) {
                if (i < first) first = i;
                break;
            }
    }
    return first;
}

void offload_to_dtype(const offload_geom *g, void *dst, const float *src, size_t n)
{
    if (g->dtype == ZO_DTYPE_F32) memcpy(dst, src, n * sizeof(float));
    else zo_convert(dst, g->dtype, src, ZO_DTYPE_F32, n);
}
