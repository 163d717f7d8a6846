# where the B = 4 / 8 gap lies (batch43): BatchGenerator over the engine's own model too, each
# forward timed; the qmm guard on and off (~4 min each on a warm machine with /root/q30)
T0=$(date +%s); source docs/measurements/2026-12-05-h200/next-calls/env.sh; export SSDMOE_SLOT_PLACEMENT=managed
for pad in auto off; do SSDMOE_QMM_PAD=$pad timeout 280 python3 scripts/batch_vs_mlx.py \
  --out /root/res/split-$pad --model /root/q30 --expert-cache 64G \
  --batch 1,2,4,8 --rounds 8 --decode-tokens 48 --prompt-tokens 64 --deadline-s 150 \
  --bg-streamed --host-split --tag pad-$pad > /root/res/split-$pad.txt 2>&1; echo "pad $pad exit $? +$(( $(date +%s)-T0 ))s"; tail -8 /root/res/split-$pad.txt; done
tar czf $OUT/c6.tgz -C /root/res split-auto split-off split-auto.txt split-off.txt
