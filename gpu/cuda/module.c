/* The module's one exported symbol: the table gpu/device_open.c looks up
 * (gpu/cuda_module.h). */
#include "gpu/cuda_module.h" /* defines: gpu_cuda_module, ZO_CUDA_MODULE_ABI */

#if defined(ZO_HAVE_NCCL) && ZO_HAVE_NCCL
struct comm_host_api;
zo_status comm_nccl_init(struct comm *c, const struct comm_host_api *host); /* gpu/cuda/comm_nccl.c */
#define NCCL_INIT comm_nccl_init
#else
#define NCCL_INIT NULL
#endif

__attribute__((visibility("default"))) const gpu_cuda_module zo_cuda_module_v1 = {
    .abi = ZO_CUDA_MODULE_ABI,
    .open = cuda_device_init,
    .device_count = cuda_device_count,
    .nccl_init = NCCL_INIT,
};
