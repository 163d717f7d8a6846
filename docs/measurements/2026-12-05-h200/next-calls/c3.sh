# the timeline: host / managed / device slots per layer (dev43's step), model routing
T0=$(date +%s); source docs/measurements/2026-12-05-h200/next-calls/env.sh
for i in $(seq 1 60); do pgrep -f "batch_bench" >/dev/null || break; sleep 5; done
OUT=/root/res/tl STEPS=compile_model,compile_device DEADLINE_S=150 bash scripts/gpu_timeline.sh > /root/res/tl-compile.log 2>&1
echo "compile exit $? +$(( $(date +%s)-T0 ))s"
OUT=/root/res/tl STEPS=device,model,managed DEADLINE_S=$(( 575 - ($(date +%s)-T0) )) bash scripts/gpu_timeline.sh > /root/res/tl.log 2>&1
echo "timeline exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/tl/steps.log
for f in /root/res/tl/timeline-*.txt; do echo "== $f"; head -2 $f; tail -1 $f; done
tar czf $OUT/c3.tgz -C /root/res tl tl.log tl-compile.log
