# carry [".whlB", ".devsite", ".benchcfg"], after a.sh and b.sh: install, build Q30, then
# (1) whether a copy on a second MLX stream runs beside the compute (the prefill staged
# `ahead` measured no gain: docs/benchmarks.md 2026-12-06 sixth session), host-placed
# slots and managed; (2) the 4k warm prefill's memory per phase under host and device
# (JSON prefill_peak_mlx_memory_bytes: is the mirror's extra peak in the prompt?);
# (3) with the time left, the model's own routing cold, host against `device` (the
# gpu_pipeline step `modelcold`: the real trace cold preferred host, the model's routing
# from the page cache preferred `device`; this is a user's model larger than RAM)
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
STEPS=q30 DEADLINE_S=120 bash scripts/gpu_pipeline.sh /root/res/build > /root/res/build.log 2>&1
echo "q30 exit $? +$(( $(date +%s)-T0 ))s"
for p in host managed; do
  timeout 90 python3 scripts/cuda_overlap_probe.py --placement $p > /root/res/overlap-$p.jsonl 2>&1
  echo "overlap $p exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/overlap-$p.jsonl
done
for way in host device; do
  SSDMOE_SLOT_PLACEMENT=$way PREFILL_MODES=warm STEPS=prefill DEADLINE_S=100 \
    bash scripts/gpu_pipeline.sh /root/res/pm-$way > /root/res/pm-$way.log 2>&1
  echo "prefill $way exit $? +$(( $(date +%s)-T0 ))s"; grep -h "prefill-warm K" /root/res/pm-$way/summary.txt
done
DECODE=24 STEPS=modelcold DEADLINE_S=$(( 570 - ($(date +%s)-T0) )) bash scripts/gpu_pipeline.sh /root/res/mc > /root/res/mc.log 2>&1
echo "modelcold exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/mc/summary.txt
cd /root/res && tar czf $OUT/n1.tgz build.log overlap-* pm-* mc mc.log
( cd /root && tar cf - ptx | gzip -1 > $OUT/ptx.tgz ); du -sh /root/ptx
