# bench_nvme: the io_uring engine against fio, and the pipelined optimizer
# step against its disk and compute baselines. With cpu_adam in the build the
# step's update (and the compute baseline) is adam_update.
if(TARGET zo_nvme)
  add_executable(bench_nvme ${CMAKE_CURRENT_SOURCE_DIR}/bench_nvme.c)
  target_link_libraries(bench_nvme PRIVATE zo_nvme zo_bench_harness PkgConfig::CJSON
                        OpenMP::OpenMP_C ${MATH_LIBRARY})
  if(TARGET zo_cpu_adam)
    target_link_libraries(bench_nvme PRIVATE zo_cpu_adam)
    target_compile_definitions(bench_nvme PRIVATE ZO_BENCH_CPU_ADAM=1)
  endif()
endif()
