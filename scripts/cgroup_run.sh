#!/usr/bin/env bash
# Prove that a checkpoint 3x larger than a memory cap runs to completion inside it.
#
#   scripts/cgroup_run.sh [MODEL_DIR] [CAP_MIB]
#
# MODEL_DIR defaults to a Qwen3-30B-A3B-shaped random checkpoint reduced to 8 layers
# (real widths, 128 experts, 4-bit; ~3.2 GB), written on first use from
# tests/fixtures/models/qwen3-30b-a3b/config.json. CAP_MIB defaults to a third of the
# checkpoint size. The cap is a cgroup (v1 `memory.limit_in_bytes`, v2 `memory.max`)
# that counts page cache too; the page cache is dropped first. Needs root on Linux.
# Prints one JSON line: model bytes, cap, peak usage, OOM events, tokens generated.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$here/.venv/bin/python}
MODEL=${1:-/tmp/ssdmoe-q3-8layers}
CAP_MIB=${2:-}
TOKENS=${TOKENS:-24}

if [ "$(id -u)" != 0 ]; then echo "cgroup_run: needs root (cgroup memory limits)" >&2; exit 2; fi
if [ ! -f "$MODEL/config.json" ]; then
  cfg="$here/tests/fixtures/models/qwen3-30b-a3b/config.json"
  [ -f "$cfg" ] || { echo "cgroup_run: no model at $MODEL and no $cfg to build one" >&2; exit 2; }
  echo "building $MODEL from $cfg (8 layers)" >&2
  "$PY" -m ssdmoe_tui.cli demo-model --config "$cfg" --layers 8 --out "$MODEL" --shard-size 1G
fi
model_bytes=$(du -sb --apparent-size "$MODEL" | cut -f1)
if [ -z "$CAP_MIB" ]; then CAP_MIB=$(( model_bytes / 3 / 1048576 )); fi
cap=$(( CAP_MIB * 1048576 ))

name=ssdmoe-cap-$$
if [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/$name; mkdir -p "$cg"
  echo "$cap" > "$cg/memory.limit_in_bytes"
  peak_file=$cg/memory.max_usage_in_bytes; oom_file=$cg/memory.failcnt; ver=v1
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  cg=/sys/fs/cgroup/$name; mkdir -p "$cg"
  echo "$cap" > "$cg/memory.max"; echo 0 > "$cg/memory.swap.max" 2>/dev/null || true
  peak_file=$cg/memory.peak; oom_file=$cg/memory.events; ver=v2
else
  echo "cgroup_run: no cgroup memory controller" >&2; exit 2
fi
cleanup() { rmdir "$cg" 2>/dev/null || true; }
trap cleanup EXIT

sync; echo 3 > /proc/sys/vm/drop_caches || echo "cgroup_run: could not drop the page cache" >&2
out=$(mktemp)
set +e
bash -c "echo \$\$ > '$cg/cgroup.procs'; exec '$PY' -m ssdmoe_tui.cli generate --model '$MODEL' --prompt 'Explain how a mixture of experts routes tokens.' --max-tokens $TOKENS --expert-cache ${EXPERT_CACHE:-128M} --json" > "$out"
rc=$?
set -e
peak=$(cat "$peak_file" 2>/dev/null || echo 0)
if [ $ver = v1 ]; then oom=$(cat "$oom_file"); else oom=$(awk '/^oom_kill /{print $2}' "$oom_file"); fi
"$PY" - "$out" "$rc" "$model_bytes" "$cap" "$peak" "$oom" "$ver" <<'PYEOF'
import json, sys
path, rc, model, cap, peak, oom, ver = sys.argv[1:]
try:
    gen = json.load(open(path))
except Exception:
    gen = {}
st = gen.get("stats", {})
res = {
    "ok": rc == "0" and len(gen.get("token_ids", [])) > 0,
    "exit_code": int(rc),
    "cgroup": ver,
    "model_bytes": int(model),
    "cap_bytes": int(cap),
    "model_over_cap": round(int(model) / int(cap), 2),
    "peak_cgroup_bytes": int(peak),
    "peak_over_cap": round(int(peak) / int(cap), 3),
    "limit_hits_or_oom": int(oom or 0),
    "generated_tokens": len(gen.get("token_ids", [])),
    "decode_tok_s": st.get("decode_tok_s"),
    "ssd_mib_per_token": st.get("ssd_mib_per_token"),
    "expert_cache_hit_rate": st.get("expert_cache_hit_rate"),
    "peak_rss_bytes": st.get("peak_rss_bytes"),
    "peak_memory_bytes": st.get("peak_memory_bytes"),
}
print(json.dumps(res))
sys.exit(0 if res["ok"] else 1)
PYEOF
