#!/usr/bin/env bash
# tern bench memory: usage, option errors, and a minimal run that prints its figures.
set -euo pipefail
bin=${TERN_BIN:?TERN_BIN not set}
fail() { echo "FAIL: $*" >&2; exit 1; }
err=$(mktemp)
trap 'rm -f "$err"' EXIT

"$bin" bench memory --help | grep -q "usage: tern bench memory" || fail "--help"
set +e
"$bin" bench memory --threads 0 2>"$err"; rc=$?
set -e
[ "$rc" = 2 ] || fail "--threads 0 exited $rc, want 2"
grep -q "threads '0'" "$err" || fail "error does not name the value: $(cat "$err")"
set +e
"$bin" bench memory --size-mib 1 2>/dev/null; rc=$?
set -e
[ "$rc" = 2 ] || fail "--size-mib 1 exited $rc, want 2"

out=$("$bin" bench memory --size-mib 16 --passes 1 --threads 2 --json)
echo "$out"
echo "$out" | grep -Eq '"gbps_1": [0-9]+\.[0-9]+, "gbps_n": [0-9]+\.[0-9]+' || fail "json: $out"
out=$("$bin" bench memory --size-mib 16 --passes 1 --threads 1)
echo "$out" | grep -Eq '^ +1 +[0-9]+\.[0-9]+$' || fail "table: $out"
echo "ok"
