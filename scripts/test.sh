#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs the whole suite twice —
# a normal build (build/) and an ASan+UBSan build (build-asan/) — then the server's
# threaded tests (label tsan) in a ThreadSanitizer build (build-tsan/).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
jobs=$(nproc)

echo "== build (RelWithDebInfo) =="
./scripts/build.sh build
echo "== tests =="
(cd build && ctest --output-on-failure -j"$jobs")

echo "== build (ASan+UBSan) =="
./scripts/build.sh build-asan -DTERN_SANITIZE=ON
echo "== tests under ASan+UBSan =="
(cd build-asan && ctest --output-on-failure -j"$jobs" -LE no-asan)

echo "== build (ThreadSanitizer: tern and the server's threaded tests) =="
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTERN_TSAN=ON >/dev/null
cmake --build build-tsan -j"$jobs" --target tern test-server-http
echo "== tests labelled tsan under ThreadSanitizer =="
(cd build-tsan && ctest --output-on-failure -j"$jobs" -L tsan)
echo "all tests passed (normal, ASan+UBSan, and the tsan subset under ThreadSanitizer)"
