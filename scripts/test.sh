#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs the whole suite twice —
# a normal build (build/) and an ASan+UBSan build (build-asan/).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
jobs=$(nproc)
# deps.sh installs the Vulkan headers, glslc and lavapipe: the Vulkan tests must run, not skip.
export TERN_REQUIRE_VULKAN=1

echo "== build (RelWithDebInfo) =="
./scripts/build.sh build
echo "== tests =="
(cd build && ctest --output-on-failure -j"$jobs")

echo "== build (ASan+UBSan) =="
./scripts/build.sh build-asan -DTERN_SANITIZE=ON
echo "== tests under ASan+UBSan =="
(cd build-asan && ctest --output-on-failure -j"$jobs" -LE no-asan)
echo "all tests passed (normal and ASan+UBSan)"
