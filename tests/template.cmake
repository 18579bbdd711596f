# Chat templates (src/template): feature and error unit tests, the conformance kit.
tern_unit_test(test-template ${CMAKE_SOURCE_DIR}/tests/unit/test-template.c)
tern_unit_test(test-template-conformance ${CMAKE_SOURCE_DIR}/tests/unit/test-template-conformance.c)
