# Tokenizer tests: synthetic GGUF vocabularies for every tokenizer family and chat templates
# (unit, also under ASan+UBSan), and SmolLM2's real vocabulary against llama.cpp's ids on the
# fixture corpus in tests/fixtures/tokenizer/ (e2e: needs the model; skipped without it).
set(TOK_TEST_LIBS medley_engine PkgConfig::JANSSON Threads::Threads)
medley_test(test_tok_smollm SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_tok_smollm.c
            LIBS ${TOK_TEST_LIBS} LABELS e2e)
medley_test(test_tok_synth SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_tok_synth.c
            LIBS ${TOK_TEST_LIBS} LABELS unit)
medley_test(test_chat SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_chat.c
            LIBS ${TOK_TEST_LIBS} LABELS unit)
medley_test(test_tok_cli SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_tok_cli.c LABELS e2e)
