#!/usr/bin/env bash
# See it: tern's flat line on this machine, in a few minutes.
#
# Installs the dependencies, builds tern, writes a 25-turn synthetic coding-agent session
# (tool calls, reasoning, new user messages that make the chat template rewrite history)
# and replays it against two `tern serve` processes on the built-in demo model: reuse on
# and reuse off, interleaved, 3 repetitions. Prints the table by turn class and where
# RESULTS.md and the plot (ttft.svg) are.
#
# Arguments go to `tern replay` and win over these defaults, e.g.
#   ./scripts/see-it.sh --reps 1
#   ./scripts/see-it.sh --model my-model.gguf --server-args "--threads 2"
#   ./scripts/see-it.sh --transcript ../shared/bench/agent-short.jsonl
#   ./scripts/see-it.sh --url http://127.0.0.1:8080 --url-b http://127.0.0.1:8081
# The output directory is build/see-it/ (or $TERN_SEE_IT_OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh build >/dev/null
out=${TERN_SEE_IT_OUT:-build/see-it}
mkdir -p "$out"

transcript="$out/agent.jsonl"
./build/tern replay --make-transcript agent --turns 25 --seed 1 --out "$transcript"

# The demo model and both arms, unless the arguments say otherwise.
has() { local opt=$1; shift; for a in "$@"; do case $a in "$opt"|"$opt"=*) return 0 ;; esac; done; return 1; }
servers=()
has --model "$@" || has --demo "$@" || has --url "$@" || servers+=(--demo)
has --url "$@" || has --arms "$@" || servers+=(--arms on,off)

echo "see-it: replaying $transcript (25 turns) with reuse on and off; this takes a few minutes" >&2
./build/tern replay --transcript "$transcript" ${servers[@]+"${servers[@]}"} --reps 3 --out "$out" "$@"
echo
echo "Open $out/ttft.svg in a browser: one line per arm, time to first token per turn."
