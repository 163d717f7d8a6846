# Shared by scripts/gpu_bench.sh, gpu_speed.sh, gpu_pipeline.sh, gpu_batch.sh and gpu_spec.sh
# (sourced, not run): the step filter, the deadline, the log, the environment record, the
# checkpoint builds and the memory-cgroup helpers, and the defaults they read. The sourcing
# script sets OUT, STEPS, DEADLINE_S and TAG (the log prefix) first; OUT is made here.
mkdir -p "$OUT"
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
  nproc; free -g; df -h /root | tail -1
  grep -E 'MemTotal|MemAvailable' /proc/meminfo
  "$PY" -c 'import mlx.core as mx, mlx_lm; print("mlx", mx.__version__, mx.default_device(), mx.device_info()); print("mlx-lm", mlx_lm.__version__)'
  lsblk -o NAME,SIZE,ROTA,TYPE,MOUNTPOINT 2>/dev/null | head -20
  git log --oneline -1 2>/dev/null
} > "$OUT/env.txt" 2>&1

build() {  # build DIR CONFIG SECONDS
  [ -f "$1/config.json" ] && return 0
  log "building $1 from $2"
  timeout "$3" "$PY" -m ssdmoe_tui.cli demo-model --config "$2" --out "$1" \
    --tokenizer .benchcfg/qwen3-tokenizer --shard-size 4G > "$OUT/build-$(basename "$1").log" 2>&1
  log "build $1 exit $?; $(du -sh "$1" 2>/dev/null | cut -f1)"
}

build_q30_batch_bench() {  # Q30 as scripts/batch_bench.py builds it (gpu_batch, gpu_spec)
  [ -f "$Q30/config.json" ] && return 0
  local config=tests/fixtures/models/qwen3-30b-a3b/config.json
  log "building $Q30 from $config"
  timeout "$(( $(left) - 200 ))" "$PY" scripts/batch_bench.py --out "$OUT" --model "$Q30" \
    --config "$config" --build-only > "$OUT/build.log" 2>&1
  log "build exit $?; $(du -sh "$Q30" 2>/dev/null | cut -f1)"
}

# ---- cgroups with a host-memory cap (v2 memory.max or v1 memory.limit_in_bytes), one per run
cap=0; cg=""; peak_file=/dev/null
make_cg() {  # make_cg NAME GIB: sets cg (empty: no memory controller, runs go uncapped) and peak_file
  cap=$(( $2 << 30 )); cg=""; peak_file=/dev/null
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory > /sys/fs/cgroup/cgroup.subtree_control
    cg=/sys/fs/cgroup/$1; mkdir -p "$cg"
    echo "$cap" > "$cg/memory.max"; echo 0 > "$cg/memory.swap.max" 2>/dev/null || true
    peak_file=$cg/memory.peak; log "cgroup v2 $cg: memory.max $(cat "$cg/memory.max")"
  elif [ -d /sys/fs/cgroup/memory ]; then
    cg=/sys/fs/cgroup/memory/$1; mkdir -p "$cg"
    echo "$cap" > "$cg/memory.limit_in_bytes"; peak_file=$cg/memory.max_usage_in_bytes
    log "cgroup v1 $cg: limit $(cat "$cg/memory.limit_in_bytes")"
  else
    log "no cgroup memory controller: running UNCAPPED"
  fi
}
run_capped() {  # run_capped SECONDS CMD...: CMD inside the cap, killed after SECONDS
  local secs=$1; shift
  if [ -n "$cg" ]; then timeout "$secs" bash -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@"
  else timeout "$secs" "$@"; fi
}
sampler=""
sample_cg() {  # sample_cg FILE: the capped cgroup's memory split every 2 s, in the background
  [ -n "$cg" ] || return 0
  ( while [ -d "$cg" ]; do
      echo "$(date +%s) $(grep -E '^(anon|file|kernel|shmem|file_dirty|file_writeback) ' "$cg/memory.stat" 2>/dev/null | tr '\n' ' ')" \
        "$(grep -E '^(max|oom_kill) ' "$cg/memory.events" 2>/dev/null | tr '\n' ' ')"
      sleep 2
    done ) >> "$1" 2>/dev/null &
  sampler=$!
}
stop_sampler() { [ -n "$sampler" ] && kill "$sampler" 2>/dev/null; sampler=""; }

# SWEEP_ARGS: more bench arguments, e.g. "--prefetch both" (decode read-ahead off / on
# per K: at K = 2 a layer's ~1.5 misses are read one small batch after another, where
# reading the next layer's guesses beside the compute may pay when it did not at K = 8)
sweep_q35() {  # sweep_q35 MARGIN [NOTE]: the uniform-routing K sweep on Q35 (gpu_speed, gpu_pipeline)
  [ "$(left)" -gt 90 ] || { log "sweep skipped: deadline"; return; }
  make_cg ssdmoe-sweep "$CAP12_GIB"; sample_cg "$OUT/sweep.mem"
  log "sweep: uniform routing, K 8,4,2, 4G, cold, cap $CAP12_GIB GiB${2:+, $2} ${SWEEP_ARGS:-}"
  # shellcheck disable=SC2086 # SWEEP_ARGS is words on purpose
  run_capped "$(( $(left) - $1 ))" "$PY" -m ssdmoe_tui.cli bench --model "$Q35" --k 8,4,2 \
    --expert-cache 4G --prompt-tokens 32 --decode-tokens 32 --disk-mib 256 --cold \
    --baseline skip --wide ${SWEEP_ARGS:-} --json "$OUT/sweep.json" > "$OUT/sweep.txt" 2> "$OUT/sweep.err"
  log "sweep exit $?; cgroup peak $(cat "$peak_file" 2>/dev/null)"
  stop_sampler
}
