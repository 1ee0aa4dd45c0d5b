# bench_gpu: GEMM throughput of the CPU device backend on transformer shapes
# (own kernel, the backend's dispatch, and OpenBLAS itself, alternated in the
# same run), and one training step of a small GPT-2 on the device interface.
add_executable(bench_gpu ${CMAKE_CURRENT_SOURCE_DIR}/bench_gpu.c)
target_link_libraries(bench_gpu PRIVATE zo_bench_harness zo_gpu zo_ref_trainer)
if(TARGET OpenBLAS::OpenBLAS)
  target_link_libraries(bench_gpu PRIVATE OpenBLAS::OpenBLAS)
  target_compile_definitions(bench_gpu PRIVATE ZO_HAVE_OPENBLAS=1)
endif()

if(ZO_HAVE_CUDA)
  # bench_gpu_cuda: the CUDA backend (GEMM vs cuBLASLt's best, copies,
  # attention); exits 77 without a GPU.
  add_executable(bench_gpu_cuda ${CMAKE_CURRENT_SOURCE_DIR}/bench_gpu_cuda.c)
  target_link_libraries(bench_gpu_cuda PRIVATE zo_bench_harness zo_gpu CUDA::cudart CUDA::cublasLt
                        ${MATH_LIBRARY})
endif()
