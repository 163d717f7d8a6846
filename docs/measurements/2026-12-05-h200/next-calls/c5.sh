# exact verify (spec43's step) on the demo and Q30
T0=$(date +%s); source docs/measurements/2026-12-05-h200/next-calls/env.sh
STEPS=exact DEADLINE_S=570 bash scripts/gpu_spec.sh /root/res/ex > /root/res/ex.log 2>&1
echo "exact exit $? +$(( $(date +%s)-T0 ))s"; tail -8 /root/res/ex/steps.log; grep -h verdict /root/res/ex/exact-*.json
tar czf $OUT/c5.tgz -C /root/res ex ex.log
