T0=$(date +%s); source gpucalls/env.sh
timeout 90 compute-sanitizer --tool memcheck --print-limit 3 python3 gpucalls/repro_qmm.py 2>&1 | grep -v "Host Frame\|^=========     in " | head -40
echo "+$(( $(date +%s)-T0 ))s"
timeout 200 python3 -m ssdmoe_tui.cli bench --json /root/res/chat12.json --decode-tokens 200 --speculate none,ngram,auto --prompt-file scripts/spec_prompts/chat.txt --rounds 12 > /root/res/chat12.txt 2>&1
echo "chat exit $? +$(( $(date +%s)-T0 ))s"; tail -8 /root/res/chat12.txt
tar czf $OUT/c7.tgz -C /root/res chat12.json chat12.txt
