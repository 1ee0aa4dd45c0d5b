/* LoRA adapters: their layout (a model_layout of their own) and adapter
 * files that Hugging Face PEFT writes and loads.
 *
 * The adapter layout has the blocks of the model's layout (block 0 the
 * embedding, 1..L the layers, L+1 the head); the embedding and the head hold
 * nothing (PEFT adapts neither), a layer block holds, for each adapted
 * linear layer in the layer's order (common/lora.h: zo_lora_layer_modules),
 * A [r, in] then B [out, r], packed without padding. Each tensor is named as
 * PEFT names it in adapter_model.safetensors:
 *     base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight   (LLaMA family)
 *     base_model.model.transformer.h.3.attn.c_attn.lora_B.weight       (GPT-2)
 * its role is the adapted weight's role (MODEL_ROLE_Q_W, MODEL_ROLE_QKV_W
 * for GPT-2's c_attn, ...) and its `lora` field says A or B. Because it is
 * a model_layout, model_save / model_load / model_load_block read and
 * write adapter buffers as they do model blocks, and total_numel is PEFT's
 * trainable count (zo_lora_trainable_params).
 *
 * An adapter directory (what `save_pretrained` writes and
 * PeftModel.from_pretrained reads): adapter_model.safetensors and
 * adapter_config.json with peft_type "LORA", task_type "CAUSAL_LM", r,
 * lora_alpha, target_modules (PEFT's module names: q_proj ...; c_attn,
 * attn.c_proj, c_fc, mlp.c_proj for GPT-2, whose Conv1D layers also set
 * fan_in_fan_out), lora_dropout 0, bias "none", base_model_name_or_path. */
#ifndef ZO_MODEL_LORA_H
#define ZO_MODEL_LORA_H

#include <stddef.h>

#include "common/dtype.h" /* defines: zo_dtype */
#include "common/lora.h"  /* defines: zo_lora_config */
#include "layout.h"      /* defines: model_layout */

#define MODEL_LORA_A 1 /* [r, in] */
#define MODEL_LORA_B 2 /* [out, r] */

#define MODEL_LORA_WEIGHTS "adapter_model.safetensors"
#define MODEL_LORA_CONFIG "adapter_config.json"

/* The adapter layout of `lc` (checked with zo_lora_check) on model `cfg`;
 * free it with model_layout_free. */
zo_status model_lora_layout_init(model_layout *l, const zo_model_config *cfg,
                                 const zo_lora_config *lc);
/* The same holding the adapters of routed experts [first, first + count)
 * only (expert parallelism: model/layout.h's expert window), under their
 * global names. */
zo_status model_lora_layout_init_experts(model_layout *l, const zo_model_config *cfg, const zo_lora_config *lc,
                                         int first, int count);

/* Write dir/adapter_model.safetensors (the adapter buffers blocks[b], of
 * type buf_dt, stored as file_dt; blocks of no elements may be NULL) and
 * dir/adapter_config.json; `base_model` (may be NULL: null) goes to
 * base_model_name_or_path. The directory is created if missing; each file
 * is written atomically. */
zo_status model_lora_save(const char *dir, const model_layout *adapters, const zo_lora_config *lc,
                          const char *base_model, const void *const *blocks, zo_dtype buf_dt,
                          zo_dtype file_dt);

/* Read dir/adapter_config.json: r, lora_alpha and target_modules into *lc
 * (checked against cfg; use_rslora's scale alpha / sqrt(r) as alpha x
 * sqrt(r)), base_model_name_or_path into base_model (may be NULL; "" when
 * the file has none). Every field is accounted for: what PEFT can say that
 * this runtime does not compute (DoRA, biases, other tasks, inits that
 * rewrite the base such as PiSSA, excluded, replicated or per-layer
 * modules, target_parameters, patterns, and any field not known here unless
 * null, false or empty; docs/transformer.md lists them) is
 * ZO_ERR_UNSUPPORTED naming the field. */
zo_status model_lora_read_config(const char *dir, const zo_model_config *cfg, zo_lora_config *lc,
                                 char *base_model, size_t base_len);
/* The same from the file's `len` bytes of text; `path` names them. */
zo_status model_lora_parse_config(const char *text, size_t len, const char *path, const zo_model_config *cfg,
                                  zo_lora_config *lc, char *base_model, size_t base_len);
/* The adapter_config.json model_lora_save writes, as text (free it); NULL
 * when out of memory. */
char *model_lora_config_text(const zo_model_config *cfg, const zo_lora_config *lc, const char *base_model);

/* Fill the adapter buffers (type dt) from dir/adapter_model.safetensors:
 * every tensor of the layout must be there with its shape, and nothing else. */
zo_status model_lora_load(const char *dir, const model_layout *adapters, void *const *blocks,
                          zo_dtype dt);

#endif
