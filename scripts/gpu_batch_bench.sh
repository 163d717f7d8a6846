#!/usr/bin/env bash
# Batched decode on the H200 (issue 20; docs/benchmarks.md "Batched decode"): the
# Qwen3-30B-A3B shape (real config, all 48 layers, random 4-bit weights), B = 1,2,4,8,
# the model's own routing and the real Qwen3-30B-A3B trace (each row at another offset),
# a 4 GiB expert cache, every bench inside a cgroup with memory.max = CAP_GIB (8) of host
# memory (page cache included), --batch-check (each row rerun alone: tokens that differ).
#
#   scripts/gpu_batch_bench.sh OUTDIR
#
# Environment: MODEL (/root/q30), CAP_GIB (8), CACHE (4G), BATCH (1,2,4,8),
# DECODE_TOKENS (48), PROMPT_TOKENS (64), ROUTING (model,trace), CHECK (1: --batch-check),
# PYTHON (python3). One routing fits a 10-minute device call (kernel compilation ~3 min on
# a fresh machine, the build ~40 s): ROUTING=trace first, then ROUTING=model.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_batch_bench.sh OUTDIR}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
MODEL=${MODEL:-/root/q30}
CAP_GIB=${CAP_GIB:-8}
export SSDMOE_HOME=${SSDMOE_HOME:-/root/ssdmoe-home} PYTHONUNBUFFERED=1
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1
  "$PY" -c 'import mlx.core as mx, mlx_lm; print("mlx", mx.__version__, mx.default_device(), "mlx-lm", mlx_lm.__version__)'
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" >&2
args=(scripts/batch_bench.py --out "$OUT" --model "$MODEL"
  --config tests/fixtures/models/qwen3-30b-a3b/config.json --cache "${CACHE:-4G}"
  --batch "${BATCH:-1,2,4,8}" --decode-tokens "${DECODE_TOKENS:-48}"
  --prompt-tokens "${PROMPT_TOKENS:-64}" --routing "${ROUTING:-model,trace}")
[ "${CHECK:-1}" = 1 ] && args+=(--check)
# the checkpoint is built uncapped (16 GiB written once)
"$PY" "${args[@]}" --build-only 2>&1 | tee "$OUT/build.log" >&2 || exit 1
sync
# A process that meets new kernel shapes compiles them (MLX-CUDA JIT) and holds ~3 GiB more
# anonymous memory while it does (4.6 GiB against 1.3 sampled, 2026-12-02): at an 8 GiB cap
# that process was OOM-killed. So the same shapes run once uncapped, short, first
# (WARMUP=0 skips it); the compiled kernels stay on the machine for the capped runs.
if [ "${WARMUP:-1}" = 1 ]; then
  "$PY" scripts/batch_bench.py --out "$OUT/warmup" --model "$MODEL" --cache "${CACHE:-4G}" \
    --batch "${BATCH:-1,2,4,8}" --decode-tokens 24 --prompt-tokens "${PROMPT_TOKENS:-64}" \
    --routing "${ROUTING:-model,trace}" > "$OUT/warmup.log" 2>&1
  echo "uncapped warm-up (kernel compilation) exit $?" >&2
fi
cg=""
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory > /sys/fs/cgroup/cgroup.subtree_control
  cg=/sys/fs/cgroup/ssdmoe-batch; mkdir -p "$cg"
  echo $(( CAP_GIB << 30 )) > "$cg/memory.max"; echo 0 > "$cg/memory.swap.max" 2>/dev/null || true
  echo "cgroup v2 $cg: memory.max $(cat "$cg/memory.max")" >&2
else
  echo "no cgroup v2 memory controller: running UNCAPPED" >&2
fi
if [ -n "$cg" ]; then
  bash -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$PY" "${args[@]}" 2>&1 | tee "$OUT/bench.log"
else
  "$PY" "${args[@]}" 2>&1 | tee "$OUT/bench.log"
fi
rc=${PIPESTATUS[0]}
[ -n "$cg" ] && cat "$cg/memory.peak" > "$OUT/memory.peak" 2>/dev/null
exit "$rc"
