# replay: the harness (src/replay/) and `tern replay`.
tern_unit_test(test-replay ${CMAKE_SOURCE_DIR}/tests/unit/test-replay.c)
tern_unit_test(test-replay-shared ${CMAKE_SOURCE_DIR}/tests/unit/test-replay-shared.c)
tern_unit_test(test-replay-http ${CMAKE_SOURCE_DIR}/tests/unit/test-replay-http.c)
tern_unit_test(test-replay-e2e ${CMAKE_SOURCE_DIR}/tests/unit/test-replay-e2e.c ${CMAKE_SOURCE_DIR}/tests/unit/test-replay-mock.c TIMEOUT 300)
tern_script_test(replay-serve ${CMAKE_SOURCE_DIR}/tests/e2e/replay-serve.sh TIMEOUT 600)
