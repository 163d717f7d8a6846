"""Fixtures the server tests share."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.fixture_paths import MODELS


@pytest.fixture(scope="module")
def tool_model(checkpoints, tmp_path_factory):
    """The small qwen3_moe checkpoint with Qwen3's own chat template (tools, thinking)."""
    src = checkpoints("qwen3_moe")
    dst = tmp_path_factory.mktemp("tools") / "qwen3-tools"
    shutil.copytree(src, dst)
    config = json.loads((dst / "tokenizer_config.json").read_text())
    config["chat_template"] = (MODELS / "qwen3-30b-a3b" / "chat_template.jinja").read_text()
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    (dst / "chat_template.jinja").unlink(missing_ok=True)
    return dst


@pytest.fixture(scope="module")
def think_model(checkpoints, tmp_path_factory):
    """The small qwen3_moe checkpoint with a tokenizer that knows <think> / </think> and
    Qwen3.5's template, whose generation prompt opens the think block."""
    from ssdmoe_tui.models.demo import write_tokenizer

    src = checkpoints("qwen3_moe")
    dst = tmp_path_factory.mktemp("think") / "qwen3-think"
    shutil.copytree(src, dst)
    template = (MODELS / "qwen3.5-35b-a3b" / "chat_template.jinja").read_text()
    write_tokenizer(dst, 1024, template, ("<think>", "</think>"))
    return dst
