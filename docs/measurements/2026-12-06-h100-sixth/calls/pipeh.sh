# right after pipe.sh (no carry): the same runs with host slots pinned, beside it
source scripts/gpu_env.sh; SSDMOE_SLOT_PLACEMENT=host STEPS=pipe DEADLINE_S=280 timeout 290 bash scripts/gpu_pipeline.sh /root/res/pipeh > /root/res/pipeh.log 2>&1; echo "exit $?"; cat /root/res/pipeh/summary.txt; cd /root/res && tar czf $OUT/pipeh.tgz pipeh pipeh.log
