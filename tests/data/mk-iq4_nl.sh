#!/usr/bin/env bash
# Regenerates iq4_nl-ggml.{json,bin}: IQ4_NL blocks written by the reference engine's
# quantizer (llama-quantize, no imatrix) and the floats ggml's dequantize_row_iq4_nl makes
# of them (llama-quantize --allow-requantize ... F32), for test-quant's bit-exact check.
# No kit file holds IQ4_NL, and tests must not depend on the reference engine (it is a
# measuring instrument: ../shared/reference/README.md), so its output is kept here as a
# small fixture (a few KiB) that every test run reads, with or without the kit.
#
#   tests/data/mk-iq4_nl.sh [path/to/shared] [path/to/tern]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
shared=${1:-$here/../../../shared}
tern=${2:-$here/../../build/tern}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run="$shared/reference/llama.cpp/run"
src="$shared/models/tiny-qwen3-f32.gguf"
"$run" llama-quantize "$src" "$tmp/nl.gguf" IQ4_NL 1 >"$tmp/q.log" 2>&1
"$run" llama-quantize --allow-requantize "$tmp/nl.gguf" "$tmp/deq.gguf" F32 1 >"$tmp/d.log" 2>&1
"$tern" inspect "$tmp/nl.gguf" --json >"$tmp/nl.json"
"$tern" inspect "$tmp/deq.gguf" --json >"$tmp/deq.json"
python3 - "$tmp" "$here" "$(sha256sum "$src" | cut -d' ' -f1)" <<'PY'
import json, sys
tmp, out, sha = sys.argv[1:4]
nl, deq = (json.load(open(f"{tmp}/{n}.json")) for n in ("nl", "deq"))
nlb, deqb = (open(f"{tmp}/{n}.gguf", "rb").read() for n in ("nl", "deq"))
def tensor(doc, name):
    return next(t for t in doc["tensors"] if t["name"] == name)
# (tensor, first row, rows): the embedding's first rows, a 768-column matrix, the last rows
# of another one.
picks = [("token_embd.weight", 0, 8), ("blk.0.ffn_down.weight", 0, 4), ("blk.3.ffn_up.weight", 764, 4)]
blob, entries = bytearray(), []
for name, r0, n in picks:
    tq, tf = tensor(nl, name), tensor(deq, name)
    assert tq["type"] == "IQ4_NL" and tf["type"] == "F32", (name, tq["type"], tf["type"])
    cols = tq["shape"][0]
    rb = cols // 32 * 18
    q0 = nl["data_offset"] + tq["offset"] + r0 * rb
    f0 = deq["data_offset"] + tf["offset"] + r0 * cols * 4
    e = {"tensor": name, "n_cols": cols, "rows": [r0, r0 + n], "blocks_offset": len(blob), "blocks_bytes": n * rb}
    blob += nlb[q0:q0 + n * rb]
    e["f32_offset"] = len(blob)
    blob += deqb[f0:f0 + n * cols * 4]
    entries.append(e)
json.dump({"source": "llama-quantize IQ4_NL of models/tiny-qwen3-f32.gguf (sha256 " + sha + "), then "
           "llama-quantize --allow-requantize ... F32 (ggml dequantize_row_iq4_nl); reference engine of "
           "shared/reference (llama.cpp a135ec0ba); made by tests/data/mk-iq4_nl.sh",
           "format": "iq4_nl-ggml.bin: per entry, the IQ4_NL blocks of rows [r0, r1) at blocks_offset, then "
           "ggml's float32 little-endian values of the same rows at f32_offset",
           "entries": entries}, open(f"{out}/iq4_nl-ggml.json", "w"), indent=1)
open(f"{out}/iq4_nl-ggml.bin", "wb").write(blob)
PY
echo "wrote $here/iq4_nl-ggml.json and iq4_nl-ggml.bin"
