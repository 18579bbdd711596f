# engine: thread pool, ops, sampling, models and sessions (docs/engine.md).
tern_unit_test(test-threadpool ${CMAKE_SOURCE_DIR}/tests/unit/test-threadpool.c)
tern_unit_test(test-ops ${CMAKE_SOURCE_DIR}/tests/unit/test-ops.c)
tern_unit_test(test-sample ${CMAKE_SOURCE_DIR}/tests/unit/test-sample.c)
# The full exactness matrix and parity run are too slow under ASan; their "lite"
# variants (same assertions, fewer configurations) run everywhere.
tern_unit_test(test-model ${CMAKE_SOURCE_DIR}/tests/unit/test-model.c
  ${CMAKE_SOURCE_DIR}/tests/unit/test-model-gen.c LABELS no-asan TIMEOUT 600)
tern_unit_test(test-model-lite ${CMAKE_SOURCE_DIR}/tests/unit/test-model.c
  ${CMAKE_SOURCE_DIR}/tests/unit/test-model-gen.c ARGS lite TIMEOUT 600)
tern_unit_test(test-model-parity ${CMAKE_SOURCE_DIR}/tests/unit/test-model-parity.c LABELS no-asan TIMEOUT 600)
tern_unit_test(test-model-parity-lite ${CMAKE_SOURCE_DIR}/tests/unit/test-model-parity.c ARGS lite TIMEOUT 600)
tern_script_test(model-cli ${CMAKE_SOURCE_DIR}/tests/e2e/model-cli.sh TIMEOUT 300)
# Mixture-of-experts models (qwen3moe, qwen35moe, gpt-oss): routing, exactness, resume, load errors.
tern_unit_test(test-moe ${CMAKE_SOURCE_DIR}/tests/unit/test-moe.c ${CMAKE_SOURCE_DIR}/tests/unit/exact.c
  LABELS no-asan TIMEOUT 900)
tern_unit_test(test-moe-light ${CMAKE_SOURCE_DIR}/tests/unit/test-moe.c ${CMAKE_SOURCE_DIR}/tests/unit/exact.c
  ARGS --light TIMEOUT 600)
# Continuous batching: a sequence batched with others equals itself alone, bit for bit.
tern_unit_test(test-batch ${CMAKE_SOURCE_DIR}/tests/unit/test-batch.c ${CMAKE_SOURCE_DIR}/tests/unit/exact.c
  LABELS no-asan TIMEOUT 600)
tern_unit_test(test-batch-light ${CMAKE_SOURCE_DIR}/tests/unit/test-batch.c ${CMAKE_SOURCE_DIR}/tests/unit/exact.c
  ARGS --light TIMEOUT 600)
