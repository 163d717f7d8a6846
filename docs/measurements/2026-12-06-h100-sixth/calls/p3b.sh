# after p3a.sh on the same machine (no carry): the warm 4k prefill four ways interleaved
# (host slots staged in place, the device mirror, host slots staged ahead, the mirror
# with its long chunks staged ahead), two runs each, resident mlx-lm in each run's
# process, then one cold run each while time is left. Keep `auto` = device for long
# prompts only if it holds the prefill; make `ahead` the default for long chunks where it
# beats the others. Targets: >= 0.8x resident warm, <= 1.15x the byte bound cold.
T0=$(date +%s); source scripts/gpu_env.sh
way_env() { case $1 in ahead) echo "SSDMOE_SLOT_PLACEMENT=host SSDMOE_PREFILL_STAGE=ahead";;
  devahead) echo "SSDMOE_SLOT_PLACEMENT=device SSDMOE_PREFILL_STAGE=ahead";;
  *) echo "SSDMOE_SLOT_PLACEMENT=$1 SSDMOE_PREFILL_STAGE=auto";; esac; }
for run in host-1 device-1 ahead-1 devahead-1 host-2 device-2 ahead-2 devahead-2; do
  env $(way_env ${run%-*}) PREFILL_MODES=warm STEPS=prefill DEADLINE_S=90 \
    bash scripts/gpu_pipeline.sh /root/res/pw-$run > /root/res/pw-$run.log 2>&1
  echo "$run exit $? +$(( $(date +%s)-T0 ))s"; grep -h "prefill-warm K" /root/res/pw-$run/summary.txt
done
for way in ahead devahead host device; do
  [ $(( $(date +%s)-T0 )) -lt 500 ] || break
  env $(way_env $way) PREFILL_MODES=cold STEPS=prefill DEADLINE_S=$(( 585 - ($(date +%s)-T0) )) \
    bash scripts/gpu_pipeline.sh /root/res/pk-$way > /root/res/pk-$way.log 2>&1
  echo "cold $way exit $? +$(( $(date +%s)-T0 ))s"; grep -h "prefill-cold K" /root/res/pk-$way/summary.txt
done
cd /root/res && tar czf $OUT/p3b.tgz pw-* pk-*
( cd /root && tar cf - ptx | gzip -1 > $OUT/ptx.tgz ); du -sh /root/ptx
