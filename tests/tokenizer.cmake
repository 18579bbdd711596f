# Tokenizer: unit tests, and conformance with llama.cpp on the shared kit's vocabularies.
tern_unit_test(test-tokenizer-conformance ${CMAKE_SOURCE_DIR}/tests/unit/test-tokenizer-conformance.c TIMEOUT 300)
tern_unit_test(test-tokenizer ${CMAKE_SOURCE_DIR}/tests/unit/test-tokenizer.c TIMEOUT 300)
