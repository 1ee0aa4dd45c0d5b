/* Opening a CUDA device with all of its options.
 *
 * gpu_device_init_cuda, gpu_device_open and gpu_cuda_device_count exist in
 * every build; the CUDA backend itself is a module that they open on first
 * use (gpu/cuda_module.h), so a build without CUDA, or a machine without
 * the module's libraries or a driver, gets ZO_ERR_UNSUPPORTED naming what
 * is missing. */
#ifndef ZO_GPU_CUDA_DEVICE_CUDA_H
#define ZO_GPU_CUDA_DEVICE_CUDA_H

#include <stddef.h>

#include "gpu/device.h" /* defines: gpu_device_t */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpu_cuda_options {
    int device;      /* CUDA device ordinal */
    size_t capacity; /* bytes of device memory the pool may hand out; 0 = the
                        memory free on the device when it is opened */
} gpu_cuda_options;

/* The CUDA backend: a stream-ordered memory pool with a capacity and a
 * high-water mark, pinned host memory, CUDA streams and events, cuBLASLt
 * GEMMs and one kernel family per gpu/cuda/<family>.cu. Fails with
 * ZO_ERR_NOT_FOUND when the ordinal does not name a device, ZO_ERR_DEVICE
 * (naming the CUDA call) when the device cannot be used, ZO_ERR_UNSUPPORTED
 * when the module cannot be opened. */
zo_status gpu_device_init_cuda(const gpu_cuda_options *opt, gpu_device_t *out);

/* The same inside the module (gpu/cuda/device_cuda.c). */
zo_status cuda_device_init(const gpu_cuda_options *opt, gpu_device_t *out);
int cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif
