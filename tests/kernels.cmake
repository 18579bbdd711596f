tern_unit_test(test-quant ${CMAKE_SOURCE_DIR}/tests/unit/test-quant.c)
# The same file's tests that need the shared kit (ggml's dequantized rows, the models).
tern_unit_test(test-quant-shared ${CMAKE_SOURCE_DIR}/tests/unit/test-quant.c ARGS shared)
tern_unit_test(test-kernels ${CMAKE_SOURCE_DIR}/tests/unit/test-kernels.c)
# `tern bench memory` runs (tiny buffer, one pass) and rejects bad options; its figures
# are never checked (timings are not a pass condition).
tern_script_test(bench-memory-cli ${CMAKE_SOURCE_DIR}/tests/e2e/bench-memory.sh)
