#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs the whole suite twice —
# a normal build (build/) and an ASan+UBSan build (build-asan/) — then the server's
# threaded tests (label tsan) in a ThreadSanitizer build (build-tsan/).
#
# --quick: the 5-minute loop for developers — one build (build/), no dependency step, the
# tests labelled quick (tests/quick.cmake: a smoke of every layer). CI runs the full command.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1
[ $quick = 1 ] || ./scripts/deps.sh --agents
jobs=$(nproc)

# The ten slowest tests of a ctest log (where the suite's time goes).
slowest() {
  echo "ten slowest tests ($1):"
  grep -E 'Test +#[0-9]+: ' "$1" | sed -E 's/.*Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec$/\2 s  \1/' |
    sort -rn | head -10 | sed 's/^/  /' || true
}
# the agent clients are installed: their e2e test must run, not skip
export TERN_REQUIRE_AGENTS=1
# deps.sh installs the Vulkan headers, glslc and lavapipe: the Vulkan tests must run, not skip.
export TERN_REQUIRE_VULKAN=1

# The shared data kit: $TERN_SHARED_DIR, else ../shared beside the checkout. Where it is
# present its conformance tests must run: a missing file fails them instead of skipping
# them (TERN_REQUIRE_SHARED=1), and the path is the one the tests read at run time.
if [ -n "${TERN_SHARED_DIR:-}" ] && [ ! -d "$TERN_SHARED_DIR" ]; then
  echo "TERN_SHARED_DIR=$TERN_SHARED_DIR is not a directory" >&2
  exit 1
fi
shared=${TERN_SHARED_DIR:-$(cd .. && pwd)/shared}
# the test hooks (src/util/testhook.h) exist only in the test suite's builds
cfg=(-DTERN_TEST_HOOKS=ON)
if [ -d "$shared" ]; then
  export TERN_SHARED_DIR=$(cd "$shared" && pwd) TERN_REQUIRE_SHARED=1
  cfg+=(-DTERN_SHARED_DIR="$TERN_SHARED_DIR")
  echo "== shared kit: $TERN_SHARED_DIR (required: a missing file fails its test) =="
else
  echo "== no shared kit at $shared: its conformance tests are skipped =="
fi

echo "== build (RelWithDebInfo) =="
./scripts/build.sh build "${cfg[@]}"
if [ $quick = 1 ]; then
  echo "== quick tests (label quick) =="
  (cd build && ctest --output-on-failure -j"$jobs" -L quick | tee ctest-quick.log)
  slowest build/ctest-quick.log
  exit 0
fi
echo "== tests =="
# the lite twins (label twin) run in the sanitizer build only: here their full tests run
(cd build && ctest --output-on-failure -j"$jobs" -LE twin | tee ctest.log)
# Skips are listed by name; with the kit present none of them may be a conformance test
# (those fail instead, above).
echo "skipped tests: $(grep -c '(Skipped)' build/ctest.log || true)"
slowest build/ctest.log

echo "== build (ASan+UBSan) =="
./scripts/build.sh build-asan -DTERN_SANITIZE=ON "${cfg[@]}"
echo "== tests under ASan+UBSan =="
(cd build-asan && ctest --output-on-failure -j"$jobs" -LE no-asan | tee ctest.log)
echo "skipped tests: $(grep -c '(Skipped)' build-asan/ctest.log || true)"
slowest build-asan/ctest.log

echo "== build (ThreadSanitizer: tern and the server's threaded tests) =="
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTERN_TSAN=ON "${cfg[@]}" >/dev/null
cmake --build build-tsan -j"$jobs" --target tern test-server-http test-disk-writer
echo "== tests labelled tsan under ThreadSanitizer =="
(cd build-tsan && ctest --output-on-failure -j"$jobs" -L tsan)
echo "all tests passed (normal, ASan+UBSan, and the tsan subset under ThreadSanitizer)"
