# bench_model: safetensors load/save throughput, the batch sampler and the
# weights' initialization from a seed.
add_executable(bench_model bench_model.c)
target_link_libraries(bench_model PRIVATE zo_model zo_transformer zo_bench_harness)

# bench_tokenizer: the tokenizer against Hugging Face's JavaScript tokenizers
# (tests/js, through node) on the same documents; C on one and on all threads.
add_executable(bench_tokenizer bench_tokenizer.c)
target_link_libraries(bench_tokenizer PRIVATE zo_model zo_bench_harness OpenMP::OpenMP_C)
target_compile_definitions(bench_tokenizer PRIVATE ZO_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
