#!/usr/bin/env bash
# tern run --device: generation through the GPU forward pass (backend/vulkan/gpu.h) gives the CPU's
# greedy ids on F32 models (a generated qwen2 and qwen3, and the kit's stories260K,
# tiny-qwen3moe, tiny-qwen35moe and tiny-gptoss when present); TERN_DEVICE does what --device does;
# auto says which device it took and why; --spec ngram, the oracle and --spec mtp on the
# device print the ids of --spec off there; a machine without Vulkan gets a message naming
# what is missing (vulkan) or the CPU (auto); a context larger than the device is refused at
# start by run (with and without --spec) and by the server; --cpu-moe / --n-cpu-moe say how
# many layers' experts stayed on the CPU and keep the CPU's ids. `lite` (gpu-cli-lite, the
# twin run under ASan+UBSan): every check on one model of each kind (the rest in the normal
# build). Skips (77) without a Vulkan
# device unless TERN_REQUIRE_VULKAN=1.
set -u
lite=${1:-}
full() { [ "$lite" != lite ]; } # the checks the lite twin leaves out
bin=${TERN_BIN:-./tern}
shared=${TERN_SHARED_DIR:-${TERN_SHARED_DIR_DEFAULT:-../shared}}
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! "$bin" devices --json 2>/dev/null | grep -q '"index":0'; then
  [ "${TERN_REQUIRE_VULKAN:-0}" = 1 ] && fail "TERN_REQUIRE_VULKAN=1 but no Vulkan device: $("$bin" devices 2>&1 | tail -3)"
  echo "SKIP: no Vulkan device"; exit 77
fi
# the device's shared memory (the attention tile's stage is sized by it) and the CPU's kernels
"$bin" devices --json | grep -q '"shared_bytes":[1-9][0-9]*,' || fail "devices --json has no shared_bytes: $("$bin" devices --json)"
"$bin" devices --json | grep -q '"avx512_tiles":\(true\|false\)' || fail "devices --json has no avx512_tiles"

# same greedy ids on the CPU and on vulkan:0 (F32 weights: the backends differ in the last bits only)
same() { # model, prompt ids, n
  local c g
  c=$("$bin" run -m "$1" --ids "$2" -n "$3" --temp 0 --print-ids -c 256 --device cpu 2>"$tmp/cpu.err") || fail "cpu run of $1: $(cat "$tmp/cpu.err")"
  g=$("$bin" run -m "$1" --ids "$2" -n "$3" --temp 0 --print-ids -c 256 --chunk 7 --device vulkan:0 2>"$tmp/gpu.err") ||
    fail "gpu run of $1: $(cat "$tmp/gpu.err")"
  grep -q "on vulkan:0" "$tmp/gpu.err" || fail "the gpu run does not say it ran on vulkan:0: $(cat "$tmp/gpu.err")"
  [ "$(echo "$g" | wc -w)" -eq "$3" ] || fail "$1: expected $3 ids on the GPU, got '$g'"
  [ "$c" = "$g" ] || fail "$1: greedy ids differ: cpu '$c' vs gpu '$g'"
  echo "ok $(basename "$1"): $3 greedy ids identical on cpu and vulkan:0"
}

for p in tiny-qwen2 tiny-qwen3; do
  [ $p = tiny-qwen2 ] && ! full && continue
  "$bin" mkmodel --preset "$p" --n-layer 2 --type f32 --out "$tmp/$p.gguf" >/dev/null 2>&1 || fail "mkmodel $p exit $?"
  same "$tmp/$p.gguf" "1 2 3 4 5 6 7 8 9 10" 12
done
if [ -f "$shared/models/stories260K.gguf" ]; then
  if full; then
    same "$shared/models/stories260K.gguf" "1 403 407 261 378" 40
    same "$shared/models/tiny-qwen3moe-f32.gguf" "785 264 1000 300 12" 16
    same "$shared/models/tiny-gptoss-f32.gguf" "785 264 1000 300 12" 24 # past its window of 16
  fi
  same "$shared/models/tiny-qwen35moe-f32.gguf" "785 264 1000 300 12" 16
  # partial offload: the experts of every layer / the first N on the CPU, said at start;
  # the F32 MoE's greedy ids stay the CPU's; bad values are usage errors
  mm=$shared/models/tiny-qwen35moe-f32.gguf
  c=$("$bin" run -m "$mm" --ids "785 264 1000 300 12" -n 16 --temp 0 --print-ids -c 256 --device cpu 2>/dev/null)
  offl=("--n-cpu-moe 1:1 of 4")
  full && offl+=("--cpu-moe:4 of 4" "--n-cpu-moe auto:0 of 4")
  for o in "${offl[@]}"; do
    # shellcheck disable=SC2086
    g=$("$bin" run -m "$mm" --ids "785 264 1000 300 12" -n 16 --temp 0 --print-ids -c 256 --device vulkan:0 ${o%%:*} \
      2>"$tmp/err") || fail "${o%%:*}: $(cat "$tmp/err")"
    grep -q "routed experts of ${o#*:} MoE layers in host memory" "$tmp/err" || fail "${o%%:*} does not say it: $(cat "$tmp/err")"
    [ "$g" = "$c" ] || fail "${o%%:*}: greedy ids '$g' vs the cpu's '$c'"
  done
  echo "ok --cpu-moe, --n-cpu-moe 1 and auto: said at start, the cpu's greedy ids"
  "$bin" run -m "$mm" --ids "1" -n 1 --device vulkan:0 --n-cpu-moe two 2>"$tmp/err" >/dev/null; rc=$?
  [ $rc -eq 2 ] && grep -q "bad --n-cpu-moe" "$tmp/err" || fail "--n-cpu-moe two: exit $rc, $(cat "$tmp/err")"
  "$bin" run -m "$mm" --ids "1" -n 1 --device vulkan:0 --cpu-moe --n-cpu-moe 2 2>"$tmp/err" >/dev/null; rc=$?
  [ $rc -eq 2 ] && grep -q "give one" "$tmp/err" || fail "--cpu-moe with --n-cpu-moe: exit $rc, $(cat "$tmp/err")"
  # --gpu-layers: the matrices of the later layers in host memory, said at start; the F32
  # models' greedy ids stay the CPU's (a hybrid MoE and an attention-only model); one state
  # token by token and in chunks; bad values are usage errors, the CPU ignores it
  gl=("$mm:785 264 1000 300 12:16")
  full && gl+=("$shared/models/tiny-qwen3-f32.gguf:785 264 1000 300 12:16")
  for e in "${gl[@]}"; do
    gm=${e%%:*} r=${e#*:}
    gi=${r%:*} gn=${r##*:}
    c=$("$bin" run -m "$gm" --ids "$gi" -n "$gn" --temp 0 --print-ids -c 256 --device cpu 2>/dev/null)
    h0=
    for o in "--gpu-layers 1" "--gpu-layers 1 --chunk 1" "--n-gpu-layers 0"; do
      # shellcheck disable=SC2086
      g=$(TERN_STATE_HASH=1 "$bin" run -m "$gm" --ids "$gi" -n "$gn" --temp 0 --print-ids -c 256 --device vulkan:0 $o \
        2>"$tmp/err") || fail "$o: $(cat "$tmp/err")"
      n_host=4
      case "$o" in --gpu-layers\ 1*) n_host=3 ;; esac
      grep -q "weight matrices of $n_host of 4 layers in host memory" "$tmp/err" || fail "$o does not say it: $(cat "$tmp/err")"
      [ "$g" = "$c" ] || fail "$(basename "$gm") $o: greedy ids '$g' vs the cpu's '$c'"
      h=$(grep state-hash "$tmp/err") || fail "$o: no state hash"
      case "$o" in --gpu-layers\ 1*) [ -z "$h0" ] && h0=$h; [ "$h" = "$h0" ] || fail "$o: another state: $h vs $h0" ;; esac
    done
  done
  "$bin" run -m "$mm" --ids "1" -n 1 --device vulkan:0 --gpu-layers some 2>"$tmp/err" >/dev/null; rc=$?
  [ $rc -eq 2 ] && grep -q "bad --gpu-layers" "$tmp/err" || fail "--gpu-layers some: exit $rc, $(cat "$tmp/err")"
  "$bin" run -m "$mm" --ids "1" -n 1 --device cpu --gpu-layers 2 2>"$tmp/err" >/dev/null || fail "--gpu-layers on the cpu"
  grep -q "ignored" "$tmp/err" || fail "--gpu-layers on the cpu: not said: $(cat "$tmp/err")"
  echo "ok --gpu-layers 1 and 0: said at start, the cpu's greedy ids, one state token by token and in chunks"
elif [ "${TERN_REQUIRE_SHARED:-0}" = 1 ]; then
  fail "TERN_REQUIRE_SHARED=1 but $shared/models/stories260K.gguf is missing"
fi

m=$tmp/tiny-qwen3.gguf
ref=$("$bin" run -m "$m" --ids "1 2 3" -n 6 --temp 0 --print-ids --device cpu 2>/dev/null)
# TERN_DEVICE chooses the device when --device is absent; --device wins over it
e=$(TERN_DEVICE=vulkan:0 "$bin" run -m "$m" --ids "1 2 3" -n 6 --temp 0 --print-ids -c 64 2>"$tmp/err") || fail "TERN_DEVICE run"
grep -q "on vulkan:0" "$tmp/err" && [ "$e" = "$ref" ] || fail "TERN_DEVICE=vulkan:0: '$e' vs '$ref': $(cat "$tmp/err")"
TERN_DEVICE=vulkan:0 "$bin" run -m "$m" --ids "1 2 3" -n 2 --temp 0 -c 64 --device cpu 2>"$tmp/err" >/dev/null || fail "cpu over env"
grep -q "on vulkan" "$tmp/err" && fail "--device cpu did not override TERN_DEVICE"
# auto says what it chose and why (lavapipe, a CPU implementation, is used only when named)
a=$("$bin" run -m "$m" --ids "1 2 3" -n 6 --temp 0 --print-ids -c 64 --device auto 2>"$tmp/err") || fail "auto run"
grep -q "^device: auto: " "$tmp/err" || fail "auto does not say which device: $(cat "$tmp/err")"
[ "$a" = "$ref" ] || fail "auto: '$a' vs '$ref'"
# the decode speed line, and text output, on the GPU
"$bin" run -m "$m" --prompt "hello" -n 4 --temp 0 -c 64 --device vulkan:0 >"$tmp/out" 2>"$tmp/err" || fail "text run on the GPU"
grep -q "decode: .* t/s" "$tmp/err" || fail "no speed line: $(cat "$tmp/err")"
# --dump-logits on the GPU: [n_prompt][n_vocab] float32, the same size as the CPU's
"$bin" run -m "$m" --ids "5 6 7" -n 0 --dump-logits "$tmp/c.f32" --device cpu >/dev/null 2>&1 || fail "cpu dump"
"$bin" run -m "$m" --ids "5 6 7" -n 0 --dump-logits "$tmp/g.f32" -c 64 --device vulkan:0 >/dev/null 2>&1 || fail "gpu dump"
[ "$(stat -c %s "$tmp/g.f32")" -eq "$(stat -c %s "$tmp/c.f32")" ] || fail "gpu dump size differs"

# errors: a bad value, a device that is not there, --spec mtp without a head, a prompt past the context
"$bin" run -m "$m" --ids "1" -n 1 --device gpu 2>"$tmp/err" >/dev/null; rc=$?
[ $rc -eq 2 ] && grep -q "cpu, vulkan, vulkan:N, auto" "$tmp/err" || fail "bad --device: exit $rc, $(cat "$tmp/err")"
"$bin" run -m "$m" --ids "1" -n 1 --device vulkan:9 2>"$tmp/err" >/dev/null; rc=$?
[ $rc -eq 1 ] && grep -q "no such device" "$tmp/err" || fail "vulkan:9: exit $rc, $(cat "$tmp/err")"
"$bin" run -m "$m" --ids "1" -n 1 --spec mtp --device vulkan:0 2>"$tmp/err" >/dev/null; rc=$?
[ $rc -eq 1 ] && grep -q "no MTP block" "$tmp/err" || fail "--spec mtp without a head on the GPU: exit $rc, $(cat "$tmp/err")"
"$bin" run -m "$m" --ids "1 2 3 4 5 6 7 8" -c 4 -n 1 --device vulkan:0 2>"$tmp/err" >/dev/null; rc=$?
[ $rc -eq 1 ] && grep -q "8" "$tmp/err" && grep -q "4" "$tmp/err" || fail "too-long prompt on the GPU: exit $rc, $(cat "$tmp/err")"
# a context the device cannot hold: run and the server refuse it at start with the sizes
# (one session's whole context must fit; sessions then take their KV pages as they grow)
for args in "" "--spec ngram"; do
  # shellcheck disable=SC2086
  "$bin" run -m "$m" --ids "1 2 3" -n 1 -c 16777216 --device vulkan:0 $args 2>"$tmp/err" >/dev/null; rc=$?
  [ $rc -eq 1 ] && grep -q "KV cache of 16777216 positions needs .* MiB .* MiB left of" "$tmp/err" ||
    fail "run $args with a context larger than the device: exit $rc, $(cat "$tmp/err")"
done
timeout 120 "$bin" serve --model "$m" --ctx-size 16777216 --device vulkan:0 --port 0 2>"$tmp/err" >/dev/null; rc=$?
[ $rc -eq 1 ] && grep -q "KV cache of 16777216 positions needs .* MiB .* MiB left of" "$tmp/err" ||
  fail "serve with a context larger than the device: exit $rc, $(cat "$tmp/err")"
# (a device that says it has 64 MiB: the weights fit, a filled context of 4M positions does not)
TERN_TEST_VK_DEVICE_BYTES=67108864 "$bin" bench -m "$m" -p 8 -n 2 -r 1 --ctx-fill 4194304 --device vulkan:0 2>"$tmp/err" >/dev/null; rc=$?
[ $rc -eq 1 ] && grep -q "KV cache of 4194560 positions needs .* MiB .* MiB left of" "$tmp/err" ||
  fail "bench with a context larger than the device: exit $rc, $(cat "$tmp/err")"
echo "ok a context larger than the device: refused at start by run, the server and bench"

# tern bench on the device: the CPU's runs in a session there, a filled context too
"$bin" bench -m "$m" -p 16 -n 4 -r 1 --ctx-fill 40 --device vulkan:0 --json >"$tmp/b.json" 2>"$tmp/err" ||
  fail "bench --device vulkan:0 --ctx-fill: $(cat "$tmp/err")"
grep -q '"device":"vulkan:0 ' "$tmp/b.json" && grep -q '"ctx_fill":40,' "$tmp/b.json" && grep -Eq '"tg_tps":[1-9]' "$tmp/b.json" ||
  fail "bench --device json: $(cat "$tmp/b.json")"
echo "ok tern bench --device vulkan:0 --ctx-fill 40"

# --spec on the device (the sessions there, drafts verified there; a hybrid's state trail
# in device memory): prompt lookup and the oracle (all accepted, all rejected, half with
# drafts of 3, so rewinds land inside the trail) print the ids of --spec off on the device
# and end in one state
"$bin" mkmodel --preset tiny-qwen35 --n-layer 4 --out "$tmp/q35.gguf" >/dev/null 2>&1 || fail "mkmodel tiny-qwen35"
for sm in "$tmp/q35.gguf" "$m"; do
  [ "$sm" = "$m" ] && ! full && continue
  srun() { TERN_STATE_HASH=1 "$bin" run -m "$sm" -p "Once upon a time, there was a little girl. Once upon a time" \
    -n 40 --temp 0 -c 256 --print-ids --device vulkan:0 "$@"; }
  srun --spec off >"$tmp/off.ids" 2>"$tmp/off.err" || fail "$sm: --spec off on the GPU: $(cat "$tmp/off.err")"
  ids=$(tr -s " " "," <"$tmp/off.ids")
  h0=$(grep state-hash "$tmp/off.err") || fail "$sm: --spec off on the GPU: no state hash"
  for args in "--spec ngram" "--spec-oracle 0:$ids" "--spec-oracle 100:$ids" "--spec-oracle 50:$ids --spec-max 3"; do
    # shellcheck disable=SC2086
    srun $args >"$tmp/spec.ids" 2>"$tmp/spec.err" || fail "$sm: $args on the GPU: $(cat "$tmp/spec.err")"
    grep -q "^device: vulkan:0" "$tmp/spec.err" || fail "$sm: $args did not run on vulkan:0: $(cat "$tmp/spec.err")"
    cmp -s "$tmp/off.ids" "$tmp/spec.ids" || fail "$sm: $args printed other ids than --spec off on the GPU"
    h=$(grep state-hash "$tmp/spec.err") || fail "$sm: $args: no state hash"
    [ -z "$h0" ] && h0=$h
    [ "$h" = "$h0" ] || fail "$sm: $args ended in another state: $h vs $h0"
    line=$(grep -o 'drafted=[0-9]* accepted=[0-9]*' "$tmp/spec.err") || fail "$sm: $args: no drafted="
    case "$args" in
      --spec-oracle\ 0:*) echo "$line" | grep -Eq "drafted=([1-9][0-9]*) accepted=\1$" || fail "$sm: the right oracle: $line" ;;
      --spec-oracle\ 100:*) echo "$line" | grep -Eq "drafted=[1-9][0-9]* accepted=0$" || fail "$sm: the wrong oracle: $line" ;;
      --spec-oracle\ 50:*) echo "$line" | grep -Eq "accepted=[1-9]" || fail "$sm: half the oracle: $line" ;;
    esac
  done
  echo "ok $(basename "$sm"): --spec ngram and the oracle on vulkan:0 print the ids of --spec off, its state"
done
# --spec mtp on the device (the head there too, reading the hidden states the device
# forward captures): a random head (drafts rejected) and an echo head (accepted), at
# drafts of 1, 4 and 8, print the ids of --spec off there and end in one state
"$bin" mkmodel --preset tiny-qwen35 --n-layer 4 --mtp 1 --out "$tmp/mtp.gguf" >/dev/null 2>&1 || fail "mkmodel --mtp"
"$bin" mkmodel --preset tiny-qwen35 --n-layer 4 --mtp 1 --mtp-echo --tied --out "$tmp/echo.gguf" >/dev/null 2>&1 ||
  fail "mkmodel --mtp-echo"
for sm in "$tmp/mtp.gguf" "$tmp/echo.gguf"; do
  [ "$sm" = "$tmp/mtp.gguf" ] && ! full && continue
  srun() { TERN_STATE_HASH=1 "$bin" run -m "$sm" -p "Once upon a time, there was a little girl. Once upon a time" \
    -n 40 --temp 0 -c 256 --print-ids --device vulkan:0 "$@"; }
  srun --spec off >"$tmp/off.ids" 2>"$tmp/off.err" || fail "$sm: --spec off on the GPU: $(cat "$tmp/off.err")"
  h0=
  for args in "--spec mtp --spec-max 1" "--spec mtp --spec-max 4" "--spec mtp"; do
    # shellcheck disable=SC2086
    srun $args >"$tmp/spec.ids" 2>"$tmp/spec.err" || fail "$sm: $args on the GPU: $(cat "$tmp/spec.err")"
    cmp -s "$tmp/off.ids" "$tmp/spec.ids" || fail "$sm: $args printed other ids than --spec off on the GPU"
    h=$(grep state-hash "$tmp/spec.err") || fail "$sm: $args: no state hash"
    [ -z "$h0" ] && h0=$h
    [ "$h" = "$h0" ] || fail "$sm: $args ended in another state: $h vs $h0"
    line=$(grep -o 'spec mtp: drafted=[0-9]* accepted=[0-9]*' "$tmp/spec.err") || fail "$sm: $args: no mtp stats"
    echo "$line" | grep -Eq "drafted=[1-9]" || fail "$sm: $args drafted nothing: $line"
    case "$sm" in *echo*) echo "$line" | grep -Eq "accepted=[1-9]" || fail "$sm: the echo head's drafts: $line" ;; esac
  done
  echo "ok $(basename "$sm"): --spec mtp on vulkan:0 prints the ids of --spec off, one state"
done

# an MTP head on a MoE model whose routed experts all stay in host memory (--cpu-moe): the
# head's stay there too (it says so), and --spec mtp prints the ids of --spec off in that
# configuration and ends in its state (an echo head: drafts accepted)
"$bin" mkmodel --preset tiny-qwen35moe --n-layer 4 --mtp 1 --mtp-echo --tied --out "$tmp/moemtp.gguf" >/dev/null 2>&1 ||
  fail "mkmodel tiny-qwen35moe --mtp-echo"
mrun() { TERN_STATE_HASH=1 "$bin" run -m "$tmp/moemtp.gguf" -p "Once upon a time, there was a little girl. Once upon a time" \
  -n 24 --temp 0 -c 256 --print-ids --device vulkan:0 --cpu-moe "$@"; }
mrun --spec off >"$tmp/off.ids" 2>"$tmp/off.err" || fail "MoE head --spec off: $(cat "$tmp/off.err")"
mrun --spec mtp >"$tmp/spec.ids" 2>"$tmp/spec.err" || fail "MoE head --spec mtp: $(cat "$tmp/spec.err")"
grep -q "MTP head's routed experts in host memory" "$tmp/spec.err" || fail "the MoE head's experts: $(cat "$tmp/spec.err")"
cmp -s "$tmp/off.ids" "$tmp/spec.ids" || fail "MoE head --cpu-moe: --spec mtp printed other ids than --spec off"
[ "$(grep state-hash "$tmp/off.err")" = "$(grep state-hash "$tmp/spec.err")" ] || fail "MoE head --cpu-moe: another state"
grep -Eq "spec mtp: drafted=[1-9][0-9]* accepted=[1-9]" "$tmp/spec.err" || fail "MoE head's drafts: $(grep drafted "$tmp/spec.err")"
echo "ok --cpu-moe keeps the MTP head's experts in host memory too; --spec mtp prints the ids of --spec off"

# no Vulkan loader: vulkan names what is missing; auto runs on the CPU and says why
TERN_VULKAN_LOADER=/nonexistent/libvulkan.so.1 "$bin" run -m "$m" --ids "1 2 3" -n 6 --temp 0 --device vulkan 2>"$tmp/err" >/dev/null; rc=$?
[ $rc -eq 1 ] && grep -q "no Vulkan loader" "$tmp/err" && grep -q "apt-get install" "$tmp/err" || fail "no loader, vulkan: exit $rc, $(cat "$tmp/err")"
n=$(TERN_VULKAN_LOADER=/nonexistent/libvulkan.so.1 "$bin" run -m "$m" --ids "1 2 3" -n 6 --temp 0 --print-ids --device auto 2>"$tmp/err") || fail "no loader, auto: $(cat "$tmp/err")"
grep -q "device: auto: the CPU (no Vulkan" "$tmp/err" && [ "$n" = "$ref" ] || fail "no loader, auto: '$n', $(cat "$tmp/err")"
echo "PASS"
