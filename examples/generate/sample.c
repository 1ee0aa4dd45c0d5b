/* Choosing the next token (sample.h). */
#include "examples/generate/sample.h"

#include <math.h>
#include <stdlib.h>

#include "common/splitmix.h" /* defines: zo_splitmix_next */

zo_status gen_sampler_init(gen_sampler *s, int vocab, double temperature, int top_k, double top_p, uint64_t seed)
{
    *s = (gen_sampler){.temperature = temperature, .top_k = top_k, .top_p = top_p, .state = seed, .vocab = vocab};
    s->scratch = malloc(2 * (size_t)vocab * sizeof *s->scratch);
    s->order = malloc((size_t)vocab * sizeof *s->order);
    if (!s->scratch || !s->order) {
        gen_sampler_free(s);
        return zo_error(ZO_ERR_NOMEM, "generate: out of host memory for a vocabulary of %d", vocab);
    }
    return ZO_OK;
}

void gen_sampler_free(gen_sampler *s)
{
    free(s->scratch);
    free(s->order);
    s->scratch = NULL;
    s->order = NULL;
}

/* The scores, most likely first (ties: the lower id first); qsort's
 * comparator reads them through this pointer. */
static const float *sort_keys;

static int by_score(const void *x, const void *y)
{
    int a = *(const int *)x, b = *(const int *)y;
    if (sort_keys[a] != sort_keys[b]) return sort_keys[a] > sort_keys[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

int32_t gen_sample(gen_sampler *s, const float *logits)
{
    const int V = s->vocab;
    if (s->temperature <= 0.0) { /* greedy: the first largest */
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    float *sc = s->scratch, *p = s->scratch + V;
    for (int i = 0; i < V; i++) {
        sc[i] = (float)(logits[i] / s->temperature);
        s->order[i] = i;
    }
    sort_keys = sc;
    qsort(s->order, (size_t)V, sizeof *s->order, by_score);
    /* top-k: every token scoring at least the k-th's */
    int keep = V;
    if (s->top_k > 0 && s->top_k < V) {
        float kth = sc[s->order[s->top_k - 1]];
        keep = s->top_k;
        while (keep < V && sc[s->order[keep]] >= kth) keep++;
    }
    /* the softmax over the tokens kept, most likely first */
    double mx = sc[s->order[0]], sum = 0.0;
    for (int r = 0; r < keep; r++) sum += (p[r] = (float)exp(sc[s->order[r]] - mx));
    for (int r = 0; r < keep; r++) p[r] = (float)(p[r] / sum);
    /* top-p: drop, from the least likely up, every token whose cumulative
     * probability (from the least likely) stays at or below 1 - p; the most
     * likely always stays */
    if (s->top_p < 1.0) {
        double below = 0.0;
        int n = keep;
        for (int r = keep - 1; r > 0; r--) {
            below += p[r];
            if (below > 1.0 - s->top_p) break;
            n = r;
        }
        keep = n;
        sum = 0.0;
        for (int r = 0; r < keep; r++) sum += p[r];
        for (int r = 0; r < keep; r++) p[r] = (float)(p[r] / sum);
    }
    /* one draw in [0, 1), walked down the tokens kept */
    double u = (double)(zo_splitmix_next(&s->state) >> 11) / 9007199254740992.0, c = 0.0;
    for (int r = 0; r < keep; r++) {
        c += p[r];
        if (u < c) return s->order[r];
    }
    return s->order[keep - 1];
}
