tern_unit_test(test-gguf ${CMAKE_SOURCE_DIR}/tests/unit/test-gguf.c TIMEOUT 120)
tern_unit_test(test-gguf-shared ${CMAKE_SOURCE_DIR}/tests/unit/test-gguf.c ARGS shared TIMEOUT 120)
