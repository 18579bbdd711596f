# qwen35: the Gated DeltaNet core and the hybrid architecture (docs/qwen35.md). Parity
# with llama.cpp on the tiny-qwen35 models is part of test-model-parity.
tern_unit_test(test-deltanet ${CMAKE_SOURCE_DIR}/tests/unit/test-deltanet.c TIMEOUT 120)
# Exactness / state / load checks on the shared and generated models, and a lighter run
# of the same checks (shorter prompts) that ASan builds run too.
tern_unit_test(test-qwen35 ${CMAKE_SOURCE_DIR}/tests/unit/test-qwen35.c ${CMAKE_SOURCE_DIR}/tests/unit/exact.c LABELS no-asan TIMEOUT 900)
tern_unit_test(test-qwen35-light ${CMAKE_SOURCE_DIR}/tests/unit/test-qwen35.c ${CMAKE_SOURCE_DIR}/tests/unit/exact.c ARGS --light TIMEOUT 600)
tern_script_test(qwen35-cli ${CMAKE_SOURCE_DIR}/tests/e2e/qwen35-cli.sh TIMEOUT 300)
