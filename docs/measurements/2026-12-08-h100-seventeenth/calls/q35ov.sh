# bash .../q35ov.sh   (~9 min at END=540), carry [".devsite", ".benchcfg"], after the wheel's
# three parts (../../2026-12-07-h100-ninth/calls/a.sh with .whlA,
# ../../2026-12-06-h200-seventh/calls/b.sh with .whlC, ../../2026-12-07-h100-tenth/calls/stash.sh
# with .whlB), each call right after the last.
#
# Decode read-ahead v2 on the uniform Qwen3.5 shape at K = 4 / 2, 4 GiB, cold, 12 GiB cap,
# host slots (as ../../2026-12-07-h100-sixteenth/calls/q35ra.sh): there read-ahead ran
# 0.83-0.95x of off, tokens waiting 48-59 ms on guesses: each layer's lookup waited for its
# guesses before reading its own misses, two round trips on the disk a layer. Now the
# guesses have their own reader and the lookup reads its misses beside them
# (SSDMOE_PREFETCH_OVERLAP, on by default). Processes alternate overlap on / off (off:
# the sixteenth session's code path), each with read-ahead off and on (--prefetch both);
# $TOP guesses a layer (default 2).
T0=$(date +%s); RET=$OUT  # the folder that comes back
bash scripts/gpu_install.sh > /root/inst.log 2>&1 || { tail -5 /root/inst.log; exit 1; }
source scripts/gpu_env.sh
export SSDMOE_SLOT_PLACEMENT=host
D=/root/res/q35ov; mkdir -p $D
[ -d /root/q35 ] || STEPS=q35 DEADLINE_S=150 bash scripts/gpu_pipeline.sh $D/build > $D/build.log 2>&1
timeout 200 python3 -m ssdmoe_tui.cli bench --model /root/q35 --k 4,2 --expert-cache 4G \
  --prompt-tokens 32 --decode-tokens 8 --disk-mib 64 --baseline skip --prefetch both > $D/compile.txt 2>&1
echo "q35 built and compiled +$(( $(date +%s)-T0 ))s"
OUT=$D STEPS=none DEADLINE_S=600 TAG=q35ov; source scripts/gpu_common.sh
for i in 1 2 3 4; do
  left=$(( ${END:-560} - ($(date +%s)-T0) )); [ $left -lt 90 ] && break
  ov=on; [ $((i % 2)) -eq 0 ] && ov=off
  make_cg "ssdmoe-q35ov-$i" 12
  run_capped $(( left < 170 ? left - 5 : 165 )) env SSDMOE_PREFETCH_OVERLAP=$ov SSDMOE_PREFETCH_TOP=${TOP:-2} python3 -m ssdmoe_tui.cli bench \
    --model /root/q35 --k 4,2 --decode-tokens 32 --prefetch both --expert-cache 4G \
    --prompt-tokens 32 --disk-mib 256 --baseline skip --cold --wide \
    --json $D/run-$i-$ov.json > $D/run-$i-$ov.txt 2>&1
  echo "q35ov $i $ov exit $? +$(( $(date +%s)-T0 ))s peak $(cat "$cg/memory.peak" 2>/dev/null)"
  python3 - $D/run-$i-$ov.json <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"  no json: {e}")
for c in r.get("configs", []):
    t = c.get("ms_per_token") or {}
    print("   K", c.get("k"), "+pf" if c.get("prefetch") else "off", "tok/s", c.get("decode_tok_s"),
          "x ceiling", c.get("achieved_over_ceiling"), "hit", c.get("hit_rate"),
          "ms", t, "pf prec", c.get("prefetch_precision"), "recall", c.get("prefetch_recall"),
          "x off", c.get("prefetch_decode_vs_off"), "wait ms", c.get("prefetch_wait_ms_per_token"))
PY
done
cd /root/res && tar czf "$RET/q35ov.tgz" q35ov; ls "$RET"
