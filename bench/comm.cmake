# bench_comm: the communicator's collectives per backend, nccl-tests style,
# against the MPI library's own MPI_Allreduce of the same bytes (needs MPI;
# NCCL rows where a GPU per rank is present). Run under mpirun.
if(ZO_HAVE_MPI)
  add_executable(bench_comm ${CMAKE_CURRENT_SOURCE_DIR}/bench_comm.c)
  target_link_libraries(bench_comm PRIVATE zo_bench_harness zo_comm MPI::MPI_C ${MATH_LIBRARY})
endif()
