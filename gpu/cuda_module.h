/* The CUDA backend is a module (libzo_cuda.so, ggml's dynamic backends are
 * the model): programs do not link CUDA, cuBLAS or NCCL; gpu_device_open
 * opens the module the first time a CUDA device is asked for, so a program
 * built with CUDA runs where there is no driver, and one that never names a
 * CUDA device never maps the libraries (train --help: 217 MiB resident with
 * them linked in).
 *
 * The module exports one table, ZO_CUDA_MODULE_SYMBOL; its own symbols are
 * hidden, and its references to the project's libraries (zo_error,
 * gpu_device_wrap) resolve against the program that opens it, which links
 * zo_gpu with --export-dynamic. The communicator's functions, which a
 * program linking zo_gpu alone lacks, come as a table (comm_host_api) when
 * comm.c opens the NCCL backend. Private to gpu/. */
#ifndef ZO_GPU_CUDA_MODULE_H
#define ZO_GPU_CUDA_MODULE_H

#include "gpu/cuda/device_cuda.h" /* defines: gpu_cuda_options */
#include "gpu/ops.h"              /* defines: GPU_OP_COUNT, gpu_op_args */

struct comm;
struct comm_host_api;

/* Bumped with any change to what crosses between the module and the
 * program (this table, the device interface, gpu_op_args): a module of
 * another build is refused by name rather than trusted. */
#define ZO_CUDA_MODULE_ABI (3000000 + 1000 * GPU_OP_COUNT + (int)sizeof(gpu_op_args))
#define ZO_CUDA_MODULE_SYMBOL "zo_cuda_module_v1"
#define ZO_CUDA_MODULE_FILE "libzo_cuda.so"

typedef struct gpu_cuda_module {
    int abi; /* ZO_CUDA_MODULE_ABI of the module's build */
    zo_status (*open)(const gpu_cuda_options *opt, gpu_device_t *out);
    int (*device_count)(void);
    /* NULL: built without NCCL. `host`: the communicator's functions it calls
     * (gpu/comm_impl.h), so the module names none of them */
    zo_status (*nccl_init)(struct comm *c, const struct comm_host_api *host);
} gpu_cuda_module;

/* The module, opened once (thread-safe); ZO_ERR_UNSUPPORTED naming what is
 * missing: no CUDA in this build, the module's file (the paths tried), a
 * library it needs (dlopen's message names it: libcublasLt.so.13, ...), or
 * the NVIDIA driver (libcuda.so.1). ZO_CUDA_MODULE in the environment names
 * the module's file instead of the build's and the installed paths. */
zo_status gpu_cuda_module_get(const gpu_cuda_module **out);

#endif
