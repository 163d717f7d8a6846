"""Fixed engine events for the app tests that need no engine thread: a model's info, the
panel's samples and a finished reply (the snapshot tests' idle layout)."""

from __future__ import annotations

from ssdmoe_tui.engine.run.protocol import ModelInfo, ModelLoaded, PhaseChanged, StatsSample
from ssdmoe_tui.ui.app import SsdmoeApp
from ssdmoe_tui.ui.widgets.prompt_input import PromptInput
from tests.helpers.pilot import wait_until

INFO = ModelInfo(
    name="Qwen3-30B-A3B-4bit",
    path="/models/Qwen3-30B-A3B-4bit",
    model_type="qwen3_moe",
    num_layers=48,
    num_experts=128,
    trained_k=8,
    k=6,
    prefill_k=8,
    max_context=40960,
    device="gpu/Metal",
    dtype="bfloat16",
    expert_bytes=1_769_472,
    resident_bytes=1_288_490_188,
    expert_cache_budget=4 << 30,
    reader="native",
    fingerprint="0" * 32,
    hybrid=False,
)


def sample(generated: int, tok_s: float, ssd: float) -> StatsSample:
    return StatsSample(
        decode_tok_s=tok_s,
        prefill_tok_s=212.5,
        ssd_mib_per_token=ssd,
        requested_mib_per_token=486.0,
        expert_cache_hit_rate=0.8125,
        expert_cache_used_bytes=3_221_225_472,
        expert_cache_budget_bytes=4 << 30,
        resident_bytes=1_288_490_188,
        kv_cache_bytes=50_331_648,
        rss_bytes=5_153_960_755,
        peak_rss_bytes=5_368_709_120,
        peak_memory_bytes=5_000_000_000,
        kv_hit_rate=0.75,
        context_tokens=1234,
        max_context=40960,
        k=6,
        generated_tokens=generated,
        routing_mass=0.874,
        routing_mass_last=0.82 + (generated % 4) * 0.03,
    )


REPLY = (
    "Experts are routed **per token**. A tiny example:\n\n"
    "```python\nfor layer in model.layers:\n    x = layer(x)\n```\n\n"
    "- K of 128 experts run in each layer\n- the rest stay on the SSD\n"
)


async def setup(pilot) -> None:
    app: SsdmoeApp = pilot.app
    app.query_one(PromptInput).cursor_blink = False
    app.feed(ModelLoaded(INFO))
    for i in range(1, 13):
        app.feed(sample(i * 5, 9.0 + (i % 4) * 1.5, 120.0 - i * 6.0))
    app.feed(PhaseChanged("idle"))
    await pilot.pause()
    await app.chat_pane.transcript.add_user("How does an MoE model pick its experts?")
    reply = await app.chat_pane.transcript.add_assistant("r1", INFO.name)
    await reply.finish(REPLY, "stop", "60 tokens · 12.5 tok/s")
    await pilot.pause()


async def open_by_key(pilot, key: str, screen_type: type) -> None:
    """Fixed events (`setup`), then `key`, until its screen is up and drawn."""
    app = pilot.app
    await setup(pilot)
    await pilot.press(key)
    await wait_until(pilot, lambda: isinstance(app.screen, screen_type), what=key)
    await pilot.pause(0.2)
