#!/usr/bin/env bash
# qwen35 (hybrid) from the command line, on a generated model: greedy ids do not depend
# on chunking or threads, and tern bench runs repeated prompts on a hybrid session
# (restoring the empty state) and reports the checkpoint.
set -u
bin=${TERN_BIN:-./tern}
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

m=$tmp/q35.gguf
"$bin" mkmodel --preset tiny-qwen35 --n-layer 4 --type q8_0 --out "$m" >/dev/null 2>&1 || fail "mkmodel exit $?"

a=$("$bin" run -m "$m" --ids "1 2 3 4 5 6 7 8 9 10 11 12 13" --temp 0 -n 12 --print-ids -t 1 2>/dev/null) || fail "run exit $?"
b=$("$bin" run -m "$m" --ids "1 2 3 4 5 6 7 8 9 10 11 12 13" --temp 0 -n 12 --print-ids -t 2 --chunk 5 2>/dev/null) \
  || fail "run exit $?"
[ "$(echo "$a" | wc -w)" -eq 12 ] || fail "expected 12 ids, got '$a'"
[ "$a" = "$b" ] || fail "chunking/threads changed greedy output: '$a' vs '$b'"

j=$("$bin" bench -m "$m" -p 16 -n 4 -r 2 --json) || fail "bench exit $?"
for k in pp_tps tg_tps '"arch":"qwen35"' ckpt_bytes ckpt_save_s ckpt_restore_s; do
  printf '%s' "$j" | grep -q "$k" || fail "bench JSON lacks $k: $j"
done
# 3 DeltaNet layers of the tiny shape: (3 x 512 + 4 x 64 x 64) floats each = 215040 bytes,
# plus the checkpoint's own struct (under 160 bytes)
printf '%s' "$j" | grep -Eq '"ckpt_bytes":2150[4-9][0-9]|"ckpt_bytes":2151[0-9][0-9]' || fail "checkpoint size: $j"
"$bin" bench -m "$m" -p 8 -n 2 -r 1 | grep -q "^checkpoint .* MB: save" || fail "bench table lacks the checkpoint line"
echo "qwen35 cli: ok"
