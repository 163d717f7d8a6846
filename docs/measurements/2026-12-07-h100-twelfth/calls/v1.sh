# carry [".devsite", ".benchcfg"], after ../../2026-12-07-h100-ninth/calls/a.sh (.whlA),
# ../../2026-12-06-h200-seventh/calls/b.sh (.whlC) and ../../2026-12-07-h100-tenth/calls/stash.sh
# (.whlB), each right after the last. Install, Q30, then the batch every expert held at
# B = 2, 4, 8 with the defaults since this session (`auto` reads pairs on MLX-CUDA; the
# KV layers' paddings on the host, batch_cache.py): is `leave` (2.3 ms a step at B = 8,
# 1.1 at B = 4 before) gone, and engine / BatchGenerator with it? Then, if time is left
# (`END`), the same with the qmm guard off (`SSDMOE_QMM_PAD=off`: its two copies a MoE
# layer, qmm_guard.py, are ~96 kernels a step; the engine's queueing was 0.7-1.1 ms a
# step over BatchGenerator's at B = 4, 8) and `--bg-streamed` (BatchGenerator over the
# engine's model: the layer's share): is the guard the rest of the gap? A measurement
# only: the guard stays on unless MLX's kernel stops reading past x. ~4-6 min.
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
[ -d /root/q30 ] || STEPS=q30 DEADLINE_S=120 bash scripts/gpu_pipeline.sh /root/res/build > /root/res/build.log 2>&1
echo "q30 +$(( $(date +%s)-T0 ))s"
o=/root/res/v1; timeout $(( ${END:-250} - ($(date +%s)-T0) )) python3 scripts/batch_vs_mlx.py --out $o \
  --model /root/q30 --tag v1 --expert-cache 64G --batch ${BS:-4,8} --rounds ${ROUNDS:-4} \
  --deadline-s ${DL:-60} --decode-tokens 48 --prompt-tokens 64 --host-split --bg-detok > $o.txt 2>&1
echo "v1 exit $? +$(( $(date +%s)-T0 ))s"; tail -9 $o.txt
left=$(( ${END:-250} - ($(date +%s)-T0) ))
if [ "$left" -gt 90 ]; then
  o=/root/res/v1pad; SSDMOE_QMM_PAD=off timeout $(( left - 5 )) python3 scripts/batch_vs_mlx.py \
    --out $o --model /root/q30 --tag nopad --expert-cache 64G --batch 4,8 --rounds 3 \
    --deadline-s $(( left / 3 )) --decode-tokens 48 --prompt-tokens 64 --host-split --bg-detok \
    --bg-streamed > $o.txt 2>&1
  echo "v1pad exit $? +$(( $(date +%s)-T0 ))s"; tail -12 $o.txt
fi
cd /root/res && tar czf $OUT/v1.tgz v1* ; ls $OUT
