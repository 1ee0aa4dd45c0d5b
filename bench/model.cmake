# bench_model: safetensors load/save throughput and the batch sampler.
# bench/CMakeLists.txt does not list "model" yet, so model/CMakeLists.txt
# includes this file; the guard keeps a second include harmless.
if(NOT TARGET bench_model)
  add_executable(bench_model ${PROJECT_SOURCE_DIR}/bench/bench_model.c)
  target_link_libraries(bench_model PRIVATE zo_model zo_bench_harness)
endif()
