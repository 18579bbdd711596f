# qwen35: the Gated DeltaNet core and the hybrid architecture (docs/qwen35.md).
tern_unit_test(test-deltanet ${CMAKE_SOURCE_DIR}/tests/unit/test-deltanet.c TIMEOUT 120)
# The full parity / exactness / state suite on the shared tiny models, and a lighter
# run of the same checks (fewer prompts, shorter prompts) that ASan builds run too.
tern_unit_test(test-qwen35 ${CMAKE_SOURCE_DIR}/tests/unit/test-qwen35.c ${CMAKE_SOURCE_DIR}/tests/unit/logits-check.c
  LABELS no-asan TIMEOUT 900)
tern_unit_test(test-qwen35-light ${CMAKE_SOURCE_DIR}/tests/unit/test-qwen35.c
  ${CMAKE_SOURCE_DIR}/tests/unit/logits-check.c ARGS --light TIMEOUT 600)
