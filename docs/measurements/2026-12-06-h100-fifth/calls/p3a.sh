# carry [".whlB", ".devsite", ".benchcfg"], after a.sh and b.sh of ../../2026-12-06-gpu/calls:
# install, build Q30, then the 4k warm prefill's compile passes under both placements
# (issue 43 item 1 (c), the prefill half: `auto` mirrors a 4 GiB cache on the device since
# the fifth session's decode timeline; host slots compute a long chunk from a staged copy,
# the mirror from its own rows): each placement's first warm 4k prefill compiles its shapes
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
STEPS=q30 DEADLINE_S=120 bash scripts/gpu_pipeline.sh /root/res/build > /root/res/build.log 2>&1
echo "q30 exit $? +$(( $(date +%s)-T0 ))s"
for p in host device; do
  share=1; [ $p = host ] && share=2  # host gets half the time left, device the rest
  SSDMOE_SLOT_PLACEMENT=$p PREFILL_MODES=warm STEPS=prefill DEADLINE_S=$(( (560 - ($(date +%s)-T0)) / share )) \
    bash scripts/gpu_pipeline.sh /root/res/pc-$p > /root/res/pc-$p.log 2>&1
  echo "compile $p exit $? +$(( $(date +%s)-T0 ))s"; grep -h "prefill-warm K" /root/res/pc-$p/summary.txt
done
cd /root/res && tar czf $OUT/p3a.tgz build.log pc-*
