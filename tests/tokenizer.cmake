# Tokenizer tests. unit (also under ASan+UBSan): test_tok_synth (synthetic GGUF vocabularies
# for every tokenizer family, streaming, threads), test_tok_hf (tokenizer.json: small files,
# hostile ones, the chat template choice), test_tok_wordpiece (BERT's WordPiece rules) and
# test_chat (template rendering). e2e
# (need SmolLM2; their model-free parts still run without it): test_tok_smollm (llama.cpp's
# ids on the fixture corpus in tests/fixtures/tokenizer/ for SmolLM2, four relabelled BPE
# pre-tokenizers and a SentencePiece vocabulary; Jinja2's chat prompts) and test_tok_cli
# (`medley tokenize`).
set(TOK_TEST_LIBS medley_engine PkgConfig::JANSSON Threads::Threads)
medley_test(test_tok_smollm SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_tok_smollm.c
            LIBS ${TOK_TEST_LIBS} LABELS e2e)
medley_test(test_tok_synth SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_tok_synth.c
            LIBS ${TOK_TEST_LIBS} LABELS unit)
medley_test(test_tok_hf SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_tok_hf.c
            LIBS ${TOK_TEST_LIBS} LABELS unit)
# WordPiece (BERT) rules on a hand-written vocabulary and hostile files; seconds.
medley_test(test_tok_wordpiece SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_tok_wordpiece.c
            LIBS ${TOK_TEST_LIBS} LABELS unit)
medley_test(test_chat SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_chat.c
            LIBS ${TOK_TEST_LIBS} LABELS unit)
medley_test(test_tok_cli SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_tok_cli.c LABELS e2e)
# tokenizer.json: `medley tokenize` on directories built by
# tests/fixtures/tokenizer/make_hf_tokenizer.py equals HF's `tokenizers` (requirements-test.txt)
# on the 312 fixture texts; the SmolLM2 variants need the model, the SentencePiece ones not.
if(MEDLEY_PYTHON)
  add_test(NAME tok_hf_match COMMAND ${MEDLEY_PYTHON}
           ${CMAKE_CURRENT_SOURCE_DIR}/integration/tok_hf_match.py $<TARGET_FILE:medley>)
  set_tests_properties(tok_hf_match PROPERTIES LABELS e2e TIMEOUT 300)
endif()
# BERT WordPiece: `medley tokenize` equals `tokenizers` with all-MiniLM-L6-v2's tokenizer.json
# (uncased) and two variants (cased, lowercase keeping accents) on the fixture corpus, 10,000
# generated multilingual lines and every code point; needs `medley models fetch
# all-minilm-l6-v2` (skipped otherwise); ~12 s of CPU.
if(MEDLEY_PYTHON)
  add_test(NAME tok_wordpiece_match COMMAND ${MEDLEY_PYTHON}
           ${CMAKE_CURRENT_SOURCE_DIR}/integration/tok_wordpiece_match.py $<TARGET_FILE:medley>)
  set_tests_properties(tok_wordpiece_match PROPERTIES LABELS e2e TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
# Hostile tokenizer.json files (mutated documents, flipped and truncated bytes), label fuzz:
# scripts/test.sh runs it under ASan+UBSan.
medley_test(test_tok_hf_fuzz SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/test_tok_hf_fuzz.c
            LIBS ${TOK_TEST_LIBS} LABELS fuzz)
# libFuzzer target: clang only, not a ctest (run it by hand, see tests/fuzz/fuzz_tok_hf.c).
if(CMAKE_C_COMPILER_ID MATCHES "Clang")
  file(GLOB TOK_SRCS ${CMAKE_SOURCE_DIR}/engine/tokenizer/*.c)
  foreach(f gguf.c hf_model.c hf_config.c safetensors.c quant.c)
    list(APPEND TOK_SRCS ${CMAKE_SOURCE_DIR}/engine/weights/${f})
  endforeach()
  add_executable(fuzz_tok_hf ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_tok_hf.c ${TOK_SRCS})
  target_compile_options(fuzz_tok_hf PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_tok_hf PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_tok_hf PRIVATE medley_common PkgConfig::JANSSON PkgConfig::PCRE2
                        PkgConfig::UTF8PROC m)
endif()
