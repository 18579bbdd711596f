#!/usr/bin/env bash
# tern replay against the real `tern serve` (both arms started by the harness) on a tiny
# hybrid model: a short synthetic session, one repetition. The run must pass every
# integrity check (identical bytes, consistent usage, equal prompt tokens across arms),
# produce every output, and give byte-identical output in both arms on every turn
# (greedy decoding; a resumed request equals a cold one, DESIGN.md §5).
# Skips (77) until `tern serve` exists, or without the shared kit's tiny model.
set -u
bin=${TERN_BIN:-./tern}
fail() { echo "FAIL: $*"; exit 1; }

"$bin" --help | grep -q "^  serve " || { echo "SKIP: tern serve is not built in"; exit 77; }
model=${TERN_SHARED_DIR:-${TERN_SHARED_DIR_DEFAULT:-../shared}}/models/tiny-qwen35-q8_0.gguf
[ -f "$model" ] || { [ "${TERN_REQUIRE_SHARED:-0}" = 0 ] || { echo "FAIL: $model is absent and TERN_REQUIRE_SHARED is set"; exit 1; }; echo "SKIP: $model is absent (the shared kit)"; exit 77; }

dir=$(mktemp -d /tmp/tern-replay-serve-XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$bin" replay --make-transcript agent --turns 7 --seed 2 --out "$dir/t.jsonl" 2>/dev/null || fail "make-transcript"
"$bin" replay --transcript "$dir/t.jsonl" --model "$model" --arms on,off --reps 1 --out "$dir/out" \
  --start-timeout 120 --timeout 120 >"$dir/stdout" 2>"$dir/stderr"
rc=$?
if [ $rc -ne 0 ]; then
  cat "$dir/stderr"; tail -20 "$dir/out/server-on.log" 2>/dev/null
  fail "tern replay exit $rc"
fi
[ "$(wc -l <"$dir/out/turns.jsonl")" -eq 14 ] || fail "turns.jsonl has $(wc -l <"$dir/out/turns.jsonl") lines, want 14"
grep -q "byte-identical across arms and repetitions on 7 of 7 turns" "$dir/out/RESULTS.md" ||
  fail "output differs between arms: $(grep 'Output:' "$dir/out/RESULTS.md")"
grep -q "</svg>" "$dir/out/ttft.svg" || fail "no ttft.svg"
grep -q "ttft.svg" "$dir/stdout" || fail "stdout does not say where the plot is"
# Every measurement has usage and a TTFT.
if grep -q '"prompt_tokens":null\|"ttft_s":null' "$dir/out/turns.jsonl"; then fail "a measurement lacks usage or TTFT"; fi
# No server outlived the harness (the ports are in its progress notes).
for port in $(sed -n "s/.*starting server '[a-z]*' on port \([0-9]*\).*/\1/p" "$dir/stderr"); do
  if pgrep -f -- "--port $port( |\$)" >/dev/null; then fail "the server on port $port is still running"; fi
done
grep -q "starting server 'off' on port" "$dir/stderr" || fail "no progress notes on stderr"

# The same session through the other two doors (--protocol), reuse on: every check
# passes, the stream parses, and each turn's prompt is the chat door's, token for token
# (the adapters render one conversation to one prompt however it is spelled); resumed
# == cold through the doors is server-protocols' (state hashes).
prompts() { sed -n 's/.*"arm":"on".*"prompt_tokens":\([0-9]*\).*/\1/p' "$1"; }
for p in messages responses; do
  "$bin" replay --transcript "$dir/t.jsonl" --model "$model" --arms on --reps 1 --protocol $p \
    --out "$dir/$p" --start-timeout 120 --timeout 120 >"$dir/stdout-$p" 2>"$dir/stderr-$p" ||
    { cat "$dir/stderr-$p"; fail "tern replay --protocol $p"; }
  [ "$(grep -c '"ttft_at":"text"' "$dir/$p/turns.jsonl")" -eq 7 ] || fail "$p: a turn without streamed text"
  [ "$(prompts "$dir/$p/turns.jsonl")" = "$(prompts "$dir/out/turns.jsonl")" ] ||
    fail "$p: prompt tokens $(prompts "$dir/$p/turns.jsonl" | tr '\n' ' ') differ from the chat door's"
done
"$bin" replay --transcript "$dir/t.jsonl" --url http://127.0.0.1:1 --protocol smtp 2>/dev/null && fail "--protocol smtp accepted"
echo "ok"
