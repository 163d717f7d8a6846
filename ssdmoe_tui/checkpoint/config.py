"""A model folder's config.json: `read_config` checks it (one line naming the file on any
fault) without importing mlx-lm, for listings; `load_config` is mlx-lm's own public
`load_config` on a checked folder (tagged inf/nan floats decoded, generation_config.json's
EOS ids merged in as `eos_token_id`), for loading a model exactly as `mlx_lm.load` does."""

from __future__ import annotations

import json
from pathlib import Path

from ssdmoe_tui.errors import ModelError
from ssdmoe_tui.user_files import (
    MODEL_JSON_MAX,
    TEMPLATE_MAX,
    TOKENIZER_FILE_MAX,
    RefusedFile,
    check_regular,
    read_regular,
)


def read_json_object(path: Path) -> dict:
    try:
        value = json.loads(read_regular(path, MODEL_JSON_MAX))
    except RefusedFile as e:
        raise ModelError(str(e)) from None
    except UnicodeDecodeError:
        raise ModelError(f"{path}: not valid JSON (not UTF-8)") from None
    except json.JSONDecodeError as e:
        raise ModelError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    except ValueError as e:  # an integer literal over Python's digit limit
        raise ModelError(f"{path}: not valid JSON ({str(e).split(';')[0]})") from None
    except RecursionError:
        raise ModelError(f"{path}: not valid JSON (nested too deep)") from None
    except OSError as e:
        raise ModelError(f"{path}: unreadable ({e.strerror or e})") from None
    if not isinstance(value, dict):
        raise ModelError(f"{path}: not a JSON object")
    return value


def read_config(folder: Path) -> dict:
    """config.json as a dict (no mlx-lm import: cheap enough for listing many models)."""
    folder = Path(folder)
    path = folder / "config.json"
    if not path.exists() and not path.is_symlink():
        raise ModelError(f"{folder}: no config.json (not a Hugging Face / MLX model folder)")
    return read_json_object(path)  # a FIFO, a folder, a link loop: refused by name


def load_config(folder: Path) -> dict:
    """The config mlx_lm.load builds its model and tokenizer from."""
    folder = Path(folder)
    read_config(folder)
    from mlx_lm.utils import load_config as mlx_load_config

    try:  # config.json is sound; mlx-lm skips a generation_config.json that is not JSON
        return mlx_load_config(folder)
    except (ValueError, TypeError, AttributeError, RecursionError, OSError):
        raise ModelError(
            f"{folder / 'generation_config.json'}: not a readable JSON object"
        ) from None


# What transformers reads to build a tokenizer and its chat template (those present).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "generation_config.json",
)
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def check_tokenizer_files(folder: Path) -> None:
    """Each tokenizer or template file present is a regular file under its cap: a FIFO
    would block transformers' open(), /dev/zero would read until memory runs out."""
    for name in TOKENIZER_FILES + TEMPLATE_FILES:
        path = Path(folder) / name
        if not path.exists() and not path.is_symlink():
            continue
        cap = TEMPLATE_MAX if name in TEMPLATE_FILES else TOKENIZER_FILE_MAX
        try:
            check_regular(path, cap)
        except FileNotFoundError:  # a broken link: transformers skips it as absent
            continue
        except OSError as e:
            raise ModelError(f"{path}: {e.strerror or e}") from None


def load_tokenizer(folder: Path):
    """The model's tokenizer as `mlx_lm.load` builds it: mlx-lm's public `load_tokenizer`
    with the EOS ids of generation_config.json (via `load_config`), plus the tokens the
    family's table entry says end a reply (`Architecture.stop_tokens`, those it has)."""
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    from ssdmoe_tui.checkpoint.arch import family

    folder = Path(folder)
    config = load_config(folder)
    eos = config.get("eos_token_id")
    check_tokenizer_files(folder)
    try:
        tok = mlx_load_tokenizer(folder, eos_token_ids=eos)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelError(f"{folder}: cannot load tokenizer ({first})") from e
    entry = family(config)
    if entry is not None and entry.stop_tokens:
        vocab = tok._tokenizer.get_vocab()
        tok.eos_token_ids = tok.eos_token_ids | {vocab[t] for t in entry.stop_tokens if t in vocab}
    return tok
