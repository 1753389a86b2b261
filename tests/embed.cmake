# Embeddings (docs/embeddings.md): the CPU encoder ops against double-precision formulas, and
# encoder models (random BERTs written as sentence-transformers directories by the test) against
# a numpy float64 forward pass, every pooling mode, hostile checkpoints; seconds.
medley_test(test_enc_ops SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_enc_ops.c
            LIBS medley_kernels LABELS unit)
# the packed products of encoder steps (kernels/cpu/enc_gemm.c) against their scalar reference
medley_test(test_enc_gemm SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_enc_gemm.c
            LIBS medley_kernels LABELS unit)
add_test(NAME embed_reference
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/embed_reference.py)
set_tests_properties(embed_reference PROPERTIES LABELS integration TIMEOUT 120
                     ENVIRONMENT "MEDLEY_BIN=$<TARGET_FILE:medley>")
# the encoder's results come from the CPU kernels: rerun at every SIMD level
set_property(TEST embed_reference APPEND PROPERTY LABELS simd)
# /v1/embeddings lines through `medley run` and a worker serving an embedding and a generation
# model at once: OpenAI's body, float = base64, the numpy reference, hostile lines; seconds.
add_test(NAME embed_lines
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/embed_lines.py)
set_tests_properties(embed_lines PROPERTIES LABELS integration TIMEOUT 180
                     ENVIRONMENT "MEDLEY_BIN=$<TARGET_FILE:medley>")
# Embedding models in the fleet: one worker mixing an embedding backlog with generation lines
# (the chat batch is not starved; polls time-bounded), cost shares and /metrics by model on
# embedding answers, `medley profile` of an encoder and `medley plan` placing it; seconds.
add_test(NAME embed_fleet
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/embed_fleet.py)
set_tests_properties(embed_fleet PROPERTIES LABELS integration TIMEOUT 300
                     ENVIRONMENT "MEDLEY_BIN=$<TARGET_FILE:medley>")
# bench/embeddings/bulk.py scaled down (400 lines on a small random BERT): `medley run` and
# `medley submit` + two workers, every custom_id once; seconds. The full run is the bench's.
add_test(NAME embed_bulk
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_SOURCE_DIR}/bench/embeddings/bulk.py
                 --medley $<TARGET_FILE:medley> --synthetic --synthetic-shape 32,4,2,64,500
                 --lines 400 --min-tokens 4 --max-tokens 40)
set_tests_properties(embed_bulk PROPERTIES LABELS integration TIMEOUT 120)
