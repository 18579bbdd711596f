#!/usr/bin/env bash
# tern bench and the reference engine's llama-bench side by side, on the same model file and
# the same machine, in one run: pairs A (tern), B (llama.cpp), A, B, ... with the load
# average read before each pair; then both figures, their ratio, and the decode bandwidth
# (weight bytes read per token x t/s) as a share of `tern bench memory` (the decode bound,
# measured before and after the pairs).
#
#   bench/vs-llama.sh -m MODEL.gguf [-p 512] [-n 128] [-r 3] [-t THREADS] [--pairs 2]
#                     [--max-load L] [--wait S] [--mmap] [--tern PATH] [--llama-bench PATH]
#                     [--ctx-fill N] [--tern-base PATH] [--llama-cpu VARIANT] [--tern-env VAR=VAL]
#                     [--avx2]
#
# Each run of either engine is -r repetitions (mean, sd over them); a pair is one run of
# each; the table reports the median over pairs. Weights are read into memory (tern
# --no-mmap, llama-bench -mmp 0) unless --mmap. A pair that starts with the 1-minute load
# average above --max-load (default: the thread count) waits up to --wait seconds (default
# 60) for it to drop and is marked "busy" if it does not; busy pairs are reported but the
# medians use the quiet ones when there are any. Timings are for reading, never a pass or
# fail: the script exits 0 whatever the figures are (2 on a usage or tool error).
# --ctx-fill N: both engines run pp and tg on a context already holding N tokens (tern bench
# --ctx-fill N, llama-bench -d N). --tern-base PATH: a second tern binary (say, main before a
# change) run in every pair too (A tern, A' base, B llama-bench), its figures and ratio beside.
# --llama-cpu VARIANT: llama-bench runs with only ggml's CPU variant VARIANT (haswell = AVX2,
# alderlake = AVX2 + AVX-VNNI, skylakex, zen4, ...) beside it instead of the best one for the
# machine (a copy of llama-bench in a scratch directory with the reference's libraries; its
# log must name the variant). --tern-env VAR=VAL (repeatable): an environment setting for
# every tern run. --avx2: the AVX2 paths of both engines on an AVX-512 machine, i.e.
# --tern-env TERN_AVX512=0 --llama-cpu haswell.
# Needs python3 (to read the two engines' JSON).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
model="" p=512 n=128 r=3 threads=$(nproc) pairs=2 max_load="" wait_s=60 mmap=0 depth=0 base=""
llama_cpu="" tern_env=()
tern=$here/build/tern
llama_run=$here/../shared/reference/llama.cpp/run
usage() { sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    -m|--model) model=$2; shift ;;
    -p) p=$2; shift ;;
    -n) n=$2; shift ;;
    -r) r=$2; shift ;;
    -t|--threads) threads=$2; shift ;;
    --pairs) pairs=$2; shift ;;
    --max-load) max_load=$2; shift ;;
    --wait) wait_s=$2; shift ;;
    --mmap) mmap=1 ;;
    --tern) tern=$2; shift ;;
    --llama-bench) llama_run=$2; shift ;;
    --ctx-fill|-d) depth=$2; shift ;;
    --tern-base) base=$2; shift ;;
    --llama-cpu) llama_cpu=$2; shift ;;
    --tern-env) [[ $2 == *=* ]] || { echo "vs-llama: --tern-env wants VAR=VAL, not '$2'" >&2; exit 2; }
                tern_env+=("$2"); shift ;;
    --avx2) tern_env+=(TERN_AVX512=0); llama_cpu=haswell ;;
    -h|--help) usage ;;
    *) echo "vs-llama: unknown option '$1'" >&2; usage ;;
  esac
  shift
done
[ -n "$model" ] || { echo "vs-llama: -m MODEL is required" >&2; usage; }
[ -f "$model" ] || { echo "vs-llama: no model file '$model'" >&2; exit 2; }
[ -x "$tern" ] || { echo "vs-llama: no tern binary at $tern (build it, or --tern PATH)" >&2; exit 2; }
[ -x "$llama_run" ] || { echo "vs-llama: no reference engine at $llama_run (--llama-bench PATH)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "vs-llama: needs python3" >&2; exit 2; }
[ -z "$base" ] || [ -x "$base" ] || { echo "vs-llama: no tern binary at $base (--tern-base)" >&2; exit 2; }
for v in p n r threads pairs wait_s depth; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "vs-llama: $v '${!v}' is not a number" >&2; exit 2; }
done
[ -n "$max_load" ] || max_load=$threads
# the reference's wrapper takes the tool's name first; a direct path to llama-bench does not
llama=("$llama_run") lbin=$(dirname "$llama_run")
[ "$(basename "$llama_run")" = run ] && llama+=(llama-bench) lbin=$lbin/bin

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --llama-cpu: ggml loads the best libggml-cpu-*.so found beside the executable, so a copy of
# llama-bench goes into a directory that links the reference's libraries but only the one
# CPU variant
if [ -n "$llama_cpu" ]; then
  [ -f "$lbin/libggml-cpu-$llama_cpu.so" ] ||
    { echo "vs-llama: no CPU variant '$llama_cpu' in $lbin (have: $(cd "$lbin" && ls libggml-cpu-*.so 2>/dev/null | sed 's/libggml-cpu-//; s/\.so//' | tr '\n' ' '))" >&2; exit 2; }
  mkdir "$tmp/llama"
  cp "$lbin/llama-bench" "$tmp/llama/"
  for f in "$lbin"/*.so*; do
    case $(basename "$f") in libggml-cpu-*) ;; *) ln -s "$f" "$tmp/llama/" ;; esac
  done
  ln -s "$lbin/libggml-cpu-$llama_cpu.so" "$tmp/llama/"
  llama=(env "LD_LIBRARY_PATH=$tmp/llama" "$tmp/llama/llama-bench")
fi
[ ${#tern_env[@]} = 0 ] || echo "tern runs with: ${tern_env[*]}"
# a tern binary with --tern-env's settings
run_tern() { env ${tern_env[@]+"${tern_env[@]}"} "$@"; }
load1() { cut -d' ' -f1 /proc/loadavg; }
above() { python3 -c "import sys; sys.exit(0 if float('$1') > float('$2') else 1)"; }

tern_mm=(--no-mmap) llama_mm=(-mmp 0)
[ "$mmap" = 1 ] && tern_mm=() llama_mm=(-mmp 1)
tern_d=() llama_d=()
[ "$depth" = 0 ] || tern_d=(--ctx-fill "$depth") llama_d=(-d "$depth")

echo "model: $model ($(stat -c %s "$model") bytes); pp$p / tg$n$([ "$depth" = 0 ] || echo " at a context of $depth tokens"), $r repetitions per run, $threads threads, $pairs pairs"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1) (family $(lscpu | sed -n 's/^CPU family: *//p' | head -1), model $(lscpu | sed -n 's/^Model: *//p' | head -1)), $(nproc) CPUs; $("$tern" --version 2>/dev/null | head -1 || echo 'tern ?')"
membench() {
  run_tern "$tern" bench memory -t "$threads" --json >"$tmp/mem$1.json"
  echo "tern bench memory ($2): $(python3 -c "import json; m=json.load(open('$tmp/mem$1.json')); print(f\"{m['gbps_n']:.1f} GB/s with {m['threads']} thread(s) ({m['gbps_1']:.1f} with 1)\")")"
}
membench 0 before

for i in $(seq 1 "$pairs"); do
  l=$(load1) busy=0
  if above "$l" "$max_load"; then
    echo "pair $i: load $l > $max_load, waiting up to ${wait_s}s"
    for _ in $(seq 1 "$wait_s"); do sleep 1; l=$(load1); above "$l" "$max_load" || break; done
    above "$l" "$max_load" && busy=1
  fi
  echo "pair $i: load $l$([ $busy = 1 ] && echo ' (busy)'): A tern, B llama-bench"
  run_tern "$tern" bench -m "$model" -p "$p" -n "$n" -r "$r" -t "$threads" "${tern_mm[@]}" "${tern_d[@]}" --json >"$tmp/a$i.json" 2>"$tmp/a$i.err" ||
    { echo "vs-llama: tern bench failed:" >&2; cat "$tmp/a$i.err" >&2; exit 2; }
  if [ -n "$base" ]; then
    run_tern "$base" bench -m "$model" -p "$p" -n "$n" -r "$r" -t "$threads" "${tern_mm[@]}" "${tern_d[@]}" --json >"$tmp/c$i.json" 2>"$tmp/c$i.err" ||
      { echo "vs-llama: tern bench (base) failed:" >&2; cat "$tmp/c$i.err" >&2; exit 2; }
  fi
  "${llama[@]}" -m "$model" -p "$p" -n "$n" -r "$r" -t "$threads" "${llama_mm[@]}" "${llama_d[@]}" -o json >"$tmp/b$i.json" 2>"$tmp/b$i.err" ||
    { echo "vs-llama: llama-bench failed:" >&2; tail -5 "$tmp/b$i.err" >&2; exit 2; }
  [ -z "$llama_cpu" ] || grep -q "libggml-cpu-$llama_cpu.so" "$tmp/b$i.err" ||
    { echo "vs-llama: llama-bench did not load the '$llama_cpu' CPU variant:" >&2; grep -i backend "$tmp/b$i.err" >&2; exit 2; }
  echo "$i $l $busy" >>"$tmp/pairs"
done

membench 1 after

python3 - "$tmp" "$p" "$n" "$base" <<'PY'
import json, os, statistics, sys
tmp, p, n, base = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
# the bound: the better of the two measurements (a busy machine lowers both)
mems = [json.load(open(f"{tmp}/mem{k}.json")) for k in (0, 1)]
mem = max(mems, key=lambda m: m["gbps_n"])
bound = mem["gbps_n"]
rows = []
for line in open(f"{tmp}/pairs"):
    i, load, busy = line.split()
    a = json.load(open(f"{tmp}/a{i}.json"))
    b = json.load(open(f"{tmp}/b{i}.json"))
    def llama(kind):
        for e in b:
            if kind == "pp" and e["n_prompt"] > 0 and e["n_gen"] == 0: return e["avg_ts"], e["stddev_ts"]
            if kind == "tg" and e["n_gen"] > 0 and e["n_prompt"] == 0: return e["avg_ts"], e["stddev_ts"]
        return None, None
    lp, lps = llama("pp")
    lt, lts = llama("tg")
    c = json.load(open(f"{tmp}/c{i}.json")) if base else {}
    rows.append(dict(i=int(i), load=float(load), busy=busy == "1", bpt=a["weight_bytes_per_token"],
                     tp=a.get("pp_tps"), tps=a.get("pp_tps_sd"), tt=a.get("tg_tps"), tts=a.get("tg_tps_sd"),
                     lp=lp, lps=lps, lt=lt, lts=lts, bp=c.get("pp_tps"), bt=c.get("tg_tps")))
def f(v, sd=None):
    if v is None: return "-"
    return f"{v:.1f} ± {sd:.1f}" if sd is not None else f"{v:.1f}"
def ratio(x, y): return f"{x / y:.2f}" if x and y else "-"
def gbps(tps, bpt): return tps * bpt / 1e9 if tps else None
def share(tps, bpt):
    g = gbps(tps, bpt)
    return f"{g:.1f} ({100 * g / bound:.0f} %)" if g else "-"
print()
print(f"| pair | load | llama.cpp pp{p} | tern pp{p} | tern ÷ llama | llama.cpp tg{n} | tern tg{n} | tern ÷ llama "
      f"| decode GB/s (% of {bound:.1f}): llama.cpp | tern |")
print("|---|---|---|---|---|---|---|---|---|---|")
for x in rows:
    print(f"| {x['i']}{' (busy)' if x['busy'] else ''} | {x['load']:.2f} | {f(x['lp'], x['lps'])} | {f(x['tp'], x['tps'])} "
          f"| {ratio(x['tp'], x['lp'])} | {f(x['lt'], x['lts'])} | {f(x['tt'], x['tts'])} | {ratio(x['tt'], x['lt'])} "
          f"| {share(x['lt'], x['bpt'])} | {share(x['tt'], x['bpt'])} |")
quiet = [x for x in rows if not x["busy"]] or rows
def med(k):
    v = [x[k] for x in quiet if x[k]]
    return statistics.median(v) if v else None
bpt = rows[0]["bpt"]
tp, lp, tt, lt = med("tp"), med("lp"), med("tt"), med("lt")
print(f"| median of {len(quiet)}{'' if quiet is not rows or not any(x['busy'] for x in rows) else ' (all busy)'} | "
      f"| {f(lp)} | {f(tp)} | {ratio(tp, lp)} | {f(lt)} | {f(tt)} | {ratio(tt, lt)} | {share(lt, bpt)} | {share(tt, bpt)} |")
if base:
    bp, bt = med("bp"), med("bt")
    print(f"\nbase tern ({base}), same pairs: pp{p} {f(bp)} ({ratio(bp, lp)} of llama.cpp; this tern {ratio(tp, bp)}x of it), "
          f"tg{n} {f(bt)} ({ratio(bt, lt)} of llama.cpp; this tern {ratio(tt, bt)}x of it)")
    for x in rows:
        print(f"  pair {x['i']}: base pp {f(x['bp'])} tg {f(x['bt'])}")
print(f"\ndecode GB/s = weight bytes read per token ({bpt} B, from tern bench) x tg t/s; the bound is the "
      f"better of the two `tern bench memory` runs with {mem['threads']} thread(s). A model that fits in the "
      f"caches, or a bound measured while the machine was busy, can give more than 100 %.")
PY
