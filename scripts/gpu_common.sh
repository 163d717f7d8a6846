# Shared by scripts/gpu_speed.sh, gpu_pipeline.sh, gpu_batch.sh and gpu_spec.sh (sourced, not run): the
# step filter, the deadline, the log, the environment record, the checkpoint build and
# the memory-cgroup helpers, and the defaults they read. The sourcing script sets OUT,
# STEPS, DEADLINE_S and TAG (the log prefix) first.
PY=${PYTHON:-python3}
Q30=${Q30:-/root/q30}
Q35=${Q35:-/root/q35}
CAP_GIB=${CAP_GIB:-8}
CAP12_GIB=${CAP12_GIB:-12}
TRACE=${TRACE:-tests/fixtures/traces/bigmoeonedge-route-trace/2026-07-15-route-trace/qwen.route.csv}
want() { [[ ",$STEPS," == *",$1,"* ]]; }
export SSDMOE_HOME=${SSDMOE_HOME:-/root/ssdmoe-home} PYTHONUNBUFFERED=1
start=$(date +%s)
left() { echo $(( DEADLINE_S - ($(date +%s) - start) )); }
log() { echo "[${TAG:-gpu} +$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/steps.log" >&2; }

{
  echo "date: $(date -u +%FT%TZ)"; uname -a
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  nproc; free -g
  "$PY" -c 'import mlx.core as mx, mlx_lm; print("mlx", mx.__version__, mx.default_device()); print("mlx-lm", mlx_lm.__version__)'
  git log --oneline -1 2>/dev/null
} > "$OUT/env.txt" 2>&1

build() {  # build DIR CONFIG SECONDS
  [ -f "$1/config.json" ] && return 0
  log "building $1 from $2"
  timeout "$3" "$PY" -m ssdmoe_tui.cli demo-model --config "$2" --out "$1" \
    --tokenizer .benchcfg/qwen3-tokenizer --shard-size 4G > "$OUT/build-$(basename "$1").log" 2>&1
  log "build $1 exit $?; $(du -sh "$1" 2>/dev/null | cut -f1)"
}

build_q30_batch_bench() {  # Q30 from CONFIG as scripts/batch_bench.py builds it (gpu_batch, gpu_spec)
  [ -f "$Q30/config.json" ] && return 0
  log "building $Q30 from $CONFIG"
  timeout "$(( $(left) - 200 ))" "$PY" scripts/batch_bench.py --out "$OUT" --model "$Q30" \
    --config "$CONFIG" --build-only > "$OUT/build.log" 2>&1
  log "build exit $?; $(du -sh "$Q30" 2>/dev/null | cut -f1)"
}

cap=0; cg=""
make_cg() {  # make_cg NAME GIB
  cap=$(( $2 << 30 )); cg=""
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory > /sys/fs/cgroup/cgroup.subtree_control
    cg=/sys/fs/cgroup/$1; mkdir -p "$cg"
    echo "$cap" > "$cg/memory.max"; echo 0 > "$cg/memory.swap.max" 2>/dev/null || true
  fi
}
run_capped() {  # run_capped SECONDS CMD...
  local secs=$1; shift
  if [ -n "$cg" ]; then timeout "$secs" bash -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@"
  else timeout "$secs" "$@"; fi
}
sampler=""
sample_cg() {  # sample_cg FILE
  [ -n "$cg" ] || return 0
  ( while [ -d "$cg" ]; do
      echo "$(date +%s) $(grep -E '^(anon|file|kernel|shmem) ' "$cg/memory.stat" 2>/dev/null | tr '\n' ' ')"
      sleep 2
    done ) >> "$1" 2>/dev/null &
  sampler=$!
}
stop_sampler() { [ -n "$sampler" ] && kill "$sampler" 2>/dev/null; sampler=""; }

