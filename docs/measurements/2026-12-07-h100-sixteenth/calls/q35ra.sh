# bash .../q35ra.sh   (~9 min at END=560), carry [".devsite", ".benchcfg"], after the wheel's
# three parts (../../2026-12-07-h100-ninth/calls/a.sh with .whlA,
# ../../2026-12-06-h200-seventh/calls/b.sh with .whlC, ../../2026-12-07-h100-tenth/calls/stash.sh
# with .whlB), each call right after the last.
#
# The uniform Qwen3.5 shape at K = 4 / 2, 4 GiB, held at 73 / 44 % of the disk's ceiling
# (H100 fourth session, 12 GiB cap; targets 90 / 85 %): at K = 2 a layer misses ~1.5
# experts, so a token's reads go out as 40 small batches one after the other (0.52 GB/s
# against the 1.01 GB/s probe) with the router sync and compute (89 of 235 ms) on top.
# Here the routing is the model's own, which the next layer's router predicts (79-90 % a
# layer on Q30): decode read-ahead v2 (`--prefetch both`: each K without, then with, each
# from an empty page cache) reads layer l+1's likely misses while l computes. Processes
# alternate split reads off / 256K (a miss as ~7 reads in flight): host slots, the 12 GiB
# cap, cold, after an uncapped short compile pass of the shape.
# Another pair to alternate (../../2026-12-08-h100-seventeenth/calls/q35ov.sh): NAME=q35ov
# ALT=SSDMOE_PREFETCH_OVERLAP A=on B=off (defaults: q35ra, split reads off / 256K).
NAME=${NAME:-q35ra}; ALT=${ALT:-SSDMOE_READ_SPLIT}; A=${A:-off}; B=${B:-256K}
T0=$(date +%s); RET=$OUT  # the folder that comes back
bash scripts/gpu_install.sh > /root/inst.log 2>&1 || { tail -5 /root/inst.log; exit 1; }
source scripts/gpu_env.sh
export SSDMOE_SLOT_PLACEMENT=host
D=/root/res/$NAME; mkdir -p $D
[ -d /root/q35 ] || STEPS=q35 DEADLINE_S=150 bash scripts/gpu_pipeline.sh $D/build > $D/build.log 2>&1
timeout 200 python3 -m ssdmoe_tui.cli bench --model /root/q35 --k 4,2 --expert-cache 4G \
  --prompt-tokens 32 --decode-tokens 8 --disk-mib 64 --baseline skip --prefetch both > $D/compile.txt 2>&1
echo "q35 built and compiled +$(( $(date +%s)-T0 ))s"
OUT=$D STEPS=none DEADLINE_S=600 TAG=$NAME; source scripts/gpu_common.sh
for i in 1 2 3 4; do
  left=$(( ${END:-560} - ($(date +%s)-T0) )); [ $left -lt 90 ] && break
  v=$A; [ $((i % 2)) -eq 0 ] && v=$B
  make_cg "ssdmoe-$NAME-$i" 12
  run_capped $(( left < 170 ? left - 5 : 165 )) env $ALT=$v python3 -m ssdmoe_tui.cli bench \
    --model /root/q35 --k 4,2 --decode-tokens 32 --prefetch both --expert-cache 4G \
    --prompt-tokens 32 --disk-mib 256 --baseline skip --cold --wide \
    --json $D/run-$i-$v.json > $D/run-$i-$v.txt 2>&1
  echo "$NAME $i $v exit $? +$(( $(date +%s)-T0 ))s peak $(cat "$cg/memory.peak" 2>/dev/null)"
  python3 - $D/run-$i-$v.json <<'PY'
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
          "x off", c.get("prefetch_decode_vs_off"), "wait ms", c.get("prefetch_wait_ms_per_token"),
          "dropped", c.get("prefetch_dropped"))
PY
done
cd /root/res && tar czf "$RET/$NAME.tgz" $NAME; ls "$RET"
