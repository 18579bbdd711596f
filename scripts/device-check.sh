#!/usr/bin/env bash
# The GPU check, in two halves (docs/gpu.md):
#
#   ./scripts/device-check.sh pack    here, on a CPU machine: builds tern and the Vulkan
#                                     test, and gathers into .device/ (git-ignored) what a
#                                     bare GPU machine lacks: the binaries, the shared
#                                     libraries they load (ldd), and the Vulkan loader
#                                     (libvulkan1, fetched with apt-get download).
#   ./scripts/device-check.sh run     there, with .device/ carried: puts the libraries on
#                                     the search path, finds NVIDIA's Vulkan driver, lists
#                                     the devices, runs the Vulkan tests on the GPU, and
#                                     writes the log under $OUT (or .device/out).
#
# One short prepared command on the GPU machine: `run` takes a few minutes (the device
# layer and kernel tests, greedy runs of generated qwen2 / MoE models on the GPU against
# the CPU, speculative decoding on the GPU, the benchmarks); it stays under 5 min.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
dev=.device

case "$mode" in
pack)
  ./scripts/deps.sh
  ./scripts/build.sh build -DTERN_TEST_HOOKS=ON # test-vulkan checks the other matmul lane count by a hook
  rm -rf "$dev" && mkdir -p "$dev/bin" "$dev/lib" "$dev/deb"
  cp build/tern build/test-vulkan build/bench-vulkan "$dev/bin/"
  # every shared library the binaries load, except the C library's own
  for b in "$dev"/bin/*; do
    ldd "$b" | awk '/=> \// {print $3}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|ld-linux*) ;;
      *) cp -L "$lib" "$dev/lib/" ;;
    esac
  done
  # the Vulkan loader (the driver comes with NVIDIA's installation there)
  (cd "$dev/deb" && apt-get download libvulkan1 2>&1 | grep -v "unsandboxed" >&2 || true)
  grep -qxF "/$dev/" .git/info/exclude 2>/dev/null || echo "/$dev/" >> .git/info/exclude
  du -sh "$dev" | awk '{print "packed " $1 " into .device/ (carry it: run(carry=[\".device\"]))"}'
  ;;
run)
  [ -d "$dev/bin" ] || { echo "no $dev/bin: run '$0 pack' on the CPU machine and carry .device" >&2; exit 2; }
  out=${OUT:-$dev/out}
  mkdir -p "$out" "$dev/root"
  for d in "$dev"/deb/*.deb; do [ -e "$d" ] && dpkg -x "$d" "$dev/root"; done
  export LD_LIBRARY_PATH="$PWD/$dev/lib:$PWD/$dev/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! ldconfig -p 2>/dev/null | grep -q libvulkan.so.1 && [ -e "$dev/root/usr/lib/x86_64-linux-gnu/libvulkan.so.1" ]; then
    export TERN_VULKAN_LOADER="$PWD/$dev/root/usr/lib/x86_64-linux-gnu/libvulkan.so.1"
  fi
  for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json \
             /etc/vulkan/icd.d/nvidia_icd.json; do
    if [ -e "$icd" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then export VK_DRIVER_FILES=$icd; fi
  done
  {
    echo "== $(date -u +%FT%TZ) $(uname -m) $(nproc) cores"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "== tern devices"
    "$dev/bin/tern" devices
    "$dev/bin/tern" devices --json
    echo "== test-vulkan (TERN_REQUIRE_VULKAN=1)"
    TERN_REQUIRE_VULKAN=1 "$dev/bin/test-vulkan"
    echo "== tern run --device: greedy ids on the GPU against the CPU's (generated F32 models, 2 layers)"
    for p in tiny-qwen2 tiny-qwen3moe tiny-qwen35moe; do
      f=/tmp/tern-$p.gguf
      "$dev/bin/tern" mkmodel --preset "$p" --n-layer 2 --type f32 --out "$f" >/dev/null 2>&1 || { echo "no preset $p"; continue; }
      c=$("$dev/bin/tern" run -m "$f" --ids "1 2 3 4 5 6 7 8" -n 16 --temp 0 --print-ids -c 256 --device cpu 2>/dev/null)
      g=$("$dev/bin/tern" run -m "$f" --ids "1 2 3 4 5 6 7 8" -n 16 --temp 0 --print-ids -c 256 --device vulkan 2>&1 >/tmp/tern-gpu-ids | grep "^model:"; cat /tmp/tern-gpu-ids)
      echo "$p: cpu [$c]"
      echo "$p: gpu $g"
      rm -f "$f" /tmp/tern-gpu-ids
    done
    echo "== tern run --device --spec: drafts verified on the GPU (the same ids as --spec off there)"
    f=/tmp/tern-echo.gguf
    "$dev/bin/tern" mkmodel --preset tiny-qwen35 --n-layer 2 --mtp 1 --mtp-echo --tied --out "$f" >/dev/null 2>&1
    for a in "--spec off" "--spec ngram" "--spec mtp"; do
      # shellcheck disable=SC2086
      ids=$("$dev/bin/tern" run -m "$f" --ids "1 2 3 4 5 6 7 8 1 2 3 4" -n 24 --temp 0 --print-ids -c 256 \
        --device vulkan $a 2>/tmp/tern-spec-err) || cat /tmp/tern-spec-err
      echo "$a: [$ids] $(grep -o 'drafted=[0-9]* accepted=[0-9]*' /tmp/tern-spec-err)"
    done
    rm -f "$f" /tmp/tern-spec-err
    echo "== bench-vulkan: per kernel, GB/s and GFLOP/s against the device's copy bandwidth"
    "$dev/bin/bench-vulkan"
    echo "== benchmarks: tern bench --device vulkan and --device cpu on generated real shapes"
    # an MoE shape too: Qwen3-30B-A3B's layers (128 experts, 8 used), 4 of its 48
    for spec in "qwen3-0.6b q8_0" "qwen3-0.6b q4_k_m" "${TERN_BENCH_BIG:-qwen3-8b q4_k_m}" "qwen3-30b-a3b q4_k_m 4"; do
      set -- $spec
      f=/tmp/tern-$1-$2.gguf
      "$dev/bin/tern" mkmodel --preset "$1" --type "$2" ${3:+--n-layer $3} --out "$f" >/dev/null 2>&1 || { echo "no preset $1"; continue; }
      "$dev/bin/tern" bench --model "$f" -p 512 -n 128 -r 2 --device vulkan
      "$dev/bin/tern" bench --model "$f" -p 512 -n 128 -r 2 --device cpu
      # partial offload: the MoE shape with two of its layers' experts on the CPU
      [ -n "${3:-}" ] && "$dev/bin/tern" bench --model "$f" -p 512 -n 128 -r 2 --device vulkan --n-cpu-moe 2
      # and the 8B shape with its last half's matrices on the CPU (--gpu-layers 18 of 36)
      [ "$1" = qwen3-8b ] && "$dev/bin/tern" bench --model "$f" -p 512 -n 128 -r 2 --device vulkan --gpu-layers 18
      # decode at a long context: attention split over the cache's pages (docs/gpu.md)
      [ "$1" = qwen3-8b ] && "$dev/bin/tern" bench --model "$f" -p 0 -n 64 -r 2 --device vulkan --ctx-fill 16384
      rm -f "$f"
    done
  } 2>&1 | tee "$out/device-check.log"
  ;;
*)
  echo "usage: $0 pack | run   (pack here, run on the GPU machine; see the top of this file)" >&2
  exit 2
  ;;
esac
