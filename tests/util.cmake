tern_unit_test(test-util ${CMAKE_SOURCE_DIR}/tests/unit/test-util.c)
tern_script_test(cli-usage ${CMAKE_SOURCE_DIR}/tests/e2e/cli-usage.sh)
# the CLI's option table: its parser is built into the test with it
tern_unit_test(test-cli-opts ${CMAKE_SOURCE_DIR}/tests/unit/test-cli-opts.c ${CMAKE_SOURCE_DIR}/src/cli/opts.c)
