# carry [".pyspy"] (the py-spy binary: `pip install py-spy`, then copy .venv/bin/py-spy into
# .pyspy/), after g.sh on the same machine (the demo's kernels compiled): where the
# speculative loop's host time goes on a 1 ms GPU token, against plain's loop (issue 44's
# nothing-drafted row: none and ngram 1-3 % under plain). ~2 min.
T0=$(date +%s); source scripts/gpu_env.sh
.pyspy/py-spy record --rate 1000 --idle --format raw -o /root/res/spy-chat.txt --nonblocking -- \
  python3 -m ssdmoe_tui.cli bench --speculate none,ngram --prompt-file scripts/spec_prompts/chat.txt \
  --decode-tokens 200 --rounds 8 --json /root/res/spy-chat.json > /root/res/spy-chat.out 2>&1
echo "spy exit $? +$(( $(date +%s)-T0 ))s"; tail -4 /root/res/spy-chat.out
python3 scripts/loop_profile.py /root/res/spy-chat.txt --rate 1000 --json /root/res/spy-split.json
cd /root/res && tar czf $OUT/s.tgz spy-*
