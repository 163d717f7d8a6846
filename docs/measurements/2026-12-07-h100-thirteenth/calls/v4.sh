# carry [".devsite", ".benchcfg"], after ../../2026-12-07-h100-ninth/calls/a.sh (.whlA),
# ../../2026-12-06-h200-seventh/calls/b.sh (.whlC) and ../../2026-12-07-h100-tenth/calls/stash.sh
# (.whlB), each right after the last. Install, Q30, then the qmm guard's one-kernel copy
# (6365334: a take instead of mx.pad's fill + copy): (1) under compute-sanitizer, no
# invalid read with it (gpu_qmm_guard.sh's `kernel` step: "guarded True ... ok" and 0
# "Invalid __global__" after the guarded lines); (2) its price in the batch every expert
# held, processes alternating SSDMOE_QMM_PAD=off / auto at B = 2, 4, 8 (the thirteenth
# session's two-kernel guard: off 0.937 / 1.026x and 0.993 / 1.120x at B = 4 / 8, on
# 0.949 / 0.889x and 0.790 / 0.750x). ~9 min at END=560.
T0=$(date +%s)
bash scripts/gpu_install.sh > /root/inst.log 2>&1 || { tail -5 /root/inst.log; exit 1; }
source scripts/gpu_env.sh
[ -d /root/q30 ] || STEPS=q30 DEADLINE_S=120 bash scripts/gpu_pipeline.sh /root/res/build > /root/res/build.log 2>&1
echo "q30 +$(( $(date +%s)-T0 ))s"
OUT=/root/res/qg STEPS=kernel DEADLINE_S=100 bash scripts/gpu_qmm_guard.sh
grep -E "^guarded|ERROR SUMMARY|Invalid __global__" /root/res/qg/kernel.txt | head -12
for i in 1 2 3 4 5 6; do
  left=$(( ${END:-560} - ($(date +%s)-T0) )); [ $left -lt 70 ] && break
  m=off; [ $((i % 2)) -eq 0 ] && m=auto
  o=/root/res/v4-$i-$m; SSDMOE_QMM_PAD=$m timeout $(( left < 100 ? left : 100 )) python3 scripts/batch_vs_mlx.py \
    --out $o --model /root/q30 --tag $m --expert-cache 64G --batch 2,4,8 --rounds 4 --deadline-s 40 \
    --decode-tokens 48 --prompt-tokens 64 --host-split --bg-detok > $o.txt 2>&1
  echo "v4 $i $m exit $? +$(( $(date +%s)-T0 ))s"; grep -E "^\| (2|4|8) \|" $o.txt
done
cd /root/res && tar czf $OUT/v4.tgz v4* qg; ls $OUT
