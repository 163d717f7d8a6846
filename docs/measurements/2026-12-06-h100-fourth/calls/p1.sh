# carry [".whlB", ".devsite", ".benchcfg"], after a.sh and b.sh of ../../2026-12-06-gpu/calls:
# install, build Q30, the uncapped compile pass, then the 4k prefill warm (issue 43:
# >= 0.8x resident after a compile pass) and cold (<= 1.15x its byte bound)
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
# the first warm 4k prefill compiles its shapes (its figures: p1c); the second is the figure
PREFILL_MODES=warm STEPS=q30,compile,prefill DEADLINE_S=330 bash scripts/gpu_pipeline.sh /root/res/p1c > /root/res/p1c.log 2>&1
echo "p1c exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/p1c/steps.log
PREFILL_MODES="warm cold" STEPS=prefill DEADLINE_S=$(( 560 - ($(date +%s)-T0) )) bash scripts/gpu_pipeline.sh /root/res/p1 > /root/res/p1.log 2>&1
echo "p1 exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/p1/steps.log; tail -n 4 /root/res/p1c/prefill-*.txt /root/res/p1/prefill-*.txt
cd /root/res && tar czf $OUT/p1.tgz p1c p1c.log p1 p1.log
