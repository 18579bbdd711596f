tern_unit_test(test-server-request ${CMAKE_SOURCE_DIR}/tests/unit/test-server-request.c)
tern_unit_test(test-server-reply ${CMAKE_SOURCE_DIR}/tests/unit/test-server-reply.c)
tern_unit_test(test-server-respond ${CMAKE_SOURCE_DIR}/tests/unit/test-server-respond.c)
tern_unit_test(test-server-chat ${CMAKE_SOURCE_DIR}/tests/unit/test-server-chat.c)
tern_unit_test(test-server-predict ${CMAKE_SOURCE_DIR}/tests/unit/test-server-predict.c)
# tern serve under a service manager: sd_notify READY/STOPPING, exit 0, a second signal
tern_unit_test(test-serve-signals ${CMAKE_SOURCE_DIR}/tests/unit/test-serve-signals.c TIMEOUT 300)
# the step scheduler driven directly: fairness, batched equals solo, cancellation
tern_unit_test(test-engine ${CMAKE_SOURCE_DIR}/tests/unit/test-engine.c TIMEOUT 300)
# Label tsan: the tests scripts/test.sh also runs in a ThreadSanitizer build (build-tsan/,
# TERN_TSAN=ON): the HTTP layer's threads, the queue, the worker, cancellation, predictive
# priming after each chat. Kept small so that CI stays within its time (the TSan stage
# builds only tern and test-server-http).
tern_unit_test(test-server-http ${CMAKE_SOURCE_DIR}/tests/unit/test-server-http.c TIMEOUT 120 LABELS tsan)
# speculative decoding: greedy identical to plain on every kit model, the sampling rule
tern_unit_test(test-spec ${CMAKE_SOURCE_DIR}/tests/unit/test-spec.c TIMEOUT 600)
# MTP drafting (Qwen3.5 nextn) on generated models: load, head chunk invariance, greedy identical
tern_unit_test(test-spec-mtp ${CMAKE_SOURCE_DIR}/tests/unit/test-mtp.c TIMEOUT 600)
# End-to-end: `tern serve` on a generated model driven over HTTP from node (fetch), by
# the official openai SDK (third_party/node_modules, installed by scripts/deps.sh), and
# with the real agent request bodies of ../shared/bench; `tern chat` from stdin.
find_program(TERN_NODE node)
if(TERN_NODE)
  tern_script_test(server-e2e ${TERN_NODE} --test-reporter=spec ${CMAKE_SOURCE_DIR}/tests/e2e/server.test.mjs
                   TIMEOUT 600 LABELS e2e tsan)
  # The same with the server's sessions on a Vulkan device (TERN_TEST_DEVICE, the node
  # harness; skipped without one unless TERN_REQUIRE_VULKAN=1).
  find_program(TERN_ENV env)
  tern_script_test(server-e2e-vulkan ${TERN_ENV} TERN_TEST_DEVICE=vulkan:0 ${TERN_NODE} --test-reporter=spec
                   ${CMAKE_SOURCE_DIR}/tests/e2e/server.test.mjs TIMEOUT 600 LABELS e2e vulkan)
  # predictive priming over HTTP: rewrite turns after idle time, mid-prediction
  # requests, wrong predictions, the switches (generated qwen35 and qwen3 models)
  tern_script_test(server-predict ${TERN_NODE} --test-reporter=spec ${CMAKE_SOURCE_DIR}/tests/e2e/predict.test.mjs
                   TIMEOUT 600 LABELS e2e)
  # per-request limits: --max-tokens, the context budget, sampler-refused parameters
  tern_script_test(server-limits ${TERN_NODE} --test-reporter=spec ${CMAKE_SOURCE_DIR}/tests/e2e/limits.test.mjs
                   TIMEOUT 300 LABELS e2e tsan)
  # memory admission measured as resident memory: 4 full-context requests within --cache-ram
  # (no-asan: the sanitizer's shadow memory and quarantine are not the server's)
  tern_script_test(server-memory ${TERN_NODE} --test-reporter=spec ${CMAKE_SOURCE_DIR}/tests/e2e/memory.test.mjs
                   TIMEOUT 300 LABELS e2e no-asan)
  # issue 37's edges: raw framing (leading zeros, 64-bit overflow, huge chunk sizes, NUL,
  # no Host), duplicate keys, logit_bias, more messages than the context, SIGHUP
  tern_script_test(server-edges ${TERN_NODE} --test-reporter=spec ${CMAKE_SOURCE_DIR}/tests/e2e/edges.test.mjs
                   TIMEOUT 300 LABELS e2e)
  # speculative decoding: the same answers and states as without it
  tern_script_test(server-spec ${TERN_NODE} --test-reporter=spec ${CMAKE_SOURCE_DIR}/tests/e2e/spec.test.mjs
                   TIMEOUT 600 LABELS e2e)
  # continuous batching: 8 concurrent conversations equal their solo runs, bit for bit
  # (255 s under ThreadSanitizer on the 2-vCPU machine alone, more beside the other tsan tests)
  tern_script_test(server-batch ${TERN_NODE} --test-reporter=spec ${CMAKE_SOURCE_DIR}/tests/e2e/batch.test.mjs
                   TIMEOUT 1200 LABELS e2e tsan)
  tern_script_test(server-openai-sdk ${TERN_NODE} --test-reporter=spec
                   ${CMAKE_SOURCE_DIR}/tests/clients/openai-sdk.test.mjs TIMEOUT 600 LABELS e2e)
  # the Anthropic Messages API by @anthropic-ai/sdk and the Responses API by openai's
  # responses: every event type, forced tool calls, round trips, lanes, resumed == cold
  # Claude Code and Codex, unmodified, two turns each: exit 0, the second resumes (the
  # clients' 12-16K-token prompts: too slow under ASan)
  tern_script_test(agents-e2e ${TERN_NODE} --test-reporter=spec ${CMAKE_SOURCE_DIR}/tests/e2e/agents.test.mjs
                   TIMEOUT 900 LABELS e2e no-asan)
  tern_script_test(server-protocols ${TERN_NODE} --test-reporter=spec
                   ${CMAKE_SOURCE_DIR}/tests/clients/protocols.test.mjs TIMEOUT 600 LABELS e2e)
  # harmony (gpt-oss): the kit's tiny gpt-oss under its real template, three doors
  tern_script_test(server-harmony ${TERN_NODE} --test-reporter=spec
                   ${CMAKE_SOURCE_DIR}/tests/clients/harmony.test.mjs TIMEOUT 300 LABELS e2e)
  # gpt-oss's real vocabulary (o200k_harmony from gpt-tokenizer): ids equal the package's,
  # and the special tokens end messages and turns as harmony says
  tern_script_test(server-harmony-vocab ${TERN_NODE} --test-reporter=spec
                   ${CMAKE_SOURCE_DIR}/tests/clients/harmony-vocab.test.mjs TIMEOUT 300 LABELS e2e)
  # Priming the bodies that fit is slow under ASan; the two tests above exercise the
  # same request path (and LeakSanitizer checks the server's exit) under ASan.
  tern_script_test(server-bench-bodies ${TERN_NODE} --test-reporter=spec
                   ${CMAKE_SOURCE_DIR}/tests/clients/bench-bodies.test.mjs TIMEOUT 900 LABELS e2e no-asan)
endif()
tern_script_test(cli-chat ${CMAKE_SOURCE_DIR}/tests/e2e/cli-chat.sh TIMEOUT 120 LABELS e2e)
# cmake --install into a temporary prefix, a binary outside the source tree: the demo
# model still starts (makes the demo model three times: too slow under ASan)
tern_script_test(install-demo ${CMAKE_SOURCE_DIR}/tests/e2e/install.sh TIMEOUT 300 LABELS e2e no-asan)
# tern run / tern chat --spec: the same output and state as --spec off, drafts reported
tern_script_test(spec-cli ${CMAKE_SOURCE_DIR}/tests/e2e/spec-cli.sh TIMEOUT 300 LABELS e2e)
# MTP drafting against llama.cpp's draft-mtp (the kit's reference): the same ids, drafts and accepts
tern_script_test(spec-mtp-parity ${CMAKE_SOURCE_DIR}/tests/e2e/mtp-parity.sh TIMEOUT 300 LABELS e2e)
if(TERN_NODE)
  # the README's first command (makes a 50 MB model once: too slow under ASan)
  tern_script_test(server-demo ${TERN_NODE} --test-reporter=spec ${CMAKE_SOURCE_DIR}/tests/e2e/demo.test.mjs
                   TIMEOUT 300 LABELS e2e no-asan)
endif()
if(TERN_NODE)
  # structured output (issue 16): schemas x seeds validated by ajv, tool_choice required
  # with the qwen-code request through the openai SDK, grammar errors (src/grammar)
  tern_script_test(server-structured ${TERN_NODE} --test-reporter=spec
                   ${CMAKE_SOURCE_DIR}/tests/clients/structured.test.mjs TIMEOUT 900 LABELS e2e)
endif()
