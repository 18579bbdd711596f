tern_unit_test(test-planner ${CMAKE_SOURCE_DIR}/tests/unit/test-planner.c)
tern_unit_test(test-cache ${CMAKE_SOURCE_DIR}/tests/unit/test-cache.c TIMEOUT 900)
# The disk tier's format and index: restore == cold at every resume point, flipped bytes,
# truncation, renamed files, another layout, the budget, two processes on one directory.
tern_unit_test(test-disk ${CMAKE_SOURCE_DIR}/tests/unit/test-disk.c TIMEOUT 600)
# The disk writer thread: async write == cold state, a resume that waits for the write in
# flight, eviction and removal of a pinned entry, shutdown with writes queued, failing
# writes logged once. Label tsan: scripts/test.sh runs it under ThreadSanitizer too.
tern_unit_test(test-disk-writer ${CMAKE_SOURCE_DIR}/tests/unit/test-disk-writer.c TIMEOUT 900 LABELS tsan)
# Reuse through HTTP: tiers, identities, checkpoints, resumed == cold (node's fetch).
find_program(TERN_NODE node)
if(TERN_NODE)
  tern_script_test(reuse-e2e ${TERN_NODE} --test-reporter=spec ${CMAKE_SOURCE_DIR}/tests/e2e/reuse.test.mjs
                   TIMEOUT 900 LABELS e2e)
  # The same reuse tests with every server's sessions on a Vulkan device (lavapipe in CI):
  # the four architectures' tests (tiers, identities, rewrites, resumed == cold state
  # hashes), not the RSS and pool-budget ones, which are the CPU's; out of the sanitizer
  # run for its time (server-device runs the device server under the sanitizers).
  find_program(TERN_ENV env)
  tern_script_test(reuse-e2e-vulkan ${TERN_ENV} TERN_TEST_DEVICE=vulkan:0 ${TERN_NODE} --test-reporter=spec
                   --test-name-pattern=^qwen ${CMAKE_SOURCE_DIR}/tests/e2e/reuse.test.mjs
                   TIMEOUT 1800 LABELS e2e vulkan no-asan)
  # The disk tier (--cache-dir): restarts, corrupt and foreign files, kill -9, budget,
  # a full tmpfs (skipped where mount is not permitted), the switches, a stream that keeps
  # decoding while the writer thread writes another conversation.
  tern_script_test(disk-e2e ${TERN_NODE} --test-reporter=spec ${CMAKE_SOURCE_DIR}/tests/e2e/disk.test.mjs
                   TIMEOUT 900 LABELS e2e)
  # nginx (deploy/nginx.conf) in front of two replicas sharing one --cache-dir; skipped
  # (77) without nginx
  tern_script_test(disk-replicas ${TERN_NODE} --test-reporter=spec ${CMAKE_SOURCE_DIR}/tests/e2e/disk-replicas.test.mjs
                   TIMEOUT 600 LABELS e2e)
endif()
