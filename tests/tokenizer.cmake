# Tokenizer: unit tests, and conformance with llama.cpp on the shared kit's vocabularies.
tern_unit_test(test-tokenizer-conformance ${CMAKE_SOURCE_DIR}/tests/unit/test-tokenizer-conformance.c TIMEOUT 300)
tern_unit_test(test-tokenizer ${CMAKE_SOURCE_DIR}/tests/unit/test-tokenizer.c TIMEOUT 300)
tern_unit_test(test-tokenizer-convert ${CMAKE_SOURCE_DIR}/tests/unit/test-tokenizer-convert.c TIMEOUT 300)
tern_script_test(tokenizer-cli ${CMAKE_SOURCE_DIR}/tests/e2e/tokenizer-cli.sh)
