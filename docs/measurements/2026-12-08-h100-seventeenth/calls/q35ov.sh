# bash .../q35ov.sh   (~9 min at END=540), carry [".devsite", ".benchcfg"], after the wheel's
# three parts (../../2026-12-07-h100-ninth/calls/a.sh with .whlA,
# ../../2026-12-06-h200-seventh/calls/b.sh with .whlC, ../../2026-12-07-h100-tenth/calls/stash.sh
# with .whlB), each call right after the last.
#
# Decode read-ahead v2 on the uniform Qwen3.5 shape at K = 4 / 2, 4 GiB, cold, 12 GiB cap,
# host slots, as ../../2026-12-07-h100-sixteenth/calls/q35ra.sh (which this runs): there
# read-ahead ran 0.83-0.95x of off, tokens waiting 48-59 ms on guesses: each layer's lookup
# waited for its guesses before reading its own misses. Now the guesses have their own
# reader and the lookup reads its misses beside them (SSDMOE_PREFETCH_OVERLAP, on by
# default). Processes alternate overlap on / off (off: the sixteenth session's code path),
# each with read-ahead off and on (--prefetch both); SSDMOE_PREFETCH_TOP=1 for one guess a
# layer. Files: $OUT/q35ov.tgz (run-N-on|off.json: prefetch_decode_vs_off,
# achieved_over_ceiling, prefetch_wait_ms_per_token).
NAME=q35ov ALT=SSDMOE_PREFETCH_OVERLAP A=on B=off \
  bash docs/measurements/2026-12-07-h100-sixteenth/calls/q35ra.sh
