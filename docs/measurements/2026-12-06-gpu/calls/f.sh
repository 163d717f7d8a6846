# where the B = 4 / 8 gap lies (batch43): BatchGenerator over the engine's own model too,
# each forward timed, the qmm guard on its default (auto)
T0=$(date +%s); source scripts/gpu_env.sh; export SSDMOE_SLOT_PLACEMENT=managed
SSDMOE_QMM_PAD=auto timeout ${F_S:-300} python3 scripts/batch_vs_mlx.py \
  --out /root/res/split-auto --model /root/q30 --expert-cache 64G \
  --batch 1,2,4,8 --rounds 6 --decode-tokens 48 --prompt-tokens 64 --deadline-s $(( ${F_S:-300} - 60 )) \
  --bg-streamed --host-split --tag pad-auto > /root/res/split-auto.txt 2>&1; echo "split exit $? +$(( $(date +%s)-T0 ))s"; tail -12 /root/res/split-auto.txt
tar czf $OUT/f.tgz -C /root/res split-auto split-auto.txt
