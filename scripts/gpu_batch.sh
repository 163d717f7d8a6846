#!/usr/bin/env bash
# Issue 32 on the H200 in one device call (~6 min on a warm machine whose /root/q30 exists
# and whose MLX-CUDA kernels for it are compiled; add ~40 s to build q30 and ~3 min of
# kernel compilation on a fresh one):
#
#   scripts/gpu_batch.sh OUTDIR
#
# e.g. one device call: `export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# SSDMOE_HOME=/root/ssdmoe-home && bash scripts/gpu_batch.sh /root/gb; cp -r /root/gb $OUT/`
# (wheels installed at /tmp/site as for scripts/gpu_speed.sh). The streamed layer's
# pipeline (SSDMOE_PIPELINE=auto) overlaps a step's reads with its hits' compute for
# calls of <= 63 rows (B x K): the trace step's B = 4 x K = 6 is one.
#
# Steps (STEPS picks them; each writes into OUTDIR as it finishes, so a timeout keeps what
# ran; a step that cannot finish before DEADLINE_S is skipped and says so):
#   q30    build the random Qwen3-30B-A3B-shaped checkpoint (48 layers) at Q30 if missing
#   vs     every expert held (64G: all 6144 slots, `auto`: managed), uncapped: the engine's batch
#          against mlx-lm's resident BatchGenerator in one process, B = 1,2,4,8, rounds
#          alternating (order of B and of the two flips each round) until VS_ROUNDS or
#          VS_S seconds after its warm-up, medians; the batch-invariant mode at B = INV_BATCH beside them;
#          then invariance: each row alone (ours: Runner.generate; mlx-lm's:
#          stream_generate), rows equal alone and the top-2 margin at each first flip
#          (scripts/batch_vs_mlx.py -> OUTDIR/batch_vs_mlx-held.json, vs.txt)
#   trace  the real Qwen3-30B-A3B trace (K = 6, row i at offset len(trace) i / B), a 4 GiB
#          expert cache, under a CAP_GIB (12) host-memory cap, B = 1,4: `bench --batch`
#          (aggregate and per-stream tok/s, MiB/token per sequence, join stall) after a
#          short uncapped compile pass (WARMUP_TOKENS, 32 a row: rows join one after
#          another, each in chunks sized to a time budget, and every row is held open
#          until the last has joined, so the pass always has steps of all B rows); then,
#          at each B > 1, a JOIN_TOKENS (1024) prompt joins the B decoding rows: JSON
#          batch[].join_probe (max_token_gap_s against median_token_gap_before_s,
#          max_join_stall_s; cut short after 240 s: bench/batch.py JOIN_PROBE_S) (OUTDIR/batch-trace.json, trace.txt)
# Environment: Q30 (/root/q30), CAP_GIB (12; 0: no cgroup), DEADLINE_S (360), VS_ROUNDS
# (12), VS_S (150), DECODE_TOKENS (48), PROMPT_TOKENS (64), INV_BATCH (4), TRACE_BATCH
# (1,4), TRACE_CACHE (4G), JOIN_TOKENS (1024; 0: no join probe), WARMUP (1), WARMUP_TOKENS
# (32), VS_ARGS (more batch_vs_mlx.py arguments for the vs step, e.g. "--bg-streamed
# --host-split": BatchGenerator over the engine's own layers and each side's host time per
# step, which place a gap in the loop or in the layer), INVARIANCE (1; 0: the vs step
# skips the rows-alone check, which on the H100 on 2026-12-05 ran ~300 s past its rounds
# and left the trace step no time), PYTHON (python3), STEPS (q30,vs,trace).
# On a CPU (the plumbing, small sizes): SMALL_LAYERS=4 SMALL_HIDDEN=128 build a small
# qwen3_moe with the trace's 128 experts at Q30 instead of the real shape, e.g.
#   Q30=/tmp/q-small SMALL_LAYERS=4 SMALL_HIDDEN=128 CAP_GIB=0 TRACE_CACHE=8M \
#   VS_ROUNDS=2 DECODE_TOKENS=32 PROMPT_TOKENS=32 JOIN_TOKENS=256 \
#   SSDMOE_HOME=/tmp/h PYTHON=.venv/bin/python bash scripts/gpu_batch.sh /tmp/gb
set -uo pipefail
OUT=${1:?usage: scripts/gpu_batch.sh OUTDIR}
CAP_GIB=${CAP_GIB:-12}
DEADLINE_S=${DEADLINE_S:-360}
STEPS=${STEPS:-q30,vs,trace}
TAG=gpu_batch
# the step filter, deadline, log, env.txt, defaults (Q30, TRACE, PY), the q30 build and
# the cgroup helpers: one copy
# shellcheck source=scripts/gpu_common.sh
source "$(dirname "$0")/gpu_common.sh"
# slot placement: what `auto` picks for users (every expert held: managed; the trace's 4 GiB
# under the cap, whose 16 GiB of experts cannot stay cached: host slots), unless
# SSDMOE_SLOT_PLACEMENT says otherwise (before 2026-12-06 this script pinned managed)

if want q30; then
  if [ -n "${SMALL_HIDDEN:-}" ] && [ ! -f "$Q30/config.json" ]; then
    log "building a small qwen3_moe at $Q30 (${SMALL_LAYERS:-4} layers, hidden $SMALL_HIDDEN)"
    "$PY" scripts/batch_bench.py --out "$OUT" --model "$Q30" --layers "${SMALL_LAYERS:-4}" \
      --hidden "$SMALL_HIDDEN" --build-only > "$OUT/build.log" 2>&1
    log "build exit $?"
  else
    build_q30_batch_bench
  fi
fi

# the vs and trace steps need the built Q30: without it batch_bench.py would build a small
# 12-layer model there (its CPU recipe) while a q30 build of another call may be writing it
# (2026-12-06: a background build from the call before raced the trace step's compile pass)
have_q30() { [ -f "$Q30/config.json" ] || { log "$1 skipped: no $Q30/config.json (the q30 step first)"; return 1; }; }

if want vs && have_q30 vs; then
  if [ "$(left)" -gt 150 ]; then
    log "vs: every expert held vs resident BatchGenerator, B 1,2,4,8, invariant mode at B ${INV_BATCH:-4}"
    timeout "$(( $(left) - 100 ))" "$PY" scripts/batch_vs_mlx.py --out "$OUT" --model "$Q30" \
      --tag held --expert-cache 64G --batch 1,2,4,8 --rounds "${VS_ROUNDS:-12}" \
      --deadline-s "${VS_S:-150}" --decode-tokens "${DECODE_TOKENS:-48}" \
      --prompt-tokens "${PROMPT_TOKENS:-64}" $([ "${INVARIANCE:-1}" = 0 ] || echo --invariance) --invariant-mode \
      --invariant-batch "${INV_BATCH:-4}" ${VS_ARGS:-} > "$OUT/vs.txt" 2> "$OUT/vs.err"
    log "vs exit $?"
  else log "vs skipped: deadline"; fi
fi

if want trace && have_q30 trace; then
  if [ "$(left)" -gt 80 ]; then
    if [ "${WARMUP:-1}" = 1 ]; then
      # the first process meeting these kernel shapes compiles them with ~3 GiB more
      # anonymous memory (docs/benchmarks.md): uncapped and short, so the capped one doesn't
      timeout "$(( $(left) - 70 ))" "$PY" scripts/batch_bench.py --out "$OUT/compile" \
        --model "$Q30" --cache "${TRACE_CACHE:-4G}" --batch "${TRACE_BATCH:-1,4}" \
        --decode-tokens "${WARMUP_TOKENS:-32}" \
        --prompt-tokens "${PROMPT_TOKENS:-64}" --routing trace > "$OUT/trace-compile.txt" 2>&1
      log "trace compile pass exit $?"
    fi
    if [ "$CAP_GIB" -gt 0 ]; then make_cg ssdmoe-gpu-batch "$CAP_GIB"; else cg=""; fi
    log "trace: ${TRACE_CACHE:-4G} cache, cap $CAP_GIB GiB ($([ -n "$cg" ] && echo "$cg" || echo UNCAPPED)), B ${TRACE_BATCH:-1,4}"
    run_capped "$(( $(left) - 5 ))" "$PY" scripts/batch_bench.py --out "$OUT" --model "$Q30" \
      --cache "${TRACE_CACHE:-4G}" --batch "${TRACE_BATCH:-1,4}" \
      --decode-tokens "${DECODE_TOKENS:-48}" --prompt-tokens "${PROMPT_TOKENS:-64}" \
      --join-tokens "${JOIN_TOKENS:-1024}" --routing trace > "$OUT/trace.txt" 2> "$OUT/trace.err"
    log "trace exit $?; cgroup peak $(cat "$peak_file" 2>/dev/null)"
  else log "trace skipped: deadline"; fi
fi
log "done"
