"""Which checkpoints could draft with their own multi-token-prediction (MTP) head.

Of the architectures the engine runs, qwen3_5_moe (`mtp_num_hidden_layers`) and
nemotron_h (`num_nextn_predict_layers`, `mtp_*`) define an MTP head; qwen3_moe and mixtral
have none. mlx-lm drops the head's tensors when it converts or loads these models
(`sanitize` filters every `mtp.` key), so mlx-community checkpoints do not carry it.
The engine does not build an MTP drafter yet: `--speculate mtp` names why for every
checkpoint in one line, and `auto` drafts by prompt lookup.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ssdmoe_tui.checkpoint.arch import text_config
from ssdmoe_tui.checkpoint.header import read_header
from ssdmoe_tui.checkpoint.layout import shard_names
from ssdmoe_tui.errors import BadValueError

MTP_CONFIG_KEYS = ("mtp_num_hidden_layers", "num_nextn_predict_layers")


def config_mtp_layers(config: Mapping) -> int:
    """MTP layers the architecture's config declares (0: none)."""
    text = text_config(config)
    for key in MTP_CONFIG_KEYS:
        v = text.get(key)
        if isinstance(v, int) and v > 0:
            return v
    return 0


def carries_mtp_weights(path: Path) -> bool:
    """Whether any shard's header names an MTP tensor (`mtp.` or `.mtp.` in its name)."""
    for name in shard_names(path, require=False):
        f = Path(path) / name
        if not f.is_file():
            continue
        if any(k.startswith("mtp.") or ".mtp." in k for k in read_header(f).tensors):
            return True
    return False


def check_mtp(config: Mapping, path: Path) -> None:
    """One line saying why this checkpoint cannot draft with an MTP head."""
    mt = str(config.get("model_type", "?"))
    if not config_mtp_layers(config):
        raise BadValueError(f"--speculate mtp: {mt} has no MTP head (use ngram or auto)")
    if not carries_mtp_weights(path):
        raise BadValueError(
            f"--speculate mtp: {path} declares an MTP head but carries none of its weights "
            "(mlx-lm conversions drop them; use ngram or auto)"
        )
    raise BadValueError(
        f"--speculate mtp: {path} carries an MTP head, which this engine does not run yet "
        "(use ngram or auto)"
    )
