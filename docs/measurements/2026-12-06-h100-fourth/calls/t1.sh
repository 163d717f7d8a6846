# carry [".whlB", ".devsite", ".benchcfg"] after a.sh and b.sh of ../../2026-12-06-gpu/calls
# (after p1.sh on the same machine: [".devsite", ".benchcfg"]):
# install, build Q30, compile the K = 8 model-routing shapes, host and device placement
# (issue 43 item 1 (c): a device mirror of the slots against host slots)
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
STEPS=q30 DEADLINE_S=120 bash scripts/gpu_pipeline.sh /root/res/build > /root/res/build.log 2>&1
echo "q30 exit $? +$(( $(date +%s)-T0 ))s"
OUT=/root/res/tl DEADLINE_S=$(( 560 - ($(date +%s)-T0) )) STEPS=compile_model,compile_device bash scripts/gpu_timeline.sh > /root/res/t1.log 2>&1
echo "compile exit $? +$(( $(date +%s)-T0 ))s"; tail -5 /root/res/t1.log
cd /root/res && tar czf $OUT/t1.tgz build build.log tl t1.log
