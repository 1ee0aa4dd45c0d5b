/* The checkpoint layer (ckpt.c; ckpt_meta.c writes and reads its small
 * files), above the gradients and the optimizer: training checkpoints
 * written and loaded block by block through the optimizer shards and the
 * weight store, and the checkpoint folder this runtime holds, locked. */
#ifndef ZO_OFFLOAD_CKPT_H
#define ZO_OFFLOAD_CKPT_H

#include "common/fileio.h" /* defines: zo_dir_lock */
#include "offload/grads.h" /* defines: offload_grads, offload_optim, ostate, wstore */

typedef struct offload_ckpt {
    /* the layers a checkpoint reads and writes (offload_init sets them) */
    const offload_env *env;
    const offload_config *cfg;  /* the hook, keep_checkpoints, sub_group */
    const offload_geom *g, *og; /* the model's blocks; the optimizer's geometry */
    wstore *ws;
    ostate *os;
    offload_optim *opt;         /* settled first; the training counters */
    offload_grads *gr;          /* drained first */
    zo_dir_lock lock;           /* the checkpoint folder this runtime writes into */
} offload_ckpt;

/* No folder held. */
void offload_ckpt_init(offload_ckpt *ck);
/* Lock `dir` (created if missing) for this runtime's life; a runtime holds
 * one checkpoint folder, the last it locked. */
zo_status offload_ckpt_lock(offload_ckpt *ck, const char *dir);
/* The folder held is let go. */
void offload_ckpt_release(offload_ckpt *ck);
/* offload_save_streamed, offload_save, offload_load and
 * offload_write_weights (offload.h), on the runtime's layers. */
zo_status offload_ckpt_save(offload_ckpt *ck, const char *dir, const offload_ckpt_meta *meta,
                            offload_weights_stream writer, void *writer_user);
zo_status offload_ckpt_save_whole(offload_ckpt *ck, const char *dir, const offload_ckpt_meta *meta,
                                  offload_weights_writer writer, void *writer_user);
zo_status offload_ckpt_load(offload_ckpt *ck, const char *dir, offload_ckpt_meta *meta);
zo_status offload_ckpt_write_weights(offload_ckpt *ck, const char *path, offload_weights_stream writer,
                                     void *user);

#endif
