/* Choosing the next token from a row of logits, as Hugging Face's generate()
 * does: greedy (temperature 0: the first of the largest logits, as
 * torch.argmax), or a draw from softmax(logits / T) after its top-k and
 * top-p warpers, in that order (TemperatureLogitsWarper, TopKLogitsWarper:
 * every token as likely as the k-th stays; TopPLogitsWarper: the smallest
 * set of the most likely tokens whose probability reaches p, at least one).
 * The draws come from one seeded generator (splitmix64), so a seed gives
 * the same tokens on any machine. */
#ifndef ZO_EXAMPLES_GENERATE_SAMPLE_H
#define ZO_EXAMPLES_GENERATE_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h" /* defines: zo_status */

typedef struct gen_sampler {
    double temperature; /* 0: greedy */
    int top_k;          /* 0: off */
    double top_p;       /* 1: off */
    uint64_t state;     /* the generator */
    int vocab;
    float *scratch;     /* [2 vocab] */
    int *order;         /* [vocab] */
} gen_sampler;

zo_status gen_sampler_init(gen_sampler *s, int vocab, double temperature, int top_k, double top_p, uint64_t seed);
void gen_sampler_free(gen_sampler *s);

/* The next token from logits[0..vocab). */
int32_t gen_sample(gen_sampler *s, const float *logits);

#endif
