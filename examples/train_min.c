/* The smallest program on the runtime: train a model from a memplan plan. */
#include <stdio.h>
#include <stdlib.h>
#include "transformer/offload_model.h" /* tf_model, tf_offload_model (pulls in offload/offload.h) */

int main(int argc, char **argv)
{
    if (argc < 3) return fprintf(stderr, "usage: %s PLAN.json STEPS [cpu|cuda [CONFIG]]\n", argv[0]), 2;
    offload_plan p;
    offload_plan_defaults(&p);
    zo_model_config cfg;
    gpu_device_t dev;
    gpu_stream_t s;
    tf_model m;
    tf_offload_model tm;
    offload_t *rt;
    if (offload_plan_load(argv[1], &p) ||
        (argc > 4 ? zo_model_config_load(argv[4], &cfg) : zo_model_preset_find(p.model_name, &cfg)) ||
        zo_plan_check_run(&p.file, &cfg, 1, argv[1]))
        goto fail;
    tf_options to = {.recompute = p.cfg.recompute, .external_res = 1};
    int B = p.micro_batch ? p.micro_batch : 1, T = p.seq ? p.seq : 64;
    if (gpu_device_open(argc > 3 ? argv[3] : "cpu", p.gpu_mem, &dev) || gpu_stream_create(dev, &s) ||
        tf_init_opts(&m, &cfg, dev, p.dtype < 0 ? ZO_DTYPE_BF16 : (zo_dtype)p.dtype, B, T, &to) ||
        tf_offload_model_init(&tm, &m) || offload_init(&rt, dev, &tm.om, &p.cfg))
        goto fail;
    float **w = calloc((size_t)m.layout.n_blocks, sizeof *w);
    for (int b = 0; b < m.layout.n_blocks; b++) w[b] = calloc(m.layout.block_numel[b] + 1, 4);
    tf_init_weights(&m.layout, w, 1);
    if (offload_set_weights(rt, (const float *const *)w)) goto fail;
    int32_t *in = malloc((size_t)B * T * 4), *tg = malloc((size_t)B * T * 4);
    for (int step = 0; step < atoi(argv[2]); step++) {
        for (int i = 0; i < B * T; i++) in[i] = (step + i) % cfg.vocab, tg[i] = (step + i + 1) % cfg.vocab;
        float loss;
        offload_step_info info;
        for (int j = 0; j < p.cfg.grad_accum; j++)
            if (tf_set_batch(&m, s, in, tg, B, T) || offload_micro_batch(rt, s) || tf_loss(&m, s, &loss)) goto fail;
        if (offload_step(rt, &info)) goto fail;
        printf("step %d loss %.4f norm %.3f\n", step, loss, info.grad_norm);
    }
    return offload_write_stats_json(rt, &p.predicted, "stats.json") ? 1 : 0;
fail:
    fprintf(stderr, "error: %s\n", zo_last_error());
    return 1;
}
