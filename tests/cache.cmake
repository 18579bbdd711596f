tern_unit_test(test-planner ${CMAKE_SOURCE_DIR}/tests/unit/test-planner.c)
tern_unit_test(test-cache ${CMAKE_SOURCE_DIR}/tests/unit/test-cache.c TIMEOUT 900)
