# The longest tests' seconds (the sanitizer build's, the longer of the two,
# from a clean-clone .ci/run on 2 cores) as their COST: ctest -j starts the
# costliest first, so that a long test does not begin last and run alone
# while the other core idles. Without this a clean build folder (no
# Testing/Temporary/CTestCostData.txt yet) runs them in declaration order.
# Refresh the figures when a test's time moves by much (docs/testing.md).
# (Gemma-2's and Gemma-3's generate tests: Gemma's figure, the same shapes
# and runs; not yet measured in a sanitizer build.)
# Included at the end of each folder that adds tests: before CMake 3.28
# set_tests_properties sees only the tests of the folder it runs in.
set(zo_test_costs
    test_transformer_torch 155 test_transformer 147
    test_offload 114 test_ops 83 test_generate_torch_mixtral 71 test_generate_torch_qwen2_moe 68
    test_generate_torch_qwen3_moe 51 test_generate_torch_gemma 45 test_generate_torch_phi3 35
    test_generate_torch_gemma2 45 test_generate_torch_gemma3_text 45
    test_generate_torch_qwen3 34 test_e2e_torch_qwen3_moe 16 test_generate_torch_gpt_neox 15
    test_generate_torch_falcon_new 15 test_generate_torch_falcon 12
    test_zero 57 test_ranks_moe_ep_zero_ckpt 57 test_ranks_moe_ep_gaps 44 test_ranks_moe_ep_zero 37 test_zero_mpi4 35 test_ranks_moe_ep 31
    test_generate_torch_llama 30 test_offload_cuda_selfcheck 26 test_ranks_moe 23 test_install 23
    test_generate_torch_gpt2 22 test_comm_fault 21 test_zero_mpi2 15 test_e2e_torch_mixtral_sparse 14
    test_e2e_torch_qwen2_moe 13 test_ranks_matrix_full 11 test_ranks_matrix_qlora 11
    test_ranks_matrix_lora 11 test_ranks_moe_ep_z3host 9 test_e2e_torch_qwen2_moe_sparse 9
    test_gpu_check_fake_gpu 9 test_ranks_refusals 9 test_finetune_torch 8 test_ranks_moe_ep_ckpt 8
    test_e2e_torch_llama 7 test_torch_side_by_side 7)
list(LENGTH zo_test_costs zo_n)
math(EXPR zo_last "${zo_n} - 1")
foreach(i RANGE 0 ${zo_last} 2)
  math(EXPR j "${i} + 1")
  list(GET zo_test_costs ${i} zo_name)
  list(GET zo_test_costs ${j} zo_cost)
  if(TEST ${zo_name})
    set_tests_properties(${zo_name} PROPERTIES COST ${zo_cost})
  endif()
endforeach()
