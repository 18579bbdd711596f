#!/usr/bin/env bash
# The first command: installs dependencies, builds, and starts the server. With no
# --model it serves the built-in demo model. Arguments go to `tern serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh build
exec ./build/tern serve "$@"
