/* The transformer as an offload_model: the runtime calls one block at a time
 * over the buffers it owns. */
#include "transformer/offload_model.h"

#include <stdlib.h>
#include <string.h>

/* Point the residual stream of block b at the runtime's buffers. */
static void tf_bind(tf_model *m, int b, const offload_block_io *io)
{
    if (b >= 1) m->res[b - 1] = (void *)io->in;
    if (b <= m->cfg.n_layers) m->res[b] = io->out;
}

static tf_block_bufs tf_bufs(const offload_block_io *io)
{
    tf_block_bufs bb = {.params = io->params, .grads = io->grads, .embed_params = io->dep_params,
                        .embed_grads = io->dep_grads, .frozen = io->frozen, .embed_frozen = io->dep_frozen,
                        .expert = io->expert, .expert_ctx = io->expert_ctx};
    return bb;
}

static zo_status tf_off_forward(void *user, int b, const offload_block_io *io, gpu_stream_t s)
{
    tf_model *m = user;
    tf_bind(m, b, io);
    tf_block_bufs bb = tf_bufs(io);
    return tf_block_forward(m, b, &bb, s);
}

static zo_status tf_off_recompute(void *user, int b, const offload_block_io *io, gpu_stream_t s)
{
    tf_model *m = user;
    tf_bind(m, b, io);
    tf_block_bufs bb = tf_bufs(io);
    return tf_block_recompute(m, b, &bb, s);
}

/* Whether layer block b's last forward routed a token to expert e. */
static int tf_off_routed(void *user, int b, int e)
{
    tf_model *m = user;
    if (b < 1 || b > m->cfg.n_layers || !m->acts[b - 1].moe_off) return 0;
    const tf_layer_acts *a = &m->acts[b - 1];
    /* with expert parallelism: the rows any rank of the group sent to local expert e */
    const int *off = m->ep_size > 1 ? a->ep_off : a->moe_off;
    return off[e + 1] > off[e];
}

/* Each routed expert's range in a layer block: its weights, expert after
 * expert (model/layout.h), or with LoRA its adapters (model/lora.c lays a
 * routed expert's adapters together); numbered per block, the experts of
 * the layout's window (expert parallelism: this rank's) only. */
static zo_status expert_ranges(tf_offload_model *a, const tf_model *m, int lora)
{
    const int E = m->layout.expert_count, L = m->cfg.n_layers;
    a->experts = calloc((size_t)L * E + 1, sizeof *a->experts);
    if (!a->experts) return zo_error(ZO_ERR_NOMEM, "tf_offload_model_init: out of host memory");
    size_t first = 0, stride = model_layout_expert_stride(&m->layout);
    if (lora) {
        stride = 0;
        for (int j = 0; j < m->n_lora && !stride; j++)
            if (m->lora[j].e_stride) {
                first = m->lora[j].a_off;
                stride = m->lora[j].e_stride;
            }
    }
    if (!stride) return ZO_OK; /* LoRA on none of the experts' projections */
    for (int l = 0; l < L; l++) {
        if (!zo_model_layer_is_moe(&m->cfg, l)) continue; /* DeepSeek's dense first layers */
        int b = model_layout_layer_block(l);
        if (!lora) first = model_layout_view(&m->layout, b, MODEL_ROLE_EXPERT_GATE_W)->offset;
        for (int e = 0; e < E; e++)
            a->experts[a->n_experts++] = (offload_expert_range){
                .block = b, .expert = e, .offset = first + (size_t)e * stride, .numel = stride};
    }
    return ZO_OK;
}

/* LoRA on a mixture of experts with expert parallelism (offload reads them
 * only then): each block's routed experts' bytes of its
 * frozen base (tf_init's frozen_off; the layout keeps a block's routed
 * experts together, so their bytes are one run, with any alignment before
 * the next tensor). */
static zo_status frozen_experts(tf_offload_model *a, const tf_model *m)
{
    const model_layout *l = &m->layout;
    a->frozen_xlo = calloc((size_t)l->n_blocks, sizeof *a->frozen_xlo);
    a->frozen_xhi = calloc((size_t)l->n_blocks, sizeof *a->frozen_xhi);
    if (!a->frozen_xlo || !a->frozen_xhi) return zo_error(ZO_ERR_NOMEM, "tf_offload_model_init: out of host memory");
    for (int i = 0; i < l->n_tensors; i++) {
        const model_tensor *t = &l->tensors[i];
        if (t->role != MODEL_ROLE_EXPERT_GATE_W && t->role != MODEL_ROLE_EXPERT_UP_W &&
            t->role != MODEL_ROLE_EXPERT_DOWN_W)
            continue;
        int b = t->block;
        size_t end = i + 1 < l->n_tensors && l->tensors[i + 1].block == b ? m->frozen_off[i + 1] : m->frozen_bytes[b];
        if (a->frozen_xlo[b] == a->frozen_xhi[b]) a->frozen_xlo[b] = m->frozen_off[i];
        a->frozen_xhi[b] = end;
    }
    return ZO_OK;
}

static zo_status tf_off_backward(void *user, int b, const offload_block_io *io, float loss_scale,
                                 gpu_stream_t s)
{
    tf_model *m = user;
    tf_bind(m, b, io);
    tf_block_bufs bb = tf_bufs(io);
    return tf_block_backward(m, b, &bb, loss_scale, s);
}

zo_status tf_offload_model_init(tf_offload_model *a, tf_model *m)
{
    memset(a, 0, sizeof *a);
    if (!m->opts.external_res)
        return zo_error(ZO_ERR_INVALID, "tf_offload_model_init: the model must be built with external_res");
    /* with LoRA the runtime trains the adapters' layout, beside each block's
     * frozen base */
    int lora = m->opts.lora.r > 0;
    const model_layout *l = lora ? &m->adapters : &m->layout;
    a->m = m;
    a->dep = calloc((size_t)l->n_blocks, sizeof(int));
    a->layer = calloc((size_t)l->n_blocks, sizeof(int));
    a->decay = calloc((size_t)l->n_tensors + 1, sizeof *a->decay);
    if (!a->dep || !a->layer || !a->decay) {
        tf_offload_model_free(a);
        return zo_error(ZO_ERR_NOMEM, "tf_offload_model_init: out of host memory");
    }
    for (int b = 0; b < l->n_blocks; b++) {
        a->dep[b] = -1;
        a->layer[b] = b >= 1 && b <= m->cfg.n_layers ? b - 1 : -1;
    }
    if (m->cfg.tied_embeddings) a->dep[model_layout_head_block(&m->layout)] = MODEL_BLOCK_EMBED;
    int nd = 0;
    for (int i = 0; i < l->n_tensors; i++) {
        const model_tensor *t = &l->tensors[i];
        if (model_tensor_decays(t))
            a->decay[nd++] = (offload_decay_range){.block = t->block, .offset = t->offset, .numel = t->numel};
    }
    zo_status st;
    if (m->cfg.moe.experts && ((st = expert_ranges(a, m, lora)) != ZO_OK ||
                               (lora && m->ep_size > 1 && (st = frozen_experts(a, m)) != ZO_OK))) {
        tf_offload_model_free(a);
        return st;
    }
    a->om = (offload_model){
        .n_blocks = l->n_blocks,
        .block_numel = l->block_numel,
        .block_dep = a->dep,
        .dtype = m->dtype,
        .boundary_bytes = (size_t)m->B * m->T * m->cfg.hidden * zo_dtype_size(m->dtype),
        .decay = a->decay,
        .n_decay = nd,
        .user = m,
        .forward = tf_off_forward,
        .backward = tf_off_backward,
        .recompute = m->opts.recompute ? tf_off_recompute : NULL,
        .block_layer = a->layer,
        /* the layers sharing one activation set: every one, or the first K */
        .recompute_layers = m->opts.recompute && tf_recompute_layers(m) < m->cfg.n_layers
                                ? tf_recompute_layers(m) : 0,
        .frozen_bytes = lora ? m->frozen_bytes : NULL,
        .expert_ranges = a->experts,
        .n_expert_ranges = a->n_experts,
        .experts = m->layout.expert_count,
        .expert_routed = a->n_experts ? tf_off_routed : NULL,
        .frozen_expert_lo = a->frozen_xlo,
        .frozen_expert_hi = a->frozen_xhi,
    };
    return ZO_OK;
}

void tf_offload_model_free(tf_offload_model *a)
{
    free(a->dep);
    free(a->layer);
    free(a->decay);
    free(a->experts);
    free(a->frozen_xlo);
    free(a->frozen_xhi);
    memset(a, 0, sizeof *a);
}
