# carry [".whlB", ".devsite"]: install; the demo's chat rows (none, ngram, auto; nothing
# drafted: >= 0.97x plain) in two processes, 24 rounds each in the Williams order
# (872a4b0); then the Q30 build starts in the background (d.sh waits for it)
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
echo "install +$(( $(date +%s)-T0 ))s"
for i in 1 2; do
  STEPS=demo DEMO_ROWS=chat DEMO_ROUNDS=24 DEMO_COMPILE_S=$([ $i = 1 ] && echo 110 || echo 10) \
    DEADLINE_S=$([ $i = 1 ] && echo 330 || echo 200) bash scripts/gpu_spec.sh /root/res/chat$i > /root/res/chat$i.log 2>&1
  echo "chat $i exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/chat$i/demo-summary.txt
done
( mkdir -p /root/res/build && OUT=/root/res/build STEPS=q30 DEADLINE_S=400 setsid nohup bash scripts/gpu_batch.sh /root/res/build > /root/res/build.log 2>&1 < /dev/null & )
tar czf $OUT/c.tgz -C /root/res chat1 chat2 chat1.log chat2.log
