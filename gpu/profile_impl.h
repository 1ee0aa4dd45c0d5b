/* Private: the profile's hooks, called by the one place each kind of work
 * passes (ops.c's gpu_op_run, device.c's copies and memsets) when a profile
 * is attached to the device: each enqueues the work between two timed
 * events (or untimed outside a profiled step) and returns its status. */
#ifndef ZO_GPU_PROFILE_IMPL_H
#define ZO_GPU_PROFILE_IMPL_H

#include "gpu/ops.h"     /* defines: gpu_op_id, gpu_op_args */
#include "gpu/profile.h" /* defines: gpu_profile */

zo_status gpu_profile_op(gpu_profile *p, gpu_stream_t s, gpu_op_id id, const gpu_op_args *a);
zo_status gpu_profile_copy(gpu_profile *p, gpu_stream_t s, void *dst, const void *src, size_t bytes,
                           gpu_copy_kind kind);
zo_status gpu_profile_memset(gpu_profile *p, gpu_stream_t s, void *dst, int value, size_t bytes);

#endif
