# Hugging Face directories (docs/models.md): the safetensors reader (unit tests with hostile
# files, and a mutation fuzzer run under ASan+UBSan by scripts/test.sh), config.json mapping,
# and SmolLM2 as a BF16 HF directory against its float64 reference (e2e; the directory is made
# at test time from the fetched GGUF by tests/fixtures/hf/make_hf_smollm2.py, skipped like the
# other SmolLM2 tests when the model is not fetched).
set(HF_TEST_LIBS medley_engine PkgConfig::JANSSON)
medley_test(test_safetensors SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_safetensors.c
            LIBS ${HF_TEST_LIBS} LABELS unit)
medley_test(test_safetensors_fuzz SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/test_safetensors_fuzz.c
            LIBS ${HF_TEST_LIBS} LABELS fuzz)
medley_test(test_hf_config SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_hf_config.c
            LIBS ${HF_TEST_LIBS} LABELS unit)
set(MEDLEY_HF_DIR ${CMAKE_BINARY_DIR}/hf-smollm2)
add_test(NAME hf_smollm2_make
         COMMAND sh -c "m=\"\${MEDLEY_MODELS:-\${XDG_CACHE_HOME:-$HOME/.cache}/medley/models}/SmolLM2-135M-Instruct.Q4_1.gguf\"; [ -f \"$m\" ] || { echo 'SmolLM2 not fetched: nothing to make'; exit 0; }; [ -f \"$1/reference.json\" ] && [ \"$1/reference.json\" -nt \"$2\" ] && exit 0; rm -rf \"$1\" && ${MEDLEY_PYTHON} \"$2\" \"$m\" \"$1\""
         _ ${MEDLEY_HF_DIR} ${MEDLEY_FIXTURES}/hf/make_hf_smollm2.py)
set_tests_properties(hf_smollm2_make PROPERTIES LABELS e2e FIXTURES_SETUP hf_smollm2 TIMEOUT 300)
medley_test(test_hf_model SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_hf_model.c
            LIBS ${HF_TEST_LIBS} medley_sched LABELS e2e)
set_tests_properties(test_hf_model PROPERTIES FIXTURES_REQUIRED hf_smollm2
                     ENVIRONMENT "MEDLEY_HF_DIR=${MEDLEY_HF_DIR};MEDLEY_BIN=$<TARGET_FILE:medley>")
# `medley run` on the HF directory, its tokenizer.json read by engine/tokenizer/tokenizer_hf.c.
add_test(NAME hf_run_smollm2
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/hf_run_smollm2.py)
set_tests_properties(hf_run_smollm2 PROPERTIES LABELS e2e TIMEOUT 600 SKIP_RETURN_CODE 77
                     FIXTURES_REQUIRED hf_smollm2
                     ENVIRONMENT "MEDLEY_BIN=$<TARGET_FILE:medley>;MEDLEY_HF_DIR=${MEDLEY_HF_DIR}")
# its logits come from the CPU kernels: rerun at every SIMD level (tests/CMakeLists.txt, simd)
set_property(TEST test_hf_model APPEND PROPERTY LABELS simd)
# `medley models add` refuses what generate refuses, inspect / unknown-model / run -m on the
# committed transformers-made directories (tests/fixtures/hf/make_hf_tiny.py); seconds.
add_test(NAME hf_models_cli COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/hf_models_cli.py)
set_tests_properties(hf_models_cli PROPERTIES LABELS integration TIMEOUT 120
                     ENVIRONMENT "MEDLEY_BIN=$<TARGET_FILE:medley>")
