"""A lower-bit copy of a checkpoint (`ssdmoe requant`): the "fit" side of stream or fit.

The source is loaded lazily with mlx-lm, its quantized layers dequantized and quantized
again at the new bits with mlx-lm's `quantize_model` (affine, the group size asked or
the source's), then written by the demo's shard writer (`demo.save_quantized`), so the
copy has the mlx-community layout and config ("quantization": bits, group_size, mode,
and one entry per layer that differs) and loads in plain `mlx_lm.load`. Layers the
source quantized at other than its default settings (the routers, 8-bit in
mlx-community's MoE checkpoints) keep those settings; layers it left unquantized stay so.
The folder is written under a temporary name and renamed when complete
(`atomic.atomic_folder`).
"""

from __future__ import annotations

import contextlib
import io
import time
from dataclasses import dataclass
from pathlib import Path

from ssdmoe_tui.errors import BadValueError
from ssdmoe_tui.models.demo import ProgressFn, _noop, copy_tokenizer, save_quantized

#: Affine bit widths MLX quantizes to that are worth a copy (below a 4-bit source: 2, 3).
BITS = (2, 3, 4, 5, 6)
GROUP_SIZES = (32, 64, 128)
MODE = "affine"  # the only MLX mode with 2- and 3-bit weights
SHARD_BYTES = 2 << 30  # a shard's dequantized weights are in memory at once

README = """# {name}: {bits}-bit copy of {source}

Written by `ssdmoe requant --bits {bits}` from `{source}` ({source_bits}-bit): every
layer the source quantized at its defaults was dequantized and quantized again with
mlx-lm (`quantize_model`, mode {mode}, group size {group_size}); the layers the source
kept at other settings (routers) keep them. It loads in plain `mlx_lm.load`; see
`ssdmoe bench --model SOURCE --fit THIS` (docs/benchmarks.md, "Stream or fit").
"""


@dataclass(frozen=True)
class Requantized:
    """What `requantize` wrote."""

    out: Path
    bits: int
    group_size: int
    mode: str
    source_bits: int
    weight_bytes: int
    seconds: float


def source_quantization(config: dict) -> dict:
    """The source's top-level quantization block (bits, group_size, mode)."""
    q = config.get("quantization") or config.get("quantization_config")
    if not isinstance(q, dict) or not isinstance(q.get("bits"), int):
        raise BadValueError("--model: not an MLX-quantized checkpoint (no quantization bits)")
    return {"bits": q["bits"], "group_size": q.get("group_size"), "mode": q.get("mode", MODE)}


def check_requant(config: dict, bits: int, group_size: int | None, out: Path) -> int:
    """One line naming the bad value, before any weight is read; returns the group size."""
    src = source_quantization(config)
    if bits not in BITS:
        raise BadValueError(
            f"--bits {bits}: not supported (choose from {', '.join(map(str, BITS))})"
        )
    if bits >= src["bits"]:
        raise BadValueError(
            f"--bits {bits}: not below the source's {src['bits']} bits (a lower-bit copy "
            "is the point)"
        )
    if group_size is None:
        group_size = src["group_size"] if src["mode"] == MODE and src["group_size"] else 64
    if group_size not in GROUP_SIZES:
        raise BadValueError(
            f"--group-size {group_size}: not supported (choose from "
            f"{', '.join(map(str, GROUP_SIZES))})"
        )
    if out.exists():
        raise BadValueError(f"--out {out}: already exists (requant writes a new folder)")
    return group_size


def _quantized_layers(model) -> dict[str, dict]:
    """{module path: its quantization settings} of the layers the source quantized."""
    found: dict[str, dict] = {}
    for name, m in model.named_modules():
        if hasattr(m, "scales") and isinstance(getattr(m, "bits", None), int):
            params = {"group_size": m.group_size, "bits": m.bits}
            if getattr(m, "mode", MODE) != MODE:
                params["mode"] = m.mode
            found[name] = params
    return found


def requantize(
    source: Path,
    out: Path,
    *,
    bits: int,
    group_size: int | None = None,
    max_shard_bytes: int = SHARD_BYTES,
    progress: ProgressFn = _noop,
) -> Requantized:
    """Write a `bits`-bit copy of the checkpoint in `source` into the new folder `out`."""
    from mlx_lm.utils import dequantize_model, load_model, quantize_model

    from ssdmoe_tui.atomic import DiskFullError, atomic_folder
    from ssdmoe_tui.checkpoint.config import read_json_object

    source, out = Path(source), Path(out)
    config = read_json_object(source / "config.json")
    group_size = check_requant(config, bits, group_size, out)
    src = source_quantization(config)
    t0 = time.monotonic()
    model, config = load_model(source, lazy=True)
    layers = _quantized_layers(model)
    default = {"group_size": src["group_size"], "bits": src["bits"]}
    if src["mode"] != MODE:
        default["mode"] = src["mode"]

    def predicate(path: str, _module) -> bool | dict:
        kept = layers.get(path)
        if kept is None:
            return False  # the source left it unquantized
        return True if kept == default else dict(kept)  # routers keep their 8 bits

    model = dequantize_model(model)
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    progress(
        f"requantizing {source.name}: {src['bits']}-bit -> {bits}-bit {MODE}, group size "
        f"{group_size} ({len(layers)} quantized layers)"
    )
    with contextlib.redirect_stdout(io.StringIO()):  # mlx-lm prints "[INFO] Quantized model ..."
        model, qconfig = quantize_model(
            model, config, group_size, bits, mode=MODE, quant_predicate=predicate
        )
    try:
        with atomic_folder(out) as tmp:
            copy_tokenizer(source, tmp)
            total = save_quantized(
                model, qconfig, tmp, max_shard_bytes=max_shard_bytes, progress=progress
            )
            (tmp / "README.md").write_text(
                README.format(
                    name=out.name, bits=bits, source=source.name, source_bits=src["bits"],
                    mode=MODE, group_size=group_size,
                )
            )  # fmt: skip
    except DiskFullError as e:  # name the folder asked for, not its temporary name
        raise DiskFullError(out, e.needed) from None
    return Requantized(
        out, bits, group_size, MODE, src["bits"], total, round(time.monotonic() - t0, 2)
    )
