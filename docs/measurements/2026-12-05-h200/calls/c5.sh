# the verify crash's Python traceback (launches synchronous), then batches vs BatchGenerator
T0=$(date +%s); source gpucalls/env.sh; mkdir -p /root/res/crash
cat > /root/res/crash/tb.py <<'PY'
import sys, traceback
import ssdmoe_tui.errors as E
orig = E.user_message
def um(e):
    traceback.print_exc()
    return orig(e)
E.user_message = um
from ssdmoe_tui import cli
sys.exit(cli.main(sys.argv[1:]))
PY
CUDA_LAUNCH_BLOCKING=1 timeout 50 python3 /root/res/crash/tb.py bench --speculate oracle:1 --draft-depth 2 --prompt-file scripts/spec_prompts/chat.txt --decode-tokens 30 --rounds 1 > /root/res/crash/tb.log 2>&1
echo "tb exit $?"; grep -v "textual" /root/res/crash/tb.log | tail -40
which compute-sanitizer || ls /usr/local/cuda*/bin 2>/dev/null | head -3
echo "+$(( $(date +%s)-T0 ))s"
STEPS=vs DEADLINE_S=$(( ${C4_S:-560} - ($(date +%s)-T0) )) bash scripts/gpu_batch.sh /root/res/gb > /root/res/gb.log 2>&1
echo "batch exit $? +$(( $(date +%s)-T0 ))s"; tail -20 /root/res/gb/steps.log; tail -30 /root/res/gb/vs.txt
tar czf $OUT/c5.tgz -C /root/res gb gb.log crash
( cd /root && tar cf - ptx | gzip -1 > $OUT/ptx.tgz ); ls -la $OUT
