# What the sixth call of 2026-12-07's eleventh session ran inline (written down after):
# the trace step of ../../2026-12-06-h100/calls/d2a.sh with host slots, on the machine
# z1.sh and z2.sh had installed (gpu_install.sh again: a no-op there) and /root/q30 built.
export SSDMOE_SLOT_PLACEMENT=host
bash scripts/gpu_install.sh > /root/inst.log 2>&1; echo install $?
T0=$(date +%s); source scripts/gpu_env.sh
STEPS=q30,trace CAP_GIB=0 WARMUP=0 DEADLINE_S=500 bash scripts/gpu_batch.sh /root/res/gb0 > /root/res/gb0.log 2>&1
echo "trace exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/gb0/steps.log; tail -8 /root/res/gb0/trace.txt
cd /root/res && tar czf $OUT/d2a.tgz gb0 gb0.log
