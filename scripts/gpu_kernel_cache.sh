#!/usr/bin/env bash
# Issue 43 item 5 on the H200: does a second process reuse MLX-CUDA's compiled kernels, and
# which of the two caches does it need? MLX compiles its kernels with NVRTC into PTX, kept in
# MLX_PTX_CACHE_DIR (ssdmoe points it at <cache>/mlx-ptx/<mlx version>: gpu_kernels.py); the
# driver turns PTX into machine code, kept in CUDA_CACHE_PATH (~/.nv/ComputeCache). Each run
# is one `ssdmoe generate` on the embedded demo (a chat prompt, 32 tokens) in a new process,
# its wall time, prefill and decode rates recorded:
#   fresh     both caches empty (what a CUDA user's first run costs; the machine's first)
#   kept      both kept from `fresh`
#   ptx-only  the PTX kept, the driver's cache emptied
#   drv-only  the driver's cache kept, the PTX emptied
#   kept2     both kept again (drift)
# Then the same fresh/kept pair on the Q30 shape when $Q30 exists (decode at 4G), which is
# what a real model's first reply costs. Results: $OUT/kernels.jsonl, one line a run.
#
#   OUT=/root/res/kc DEADLINE_S=500 bash scripts/gpu_kernel_cache.sh
set -u
OUT=${OUT:-/root/res/kc}
STEPS=${STEPS:-demo,q30}
DEADLINE_S=${DEADLINE_S:-500}
TAG=kernels
source "$(dirname "$0")/gpu_common.sh"
KC=${KC:-/root/kc}
PROMPT=${PROMPT:-"Tell me about the GNU General Public License."}

one() {  # one NAME PTXDIR DRVDIR SECONDS MODEL [args...]
  local name=$1 ptx=$2 drv=$3 secs=$4 model=$5; shift 5
  [ "$(left)" -gt 20 ] || { log "$name skipped: deadline"; return; }
  (( secs > $(left) - 10 )) && secs=$(( $(left) - 10 ))
  mkdir -p "$ptx" "$drv"
  local t0 t1 rc
  t0=$(date +%s.%N)
  MLX_PTX_CACHE_DIR=$ptx CUDA_CACHE_PATH=$drv CUDA_CACHE_MAXSIZE=4294967296 \
    timeout "$secs" "$PY" -m ssdmoe_tui.cli generate ${model:+--model "$model"} "$@" \
    --max-tokens 32 --ignore-eos --json "$PROMPT" > "$OUT/$name.json" 2> "$OUT/$name.err"
  rc=$?
  t1=$(date +%s.%N)
  "$PY" - "$name" "$rc" "$t0" "$t1" "$ptx" "$drv" "$OUT/$name.json" >> "$OUT/kernels.jsonl" <<'EOF'
import json, sys, pathlib
name, rc, t0, t1, ptx, drv, res = sys.argv[1:8]
def size(p):
    files = [f for f in pathlib.Path(p).rglob("*") if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)
row = {"run": name, "rc": int(rc), "wall_s": round(float(t1) - float(t0), 2),
       "ptx_files_bytes": size(ptx), "driver_files_bytes": size(drv)}
try:
    text = pathlib.Path(res).read_text().strip().splitlines()[-1]
    stats = json.loads(text)["stats"]
    row.update({k: stats.get(k) for k in ("prompt_tokens", "prefill_tok_s", "decode_tok_s")})
except Exception as exc:  # a run killed at its bound has no JSON: the row says so
    row["error"] = repr(exc)[:200]
print(json.dumps(row))
EOF
  log "$name rc=$rc $(tail -1 "$OUT/kernels.jsonl")"
}

if want demo; then
  rm -rf "$KC"
  one fresh "$KC/p1" "$KC/d1" 300 ""
  one kept "$KC/p1" "$KC/d1" 120 ""
  rm -rf "$KC/d2"; cp -r "$KC/p1" "$KC/p2"
  one ptx-only "$KC/p2" "$KC/d2" 200 ""
  rm -rf "$KC/p3"; cp -r "$KC/d1" "$KC/d3"
  one drv-only "$KC/p3" "$KC/d3" 200 ""
  one kept2 "$KC/p1" "$KC/d1" 120 ""
fi
if want q30 && [ -f "$Q30/config.json" ]; then
  one q30-fresh "$KC/q1" "$KC/qd1" 300 "$Q30" --expert-cache 4G
  one q30-kept "$KC/q1" "$KC/qd1" 200 "$Q30" --expert-cache 4G
fi
log "done"
