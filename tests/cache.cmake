tern_unit_test(test-planner ${CMAKE_SOURCE_DIR}/tests/unit/test-planner.c)
