# bench_generate: generation's tokens/s on the CPU backend with the weights
# resident, streamed from host and read from NVMe, against memplan
# generate's prediction for this machine (gen_time.c: the machine measured
# as the planner sees it); the largest relative difference last.
add_executable(bench_generate ${CMAKE_CURRENT_SOURCE_DIR}/bench_generate.c ${CMAKE_CURRENT_SOURCE_DIR}/gen_time.c)
target_link_libraries(bench_generate PRIVATE zo_bench_harness zo_transformer zo_planner_calibrate m)
