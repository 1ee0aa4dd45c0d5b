# bench_offload: step time of the offload runtime with weights streamed from
# pinned host memory, against all-resident, same model and backend, for
# prefetch depths 0, 1, 2; the ratio last.
add_executable(bench_offload ${CMAKE_CURRENT_SOURCE_DIR}/bench_offload.c)
target_link_libraries(bench_offload PRIVATE zo_bench_harness zo_offload zo_transformer)

# bench_zero: a step on N ranks (mpirun -np N) with ZeRO 0-3 against one rank
# with grad-accum N (the same global batch) and the communicator's own
# all-reduce of the model, in the same run; the speed-up last.
add_executable(bench_zero ${CMAKE_CURRENT_SOURCE_DIR}/bench_zero.c)
target_link_libraries(bench_zero PRIVATE zo_bench_harness zo_offload zo_comm zo_transformer)

# bench_lora: one step of full fine-tuning against LoRA and QLoRA on the same
# model and device, alternating; the ratios last.
add_executable(bench_lora ${CMAKE_CURRENT_SOURCE_DIR}/bench_lora.c)
target_link_libraries(bench_lora PRIVATE zo_bench_harness zo_offload zo_transformer)

# bench_schedule: the planner's step time for the optimizer schedules
# (serial, overlap, dpu) against the runtime's on the CPU backend, three
# placements; the largest relative difference last.
add_executable(bench_schedule ${CMAKE_CURRENT_SOURCE_DIR}/bench_schedule.c)
target_link_libraries(bench_schedule PRIVATE zo_bench_harness zo_offload zo_transformer zo_planner_calibrate m)

# bench_opt_state: the host update of 8-bit (or bf16) m and v, whole chunks
# fused against decoded and coded a chunk at a time and against fp32 state,
# one step each in turn; the ratios last.
add_executable(bench_opt_state ${CMAKE_CURRENT_SOURCE_DIR}/bench_opt_state.c)
target_link_libraries(bench_opt_state PRIVATE zo_bench_harness zo_offload zo_transformer)
