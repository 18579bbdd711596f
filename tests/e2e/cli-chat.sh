#!/usr/bin/env bash
# tern chat (and tern run --chat): two turns from stdin on a generated model; the second
# turn resumes the first's session (only what the render added is read).
set -u
bin=${TERN_BIN:-./tern}
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" mkmodel --preset tiny-qwen3 --type q8_0 --out "$tmp/m.gguf" >/dev/null 2>&1 || fail "mkmodel"
printf 'Hello there\nTell me more\n/exit\n' |
  "$bin" chat --model "$tmp/m.gguf" -n 6 --temp 0 --system "Be brief." >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] || { cat "$tmp/err"; fail "tern chat exit $rc"; }
n=$(grep -c '^\[[0-9]* read, [0-9]* reused, [0-9]* generated' "$tmp/err")
[ "$n" -eq 2 ] || { cat "$tmp/err"; fail "expected 2 turn lines, got $n"; }
reused=$(grep '^\[[0-9]* read' "$tmp/err" | sed -n 2p | sed 's/^\[[0-9]* read, \([0-9]*\) reused.*/\1/')
[ "$reused" -gt 0 ] || { cat "$tmp/err"; fail "the second turn reused nothing"; }
# the same through tern run --chat, when tern run exists and delegates
if "$bin" --help | grep -q '^  run '; then
  printf 'Hi\n' | "$bin" run --chat --model "$tmp/m.gguf" -n 3 --temp 0 >/dev/null 2>"$tmp/err2" ||
    { cat "$tmp/err2"; fail "tern run --chat"; }
  grep -q '^\[[0-9]* read' "$tmp/err2" || fail "tern run --chat did not chat"
fi
echo ok
