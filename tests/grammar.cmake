# Grammar tests (engine/grammar, docs/structured.md). unit: test_grammar (each front end and
# keyword, masks against brute force on small vocabularies, random walks that sample only
# masked tokens). fuzz: test_grammar_fuzz (hostile schemas, regexes and grammars: bounded
# time and memory, never a crash; scripts/test.sh runs it under ASan+UBSan). integration:
# grammar_conformance (the JSON-Schema-Test-Suite draft2020-12 files from the `jsonschema`
# sdist on PyPI, fetched at test time; skipped when offline) driven through gr_check, and
# grammar_real_schemas (240 extraction-style schemas made from a fixed seed, each with an
# instance that must be accepted; then the check-jsonschema wheel's vendored schemas, which
# must compile or be refused naming a keyword).
set(GRAMMAR_TEST_LIBS medley_grammar PkgConfig::JANSSON Threads::Threads)
medley_test(test_grammar SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_grammar.c
            LIBS ${GRAMMAR_TEST_LIBS} LABELS unit)
medley_test(test_grammar_fuzz SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/test_grammar_fuzz.c
            LIBS ${GRAMMAR_TEST_LIBS} LABELS fuzz)
add_executable(gr_check ${CMAKE_CURRENT_SOURCE_DIR}/grammar/gr_check.c)
target_link_libraries(gr_check PRIVATE medley_grammar PkgConfig::JANSSON medley_common)
if(MEDLEY_PYTHON)
  add_test(NAME grammar_conformance COMMAND ${MEDLEY_PYTHON}
           ${CMAKE_CURRENT_SOURCE_DIR}/integration/grammar_conformance.py $<TARGET_FILE:gr_check>)
  set_tests_properties(grammar_conformance PROPERTIES LABELS integration TIMEOUT 600
                       SKIP_RETURN_CODE 77)
  add_test(NAME grammar_real_schemas COMMAND ${MEDLEY_PYTHON}
           ${CMAKE_CURRENT_SOURCE_DIR}/integration/grammar_real_schemas.py $<TARGET_FILE:gr_check>)
  set_tests_properties(grammar_real_schemas PROPERTIES LABELS integration TIMEOUT 600
                       SKIP_RETURN_CODE 77)
endif()
