#!/usr/bin/env bash
# Warm resume vs a cold restart, under a memory cap that keeps the page cache from
# holding the model (docs/sessions.md, "Warm resume").
#
#   scripts/warm_resume_bench.sh MODEL_DIR [CAP_MIB] [EXPERT_CACHE] [REPEATS]
#
# Saves one conversation (one reply), then for each repeat runs a cold and a warm
# restart, each in a fresh process inside a memory cgroup (v1 memory.limit_in_bytes or
# v2 memory.max: the page cache counts), the page cache dropped first, from a fresh copy
# of the saved data folder. One JSON line per run (scripts/warm_resume_bench.py).
# Needs root on Linux.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$here/.venv/bin/python}
MODEL=${1:?model folder}
CAP_MIB=${2:-1536}
CACHE=${3:-256M}
REPEATS=${4:-2}
if [ "$(id -u)" != 0 ]; then echo "warm_resume_bench: needs root (cgroup memory limits)" >&2; exit 2; fi
work=$(mktemp -d /tmp/warm-bench.XXXXXX)
trap 'rm -rf "$work"; [ -n "${cg:-}" ] && rmdir "$cg" 2>/dev/null || true' EXIT

"$PY" "$here/scripts/warm_resume_bench.py" save "$MODEL" "$work/saved" "$CACHE" >"$work/save.json"
echo "{\"saved\": $(cat "$work/save.json")}" | "$PY" -c 'import json,sys; d=json.load(sys.stdin); d["saved"].pop("token_ids"); print(json.dumps(d))'

cg_name=ssdmoe-warm-$$
if [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/$cg_name; mkdir -p "$cg"; echo $((CAP_MIB << 20)) > "$cg/memory.limit_in_bytes"
else
  cg=/sys/fs/cgroup/$cg_name; mkdir -p "$cg"; echo $((CAP_MIB << 20)) > "$cg/memory.max"
  echo 0 > "$cg/memory.swap.max" 2>/dev/null || true
fi
for r in $(seq "$REPEATS"); do
  for mode in ${MODES:-cold warm warm-now}; do
    rm -rf "$work/run"; cp -a "$work/saved" "$work/run"
    sync; echo 3 > /proc/sys/vm/drop_caches
    bash -c "echo \$\$ > '$cg/cgroup.procs'; exec '$PY' '$here/scripts/warm_resume_bench.py' $mode '$MODEL' '$work/run' '$CACHE'" \
      | "$PY" -c "import json,sys; d=json.loads(sys.stdin.read()); d['repeat']=$r; d['cap_mib']=$CAP_MIB; d['token_ids']=hash(tuple(d['token_ids'])) % 10**6; print(json.dumps(d))"
  done
done
