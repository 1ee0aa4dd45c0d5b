# Per-test properties set after the tests exist (included at the end of each
# folder that adds tests: before CMake 3.28 set_tests_properties sees only the
# tests of the folder it runs in).
#
# COST: the tests' seconds (the sanitizer build's where it runs them, the
# longer of the two; else the plain build's), from a run of each suite with
# ctest -j2 on the 2-core machine, the machine otherwise idle (2026-11-27's
# clean-clone run of 764ec77, docs/testing.md; the Granite/Cohere families'
# seconds moved from the LLaMA entries to Mistral's and Qwen3's by estimate;
# test_ops and test_offload less what the suitecut2 branch measured it took
# out of them, docs/testing.md; test_offload, test_ranks_family_qwen3 and
# test_ranks_moe_ep_qwen3 plus what the rankrows branch measured its rows and
# test_state_fused_experts add; test_ranks_moe_ep4_lora as the ep4 branch
# measured it, 4.9 s; test_e2e_torch_mixtral and test_generate_torch_mixtral
# as measured with their phimoe families, 11.3 and 13.0 s, the latter 17 with
# phimoe_cross, and test_generate_torch_phi3 17 with the longrope crossings,
# as the longgen branch measured them; test_ranks_moe_ep_capacity 4 with its
# phimoe row, 0.9 s, as the sparsecap branch measured it; test_ops,
# test_comm_fault, test_ranks_moe_ep, _z3host and _zero less what the
# suitecut3 branch measured it took out of them; test_install, test_ops and
# test_offload less what the suitecut4 branch measured, 6 s for the first;
# test_e2e_torch_qwen3_moe and test_generate_torch_qwen3_moe plus their
# DeepSeek-V3 (and V2 group-limited) families, 11 and 8 s, as the dsv3
# branch measured them alone; test_e2e_torch_qwen2_moe and
# test_generate_torch_qwen2_moe with their GLM-4.5 families, 18 and 10 s,
# as the glm45 branch measured them; test_e2e_torch_gemma2 and
# test_generate_torch_gemma2 plus their OLMo-2 and OLMo-3 families, 11.5
# and 7.8 s, as the olmo2 branch measured them alone at a load of about 1;
# test_model 2 as the suitecut5 branch measured it under the sanitizers,
# model_layout_find's search no longer a scan; test_e2e_torch_mixtral and
# test_generate_torch_mixtral with OLMoE's families, 15.9 and 26.3 s
# measured in place at a load of 0.4; test_e2e_torch_qwen2 and
# test_generate_torch_qwen3 plus SmolLM3's families, 5.6 and 6.4 s alone;
# test_e2e_torch_falcon_seq and test_generate_torch_gpt2 plus StarCoder2's,
# 5.1 and 6.3 s alone, and the first two plus Seed-OSS's, 4.8 and 4.3 s;
# test_e2e_torch_mistral and test_generate_torch_phi3 plus ERNIE 4.5's,
# 4.9 and 5.1 s; test_e2e_torch_gemma2 and test_generate_torch_gemma2
# plus EXAONE 4.0's, 16.7 and 5.7 s alone at a load of about 1;
# test_e2e_torch_mixtral and test_generate_torch_mixtral plus gpt-oss's,
# about 6 s each as the gptossrt branch measured them; test_ops less what
# the shim's AVX2 paths took out of its sanitizer run, 206 -> about 125 s
# on the AMD EPYC; the PyTorch entries that took in others' families, the
# sum of their seconds in 2c7095d's clean-clone run less 2.4 s for each
# Python process saved):
# ctest -j starts
# the costliest first, so that a long test
# does not begin last and run alone while the other core idles. Without this
# a clean build folder (no Testing/Temporary/CTestCostData.txt yet) runs them
# in declaration order. Refresh the figures when a test's time moves by much.
set(zo_test_costs
    test_ops 125 test_offload 126 test_zero_mpi4 65 test_zero 63 test_ranks_moe_ep_zero 46
    test_e2e_torch_llama 33 test_ranks_moe_ep 25 test_ranks_moe_ep_zero_ckpt 35 test_zero_mpi2 32
    test_ranks_moe_ep_gaps 31 test_e2e_torch_qwen3_moe 35 test_ranks_moe 21 test_offload_memplan 21
    test_e2e_torch_mistral 36 test_generate_torch_llama 14 test_gpu_check_fake_gpu 19 test_e2e_torch_gpt2 18
    test_install 6 test_comm_fault 8 test_e2e_torch_falcon_seq 21 test_offload_cuda_selfcheck 16 test_model 2
    test_ranks_matrix_full 15 test_planner_search 14 test_ranks_family_falcon 14 test_ranks_moe_ep_z3host 10
    test_ranks_matrix_qlora 13 test_ranks_matrix_lora 13 test_transformer_torch 13 test_gpu 13
    test_torch_side_by_side 12 test_offload_edges 12 test_generate_torch_qwen3 27 test_plan_schema 10
    test_gpu_gemm 10 test_cpu_adam_state 10 test_transformer 10 test_tokenizer_js 9
    test_generate_torch_qwen3_moe 29 test_ranks_moe_ep_qlora 9 test_e2e_torch_gemma2 34
    test_ranks_moe_ep_qwen3 10 test_cuda_shim 8 test_configure 8 test_ranks_moe_ep_ckpt 8 test_ranks_refusals 8
    test_generate_torch_mixtral 27 test_ranks_moe_ep_nvme 7 test_planner_generate 7 test_planner_attn 9
    test_ranks_family_qwen3 9 test_cpu_adam 7 test_e2e_torch_qwen2_moe 21 test_finetune_torch 7
    test_e2e_torch_mixtral 34 test_generate_torch_gpt2 29 test_profile 6 test_generate_torch_gemma2 24
    test_ranks_searched_plans 5 test_finetune 4 test_generate 4 test_ranks_moe_ep_capacity 4
    test_ranks_moe_ep4_lora 5)
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

# Label `repeat`: tests that run, at more families, shapes or ranks, code
# paths which other tests run too. The sanitizer pass of scripts/test.sh
# leaves them out (ctest -LE 'buildsystem|repeat'; ZO_SANITIZE_ALL=1 runs
# them too), toward the suite's 15 minutes on 2 cores (both passes: 23.5
# minutes before, 17.7 after, 13.7 with the MPI and shim changes;
# docs/testing.md); the plain pass runs every
# test. Under the sanitizers stay: every C test
# (test_transformer_torch's families, test_model's loaders, test_offload,
# test_ops, ...), the PyTorch runs of one dense family and one of each
# layer kind (test_e2e_torch_llama, _gpt2: GPT-2/OPT/Phi/GPT-J layers,
# _qwen3_moe: experts and latent attention; test_generate_torch_llama;
# fine-tuning, NF4, LoRA, the side by side), ZeRO in process on one rank
# with train launched on several (test_zero) and train on several ranks for
# every method, ZeRO stage and placement (test_ranks_matrix_*, searched
# plans, three ranks, refusals) and expert parallelism (test_ranks_moe_ep and
# its checkpoint, NVMe, QLoRA, capacity, clip and ZeRO-3 host rows). Left
# out: the other families' PyTorch runs (the same loader, layers and train
# with another config); ZeRO in process on two and four ranks (the
# partitions, gathers and reductions train runs in test_ranks_matrix_*); the
# family rows on two ranks; the longer expert-parallel matrices (ZeRO stages
# by methods, checkpoints across them, uneven expert counts, LoRA's and
# QLoRA's gradient norms with --ep 2 on 4 ranks), which repeat
# test_ranks_moe_ep's paths over more combinations; the CUDA test's
# self-check without a GPU (the runtime on a second CPU device, which
# test_offload runs); the peaks against memplan's plans at every placement
# and family (test_offload_memplan: the accounting is the planner's, the
# placements' code paths run under the sanitizers in test_offload's
# dedicated tests: schedules, master and state kinds, the GPU share, NVMe);
# and the GPU script's checks with a fake GPU (shell logic, the same in
# both builds).
set(zo_test_repeats
    test_zero_mpi2 test_zero_mpi4 test_gpu_check_fake_gpu test_ranks_moe test_ranks_moe_ep_gaps test_ranks_moe_ep_zero test_ranks_moe_ep_zero_ckpt
    test_ranks_moe_ep_qwen3 test_ranks_moe_ep4_lora test_ranks_family_qwen3 test_ranks_family_phi3
    test_ranks_family_gemma
    test_ranks_family_gemma2 test_ranks_family_gemma3 test_ranks_family_neox test_ranks_family_falcon
    test_offload_cuda_selfcheck test_offload_memplan)
foreach(family mistral gemma2 falcon_seq mixtral qwen2_moe)
  list(APPEND zo_test_repeats test_e2e_torch_${family})
endforeach()
foreach(family gpt2 qwen3 gemma2 mixtral qwen3_moe)
  list(APPEND zo_test_repeats test_generate_torch_${family})
endforeach()
foreach(zo_name IN LISTS zo_test_repeats)
  if(TEST ${zo_name})
    set_tests_properties(${zo_name} PROPERTIES LABELS repeat)
  endif()
endforeach()
