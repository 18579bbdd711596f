# qwen35: the Gated DeltaNet core and the hybrid architecture (docs/qwen35.md).
tern_unit_test(test-deltanet ${CMAKE_SOURCE_DIR}/tests/unit/test-deltanet.c TIMEOUT 120)
tern_unit_test(test-qwen35 ${CMAKE_SOURCE_DIR}/tests/unit/test-qwen35.c ${CMAKE_SOURCE_DIR}/tests/unit/logits-check.c
  TIMEOUT 600)
