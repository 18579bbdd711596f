#!/usr/bin/env bash
# MTP drafting against the reference llama.cpp (../shared/reference/llama.cpp, whose
# llama-server has --spec-type draft-mtp for qwen35): neither engine exposes the MTP
# head's logits, so the check is what they decide with them. On generated qwen35 models
# whose MTP block echoes the main model (--mtp-echo: a hidden-state pass-through whose
# guesses are often right; --mtp-echo-attn: the same with the head's attention left
# random, so its KV rows over the prompt and the generated tokens matter), greedy, one
# drafted token per step: both engines generate the same ids and draft and accept the
# same number of tokens. Skipped (77) without the reference or curl.
set -u
bin=${TERN_BIN:-./tern}
fail() { echo "FAIL: $*"; exit 1; }
shared=${TERN_SHARED_DIR:-$(dirname "$0")/../../../shared}
ref=$shared/reference/llama.cpp/run
[ -x "$ref" ] || { echo "no reference llama.cpp at $ref: skipped"; exit 77; }
command -v curl >/dev/null || { echo "no curl: skipped"; exit 77; }
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT

n=40
# preset:kind; the qwen35moe one checks that llama.cpp loads tern's MoE MTP block and agrees
for pk in tiny-qwen35:--mtp-echo tiny-qwen35:--mtp-echo-attn tiny-qwen35moe:--mtp-echo-attn; do
  preset=${pk%%:*}; kind=${pk#*:}
  m=$tmp/$preset$kind.gguf
  "$bin" mkmodel --preset "$preset" --mtp 1 $kind --tied --out "$m" >/dev/null 2>&1 || fail "mkmodel $pk"
  port=$((20000 + RANDOM % 20000))
  "$ref" llama-server -m "$m" --port $port -t 2 -c 1024 --no-warmup --spec-type draft-mtp --spec-draft-n-max 1 \
    >"$tmp/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 0.25; done
  for ids in "1 14 27 40 53 66 79 92" "5 6 7 8 9 10 11 12 13 14 15 16 200 300 400 500 600 700 800 900 1000"; do
    body="{\"prompt\":[$(echo "$ids" | tr ' ' ',')],\"n_predict\":$n,\"temperature\":0,\"top_k\":1,\"cache_prompt\":false,\"return_tokens\":true}"
    curl -sf "localhost:$port/completion" -d "$body" >"$tmp/ref.json" || { cat "$tmp/server.log"; fail "$kind: llama-server request"; }
    ref_line=$(python3 -c '
import json, sys
j = json.loads(open(sys.argv[1], "rb").read().decode("utf8", "replace"))
t = j["timings"]
print(" ".join(map(str, j["tokens"])), "|", t.get("draft_n", 0), t.get("draft_n_accepted", 0))' "$tmp/ref.json") ||
      fail "$kind: reference response: $(head -c 300 "$tmp/ref.json")"
    got=$("$bin" run -m "$m" --ids "$ids" -n $n --temp 0 -t 2 --spec mtp --spec-max 1 --print-ids 2>"$tmp/run.err") ||
      { cat "$tmp/run.err"; fail "$kind: tern run"; }
    line=$(grep -o 'drafted=[0-9]* accepted=[0-9]*' "$tmp/run.err") || fail "$kind: no stats line"
    d=$(echo "$line" | sed 's/drafted=\([0-9]*\).*/\1/'); a=$(echo "$line" | sed 's/.*accepted=//')
    mine="$(echo $got) | $d $a"
    echo "# $preset $kind prompt of $(echo "$ids" | wc -w): reference drafted/accepted ${ref_line#*| }, tern $d $a"
    [ "${ref_line%% |*}" = "$(echo $got)" ] || fail "$kind: the ids differ: reference '${ref_line%% |*}', tern '$(echo $got)'"
    [ "$ref_line" = "$mine" ] || fail "$kind: drafted/accepted differ: reference '${ref_line#*| }', tern '$d $a'"
    # some drafts accepted, some rejected: a wrong head would show (the MoE model mostly
    # repeats itself: there, the load and the agreement are the point)
    [ "$a" -gt 0 ] || fail "$pk: nothing accepted"
    [ "$preset" = tiny-qwen35moe ] || [ "$a" -lt "$d" ] || fail "$pk: accepted $a of $d: the check would not see a difference"
  done
  kill "$pid"; wait "$pid" 2>/dev/null; pid=
done
echo "mtp parity: ok"
