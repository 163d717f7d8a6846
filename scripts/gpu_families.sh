#!/usr/bin/env bash
# Issue 42 on the H200: greedy tokens of the streamed engine equal resident mlx-lm's on the
# gpt-oss-120b and DeepSeek-V3 shapes (few layers, random weights, 4 GiB cache and every
# expert held), from their genuine configs in tests/fixtures/models/.
#
#   OUT=/root/res/fam DEADLINE_S=560 bash scripts/gpu_families.sh
#
# The machine has no platformdirs: carry a copy (`cp -r .venv/lib/python3.*/site-packages/
# platformdirs .devsite/`, `.devsite` ignored) and put it on PYTHONPATH with the wheels.
#
# gpt-oss-120b: 4 layers x 128 experts of 2880 x 2880, MXFP4 (its published experts' mode;
# the rest of the model too), ~7 GB. DeepSeek-V3: 3 layers with the first dense (the real
# config keeps 3 dense layers first; cut here so 2 of 3 are MoE), 256 experts of 7168 x 2048
# at 4 bits (group 64), ~14 GB. Each is built once on the machine (random weights, a small
# trained tokenizer), then scripts/gpu_exact_large_cache.py runs resident mlx-lm first (it
# also pays MLX-CUDA's kernel compilation, uncapped), then the engine at 4G and `all`.
# Results: $OUT/<model>.jsonl (one line per run: tokens, same_tokens, first_diff, banks).
# STEPS=goss,dsv3 picks the models (both by default); LAYERS_GOSS / LAYERS_DSV3 the depth;
# SHRINK (a JSON object merged into both configs) makes a CPU dry run of the plumbing.
set -u
OUT=${OUT:-/root/res/fam}
STEPS=${STEPS:-goss,dsv3}
DEADLINE_S=${DEADLINE_S:-560}
TAG=families
source "$(dirname "$0")/gpu_common.sh"
TOKENS=${TOKENS:-24}
ROOT=${ROOT:-/root}

shape() {  # shape SRC_CONFIG DST_CONFIG LAYERS [JSON overrides]: a config of that shape, cut
  "$PY" - "$1" "$2" "$3" "${4:-{\}}" "${SHRINK:-{\}}" <<'EOF'
import json, sys
src, dst, layers, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
c = json.load(open(src))
c.update(extra)
c.update(json.loads(sys.argv[5]) if len(sys.argv) > 5 else {})
c["num_hidden_layers"] = layers
if isinstance(c.get("layer_types"), list):
    c["layer_types"] = c["layer_types"][:layers]
json.dump(c, open(dst, "w"), indent=1)
EOF
}

run_model() {  # run_model NAME SRC_CONFIG LAYERS OVERRIDES
  local name=$1 dir=$ROOT/$1 cfg=$ROOT/$1.config.json
  want "$name" || return 0
  if [ "$(left)" -lt 120 ]; then log "$name: skipped, $(left) s left"; return 0; fi
  shape "$2" "$cfg" "$3" "$4"
  if [ ! -f "$dir/config.json" ]; then
    log "building $dir ($3 layers) from $2"
    timeout "$(( $(left) - 60 ))" "$PY" -m ssdmoe_tui.cli demo-model --config "$cfg" --out "$dir" \
      --shard-size 4G > "$OUT/build-$name.log" 2>&1
    log "build $name exit $?; $(du -sh "$dir" 2>/dev/null | cut -f1)"
  fi
  [ -f "$dir/config.json" ] || return 0
  timeout "$(( $(left) - 10 ))" "$PY" scripts/gpu_exact_large_cache.py --model "$dir" \
    --configs 4G:host,all --tokens "$TOKENS" --out "$OUT/$name.jsonl" > "$OUT/exact-$name.log" 2>&1
  log "exact $name exit $? ($(grep -c '"same_tokens": true' "$OUT/$name.jsonl" 2>/dev/null) same)"
}

run_model goss tests/fixtures/models/gpt-oss-120b/config.json "${LAYERS_GOSS:-4}" \
  '{"quantization": {"bits": 4, "group_size": 32, "mode": "mxfp4"}}'
run_model dsv3 tests/fixtures/models/deepseek-v3/config.json "${LAYERS_DSV3:-3}" \
  '{"first_k_dense_replace": 1, "quantization": {"bits": 4, "group_size": 64}}'
log "done"
