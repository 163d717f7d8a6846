# carry [".whlB", ".devsite"], after ../../2026-12-06-h200-seventh/calls/a.sh and b.sh, where
# the device time left is short (~2.5 min): install, then only the overlap probe on
# host-placed slots (no model: the pages' way back beside a layer's compute,
# `return_overlap_share`, `return_gb_s`, and the CPU's refill of pages on the host against
# left on the GPU, `cpu_write_gb_s`)
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
echo "install +$(( $(date +%s)-T0 ))s"
timeout 120 python3 scripts/cuda_overlap_probe.py --placement host > $OUT/overlap2.jsonl 2>&1
echo "probe exit $? +$(( $(date +%s)-T0 ))s"; cat $OUT/overlap2.jsonl | tail -4
