if(ZO_HAVE_CUDA)
  # bench_gpu_cuda: the CUDA backend (GEMM vs cuBLASLt's best, copies,
  # attention); exits 77 without a GPU.
  add_executable(bench_gpu_cuda ${CMAKE_CURRENT_SOURCE_DIR}/bench_gpu_cuda.c)
  target_link_libraries(bench_gpu_cuda PRIVATE zo_bench_harness zo_gpu CUDA::cudart CUDA::cublasLt
                        ${MATH_LIBRARY})
endif()
