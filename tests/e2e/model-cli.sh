#!/usr/bin/env bash
# tern run and tern bench from the command line: on a generated model (always) and on
# the shared kit's stories260K (when present: its greedy story must match llama.cpp's).
set -u
bin=${TERN_BIN:-./tern}
shared=${TERN_SHARED_DIR:-${TERN_SHARED_DIR_DEFAULT:-../shared}}
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

m=$tmp/tiny.gguf
"$bin" mkmodel --preset tiny-qwen3 --type q8_0 --out "$m" >/dev/null 2>&1 || fail "mkmodel exit $?"

# --ids with --print-ids: greedy is deterministic, the same ids whatever the chunking and threads.
a=$("$bin" run -m "$m" --ids "1 2 3 4 5 6 7 8 9 10" --temp 0 -n 12 --print-ids -t 1 2>/dev/null) || fail "run exit $?"
b=$("$bin" run -m "$m" --ids "1,2,3,4,5,6,7,8,9,10" --temp 0 -n 12 --print-ids -t 2 --chunk 3 2>/dev/null) || fail "run exit $?"
[ "$(echo "$a" | wc -w)" -eq 12 ] || fail "expected 12 ids, got '$a'"
[ "$a" = "$b" ] || fail "chunking/threads changed greedy output: '$a' vs '$b'"
# a seeded sample is reproducible
s1=$("$bin" run -m "$m" --prompt "hello" --temp 1 --seed 7 -n 8 --print-ids 2>/dev/null)
s2=$("$bin" run -m "$m" --prompt "hello" --temp 1 --seed 7 -n 8 --print-ids 2>/dev/null)
[ -n "$s1" ] && [ "$s1" = "$s2" ] || fail "seeded sampling not reproducible: '$s1' vs '$s2'"
# text streams to stdout, statistics to stderr
"$bin" run -m "$m" --prompt "hello world" -n 5 --temp 0 >"$tmp/out" 2>"$tmp/err" || fail "text run"
grep -q "decode: .* t/s" "$tmp/err" || fail "no speed line on stderr: $(cat "$tmp/err")"
# --dump-logits: [n_prompt][n_vocab] float32
"$bin" run -m "$m" --ids "5 6 7" -n 0 --dump-logits "$tmp/l.f32" 2>/dev/null || fail "dump-logits"
size=$(stat -c %s "$tmp/l.f32")
[ $((size % 12)) -eq 0 ] && [ $((size / 12)) -ge 256 ] || fail "dump size $size is not 3 rows of float32 logits"
"$bin" run -m "$m" --ids "5 6 7 8" -n 0 --dump-logits "$tmp/l4.f32" 2>/dev/null || fail "dump-logits"
[ "$(stat -c %s "$tmp/l4.f32")" -eq $((size / 3 * 4)) ] || fail "4-token dump is not 4 rows"
cmp -n "$size" "$tmp/l.f32" "$tmp/l4.f32" || fail "the first 3 rows differ when a 4th token follows"
# a prompt longer than the context: refused with both numbers
err=$("$bin" run -m "$m" --ids "1 2 3 4 5 6 7 8" --ctx-size 4 -n 1 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] || fail "too-long prompt exit $rc"
printf '%s' "$err" | grep -q "8" && printf '%s' "$err" | grep -q "4" || fail "message lacks the numbers: $err"
# an id outside the vocabulary
err=$("$bin" run -m "$m" --ids "1 999999" -n 1 2>&1 >/dev/null); [ $? -eq 1 ] || fail "oov exit"
printf '%s' "$err" | grep -q "999999" || fail "oov message: $err"
# usage errors
"$bin" run -m "$m" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no prompt should exit 2"
"$bin" run -m "$m" --ids "1" --kv-type f8 >/dev/null 2>&1; [ $? -eq 2 ] || fail "bad kv type should exit 2"
"$bin" run -m "$m" --ids "1 x" >/dev/null 2>&1; [ $? -eq 2 ] || fail "bad ids should exit 2"
# the IQ4 types: mkmodel writes them, inspect names them (in the text and the JSON), run
# computes with them, the same ids whatever the chunking and threads
for ty in iq4_xs iq4_nl; do
  q=$tmp/tiny-$ty.gguf
  "$bin" mkmodel --preset tiny-qwen3 --type $ty --out "$q" >/dev/null 2>&1 || fail "mkmodel --type $ty exit $?"
  T=$(echo $ty | tr a-z A-Z)
  "$bin" inspect "$q" | grep -q "^  $T  *29 tensors" || fail "inspect does not count 29 $T tensors: $("$bin" inspect "$q" | tail -4)"
  "$bin" inspect "$q" --json | grep -q "\"$T\"" || fail "inspect --json does not name $T"
  a=$("$bin" run -m "$q" --ids "1 2 3 4 5 6 7 8 9 10" --temp 0 -n 8 --print-ids -t 1 2>/dev/null) || fail "run $ty exit $?"
  b=$("$bin" run -m "$q" --ids "1 2 3 4 5 6 7 8 9 10" --temp 0 -n 8 --print-ids -t 2 --chunk 3 2>/dev/null) || fail "run $ty exit $?"
  [ "$(echo "$a" | wc -w)" -eq 8 ] && [ "$a" = "$b" ] || fail "$ty: '$a' vs '$b'"
done
# two of the low-bit types (the cheapest to write): the same checks; q2_k is llama-quantize's
# Q2_K mix (as the kit's tiny-qwen3-q2_k: 17 Q2_K, attn_v / attn_output / ffn_down Q3_K)
for ty in q2_k iq2_xs; do
  q=$tmp/tiny-$ty.gguf
  "$bin" mkmodel --preset tiny-qwen3 --type $ty --out "$q" >/dev/null 2>&1 || fail "mkmodel --type $ty exit $?"
  T=$(echo $ty | tr a-z A-Z) n=29
  [ $ty = q2_k ] && n=17
  "$bin" inspect "$q" | grep -q "^  $T  *$n tensors" || fail "inspect does not count $n $T tensors: $("$bin" inspect "$q" | tail -4)"
  [ $ty = q2_k ] && { "$bin" inspect "$q" | grep -q "^  Q3_K  *12 tensors" || fail "q2_k: not 12 Q3_K tensors: $("$bin" inspect "$q" | tail -4)"; }
  a=$("$bin" run -m "$q" --ids "1 2 3 4 5 6 7 8 9 10" --temp 0 -n 8 --print-ids -t 1 2>/dev/null) || fail "run $ty exit $?"
  b=$("$bin" run -m "$q" --ids "1 2 3 4 5 6 7 8 9 10" --temp 0 -n 8 --print-ids -t 2 --chunk 3 2>/dev/null) || fail "run $ty exit $?"
  [ "$(echo "$a" | wc -w)" -eq 8 ] && [ "$a" = "$b" ] || fail "$ty: '$a' vs '$b'"
done
if [ -f "$shared/models/tiny-qwen3-lowbit-mix.gguf" ]; then
  for T in Q2_K Q3_K IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ1_S IQ1_M; do
    "$bin" inspect "$shared/models/tiny-qwen3-lowbit-mix.gguf" | grep -q "^  $T  *[0-9]* tensors" ||
      fail "inspect of the kit's low-bit mix does not count its $T tensors"
  done
fi
# IQ4 expert tensors (IQ4_XS, and IQ4_NL where 256 does not divide an expert's rows)
for pre in tiny-qwen3moe tiny-qwen35moe; do
  q=$tmp/$pre-iq4_xs.gguf
  "$bin" mkmodel --preset $pre --type iq4_xs --out "$q" >/dev/null 2>&1 || fail "mkmodel $pre iq4_xs exit $?"
  "$bin" inspect "$q" | grep -q "^  IQ4_NL " || fail "$pre iq4_xs: no IQ4_NL fallback tensors"
  a=$("$bin" run -m "$q" --ids "1 2 3 4 5 6 7 8 9 10 11 12" --temp 0 -n 8 --print-ids -t 1 2>/dev/null) || fail "run $pre exit $?"
  b=$("$bin" run -m "$q" --ids "1 2 3 4 5 6 7 8 9 10 11 12" --temp 0 -n 8 --print-ids -t 2 --chunk 5 2>/dev/null) || fail "run $pre exit $?"
  [ "$(echo "$a" | wc -w)" -eq 8 ] && [ "$a" = "$b" ] || fail "$pre iq4_xs: '$a' vs '$b'"
done
# qwen3next written directly in an IQ2/IQ3 mix (the files Qwen3-Coder-Next users run), with
# the MTP block: it runs, the same over threads and chunks
q=$tmp/qwen3next-iq2.gguf
"$bin" mkmodel --preset tiny-qwen3next --type iq2_xs --mtp 1 --out "$q" >/dev/null 2>&1 || fail "mkmodel tiny-qwen3next iq2_xs exit $?"
"$bin" inspect "$q" | grep -q "ssm_ba" || fail "tiny-qwen3next: no fused ssm_ba"
a=$("$bin" run -m "$q" --ids "1 2 3 4 5 6 7 8 9 10 11 12" --temp 0 -n 8 --print-ids -t 1 2>/dev/null) || fail "run qwen3next exit $?"
b=$("$bin" run -m "$q" --ids "1 2 3 4 5 6 7 8 9 10 11 12" --temp 0 -n 8 --print-ids -t 2 --chunk 5 2>/dev/null) || fail "run qwen3next exit $?"
c=$("$bin" run -m "$q" --ids "1 2 3 4 5 6 7 8 9 10 11 12" --temp 0 -n 8 --print-ids -t 2 --spec mtp 2>/dev/null) || fail "run qwen3next --spec mtp exit $?"
[ "$(echo "$a" | wc -w)" -eq 8 ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] || fail "qwen3next iq2_xs: '$a' vs '$b' vs '$c'"
"$bin" mkmodel --preset qwen3-coder-next --type iq2_xs --dry-run --out "$tmp/x.gguf" 2>&1 |
  grep -q "843 tensors, n_vocab 151936, 79674391296 parameters" || fail "qwen3-coder-next preset: not the 80B-A3B shape"
[ ! -f "$shared/models/tiny-qwen3-iq4_xs.gguf" ] || "$bin" inspect "$shared/models/tiny-qwen3-iq4_xs.gguf" |
  grep -q "^  IQ4_XS  *29 tensors" || fail "inspect of the kit's IQ4_XS file"

# bench: JSON with the figures
j=$("$bin" bench -m "$m" -p 16 -n 4 -r 1 --json) || fail "bench exit $?"
for k in pp_tps tg_tps tg_gbps pp_gflops '"mmap":true'; do
  printf '%s' "$j" | grep -q "$k" || fail "bench JSON lacks $k: $j"
done
"$bin" bench -m "$m" -p 8 -n 0 -r 1 --no-mmap | grep -q "no-mmap" || fail "bench does not say the mmap mode"
# --ctx-fill: the runs start from a filled context (said in the JSON), a bad value is refused
j=$("$bin" bench -m "$m" -p 8 -n 2 -r 1 --ctx-fill 40 --json) || fail "bench --ctx-fill exit $?"
printf '%s' "$j" | grep -q '"ctx_fill":40' || fail "bench --ctx-fill JSON: $j"
"$bin" bench -m "$m" -p 8 -n 2 --ctx-fill x >/dev/null 2>&1 && fail "bench --ctx-fill x accepted"

# stories260K: the reference's greedy continuation of "Once upon a time"
st=$shared/models/stories260K.gguf
if [ -f "$st" ]; then
  want="432 383 286 261 376 298 315 421 395 317 426 338 401 396 267 337 410 408 419 292 411 322 265 282 295 433 426 385 328 432 358 394 261 370 432 352 266 268 388 426"
  got=$("$bin" run -m "$st" --prompt "Once upon a time" --temp 0 -n 40 --print-ids 2>/dev/null)
  [ "$got" = "$want" ] || fail "stories260K greedy: '$got'"
  txt=$("$bin" run -m "$st" --prompt "Once upon a time" --temp 0 -n 40 2>/dev/null)
  [ "$txt" = ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball." ] \
    || fail "stories260K text: '$txt'"
  txt=$("$bin" run -m "$st" --prompt "Once upon a time" --temp 0 -n 40 --stop "park" 2>/dev/null)
  [ "$txt" = ", there was a little girl named Lily. She loved to play outside in the " ] || fail "stop string: '$txt'"
else
  [ "${TERN_REQUIRE_SHARED:-0}" = 0 ] || fail "$st is absent and TERN_REQUIRE_SHARED is set"
  echo "note: $st absent; the stories260K checks did not run"
fi
echo ok
