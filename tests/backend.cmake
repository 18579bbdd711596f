# The Vulkan backend (docs/gpu.md): device layer and kernels on lavapipe or a real GPU.
# The timeouts are wide because lavapipe's speed depends on the CPU: on a 2-vCPU Zen 3 guest
# (llvmpipe 256 bits) these suites ran 3-4x longer than on Zen 5 (test-model-parity-vulkan
# 693 s, test-gpu-session past its old 600 s limit; 2026-12-07).
tern_unit_test(test-vulkan ${CMAKE_SOURCE_DIR}/tests/unit/test-vulkan.c LABELS vulkan TIMEOUT 300)
# bench-vulkan (scripts/device-check.sh's per-kernel table) runs every kernel it times on
# small shapes: a smoke test, its figures not read.
tern_script_test(bench-vulkan-smoke $<TARGET_FILE:bench-vulkan> --quick LABELS vulkan no-asan TIMEOUT 120)
# Models on the Vulkan backend against the CPU path (kit models).
tern_unit_test(test-gpu-model ${CMAKE_SOURCE_DIR}/tests/unit/test-gpu-model.c ${CMAKE_SOURCE_DIR}/tests/unit/exact.c
  LABELS vulkan no-asan TIMEOUT 1800)
tern_unit_test(test-gpu-model-lite ${CMAKE_SOURCE_DIR}/tests/unit/test-gpu-model.c ${CMAKE_SOURCE_DIR}/tests/unit/exact.c
  ARGS lite LABELS vulkan TIMEOUT 1500)
# The kit's parity rules against llama.cpp's logits (test-model-parity) with the models'
# sessions on the device: every kit model in full, four of them with short prompts under
# the sanitizers.
tern_unit_test(test-model-parity-vulkan ${CMAKE_SOURCE_DIR}/tests/unit/test-model-parity.c
  ARGS vulkan LABELS vulkan no-asan TIMEOUT 1800)
tern_unit_test(test-model-parity-vulkan-lite ${CMAKE_SOURCE_DIR}/tests/unit/test-model-parity.c
  ARGS lite vulkan LABELS vulkan TIMEOUT 1500)
# tern run --device: the GPU's greedy ids equal the CPU's; auto, TERN_DEVICE, errors.
tern_script_test(gpu-cli ${CMAKE_SOURCE_DIR}/tests/e2e/gpu-cli.sh LABELS vulkan no-asan TIMEOUT 1200)
# its twin under the sanitizers: one model of each kind
tern_script_test(gpu-cli-lite ${CMAKE_SOURCE_DIR}/tests/e2e/gpu-cli.sh lite LABELS vulkan TIMEOUT 1200)
# Sessions on the Vulkan backend: resumed equals cold within the device (checkpoints, fork,
# export/import, cancel, batches) on tiny-qwen3 and tiny-qwen35, F32 and Q8_0.
tern_unit_test(test-gpu-session ${CMAKE_SOURCE_DIR}/tests/unit/test-gpu-session.c ${CMAKE_SOURCE_DIR}/tests/unit/exact.c
  LABELS vulkan no-asan TIMEOUT 1800)
# its twin under the sanitizers: the hybrids only (tiny-qwen35, tiny-qwen35moe)
tern_unit_test(test-gpu-session-lite ${CMAKE_SOURCE_DIR}/tests/unit/test-gpu-session.c ${CMAKE_SOURCE_DIR}/tests/unit/exact.c
  ARGS lite LABELS vulkan TIMEOUT 1500)
# The server with its sessions on the device (--device vulkan:0): multi-turn reuse, a hybrid
# checkpoint, cancellation, resumed == cold state hashes against a cold server on the device.
find_program(TERN_NODE node)
if(TERN_NODE)
  tern_script_test(server-device ${TERN_NODE} --test-reporter=spec ${CMAKE_SOURCE_DIR}/tests/e2e/device.test.mjs
                   TIMEOUT 600 LABELS vulkan e2e)
endif()
