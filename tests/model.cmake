# engine: thread pool, ops, sampling, models and sessions (docs/engine.md).
tern_unit_test(test-threadpool ${CMAKE_SOURCE_DIR}/tests/unit/test-threadpool.c)
tern_unit_test(test-ops ${CMAKE_SOURCE_DIR}/tests/unit/test-ops.c)
tern_unit_test(test-sample ${CMAKE_SOURCE_DIR}/tests/unit/test-sample.c)
tern_unit_test(test-model ${CMAKE_SOURCE_DIR}/tests/unit/test-model.c
  ${CMAKE_SOURCE_DIR}/tests/unit/test-model-gen.c TIMEOUT 300)
tern_unit_test(test-model-parity ${CMAKE_SOURCE_DIR}/tests/unit/test-model-parity.c TIMEOUT 300)
