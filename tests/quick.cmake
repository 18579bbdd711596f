# The 5-minute loop (./scripts/test.sh --quick): a smoke of every layer — the parsers'
# fuzz corpora, gguf, kernels and weight types, the model's light exactness and parity
# twins, tokenizer, templates, grammars, cache and disk tier, the server's units, its
# e2e and protocol tests, Vulkan on lavapipe — each of them seconds, none of the slow
# matrices (those run in the full command). A test joins by name here.
set(TERN_QUICK_TESTS
  fuzz-replay-disk fuzz-replay-gbnf fuzz-replay-gguf fuzz-replay-replay fuzz-replay-request
  fuzz-replay-schema fuzz-replay-template fuzz-replay-tokenizer
  test-util test-threadpool test-gguf test-gguf-shared test-quant test-quant-shared test-kernels test-ops
  test-sample test-mkmodel test-model-lite test-model-parity-lite test-deltanet test-vulkan
  test-tokenizer test-template test-grammar test-grammar-schema
  test-planner test-cache test-disk test-disk-writer test-replay
  test-server-request test-server-reply test-server-respond test-server-chat test-server-constrain
  test-serve-signals server-e2e server-protocols server-harmony server-edges cli-usage test-cli-opts)
foreach(t ${TERN_QUICK_TESTS})
  if(TEST ${t})
    set_property(TEST ${t} APPEND PROPERTY LABELS quick)
  elseif(TERN_NODE OR NOT t MATCHES "^server-|^cli-")
    message(WARNING "tests/quick.cmake names ${t}, which is not a test")
  endif()
endforeach()

# The lite twins: the same assertions as a full test on fewer configurations, there for
# the sanitizer build, where the full ones are too slow (label no-asan). Beside their full
# tests in the normal build they add nothing, so scripts/test.sh runs them only under
# ASan+UBSan (label twin; the quick loop still takes the two it names above).
set(TERN_TWIN_TESTS test-model-lite test-model-parity-lite test-moe-light test-batch-light test-qwen35-light
  test-gpu-model-lite test-model-parity-vulkan-lite test-gpu-session-lite gpu-cli-lite)
foreach(t ${TERN_TWIN_TESTS})
  set_property(TEST ${t} APPEND PROPERTY LABELS twin)
endforeach()
