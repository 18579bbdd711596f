# Grammars (src/grammar): the GBNF engine and token masks, JSON Schema -> grammar.
tern_unit_test(test-grammar ${CMAKE_SOURCE_DIR}/tests/unit/test-grammar.c)
tern_unit_test(test-grammar-schema ${CMAKE_SOURCE_DIR}/tests/unit/test-grammar-schema.c)
tern_unit_test(test-server-constrain ${CMAKE_SOURCE_DIR}/tests/unit/test-server-constrain.c)
