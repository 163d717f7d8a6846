"""Chat templates and token ids the prompt tests share: the genuine Qwen3 folder (tokenizer
and template, tests/fixtures/models), a plain ChatML template and Qwen3's <|im_end|> id."""

from __future__ import annotations

from tests.helpers.fixture_paths import MODELS

QWEN3 = MODELS / "qwen3-30b-a3b"
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
IM_END = 151645
