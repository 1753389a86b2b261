# Engine tests: sampler and KV-cache block accounting (unit, also under ASan+UBSan), and the
# forward pass / batching loop on SmolLM2-135M against llama.cpp fixtures (e2e; skipped when
# the model is not fetched).
set(ENGINE_TEST_LIBS medley_engine PkgConfig::JANSSON)
medley_test(test_sampler SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sampler.c
            LIBS ${ENGINE_TEST_LIBS} LABELS unit)
# the grammar engine's vocabulary: synthetic SentencePiece and byte-level BPE (unit); SmolLM2's
# real one (e2e, skipped when not fetched)
medley_test(test_grammar_vocab SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_grammar_vocab.c
            LIBS ${ENGINE_TEST_LIBS} LABELS unit)
add_test(NAME test_grammar_vocab_smollm2 COMMAND test_grammar_vocab smollm2)
set_tests_properties(test_grammar_vocab_smollm2 PROPERTIES LABELS e2e)
medley_test(test_kvcache SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_kvcache.c
            LIBS ${ENGINE_TEST_LIBS} LABELS unit)
medley_test(test_engine_logits SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_engine_logits.c
            LIBS ${ENGINE_TEST_LIBS} LABELS e2e)
medley_test(test_engine_batch SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_engine_batch.c
            LIBS ${ENGINE_TEST_LIBS} LABELS e2e)
# its three groups as entries that run side by side: the answers (greedy against llama.cpp;
# seeded alone and batched, stop strings, a cut character; label simd) and the engine's
# batching and accounting
set_tests_properties(test_engine_batch PROPERTIES DISABLED TRUE)
foreach(g greedy answers engine)
  add_test(NAME test_engine_batch_${g} COMMAND test_engine_batch ${g})
  set_tests_properties(test_engine_batch_${g} PROPERTIES LABELS e2e
                       ENVIRONMENT "MEDLEY_BIN=$<TARGET_FILE:medley>")
endforeach()
# tiny synthetic models from tests/fixtures/engine: no real model needed, runs with the unit tests
medley_test(test_engine_archs SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_engine_archs.c
            LIBS ${ENGINE_TEST_LIBS} LABELS unit)
medley_test(test_engine_cli SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_engine_cli.c
            LIBS ${ENGINE_TEST_LIBS} LABELS e2e)
# step recording (backend.h step_begin/step_end, CUDA graphs) imitated on the CPU by
# tests/unit/graph_backend.c: tiny fixture model always, SmolLM2 when fetched
medley_test(test_engine_graph SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_engine_graph.c
            ${CMAKE_CURRENT_SOURCE_DIR}/unit/graph_backend.c
            LIBS ${ENGINE_TEST_LIBS} LABELS unit)
# GGUF hyperparameters (engine/model/model_load.c) on small files written by the test
medley_test(test_hparams SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_hparams.c
            LIBS ${ENGINE_TEST_LIBS} LABELS unit)
# synthetic models (engine/weights/synth.h): shapes, GGUF validity, determinism, every weight type
medley_test(test_synth SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_synth.c
            LIBS ${ENGINE_TEST_LIBS} LABELS unit)
# sharded replicas in one process (docs/sharding.md): pipelines and tensor parallelism against
# the single-device answers, the stage memory cap, refusals; synthetic always, SmolLM2 when
# fetched
medley_test(test_sharding SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_sharding.c
            LIBS ${ENGINE_TEST_LIBS} LABELS e2e)
# a tensor-parallel stage sums through the backends' all_reduce (NCCL's place, imitated on
# the CPU) when every rank has it, bit-equal to the host path; through host memory otherwise
medley_test(test_tp_allreduce SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_tp_allreduce.c
            LIBS ${ENGINE_TEST_LIBS} Threads::Threads LABELS unit)
# Gemma 3 270M against tests/fixtures/engine/gemma3_*.json (make_gemma3_fixtures.py): tokenizer
# and greedy continuations; skipped when `medley models fetch gemma3-270m` has not run
medley_test(test_engine_gemma3 SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_engine_gemma3.c
            LIBS ${ENGINE_TEST_LIBS} LABELS e2e)
# chunked prefill on SmolLM2: greedy tokens the same in one step and in chunks, decodes never
# stalled by a long prompt (label simd: the identity rests on the attention kernels' arithmetic)
medley_test(test_engine_chunked SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_engine_chunked.c
            LIBS ${ENGINE_TEST_LIBS} LABELS e2e)
# structured outputs on SmolLM2 (logit_bias, grammar-constrained answers, under preemption)
medley_test(test_engine_constrained SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_engine_constrained.c
            LIBS ${ENGINE_TEST_LIBS} LABELS e2e)
# Benchmark (not a test): build-dir/tests/bench_constrained [MODEL] [--seqs 64] (bench/engine)
add_executable(bench_constrained ${CMAKE_SOURCE_DIR}/bench/engine/bench_constrained.c)
target_link_libraries(bench_constrained PRIVATE medley_engine medley_common m)
