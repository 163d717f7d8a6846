"""The pipelined streamed layer (issue 29): a layer's hits are queued before its misses
are read, and the misses computed after, in calls whose arithmetic for each row is
mlx-lm's. Greedy tokens against resident mlx-lm, for every architecture, with both call
shapes (`full`: mlx-lm's shape with the other rows pointed at an unused row, what a GPU
runs; `compact`: a call of the rows alone, the CPU's default), over one bank and several."""

from __future__ import annotations

import mlx.core as mx
import pytest

from ssdmoe_tui.engine.experts.cache import BANK_BYTES_ENV, slot_memory_bytes
from ssdmoe_tui.engine.experts.index import build_index
from ssdmoe_tui.engine.model.loader import load_streamed
from ssdmoe_tui.engine.model.streamed import PIPELINE_ENV
from ssdmoe_tui.engine.run.runner import Runner
from ssdmoe_tui.errors import SsdmoeError
from tests.helpers.exact import MAX_TOKENS, PROMPT, reference_tokens
from tests.helpers.real_shapes import routed

ARCHS = ["qwen3_moe", "qwen3_5_moe", "nemotron_h", "mixtral"]


def _half_budget(path) -> int:
    index = build_index(path)
    return slot_memory_bytes(index, mx.float32) * index.num_experts * index.num_layers // 2


def _generate(path, budget, max_tokens=MAX_TOKENS):
    sm = load_streamed(path, expert_cache=str(budget))
    runner = Runner(sm)
    prompt = sm.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
    return sm, prompt, runner.generate(prompt, max_tokens=max_tokens)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["full", "compact"])
def test_pipelined_layer_matches_mlx_lm(checkpoints, monkeypatch, tmp_path_factory, arch, mode):
    monkeypatch.setenv(PIPELINE_ENV, mode)
    path = checkpoints(arch)
    if arch == "nemotron_h":
        path = routed(path, tmp_path_factory.getbasetemp() / "nemotron_h-routed")
    sm, prompt, res = _generate(path, _half_budget(path))
    c = sm.cache.counters
    assert sm.times.pipelined_calls > 0, "no layer had both hits and misses"
    assert c.hits > 0 and c.misses > 0
    assert res.tokens == reference_tokens(path, None, mx.float32, prompt)
    sm.close()


@pytest.mark.parametrize("mode", ["full", "compact"])
def test_pipelined_layer_over_several_banks(checkpoints, monkeypatch, mode) -> None:
    """Hits and misses spread over banks: the calls are per bank and per phase, and the
    hits' calls never point a row at a slot being read meanwhile."""
    monkeypatch.setenv(PIPELINE_ENV, mode)
    monkeypatch.setenv(BANK_BYTES_ENV, "20K")
    path = checkpoints("qwen3_moe")
    sm, prompt, res = _generate(path, _half_budget(path))
    assert sm.cache.num_banks > 2
    assert sm.times.pipelined_calls > 0
    assert res.tokens == reference_tokens(path, None, mx.float32, prompt)
    sm.close()


def test_pipeline_off_is_the_serial_layer(checkpoints, monkeypatch) -> None:
    monkeypatch.setenv(PIPELINE_ENV, "off")
    path = checkpoints("qwen3_moe")
    sm, prompt, res = _generate(path, _half_budget(path), max_tokens=8)
    assert sm.times.pipelined_calls == 0
    assert sm.cache.counters.misses > 0
    sm.close()


@pytest.mark.parametrize(
    ("env", "choices"),
    [
        (PIPELINE_ENV, "auto, on, off, full, compact"),
        ("SSDMOE_PREFILL_STAGE", "auto, on, off, ahead, migrate"),
        ("SSDMOE_PREFILL_READAHEAD", "auto, on, off"),
    ],
)
def test_bad_mode_is_one_line(checkpoints, monkeypatch, env, choices) -> None:
    monkeypatch.setenv(env, "sometimes")
    with pytest.raises(SsdmoeError) as err:
        load_streamed(checkpoints("qwen3_moe"), expert_cache="1")
    assert str(err.value) == f"{env}='sometimes': use one of {choices}"


@pytest.mark.parametrize(("budget", "banks"), [("half", None), ("1", None), ("half", "20K")])
def test_staged_prefill_matches_mlx_lm(checkpoints, monkeypatch, budget, banks) -> None:
    """A prefill chunk computed from a copy of the slots it uses (what MLX-CUDA's `host`
    placement gets, forced here on the CPU): the same tokens, whether the chunk's union
    fits (one staged call), exceeds the cache (groups) or spans banks."""
    from ssdmoe_tui.engine.model.streamed import STAGE_ENV

    monkeypatch.setenv(STAGE_ENV, "on")
    if banks:
        monkeypatch.setenv(BANK_BYTES_ENV, banks)
    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache=str(_half_budget(path) if budget == "half" else budget))
    prompt = _long_prompt(sm)
    res = Runner(sm, prefill_step_size=len(prompt)).generate(prompt, max_tokens=6)
    assert sm.times.staged_calls > 0
    assert (sm.times.grouped_calls > 0) == (budget == "1")
    assert res.tokens == _reference_long(path, prompt)
    sm.close()


@pytest.mark.parametrize(("budget", "banks"), [("half", None), ("half", "20K"), ("tight", None)])
def test_prefill_staged_ahead_matches_mlx_lm(checkpoints, monkeypatch, budget, banks) -> None:
    """`SSDMOE_PREFILL_STAGE=ahead` (prestage.py): each layer's copy of its predicted
    union is queued on a second stream while the layer before computes, and the layer
    computes from it plus the experts it lacked. The same tokens as mlx-lm's, over one
    bank and several, and with a cache small enough that the read-ahead cannot hold a
    whole predicted union (the copy then lacks experts the layer gathers itself)."""
    from ssdmoe_tui.engine.model.streamed import STAGE_ENV

    monkeypatch.setenv(STAGE_ENV, "ahead")  # the prefill read-ahead follows it ("auto")
    if banks:
        monkeypatch.setenv(BANK_BYTES_ENV, banks)
    path = checkpoints("qwen3_moe")
    index = build_index(path)
    # tight: a layer and a half of slots, so the read-ahead, with this layer's union
    # pinned, has room for half of the next one's
    tight = slot_memory_bytes(index, mx.float32) * index.num_experts * 3 // 2
    sm = load_streamed(path, expert_cache=str(_half_budget(path) if budget == "half" else tight))
    prompt = _long_prompt(sm)
    res = Runner(sm, prefill_step_size=len(prompt)).generate(prompt, max_tokens=6)
    t = sm.times
    assert t.readahead_calls > 0 and t.prestaged_calls > 0 and t.prestaged_experts > 0
    if budget == "tight":
        assert t.prestage_missed_experts > 0
    assert res.tokens == _reference_long(path, prompt)
    sm.close()


def test_prefill_pages_moved_ahead_stage_in_place_with_mlx_lms_tokens(
    checkpoints, monkeypatch
) -> None:
    """`SSDMOE_PREFILL_STAGE=migrate` (page_ahead.py): the long chunk stages in place, its
    read-ahead on, each layer's predicted rows handed to the page mover at the start of
    the layer's call; on the CPU there is no mover (nothing to move), and the tokens are
    mlx-lm's. The bench's figure says so (None: nothing moved)."""
    from ssdmoe_tui.bench.bench import _pages_moved
    from ssdmoe_tui.engine.model.page_ahead import PageAhead
    from ssdmoe_tui.engine.model.streamed import STAGE_ENV

    monkeypatch.setenv(STAGE_ENV, "migrate")
    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache=str(_half_budget(path)))
    ahead = sm.switches[0].prestage
    assert isinstance(ahead, PageAhead) and ahead.mover is None
    assert all(sw.prestage is ahead for sw in sm.switches)
    prompt = _long_prompt(sm)
    try:
        res = Runner(sm, prefill_step_size=len(prompt)).generate(prompt, max_tokens=6)
        t = sm.times
        assert t.readahead_calls > 0 and t.staged_calls > 0 and t.prestaged_calls == 0
        assert set(_pages_moved(sm).values()) == {None}
    finally:
        sm.close()
    assert res.tokens == _reference_long(path, prompt)


def test_auto_moves_pages_in_a_prompts_first_chunk_only(checkpoints, monkeypatch) -> None:
    """`auto`'s rule under MLX-CUDA `host` placement (page_ahead.py): the runner tells the
    layers each chunk's place in its prefill (`PrefillGate.chunk`), and pages move to the
    GPU in the first long chunk only; those moved go back during the later ones. On the
    CPU a recorder stands in for the driver's moves; the tokens stay mlx-lm's."""
    from ssdmoe_tui.engine.model.streamed import LONG_CHUNK_ROWS, STAGE_ENV

    monkeypatch.setenv(STAGE_ENV, "migrate")  # staged in place, read ahead: auto's on CUDA
    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache=str(_half_budget(path)))
    gate, ahead = sm.prefill_gate, sm.switches[0].prestage
    calls: list[tuple[str, int | None]] = []

    class Recorder:
        def to_device(self, ranges: list) -> None:
            calls.append(("device", gate.chunk))

        def to_host(self, ranges: list) -> None:
            calls.append(("host", gate.chunk))

    ahead.mover, ahead.moves_now = Recorder(), lambda: gate.chunk == 0
    step = LONG_CHUNK_ROWS // sm.trained_k + 8  # each chunk a long one
    prompt = [5 + (i * 7) % 500 for i in range(3 * step + 1)]
    try:
        res = Runner(sm, prefill_step_size=step).generate(prompt, max_tokens=4)
        assert gate.chunk is None and gate.chunk_tokens == 0  # only set around a chunk
    finally:
        sm.close()
    assert {c for kind, c in calls if kind == "device"} == {0}
    assert ("device", 0) in calls and ("host", 1) in calls  # moved, then back in the next
    assert res.tokens == _reference_long(path, prompt, step)[:4]


def test_auto_installs_the_first_chunk_mover_where_slots_are_host_placed_on_cuda(
    checkpoints, monkeypatch
) -> None:
    """Which models `auto` gives a page mover: MLX-CUDA with the layers computing from
    host slots (stood in for on the CPU), moving while the gate says chunk 0 of at least
    `AUTO_MIN_TOKENS` (a stoppable request's 128-token first chunk would wait for its
    pages); nowhere else (here: the CPU as it is)."""
    from ssdmoe_tui.engine.model import loader
    from ssdmoe_tui.engine.model.page_ahead import PageAhead

    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache="1G")
    assert sm.switches[0].prestage is None
    sm.close()
    monkeypatch.setattr(loader, "is_cuda", lambda: True)
    monkeypatch.setattr(loader, "computed_from", lambda cache: "host")
    sm = load_streamed(path, expert_cache="1G")
    try:
        ahead = sm.switches[0].prestage
        assert isinstance(ahead, PageAhead) and ahead.moves_now is not None
        assert all(sw.prestage is ahead for sw in sm.switches)
        gate = sm.prefill_gate
        for chunk, tokens, moves in ((0, 4096, True), (0, 2048, True), (0, 128, False),
                                     (1, 4096, False), (None, 0, False)):  # fmt: skip
            gate.chunk, gate.chunk_tokens = chunk, tokens
            assert ahead.moves_now() is moves, (chunk, tokens)
    finally:
        sm.close()


def test_prefill_staged_ahead_under_a_mirror_defers_the_mirror(checkpoints, monkeypatch) -> None:
    """Under a mirror (`device` placement, forced on the CPU) the long chunk stages ahead
    from the host banks and copies nothing into the mirror: the rows it read wait, marked,
    for the mirror's next sync, which the next one-token step's lookup makes (here the
    prompt's last token) before anything computes from the mirror. The tokens stay
    mlx-lm's."""
    from ssdmoe_tui.engine.experts.mirror import MIRROR_ENV, SlotMirror
    from ssdmoe_tui.engine.model.streamed import STAGE_ENV

    monkeypatch.setenv(STAGE_ENV, "ahead")
    monkeypatch.setenv(MIRROR_ENV, "on")
    copied: list[tuple[int, int]] = []  # (layer calls so far, rows) per sync that copied
    real_sync = SlotMirror.sync
    times = []

    def watched(self) -> int:
        n = real_sync(self)
        if n:
            copied.append((times[0].calls, n))
        return n

    monkeypatch.setattr(SlotMirror, "sync", watched)
    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache=str(_half_budget(path)))
    times.append(sm.times)
    prompt = _long_prompt(sm)
    try:
        res = Runner(sm, prefill_step_size=len(prompt)).generate(prompt, max_tokens=6)
        layers = len(sm.switches)
        assert sm.times.prestaged_calls > 0
        assert copied and all(calls > layers for calls, _ in copied)  # none in the chunk
        assert copied[0][1] > 0  # the chunk's rows, copied at the next step's first lookup
    finally:
        sm.close()
    assert res.tokens == _reference_long(path, prompt)


def test_a_prestaged_copy_serves_its_own_layer_and_call_only() -> None:
    """A prediction asked for layer l by call c is copied only at the start of layer l's
    call (calls still c), and that copy is taken only by the same call once it has
    counted itself (c + 1); anything else is dropped, as is all on `drop` (a stopped
    chunk), so no copy outlives the pass it was made for."""
    import numpy as np

    from ssdmoe_tui.engine.model.prestage import Prestage, Prestaged

    class NoCache:  # fulfil must not touch the cache unless the ask matches
        def __getattr__(self, name):
            raise AssertionError(f"cache.{name} used for a prediction of another call")

    p = Prestage()
    for layer, call in [(4, 10), (3, 11), (3, 9)]:
        p.ask(3, np.array([1, 2]), 10)
        p.fulfil(NoCache(), layer, call)
        assert p._asked is None and p._held is None
    copy = Prestaged(3, 10, np.array([1, 2]), {})
    for layer, call, got in [(3, 11, copy), (4, 11, None), (3, 12, None), (3, 10, None)]:
        p._held = copy
        assert p.take(layer, call) is got
        assert p.take(layer, call) is None  # held once
    p.ask(3, np.array([1]), 10)
    p._held = copy
    p.drop()
    assert p._asked is None and p._held is None


def _long_prompt(sm) -> list[int]:
    """A prompt whose one chunk is a long chunk (`LONG_CHUNK_ROWS` rows and more)."""
    from ssdmoe_tui.engine.model.streamed import LONG_CHUNK_ROWS

    return [5 + (i * 7) % 500 for i in range(LONG_CHUNK_ROWS // sm.trained_k + 8)]


def _reference_long(path, prompt: list[int], step: int | None = None) -> list[int]:
    """Resident mlx-lm's greedy tokens with the whole prompt in one chunk (or chunks of
    `step`), as the engine."""
    from mlx_lm import load, stream_generate

    from ssdmoe_tui.engine.model.loader import cast_model

    model, tok = load(str(path))
    cast_model(model, mx.float32)
    step = step or len(prompt)
    ref = stream_generate(model, tok, mx.array(prompt), max_tokens=6, prefill_step_size=step)
    return [r.token for r in ref]


def test_staging_is_chosen_by_placement() -> None:
    from ssdmoe_tui.engine.model.streamed import stages

    assert stages("auto", "host")
    assert not any(stages("auto", p) for p in ("managed", "none"))
    assert stages("on", "none") and not stages("off", "host")


def test_staging_follows_where_the_layers_compute_from() -> None:
    """A mirror (`device`) is device memory: nothing to stage; `device` with its mirror
    off computes from the host slots, as `host` does."""
    from types import SimpleNamespace as NS

    from ssdmoe_tui.engine.model.streamed import computed_from

    assert computed_from(NS(mirror=object(), placement=NS(placement="device"))) == "device"
    assert computed_from(NS(mirror=None, placement=NS(placement="device"))) == "host"
    assert computed_from(NS(mirror=None, placement=NS(placement="managed"))) == "managed"
    assert computed_from(NS(mirror=object(), placement=NS(placement="none"))) == "device"


@pytest.mark.parametrize("readahead", ["on", "off"])
def test_prefill_reads_the_next_layers_union_ahead(checkpoints, monkeypatch, readahead) -> None:
    """A long prefill chunk (`LONG_CHUNK_ROWS` rows and more) reads the next layer's predicted
    union while a layer computes: the next layer then misses less, and the tokens stay
    mlx-lm's; $SSDMOE_PREFILL_READAHEAD=off leaves it out."""
    from ssdmoe_tui.engine.model.streamed import READAHEAD_ENV

    monkeypatch.setenv(READAHEAD_ENV, readahead)
    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache=str(_half_budget(path)))
    prompt = _long_prompt(sm)
    res = Runner(sm, prefill_step_size=len(prompt)).generate(prompt, max_tokens=6)
    c = sm.cache.counters
    if readahead == "on":
        assert sm.times.readahead_calls == sm.index.num_layers - 1
        assert c.prefetch_issued > 0 and c.prefetch_used > 0
    else:
        assert sm.times.readahead_calls == 0 and c.prefetch_issued == 0
    assert res.tokens == _reference_long(path, prompt)
    sm.close()


def test_rows_outside_a_call_point_at_a_row_neither_used_nor_being_read() -> None:
    import numpy as np

    from ssdmoe_tui.engine.model.streamed import unused_row

    assert unused_row(8, np.array([0, 1, 3]), np.array([2, 4])) == 5
    assert unused_row(8, np.array([5, 6]), np.array([], dtype=np.int64)) == 0
    assert unused_row(3, np.array([2, 1]), np.array([0])) == 1  # none free: a used row
