# Tokenizer tests. unit (also under ASan+UBSan): test_tok_synth (synthetic GGUF vocabularies
# for every tokenizer family, streaming, threads), test_tok_hf (tokenizer.json: small files,
# hostile ones, the chat template choice) and test_chat (template rendering). e2e
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
