# As run at c5493b2 (its mirror copy probe and the `devmlx` way were removed in ec85f09).
# carry [".whlB", ".devsite", ".benchcfg"], after ../../2026-12-06-h100-sixth/calls/a.sh
# (restores the PTX folder) and b.sh: install, build Q30, then
# (1) the mirror's direct row copies (row_copy.py: cuMemcpyAsync) checked against the host
#     rows and timed against MLX's gather / scatter (if they match, the rest of the call
#     copies directly, SSDMOE_SLOT_MIRROR_COPY=direct; else through MLX, `auto`'s choice
#     on MLX-CUDA for now);
# (2) whether a copy on a second MLX stream runs beside the compute (host-placed slots and
#     managed; `ahead`'s no-gain of the sixth session);
# (3) the 4k warm prefill under `device` with the prompt's own MLX peak (13.5-13.8 GiB
#     with the MLX copies, sixth session: does the direct copy remove the extra?);
# (4) the model's own routing, K = 8, cold under the 12 GiB cap, read-ahead off / on:
#     `device` (direct copies), host, `device` with MLX copies (devmlx), in that order
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
STEPS=q30 DEADLINE_S=120 bash scripts/gpu_pipeline.sh /root/res/build > /root/res/build.log 2>&1
echo "q30 exit $? +$(( $(date +%s)-T0 ))s"
timeout 60 python3 scripts/cuda_mirror_copy_probe.py > /root/res/mirror-copy.jsonl 2>&1
rc=$?; echo "mirror copy probe exit $rc +$(( $(date +%s)-T0 ))s"; cat /root/res/mirror-copy.jsonl
if [ $rc = 0 ]; then export SSDMOE_SLOT_MIRROR_COPY=direct; else export SSDMOE_SLOT_MIRROR_COPY=mlx; fi
for p in host managed; do
  timeout 75 python3 scripts/cuda_overlap_probe.py --placement $p > /root/res/overlap-$p.jsonl 2>&1
  echo "overlap $p exit $? +$(( $(date +%s)-T0 ))s"; tail -3 /root/res/overlap-$p.jsonl
done
SSDMOE_SLOT_PLACEMENT=device PREFILL_MODES=warm STEPS=prefill DEADLINE_S=100 \
  bash scripts/gpu_pipeline.sh /root/res/pm-device > /root/res/pm-device.log 2>&1
echo "prefill device exit $? +$(( $(date +%s)-T0 ))s"; grep -h "prefill-warm K" /root/res/pm-device/summary.txt
MODELCOLD_WAYS="device host devmlx" DECODE=24 STEPS=modelcold DEADLINE_S=$(( 565 - ($(date +%s)-T0) )) \
  bash scripts/gpu_pipeline.sh /root/res/mc > /root/res/mc.log 2>&1
echo "modelcold exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/mc/summary.txt
cd /root/res && tar czf $OUT/n1.tgz build.log mirror-copy.jsonl overlap-* pm-* mc mc.log
( cd /root && tar cf - ptx | gzip -1 > $OUT/ptx.tgz ); du -sh /root/ptx
