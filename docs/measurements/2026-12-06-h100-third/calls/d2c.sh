# after docs/measurements/2026-12-06-h100/calls/d2a.sh on the same machine (its /root/q30
# and /root/ptx): the join probe's shapes, uncapped, so that d2b.sh's capped run compiles
# nothing (on 2026-12-06 d2a.sh's 570 s ended inside the 1k join's compilation)
T0=$(date +%s); source scripts/gpu_env.sh
STEPS=trace CAP_GIB=0 WARMUP=0 TRACE_BATCH=4 DECODE_TOKENS=8 DEADLINE_S=570 \
  bash scripts/gpu_batch.sh /root/res/gbj > /root/res/gbj.log 2>&1
echo "join compile pass exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/gbj/steps.log; tail -3 /root/res/gbj/trace.txt
cd /root/res && tar czf $OUT/d2c.tgz gbj gbj.log
