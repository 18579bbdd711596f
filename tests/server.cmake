tern_unit_test(test-server-request ${CMAKE_SOURCE_DIR}/tests/unit/test-server-request.c)
tern_unit_test(test-server-reply ${CMAKE_SOURCE_DIR}/tests/unit/test-server-reply.c)
tern_unit_test(test-server-respond ${CMAKE_SOURCE_DIR}/tests/unit/test-server-respond.c)
tern_unit_test(test-server-http ${CMAKE_SOURCE_DIR}/tests/unit/test-server-http.c TIMEOUT 120)
