# The Vulkan backend (docs/gpu.md): device layer and kernels on lavapipe or a real GPU.
tern_unit_test(test-vulkan ${CMAKE_SOURCE_DIR}/tests/unit/test-vulkan.c LABELS vulkan TIMEOUT 300)
# Models on the Vulkan backend against the CPU path (kit models).
tern_unit_test(test-gpu-model ${CMAKE_SOURCE_DIR}/tests/unit/test-gpu-model.c ${CMAKE_SOURCE_DIR}/tests/unit/exact.c
  LABELS vulkan no-asan TIMEOUT 600)
tern_unit_test(test-gpu-model-lite ${CMAKE_SOURCE_DIR}/tests/unit/test-gpu-model.c ${CMAKE_SOURCE_DIR}/tests/unit/exact.c
  ARGS lite LABELS vulkan TIMEOUT 600)
