# The Vulkan backend (docs/gpu.md): device layer and kernels on lavapipe or a real GPU.
tern_unit_test(test-vulkan ${CMAKE_SOURCE_DIR}/tests/unit/test-vulkan.c LABELS vulkan TIMEOUT 300)
