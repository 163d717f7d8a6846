T0=$(date +%s); source gpucalls/env.sh
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 --show-backtrace device python3 -m ssdmoe_tui.cli bench --speculate oracle:1 --draft-depth 2 --prompt-file scripts/spec_prompts/chat.txt --decode-tokens 8 --rounds 1 > /root/res/crash/san.log 2>&1
echo "san exit $? +$(( $(date +%s)-T0 ))s"; grep -v "^=========     \(Host Frame\|in \)" /root/res/crash/san.log | head -60
rm -rf /root/res/gb2; VS_S=200 VS_ROUNDS=8 STEPS=vs DEADLINE_S=$(( 560 - ($(date +%s)-T0) )) bash scripts/gpu_batch.sh /root/res/gb2 > /root/res/gb2.log 2>&1
echo "batch exit $? +$(( $(date +%s)-T0 ))s"; tail -5 /root/res/gb2/steps.log; grep -v "flips at" /root/res/gb2/vs.txt | tail -30
tar czf $OUT/c6.tgz -C /root/res gb2 gb2.log crash
