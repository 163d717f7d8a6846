# carry [".devsite", ".benchcfg"], after ../../2026-12-07-h100-ninth/calls/a.sh (.whlA),
# ../../2026-12-06-h200-seventh/calls/b.sh (.whlC) and
# ../../2026-12-07-h100-tenth/calls/stash.sh (.whlB), each right after the last.
# Install, Q30, then the batch's token read (issue 43 item 2): the probe in the engine's
# order (the next step built on the lazy tokens: `direct`; the first probe's `unconsumed`;
# `host_input`; `cpu_copy`; `pairs`), then the B = 4, 8 step split, every expert held,
# SSDMOE_BATCH_HOST_COPY off, pairs, then both with a step's work in one CUDA graph
# (`big`, below), four rounds each; BatchGenerator's own split
# beside the engine's (525f336: its async_eval / eval timed, the rest its read and loop)
# and the rows ending in the window's last step leaving together (26b2487). Read: does
# `pairs` take `to_host` (1.7-7.3 ms at B = 8 off) away without moving it into `queue`,
# and engine / BatchGenerator with it? Is BatchGenerator's read as slow? If `pairs` wins,
# `auto` = pairs on MLX-CUDA; if `big` closes the gap, the engine sets those limits for
# its process on MLX-CUDA (before the first GPU work; tokens must stay equal). ~8 min.
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
STEPS=q30 DEADLINE_S=120 bash scripts/gpu_pipeline.sh /root/res/build > /root/res/build.log 2>&1
echo "q30 exit $? +$(( $(date +%s)-T0 ))s"
timeout 90 python3 scripts/cuda_tolist_probe.py --rounds 30 --json /root/res/tolist2.json \
  > /root/res/tolist2.txt 2>&1; echo "tolist exit $? +$(( $(date +%s)-T0 ))s"; tail -7 /root/res/tolist2.txt
# then the same with MLX-CUDA's graphs made large enough for a whole step (`big`):
# MLX commits a CUDA graph every 100 kernels or 1,000 MB of inputs on an H100, a task
# each, and `mx.async_eval` waits while more than 10 tasks are in flight
# (mlx/transforms.cpp MAX_ACTIVE_TASKS): with every expert held each MoE layer's inputs
# are its 330 MB of banks, so a step commits every ~3 layers and the host's queueing
# waits on the device (the split's `queue`, 14-16 ms of a 22-30 ms step); with one graph
# a step the host's work after queueing (the engine's deliver, 2-7 ms) could run beside
# the device. Both loops run under the same setting (one process).
for run in off pairs off:big pairs:big; do
  left=$(( 560 - ($(date +%s)-T0) )); [ "$left" -gt 80 ] || break
  way=${run%%:*}; o=/root/res/split-${run/:/-}-$(date +%s)
  if [ "$run" != "$way" ]; then big="MLX_MAX_OPS_PER_BUFFER=100000 MLX_MAX_MB_PER_BUFFER=1000000"; else big=""; fi
  env $big SSDMOE_BATCH_HOST_COPY=$way timeout $(( left - 5 )) python3 scripts/batch_vs_mlx.py --out $o \
    --model /root/q30 --tag split --expert-cache 64G --batch 4,8 --rounds 4 --deadline-s 60 \
    --decode-tokens 48 --prompt-tokens 64 --host-split > $o.txt 2>&1
  echo "split $run exit $? +$(( $(date +%s)-T0 ))s"; tail -5 $o.txt
done
cd /root/res && tar czf $OUT/z3.tgz build.log tolist2.* split-*; ls $OUT
