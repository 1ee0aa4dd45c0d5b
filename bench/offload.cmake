# bench_offload: step time of the offload runtime with weights streamed from
# pinned host memory, against all-resident, same model and backend, for
# prefetch depths 0, 1, 2; the ratio last.
add_executable(bench_offload ${CMAKE_CURRENT_SOURCE_DIR}/bench_offload.c)
target_link_libraries(bench_offload PRIVATE zo_bench_harness zo_offload zo_transformer)
