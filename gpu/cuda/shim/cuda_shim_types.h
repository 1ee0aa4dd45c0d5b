/* The CUDA runtime and cuBLASLt types that gpu/cuda/cuda_impl.h names, as
 * stand-ins for a build without the CUDA headers (ZO_CUDA_SHIM): C11 and
 * C++ alike, so that a plain C test can include cuda_impl.h and call the
 * shim's launchers. Handles are pointers to structs that are never defined
 * (a NULL stream is the only one the shim takes); the error enumerators
 * that the shim reports keep the CUDA runtime's values. Never include this
 * beside the real CUDA headers. */
#ifndef ZO_GPU_CUDA_SHIM_TYPES_H
#define ZO_GPU_CUDA_SHIM_TYPES_H

#ifdef __CUDACC__
#error "cuda_shim_types.h is for builds without CUDA (ZO_CUDA_SHIM); nvcc has the real types"
#endif

typedef struct zo_shim_cuda_stream *cudaStream_t;   /* kernels run at the launch: NULL */
typedef struct zo_shim_cuda_event *cudaEvent_t;     /* never created */
typedef struct zo_shim_cuda_mempool *cudaMemPool_t; /* never created */
typedef struct zo_shim_cublaslt *cublasLtHandle_t;  /* the cuBLASLt path is left out */

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,          /* bad argument; dynamic shared memory over the limit */
    cudaErrorMemoryAllocation = 2,      /* the shim could not allocate host memory */
    cudaErrorInvalidConfiguration = 9,  /* block or grid dimensions out of range */
    cudaErrorIllegalInstruction = 715,  /* a warp shuffle a GPU leaves undefined */
    cudaErrorMisalignedAddress = 716,   /* a 16-byte vector access off a 16-byte boundary */
    cudaErrorLaunchFailure = 719,       /* a block that cannot finish: a barrier deadlock */
} cudaError_t;

typedef enum cublasStatus {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;

typedef enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
} cudaFuncAttribute;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;

#endif
