# the per-layer timeline on Q30 (compile pass, then the timed run: model routing, then the trace)
T0=$(date +%s); source gpucalls/env.sh
for i in $(seq 1 60); do pgrep -f "demo-model|batch_bench" >/dev/null || break; sleep 5; done
cat /root/res/build/steps.log; du -sh /root/q30
OUT=/root/res/tl STEPS=compile DEADLINE_S=${COMPILE_S:-200} bash scripts/gpu_timeline.sh > /root/res/tl-compile.log 2>&1
echo "compile exit $? +$(( $(date +%s)-T0 ))s"
OUT=/root/res/tl DEADLINE_S=$(( 570 - ($(date +%s)-T0) )) bash scripts/gpu_timeline.sh > /root/res/tl.log 2>&1
echo "timeline exit $? +$(( $(date +%s)-T0 ))s"
for f in /root/res/tl/timeline-*.txt; do echo "== $f"; tail -30 $f; done
tar czf $OUT/c4.tgz -C /root/res tl tl.log tl-compile.log build.log build
