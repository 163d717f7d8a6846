# first: where the speculative verify crashes on MLX-CUDA (illegal memory access in c2), then the timeline
T0=$(date +%s); source gpucalls/env.sh; mkdir -p /root/res/crash
for d in 1 2 4; do
  timeout 60 python3 -X faulthandler -c "
import sys, traceback
from ssdmoe_tui import cli
try:
    sys.argv=['ssdmoe','bench','--speculate','oracle:1','--draft-depth','$d','--prompt-file','scripts/spec_prompts/chat.txt','--decode-tokens','60','--rounds','1']
    cli.main()
except BaseException:
    traceback.print_exc(); raise
" > /root/res/crash/d$d.log 2>&1; echo "depth $d exit $?"; grep -v "^  File.*site-packages/textual" /root/res/crash/d$d.log | tail -25
done
echo "+$(( $(date +%s)-T0 ))s"
OUT=/root/res/tl STEPS=compile_model DEADLINE_S=${COMPILE_S:-170} bash scripts/gpu_timeline.sh > /root/res/tl-compile.log 2>&1
echo "compile exit $? +$(( $(date +%s)-T0 ))s"
OUT=/root/res/tl STEPS=managed,model DEADLINE_S=$(( 575 - ($(date +%s)-T0) )) bash scripts/gpu_timeline.sh > /root/res/tl.log 2>&1
echo "timeline exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/tl/steps.log
for f in /root/res/tl/timeline-*.txt; do echo "== $f"; tail -22 $f; done
tar czf $OUT/c3.tgz -C /root/res tl tl.log tl-compile.log build.log build crash
