# after p3b.sh on the same machine (no carry): the real trace's ceiling under the slot
# placement `auto` picks now (`device` for a 4 GiB cache), 4 and 2 GiB, 12 and 8 GiB caps
source scripts/gpu_env.sh; STEPS=pipe DEADLINE_S=530 bash scripts/gpu_pipeline.sh /root/res/pipe > /root/res/pipe.log 2>&1; echo "exit $?"; tail -n 30 /root/res/pipe.log; cat /root/res/pipe/summary.txt; cd /root/res && tar czf $OUT/pipe.tgz pipe pipe.log
