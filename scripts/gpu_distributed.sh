#!/usr/bin/env bash
# Expert-parallel on two GPUs of one host (issue 25, docs/distributed.md "GPU"): one GPU
# with the whole expert cache against two ranks (one GPU each) with half of it each,
# over NCCL and over the ring backend, at K=8 and 4, cold and warm. Run on the
# nvidia-h200-x2 machine from the repository root, with mlx-cuda, mlx-lm and the
# project's pure-Python dependencies importable (../shared/tools/device-mlx-cuda.md:
# the mlx-cuda-13 wheel travels in two parts).
#
#   scripts/gpu_distributed.sh OUTDIR
#
# Steps (STEPS, default build,one,nccl,ring,table; each writes into OUTDIR as it ends,
# so a timeout keeps what finished, and a warm machine can take them over two calls):
#   build  the random Qwen3.5-35B-A3B-shaped checkpoint at MODEL (LAYERS of its 40 MoE
#          layers), unless it exists;
#   one    `ssdmoe bench` on GPU 0 alone, expert cache CACHE (cold, then warm);
#   nccl   `ssdmoe launch -n 2 --backend nccl ... bench --distributed`, CACHE/2 per rank
#          (mlx.launch gives rank r CUDA_VISIBLE_DEVICES=r);
#   ring   the same over the ring backend (loopback TCP; each rank is pinned to its GPU
#          here, since mlx.launch's ring launcher pins nothing);
#   table  one markdown table from the JSONs: decode tok/s, ms/token, per-rank requested
#          and device MiB/token, hit rate, all_sum ms/token and one all_sum alone,
#          same tokens as one GPU, speed-up over one GPU.
# Environment: MODEL (/root/q35d), CONFIG (tests/fixtures/models/qwen3.5-35b-a3b/
# config.reconstructed.json), TOKENIZER (tests/fixtures/models/qwen3-30b-a3b), LAYERS
# (8), CACHE (1G: the expert set of 8 layers is ~3.4 GiB, so one GPU caches ~30 % of
# it and two GPUs ~60 %), KS (8,4), MODES (cold,warm), PROMPT_TOKENS (32),
# DECODE_TOKENS (48), DEADLINE_S (560), PYTHON (python3), PORT (42323).
# NCCL_NVLS_ENABLE=0 stays set (the machine's rule: no NVLink multicast).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_distributed.sh OUTDIR}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
MODEL=${MODEL:-/root/q35d}
CONFIG=${CONFIG:-tests/fixtures/models/qwen3.5-35b-a3b/config.reconstructed.json}
TOKENIZER=${TOKENIZER:-tests/fixtures/models/qwen3-30b-a3b}
LAYERS=${LAYERS:-8}
CACHE=${CACHE:-1G}
KS=${KS:-8,4}
MODES=${MODES:-cold,warm}
PROMPT_TOKENS=${PROMPT_TOKENS:-32}
DECODE_TOKENS=${DECODE_TOKENS:-48}
DEADLINE_S=${DEADLINE_S:-560}
PORT=${PORT:-42323}
STEPS=${STEPS:-build,one,nccl,ring,table}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SSDMOE_HOME=${SSDMOE_HOME:-/root/ssdmoe-home} PYTHONUNBUFFERED=1
want() { [[ ",$STEPS," == *",$1,"* ]]; }
start=$(date +%s)
left() { echo $(( DEADLINE_S - ($(date +%s) - start) )); }
log() { echo "[gpu_distributed +$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/steps.log" >&2; }
half=$("$PY" -c 'import sys; from ssdmoe_tui.options import parse_bytes; print(parse_bytes(sys.argv[1], "CACHE") // 2)' "$CACHE") \
  || { log "bad CACHE $CACHE"; exit 2; }

{
  echo "date: $(date -u +%FT%TZ)"; uname -a
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1
  nvidia-smi topo -m 2>&1 | head -8
  nproc; free -g; df -h /root | tail -1
  "$PY" -c 'import mlx.core as mx, mlx_lm; print("mlx", mx.__version__, mx.default_device(), "cuda", mx.cuda.is_available()); print("mlx-lm", mlx_lm.__version__)'
  echo "CACHE $CACHE (one GPU) = 2 x $half bytes (two ranks); KS $KS; MODES $MODES; LAYERS $LAYERS"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" >&2

# ---- the native reader for this Python (the one built here is for another version)
so=$("$PY" -c 'import sysconfig; print("ssdmoe_tui/engine/experts/_ssdmoe_reader" + sysconfig.get_config_var("EXT_SUFFIX"))')
if [ ! -f "$so" ] && command -v cc >/dev/null; then
  cc $(cat native/cflags.txt) -shared -fPIC -pthread -o "$so" native/ssdmoe_reader.c && log "built $so"
fi

# ---- build
if want build && [ ! -f "$MODEL/config.json" ]; then
  log "building $MODEL from $CONFIG ($LAYERS layers)"
  timeout "$(( $(left) - 60 ))" "$PY" -m ssdmoe_tui.cli demo-model --config "$CONFIG" --out "$MODEL" \
    --layers "$LAYERS" --tokenizer "$TOKENIZER" --shard-size 4G > "$OUT/build.log" 2>&1
  rc=$?; log "build exit $rc; $(du -sh "$MODEL" 2>/dev/null | cut -f1)"
  [ "$rc" = 0 ] || { tail -5 "$OUT/build.log" >&2; exit 1; }
fi
sync

bench_args() {  # bench_args MODE: the flags every configuration shares
  local cold=(); [ "$1" = cold ] && cold=(--cold)
  echo --model "$MODEL" --k "$KS" --prompt-tokens "$PROMPT_TOKENS" --decode-tokens "$DECODE_TOKENS" \
    --baseline skip "${cold[@]}"
}

# ---- one GPU, the whole cache
if want one; then
  for mode in ${MODES//,/ }; do
    [ "$(left)" -gt 60 ] || { log "one-$mode skipped: deadline"; continue; }
    log "one GPU, $mode, cache $CACHE"
    # shellcheck disable=SC2046
    CUDA_VISIBLE_DEVICES=0 timeout "$(( $(left) - 20 ))" "$PY" -m ssdmoe_tui.cli bench $(bench_args "$mode") \
      --expert-cache "$CACHE" --json "$OUT/one-$mode.json" > "$OUT/one-$mode.txt" 2> "$OUT/one-$mode.err"
    log "one-$mode exit $?"
  done
fi

# ---- two GPUs, half the cache each
two() {  # two BACKEND MODE
  local backend=$1 mode=$2 p=$PORT
  [ "$(left)" -gt 90 ] || { log "$backend-$mode skipped: deadline"; return; }
  log "two ranks over $backend, $mode, cache $half bytes per rank"
  local cmd=("$PY" -m ssdmoe_tui.cli bench --distributed $(bench_args "$mode") --expert-cache "$half"
    --json "$OUT/$backend-$mode.json")
  if [ "$backend" = ring ]; then  # pin rank r to GPU r (the nccl launcher does it itself)
    cmd=(/bin/sh -c 'CUDA_VISIBLE_DEVICES=$MLX_RANK exec "$@"' sh "${cmd[@]}")
  fi
  timeout "$(( $(left) - 20 ))" "$PY" -m ssdmoe_tui.cli launch -n 2 --backend "$backend" \
    --starting-port "$p" --nccl-port "$(( p + 10 ))" --env NCCL_NVLS_ENABLE=0 "${cmd[@]}" \
    > "$OUT/$backend-$mode.txt" 2> "$OUT/$backend-$mode.err"
  log "$backend-$mode exit $? (the ranks' status, through ssdmoe launch)"
  PORT=$(( PORT + 20 ))
}
for backend in nccl ring; do
  want "$backend" || continue
  for mode in ${MODES//,/ }; do two "$backend" "$mode"; done
done

# ---- table
if want table; then
  "$PY" - "$OUT" "$MODES" > "$OUT/table.md" <<'EOF'
import json
import sys
from pathlib import Path

out, modes = Path(sys.argv[1]), sys.argv[2].split(",")


def configs(name):
    f = out / f"{name}.json"
    if not f.exists():
        return {}
    return {c["k"]: c for c in json.loads(f.read_text()).get("configs", []) if "k" in c}


def ms(c):
    t = c.get("ms_per_token", {})
    return t.get("total") if isinstance(t, dict) else None


print("| mode | run | K | decode tok/s | ms/token | per-rank requested MiB/tok | per-rank device MiB/tok "
      "| hit | all_sum ms/tok | one all_sum alone | same tokens as 1 GPU | vs 1 GPU |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for mode in modes:
    one = configs(f"one-{mode}")
    for run in ("one", "nccl", "ring"):
        got = configs(f"{run}-{mode}")
        for k, c in sorted(got.items(), reverse=True):
            tok_s = c.get("decode_tok_s")
            d = c.get("distributed") or {}
            per = d.get("per_rank") or []
            req = " / ".join(f"{r.get('requested_mib_per_token') or 0:.2f}" for r in per) or (
                f"{c.get('requested_mib_per_token') or 0:.2f}")
            dev = " / ".join(f"{r.get('device_mib_per_token') or 0:.2f}" for r in per) or (
                f"{c.get('device_mib_per_token') or 0:.2f}")
            hit = d.get("hit_rate", c.get("hit_rate"))
            base = one.get(k)
            same = "–" if run == "one" or base is None else (
                "yes" if base.get("token_ids") == c.get("token_ids") else "NO")
            ratio = "–"
            if run != "one" and base is not None and base.get("decode_tok_s") and tok_s:
                ratio = f"{tok_s / base['decode_tok_s']:.2f}x"
            lat = d.get("all_sum_latency_us")
            print(f"| {mode} | {run} | {k} | {tok_s or 0:.2f} | {ms(c) or 0:.1f} | {req} | {dev} "
                  f"| {'' if hit is None else f'{hit:.1%}'} | {d.get('all_sum_ms_per_token', '–')} "
                  f"| {'–' if lat is None else f'{lat:.0f} µs'} | {same} | {ratio} |")
EOF
  cat "$OUT/table.md" >&2
fi
log "done"
