tern_unit_test(test-mkmodel ${CMAKE_SOURCE_DIR}/tests/unit/test-mkmodel.c TIMEOUT 300)
tern_unit_test(test-mkmodel-shared ${CMAKE_SOURCE_DIR}/tests/unit/test-mkmodel.c ARGS shared TIMEOUT 300)
