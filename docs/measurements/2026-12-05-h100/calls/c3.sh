# Q30 build in the background (from a copy of the tree), the demo fine-tune in front
T0=$(date +%s)
rm -rf /root/tree && mkdir -p /root/tree && cp -r scripts ssdmoe_tui tests pyproject.toml /root/tree/
( cd /root/tree && export PYTHONPATH=/tmp/site:/root/devsite:/root/tree PYTHONUNBUFFERED=1 \
    SSDMOE_HOME=/root/ssdmoe-home SSDMOE_LOCK_DIR=/root/locks STEPS=q30 DEADLINE_S=900 \
  && mkdir -p /root/res/build /root/locks \
  && setsid nohup nice -n 10 bash scripts/gpu_batch.sh /root/res/build > /root/res/build.log 2>&1 < /dev/null & )
sleep 2
OUT=$OUT bash scripts/gpu_demo_finetune.sh
echo "finetune exit $? +$(( $(date +%s)-T0 ))s"
cat /root/res/build/steps.log 2>/dev/null; du -sh /root/q30 2>/dev/null
