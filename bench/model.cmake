# bench_model: safetensors load/save throughput and the batch sampler.
add_executable(bench_model bench_model.c)
target_link_libraries(bench_model PRIVATE zo_model zo_bench_harness)
