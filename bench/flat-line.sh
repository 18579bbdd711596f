#!/usr/bin/env bash
# The flat line through each door, side by side with llama-server: a recorded agent
# session replayed turn by turn as Claude Code would send it (the Anthropic Messages API,
# with Claude Code's own system prompt and tools) and as Codex would (the Responses API,
# with Codex's), against tern serve and the reference's llama-server on the same model
# file and machine, the two arms alternating (tern replay --url A --url-b B). The shapes
# are captured from the real clients on this machine (bench/agent-shape.mjs; the clients
# come from ./scripts/deps.sh --agents), never committed.
#
#   bench/flat-line.sh -m MODEL.gguf [-t TRANSCRIPT.jsonl] [--turns 20] [--reps 1]
#                      [--threads 2] [--ctx 65536] [--out DIR] [--doors messages,responses]
#                      [--user-gap S]
#
# --user-gap S: seconds of quiet after a turn that ended with an answer (a person reads it
# and types the next message; default 0), tern replay's --user-gap.
# Writes DIR/<door>/RESULTS.md, ttft.svg and turns.jsonl per door, and prints each run's
# summary: TTFT per turn class for both arms, the sum over turns and its ratio. Timings
# are for reading: the script exits 0 whatever they are (2 on a usage or tool error).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
model="" transcript=$here/../shared/bench/agent-long.jsonl turns=20 reps=1 threads=$(nproc) ctx=65536
out=flat-line-out doors=messages,responses user_gap=0
tern=$here/build/tern
llama_run=$here/../shared/reference/llama.cpp/run
usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    -m|--model) model=$2; shift ;;
    -t|--transcript) transcript=$2; shift ;;
    --turns) turns=$2; shift ;;
    --reps) reps=$2; shift ;;
    --threads) threads=$2; shift ;;
    --ctx) ctx=$2; shift ;;
    --out) out=$2; shift ;;
    --doors) doors=$2; shift ;;
    --user-gap) user_gap=$2; shift ;;
    -h|--help) usage ;;
    *) echo "flat-line.sh: unknown argument $1" >&2; usage ;;
  esac
  shift
done
[ -n "$model" ] && [ -f "$model" ] || { echo "flat-line.sh: -m MODEL.gguf is required" >&2; exit 2; }
[ -f "$transcript" ] || { echo "flat-line.sh: no transcript $transcript" >&2; exit 2; }
[ -x "$llama_run" ] || { echo "flat-line.sh: no reference engine at $llama_run" >&2; exit 2; }
mkdir -p "$out"
lscpu | sed -n 's/^Model name: *//p' | head -1 > "$out/cpu.txt"
echo "CPU: $(cat "$out/cpu.txt"), $(nproc) cores; model $model; transcript $transcript; $turns turns, $reps rep(s)"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_health() { for _ in $(seq 600); do curl -sf "$1/health" >/dev/null 2>&1 && return 0; sleep 0.5; done; return 1; }

pt=$(free_port) pl=$(free_port)
"$tern" serve --model "$model" --port "$pt" --threads "$threads" --ctx-size "$ctx" >"$out/tern.log" 2>&1 &
tpid=$!
"$llama_run" llama-server -m "$model" --port "$pl" -t "$threads" -c "$ctx" --jinja >"$out/llama.log" 2>&1 &
lpid=$!
trap 'kill $tpid $lpid 2>/dev/null; wait 2>/dev/null' EXIT
wait_health "http://127.0.0.1:$pt" || { echo "tern serve did not start (see $out/tern.log)" >&2; exit 2; }
wait_health "http://127.0.0.1:$pl" || { echo "llama-server did not start (see $out/llama.log)" >&2; exit 2; }

for door in ${doors//,/ }; do
  client=$([ "$door" = messages ] && echo claude || echo codex)
  # The two servers' adapters render the same request to different prompts: tern drops
  # Claude Code's per-request billing block (~40 tokens) where llama-server keeps it, and
  # llama-server leaves out Codex's namespace tools (its sub-agent tools, ~3.7K tokens)
  # where tern flattens them in. RESULTS.md lists both prompt sizes per turn.
  slack=$([ "$door" = messages ] && echo 64 || echo 8000)
  node "$here/bench/agent-shape.mjs" "$client" "$out/shape-$client.json"
  echo "== $door ($client's system prompt and tools) =="
  "$tern" replay --transcript "$transcript" --url "http://127.0.0.1:$pt" --url-b "http://127.0.0.1:$pl" \
    --labels tern,llama.cpp --protocol "$door" --shape "$out/shape-$client.json" --turns "$turns" --reps "$reps" \
    --max-tokens 1 --user-gap "$user_gap" --isolate salt --prompt-slack "$slack" --pause-pids "$tpid,$lpid" --out "$out/$door" --quiet | sed -n '/^class/,/^rewrite turns/p'
done
echo "results: $out/*/RESULTS.md"
