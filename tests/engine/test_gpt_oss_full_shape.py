"""The FULL gpt-oss-120b shape (36 MoE layers x 128 MXFP4 experts, 58.9 GiB), as
safetensors headers over sparse files (tests/helpers/real_shapes.py: the data reads as
zeros and takes no disk):
- `ssdmoe index --model` on it prints the MiB/token per K the registry's arithmetic gives
  for the genuine config, and reads the headers, not the 59 GiB;
- the trace-driven engine runs on it with the recorded gpt-oss-120b routing trace
  (`gptoss.route.csv`, K = 2), every layer routed by the trace, and its decode hit rate
  equals `ssdmoe trace replay`'s. Zero weights change no lookup: the trace routes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import pytest

from ssdmoe_tui.bench.trace_replay import replay
from ssdmoe_tui.engine.experts.cache import slot_memory_bytes
from ssdmoe_tui.engine.experts.index import build_index
from ssdmoe_tui.engine.model.loader import load_streamed
from ssdmoe_tui.engine.policy import trace_routing
from ssdmoe_tui.engine.policy.traces import read_trace
from ssdmoe_tui.engine.run.runner import Runner
from ssdmoe_tui.models import registry
from tests.helpers.cli_runner import run_cli
from tests.helpers.fixture_paths import MODELS
from tests.helpers.real_shapes import VOCAB, allocated_bytes, write_headers_only
from tests.helpers.traces import GPTOSS, cut_trace

REAL = json.loads((MODELS / "gpt-oss-120b" / "config.json").read_text())


def _full_shape(out: Path, vocab: int | None = None) -> Path:
    config = json.loads(json.dumps(REAL))
    config.pop("quantization_config")  # the written config says MLX's own quantization
    if vocab is not None:
        config["vocab_size"] = vocab
    write_headers_only(config, out, "mxfp4")
    return out


@pytest.fixture(scope="module")
def full_shape(tmp_path_factory):
    out = _full_shape(tmp_path_factory.mktemp("gpt-oss-120b") / "full")
    yield out
    shutil.rmtree(out, ignore_errors=True)


def _rchar() -> int:
    """Bytes this process has read through read(2)/pread(2) so far (Linux)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_index_of_the_full_gpt_oss_120b_shape_is_the_config_arithmetic(full_shape, capsys):
    from ssdmoe_tui.cli import main

    assert allocated_bytes(full_shape) < 8 << 20  # 58.9 GiB of data, none of it on disk
    before = _rchar()
    assert main(["index", "--model", str(full_shape), "--json"]) == 0
    read = _rchar() - before
    got = json.loads(capsys.readouterr().out)
    assert read < 16 << 20, f"the index read {read:,} bytes of a 59 GiB checkpoint"
    geo = registry.moe_geometry(REAL)
    assert (got["moe_layers"], got["experts_per_layer"], got["trained_k"]) == (36, 128, 4)
    assert got["expert_bytes"] == registry.expert_bytes_from_config(REAL, 4, 32, "mxfp4")
    assert got["expert_bytes_total"] == got["expert_bytes"] * 36 * 128
    want = {str(k): round(registry.mib_per_token(REAL, k, bits=4, group_size=32, mode="mxfp4"), 3)
            for k in (1, 2, 4, 8)}  # fmt: skip
    assert got["mib_per_token"] == want and geo.trained_k == 4
    assert want["4"] == 1817.754  # 4 x 36 x 13,236,480 B: the genuine config's K = 4

    # the text the user reads: one line per figure, each K's MiB/token as computed
    out = run_cli(["index", "--model", str(full_shape)], check=True).stdout
    assert "36 x 128 experts, trained K = 4" in out
    assert "13,236,480 (12.623 MiB; 9 components, 9 reads)" in out
    assert "MiB per token    " + ", ".join(f"K={k}: {v}" for k, v in want.items()) in out


@pytest.mark.slow
def test_trace_drives_the_engine_on_the_gpt_oss_120b_shape(tmp_path):
    """The recorded gpt-oss-120b trace (K = 2), cut to its first decode steps (the CPU
    computes 36 layers of 2880-wide MXFP4 experts per token), routes every layer of the
    full-depth shape; the engine's decode hits equal the replay's at the same slots."""
    path = _full_shape(tmp_path / "ckpt", vocab=VOCAB)
    trace = cut_trace(GPTOSS, tmp_path / "gptoss-8.jsonl", 36, 8)
    index = build_index(path)
    slots = 4 * 36  # 2 x K per layer
    sm = load_streamed(path, expert_cache=str(slots * slot_memory_bytes(index, mx.float32)))
    try:
        assert sm.cache.capacity == slots
        routing = trace_routing.attach(sm, trace)
        assert routing.k == 2 and routing.num_layers == 36
        sm.tokenizer.eos_token_ids = set()
        runner = Runner(sm, prefill_step_size=64)
        runner.k = routing.k
        res = runner.generate(list(range(3, 19)), max_tokens=len(routing.decode))
        st = res.stats
        assert st.k_per_token == [2] * len(routing.decode)
        assert routing.wraps == 0 and routing.position == len(routing.decode) - 1
        got = st.decode_hits / (st.decode_hits + st.decode_misses)
        want = replay(read_trace(trace), "cycle-lfu", slots, warmup=1).hit_rate
        assert abs(100 * got - 100 * want) <= 0.5, (got, want)
        assert st.requested_bytes == st.misses * index.expert_bytes
    finally:
        sm.close()
