# the real Qwen3-30B trace at B = 1 and 4 with the 1k join, first pass (issue 43 item 2):
# builds /root/q30 in this call (a background build from the call before raced the
# trace step on 2026-12-06) and runs the whole trace step UNCAPPED, so every kernel shape
# of it (the 1k join's chunks too) is compiled into /root/ptx before d2b's capped run.
# Its own figures are a first process's (compilation in them).
T0=$(date +%s); source scripts/gpu_env.sh
STEPS=q30,trace CAP_GIB=0 WARMUP=0 DEADLINE_S=570 bash scripts/gpu_batch.sh /root/res/gb0 > /root/res/gb0.log 2>&1
echo "trace (uncapped, compiling) exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/gb0/steps.log; tail -6 /root/res/gb0/trace.txt
cd /root/res && tar czf $OUT/d2a.tgz gb0 gb0.log
