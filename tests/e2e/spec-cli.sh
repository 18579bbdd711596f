#!/usr/bin/env bash
# Speculative decoding from the command line: tern run --spec ngram and the oracle
# (--spec-oracle PCT:IDS, all accepted / all rejected) print the same ids and end in the
# same state (TERN_STATE_HASH=1) as --spec off; the closing stats line reports
# drafted=N accepted=M; tern chat --spec ngram answers as --spec off. On the kit's
# stories260K and a generated hybrid (tiny-qwen35).
set -u
bin=${TERN_BIN:-./tern}
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shared=${TERN_SHARED_DIR:-$(dirname "$0")/../../../shared}
"$bin" mkmodel --preset tiny-qwen35 --n-layer 4 --out "$tmp/q35.gguf" >/dev/null 2>&1 || fail "mkmodel"
models="$tmp/q35.gguf"
[ -f "$shared/models/stories260K.gguf" ] && models="$shared/models/stories260K.gguf $models"

run() { # model spec-args... -> ids on stdout, stats + hash on stderr
  local m=$1; shift
  TERN_STATE_HASH=1 "$bin" run -m "$m" -p "Once upon a time, there was a little girl. Once upon a time" -n 48 \
    --temp 0 -t 1 --print-ids "$@"
}
for m in $models; do
  run "$m" --spec off >"$tmp/off.ids" 2>"$tmp/off.err" || { cat "$tmp/off.err"; fail "$m: run --spec off"; }
  grep -q 'drafted=' "$tmp/off.err" && fail "$m: --spec off reports drafts"
  ids=$(tr -s " " "," <"$tmp/off.ids")
  for args in "--spec ngram" "--spec ngram --spec-max 2" "--spec-oracle 0:$ids" "--spec-oracle 100:$ids" \
              "--spec-oracle 50:$ids --spec-max 3"; do
    # shellcheck disable=SC2086
    run "$m" $args >"$tmp/spec.ids" 2>"$tmp/spec.err" || { cat "$tmp/spec.err"; fail "$m: run $args"; }
    cmp -s "$tmp/off.ids" "$tmp/spec.ids" || fail "$m: $args printed other ids than --spec off"
    [ "$(grep state-hash "$tmp/off.err")" = "$(grep state-hash "$tmp/spec.err")" ] ||
      fail "$m: $args ended in another state: $(grep state-hash "$tmp/spec.err") vs $(grep state-hash "$tmp/off.err")"
    line=$(grep -o 'drafted=[0-9]* accepted=[0-9]*' "$tmp/spec.err") || { cat "$tmp/spec.err"; fail "$m: no drafted= on the stats line"; }
    d=$(echo "$line" | sed 's/drafted=\([0-9]*\).*/\1/'); a=$(echo "$line" | sed 's/.*accepted=//')
    [ "$a" -le "$d" ] || fail "$m: $args accepted $a of $d"
    case "$args" in
      --spec-oracle\ 0:*) [ "$d" -gt 0 ] && [ "$a" -eq "$d" ] || fail "$m: the right oracle: $line" ;;
      --spec-oracle\ 100:*) [ "$d" -gt 0 ] && [ "$a" -eq 0 ] || fail "$m: the wrong oracle: $line" ;;
    esac
  done
done
# --spec mtp (the MTP head, docs/spec.md): a random head (drafts rejected) and an echo head
# on a tied model that repeats itself (drafts accepted) give the ids and state of --spec off
"$bin" mkmodel --preset tiny-qwen35 --n-layer 4 --mtp 1 --out "$tmp/q35mtp.gguf" >/dev/null 2>&1 || fail "mkmodel --mtp"
"$bin" mkmodel --preset tiny-qwen35 --n-layer 4 --mtp 1 --mtp-echo --tied --out "$tmp/q35echo.gguf" >/dev/null 2>&1 ||
  fail "mkmodel --mtp-echo"
for m in "$tmp/q35mtp.gguf" "$tmp/q35echo.gguf"; do
  run "$m" --spec off >"$tmp/off.ids" 2>"$tmp/off.err" || { cat "$tmp/off.err"; fail "$m: run --spec off"; }
  for args in "--spec mtp" "--spec mtp --spec-max 1" "--spec mtp --spec-max 5"; do
    # shellcheck disable=SC2086
    run "$m" $args >"$tmp/spec.ids" 2>"$tmp/spec.err" || { cat "$tmp/spec.err"; fail "$m: run $args"; }
    cmp -s "$tmp/off.ids" "$tmp/spec.ids" || fail "$m: $args printed other ids than --spec off"
    [ "$(grep state-hash "$tmp/off.err")" = "$(grep state-hash "$tmp/spec.err")" ] || fail "$m: $args ended in another state"
    line=$(grep -o 'spec mtp: drafted=[0-9]* accepted=[0-9]*' "$tmp/spec.err") || { cat "$tmp/spec.err"; fail "$m: no mtp stats"; }
    d=$(echo "$line" | sed 's/.*drafted=\([0-9]*\).*/\1/'); a=$(echo "$line" | sed 's/.*accepted=//')
    [ "$d" -gt 0 ] && [ "$a" -le "$d" ] || fail "$m: $args: $line"
    case "$m" in *echo*) [ "$a" -gt 0 ] || fail "$m: the echo head's drafts were never accepted: $line" ;; esac
  done
done
# bad values are usage errors; --spec mtp needs a model with the head
"$bin" run -m "$tmp/q35.gguf" -p x --spec mtp 2>"$tmp/mtp.err" >/dev/null && fail "--spec mtp accepted"
grep -q "multi-token-prediction head" "$tmp/mtp.err" || { cat "$tmp/mtp.err"; fail "--spec mtp without the head: message"; }
"$bin" run -m "$tmp/q35.gguf" -p x --spec-max 33 >/dev/null 2>&1 && fail "--spec-max 33 accepted"
# tern chat: the same answers, and the turn line reports drafts
printf 'alpha beta gamma alpha beta gamma\nagain alpha beta gamma\n/exit\n' >"$tmp/in"
"$bin" chat --model "$tmp/q35.gguf" -n 24 --temp 0 --spec off <"$tmp/in" >"$tmp/c-off" 2>"$tmp/c-off.err" || fail "chat off"
"$bin" chat --model "$tmp/q35.gguf" -n 24 --temp 0 --spec ngram --spec-max 4 <"$tmp/in" >"$tmp/c-on" 2>"$tmp/c-on.err" ||
  { cat "$tmp/c-on.err"; fail "chat ngram"; }
cmp -s "$tmp/c-off" "$tmp/c-on" || fail "tern chat --spec ngram answered otherwise"
[ "$(grep -c 'drafted=[0-9]* accepted=[0-9]*\]' "$tmp/c-on.err")" -eq 2 ] || { cat "$tmp/c-on.err"; fail "chat turn lines"; }
echo ok
