# after p3a.sh on the same machine (no carry): the warm 4k prefill, host and device
# placement interleaved (two runs each, resident mlx-lm in each run's process), then one
# cold run each (`auto` = device since the fifth session: keep it only if it holds the
# prefill too; the target is >= 0.8x resident warm, <= 1.15x the byte bound cold)
T0=$(date +%s); source scripts/gpu_env.sh
for run in host-1 device-1 host-2 device-2; do
  p=${run%-*}
  SSDMOE_SLOT_PLACEMENT=$p PREFILL_MODES=warm STEPS=prefill DEADLINE_S=100 \
    bash scripts/gpu_pipeline.sh /root/res/pw-$run > /root/res/pw-$run.log 2>&1
  echo "$run exit $? +$(( $(date +%s)-T0 ))s"; grep -h "prefill-warm K" /root/res/pw-$run/summary.txt
done
for p in host device; do
  [ $(( $(date +%s)-T0 )) -lt 480 ] || break
  SSDMOE_SLOT_PLACEMENT=$p PREFILL_MODES=cold STEPS=prefill DEADLINE_S=$(( 580 - ($(date +%s)-T0) )) \
    bash scripts/gpu_pipeline.sh /root/res/pk-$p > /root/res/pk-$p.log 2>&1
  echo "cold $p exit $? +$(( $(date +%s)-T0 ))s"; grep -h "prefill-cold K" /root/res/pk-$p/summary.txt
done
cd /root/res && tar czf $OUT/p3b.tgz pw-* pk-*
