/* Opening a CUDA device with all of its options.
 *
 * gpu_device_init_cuda exists only in builds with CUDA (ZO_HAVE_CUDA is
 * defined to 1 for every target that links zo_gpu). gpu_device_open and
 * gpu_cuda_device_count (gpu/device.h) exist in every build, so programs can
 * name a device on their command line without build-time guards. */
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

#if defined(ZO_HAVE_CUDA) && ZO_HAVE_CUDA
/* The CUDA backend: a stream-ordered memory pool with a capacity and a
 * high-water mark, pinned host memory, CUDA streams and events, cuBLASLt
 * GEMMs and one kernel family per gpu/cuda/<family>.cu. Fails with
 * ZO_ERR_NOT_FOUND when the ordinal does not name a device, ZO_ERR_DEVICE
 * (naming the CUDA call) when the device cannot be used. */
zo_status gpu_device_init_cuda(const gpu_cuda_options *opt, gpu_device_t *out);
#endif

#ifdef __cplusplus
}
#endif

#endif
