tern_unit_test(test-quant ${CMAKE_SOURCE_DIR}/tests/unit/test-quant.c)
tern_unit_test(test-kernels ${CMAKE_SOURCE_DIR}/tests/unit/test-kernels.c)
