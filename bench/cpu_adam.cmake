# bench_cpu_adam: the optimizer step and the gradient statistics against the
# memory roof measured in the same run (see docs/performance.md).
add_executable(bench_cpu_adam ${CMAKE_CURRENT_SOURCE_DIR}/bench_cpu_adam.c)
target_link_libraries(bench_cpu_adam PRIVATE zo_cpu_adam zo_bench_harness OpenMP::OpenMP_C)
# bench_grad_sum: the host's gradient sum (adam_grad_accumulate) against a
# roof with the same bytes, alternated (see docs/performance.md).
add_executable(bench_grad_sum ${CMAKE_CURRENT_SOURCE_DIR}/bench_grad_sum.c)
target_link_libraries(bench_grad_sum PRIVATE zo_cpu_adam zo_bench_harness OpenMP::OpenMP_C)
