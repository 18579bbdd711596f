tern_unit_test(test-util ${CMAKE_SOURCE_DIR}/tests/unit/test-util.c)
tern_script_test(cli-usage ${CMAKE_SOURCE_DIR}/tests/e2e/cli-usage.sh)
