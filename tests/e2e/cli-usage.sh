#!/usr/bin/env bash
# The CLI's usage conventions: --help exits 0, a usage error exits 2 with one line.
set -u
bin=${TERN_BIN:-./tern}
fail() { echo "FAIL: $*"; exit 1; }

"$bin" --help | grep -q "usage: tern" || fail "tern --help"
"$bin" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no command should exit 2"
err=$("$bin" no-such-command 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] || fail "unknown command exit $rc"
[ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] || fail "usage error is not one line: $err"
# Every registered command answers --help with exit 0 and a usage line.
for cmd in $("$bin" --help | awk '/^commands:/{on=1;next} on && /^  [a-z]/{print $1}'); do
  out=$("$bin" "$cmd" --help 2>&1); rc=$?
  [ $rc -eq 0 ] || fail "tern $cmd --help exit $rc"
  printf '%s' "$out" | grep -qi "usage" || fail "tern $cmd --help prints no usage"
  "$bin" "$cmd" --no-such-option >/dev/null 2>&1; rc=$?
  [ $rc -eq 2 ] || fail "tern $cmd --no-such-option exit $rc (want 2)"
done
echo "ok"
