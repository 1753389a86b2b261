# docs/: checks that the documents are true of the tree.
#   check_architecture  docs/architecture.md lists every product source file, each folder's
#                       stated includes and links match the #include lines and CMake, and the
#                       folder include graph has no cycle (tests/docs/check_architecture.py)
if(MEDLEY_PYTHON)
  add_test(NAME check_architecture
           COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/docs/check_architecture.py
                   ${CMAKE_SOURCE_DIR})
  set_tests_properties(check_architecture PROPERTIES LABELS unit TIMEOUT 30)
endif()
