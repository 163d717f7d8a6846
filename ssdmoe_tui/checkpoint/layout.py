"""The expert-tensor layout of an MLX MoE checkpoint, read from its safetensors headers.

mlx-lm stacks every MoE layer's experts into `<prefix>.<switch>.<proj>.<part>` tensors of
shape (experts, ...): `<switch>` is the attribute the family's block keeps its SwitchGLU /
SwitchMLP under (`switch_mlp` for most, `experts` for gpt-oss, Llama 4, dots1..., and
`switch_glu` for Gemma 4: `SWITCH_ATTRS`, from the architecture table), `<proj>` gate/up/
down_proj (SwitchGLU) or fc1/fc2 (SwitchMLP), `<part>` weight, scales, biases (the
quantization's) or bias (the projection's own, gpt-oss). Expert e of such a tensor is one
contiguous piece at `offset + e * nbytes / experts`. This module is the one place that
knows that: the engine's index, the model scan and the registry all group tensors through
`scan_experts`. A per-expert layout (`experts.0.gate_proj.weight`, the original Hugging
Face one) never matches: the projection must follow the switch attribute directly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ssdmoe_tui.checkpoint.arch import SWITCH_ATTRS, layer_number
from ssdmoe_tui.checkpoint.header import Header, HeaderError, TensorEntry, read_header
from ssdmoe_tui.errors import ModelError, UnsupportedModelError
from ssdmoe_tui.user_files import MODEL_JSON_MAX, check_regular, read_regular

MIB = 1 << 20

PROJECTIONS = ("gate_proj", "up_proj", "down_proj", "fc1", "fc2")  # canonical read order
PARTS = ("weight", "scales", "biases", "bias")
_SWITCH = "|".join(SWITCH_ATTRS)
EXPERT_RE = re.compile(
    rf"^(?P<prefix>.+)\.(?P<switch>{_SWITCH})\.(?P<proj>"
    + "|".join(PROJECTIONS)
    + r")\.(?P<part>"
    + "|".join(PARTS)
    + r")$"
)
#: nvfp4 expert stacks with one tensor scale per expert (mlx-lm `global_scale=True`).
GLOBAL_SCALE_RE = re.compile(rf"\.(?:{_SWITCH})\.(?:" + "|".join(PROJECTIONS) + r")\.global_scale$")
#: Experts stored one tensor each (original HF layout): recognised only to say so.
LOOSE_EXPERT_RE = re.compile(r"\.experts?\.")


def is_expert_tensor(name: str) -> bool:
    return EXPERT_RE.match(name) is not None


def is_auxiliary(prefix: str) -> bool:
    """A multi-token-prediction head's layers: mlx-lm drops them, so they are not streamed."""
    return "mtp" in prefix.split(".")


def layer_sort_key(prefix: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", prefix)]


def component_sort_key(name: str) -> tuple[int, int]:
    """Order of "<proj>.<part>" names inside one expert (gate, up, down; weight first)."""
    proj, part = name.split(".")
    return PROJECTIONS.index(proj), PARTS.index(part)


def mib_per_token(bytes_per_expert: int, k: int, moe_layers: int = 1) -> float:
    """Expert MiB one decoded token reads at top-K when nothing is cached."""
    return bytes_per_expert * k * moe_layers / MIB


# --------------------------------------------------------------------------- shards


def shard_names(folder: Path, *, require: bool = True) -> list[str]:
    """Shard file names: those model.safetensors.index.json maps to, else `*.safetensors`.

    With `require`, a listed shard that is not there raises one line naming it."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(read_regular(index, MODEL_JSON_MAX))["weight_map"]
            names = sorted({str(v) for v in weight_map.values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise ModelError(f"{index}: not a valid safetensors index") from None
        for n in names:
            if Path(n).is_absolute() or ".." in Path(n).parts:
                raise ModelError(f"{index}: shard name {n!r} points outside the model folder")
            if require:
                try:
                    check_regular(folder / n)
                except FileNotFoundError:
                    raise ModelError(
                        f"missing shard: {folder / n} (listed in {index.name})"
                    ) from None
                except OSError as e:  # a FIFO, a folder, a link loop, /dev/zero...
                    why = e.strerror or str(e)
                    raise ModelError(
                        f"{folder / n}: {why} (a shard listed in {index.name})"
                    ) from None
        return names
    names = sorted(p.name for p in folder.glob("*.safetensors"))
    if require and not names:
        raise ModelError(f"{folder}: no .safetensors files")
    return names


def missing_shards(folder: Path) -> list[str]:
    """Shards named by model.safetensors.index.json that are not in the folder."""
    return [n for n in shard_names(folder, require=False) if not (Path(folder) / n).is_file()]


# --------------------------------------------------------------------------- experts


@dataclass(frozen=True)
class ExpertTensor:
    """One stacked expert tensor, e.g. `model.layers.3.mlp.switch_mlp.gate_proj.weight`."""

    prefix: str  # the MoE block, e.g. "model.layers.3.mlp"
    component: str  # "<proj>.<part>", e.g. "gate_proj.weight"
    shard: str  # file name relative to the model folder
    offset: int  # absolute file offset of expert 0
    stride: int  # bytes per expert
    shape: tuple[int, ...]  # per-expert shape
    dtype: str

    @property
    def part(self) -> str:
        return self.component.split(".")[1]


@dataclass
class ExpertScan:
    """Every stacked expert tensor of a checkpoint, grouped by MoE block in layer order."""

    blocks: dict[str, list[ExpertTensor]] = field(default_factory=dict)
    num_experts: int = 0
    resident_bytes: int = 0  # every tensor that is not a streamed expert tensor
    total_bytes: int = 0
    sample_expert_tensor: str | None = None  # an expert-looking tensor outside switch_mlp
    headers: dict[str, Header] = field(default_factory=dict)  # shard name -> header

    def quantized(self, prefix: str) -> bool:
        return any(t.part == "scales" for t in self.blocks[prefix])


def _expert_tensor(shard: str, header: Header, entry: TensorEntry, m: re.Match) -> ExpertTensor:
    if len(entry.shape) < 2:
        raise HeaderError(
            header.path,
            f"expert tensor {entry.name} has shape {list(entry.shape)}, expected (experts, ...)",
        )
    if entry.shape[0] == 0:
        raise HeaderError(header.path, f"expert tensor {entry.name} has 0 experts (shape[0] = 0)")
    return ExpertTensor(
        prefix=m["prefix"],
        component=f"{m['proj']}.{m['part']}",
        shard=shard,
        offset=header.absolute(entry),
        stride=entry.nbytes // entry.shape[0],
        shape=entry.shape[1:],
        dtype=entry.dtype,
    )


def scan_experts(folder: Path, names: list[str] | None = None) -> ExpertScan:
    """Read every shard header and group the stacked expert tensors by MoE block.

    All expert tensors must stack the same number of experts. Auxiliary stacks (an MTP
    head) are left out, as mlx-lm leaves them out of the model."""
    folder = Path(folder)
    names = shard_names(folder) if names is None else names
    scan = ExpertScan()
    seen: dict[str, str] = {}  # tensor name -> the shard that holds it
    for shard in names:
        header = read_header(folder / shard)
        scan.headers[shard] = header
        for entry in header.tensors.values():
            other = seen.setdefault(entry.name, shard)
            if other != shard:
                raise HeaderError(
                    header.path,
                    f"tensor {entry.name} is also in {other} (each tensor belongs to one "
                    "shard: a shard copied or merged twice?)",
                )
            scan.total_bytes += entry.nbytes
            m = EXPERT_RE.match(entry.name)
            if m is None and GLOBAL_SCALE_RE.search(entry.name):
                raise UnsupportedModelError(
                    f"{header.path}: {entry.name}: nvfp4 experts with per-expert global scales "
                    "are not streamed yet"
                )
            if m is None:
                scan.resident_bytes += entry.nbytes
                if scan.sample_expert_tensor is None and LOOSE_EXPERT_RE.search(entry.name):
                    scan.sample_expert_tensor = entry.name
                continue
            if is_auxiliary(m["prefix"]):
                continue
            tensor = _expert_tensor(shard, header, entry, m)
            experts = entry.shape[0]
            if scan.num_experts and experts != scan.num_experts:
                raise HeaderError(
                    header.path,
                    f"expert tensor {entry.name} has {experts} experts, other layers have "
                    f"{scan.num_experts}",
                )
            scan.num_experts = experts
            scan.blocks.setdefault(m["prefix"], []).append(tensor)
    scan.blocks = {
        p: sorted(scan.blocks[p], key=lambda t: component_sort_key(t.component))
        for p in sorted(scan.blocks, key=layer_sort_key)
    }
    return scan


# --------------------------------------------------------------------------- measure


@dataclass
class LayerExperts:
    total_bytes: int = 0
    num_experts: int = 0
    quantized: bool = False

    @property
    def bytes_per_expert(self) -> int:
        return self.total_bytes // self.num_experts if self.num_experts else 0


@dataclass
class ExpertMeasure:
    """switch_mlp expert tensors found in a checkpoint's headers, per decoder layer."""

    layers: dict[int, LayerExperts] = field(default_factory=dict)
    sample_expert_tensor: str | None = None  # an expert-looking tensor outside switch_mlp

    @property
    def num_experts(self) -> int:
        return next(iter(self.layers.values())).num_experts if self.layers else 0

    @property
    def quantized(self) -> bool:
        return bool(self.layers) and all(layer.quantized for layer in self.layers.values())

    @property
    def bytes_per_expert(self) -> int:
        """One expert of the first MoE layer."""
        if not self.layers:
            return 0
        return self.layers[min(self.layers)].bytes_per_expert

    def mib_per_token(self, k: int) -> float:
        """Expert MiB one token reads at top-k (summed per layer: exact for mixed recipes)."""
        return mib_per_token(sum(la.bytes_per_expert for la in self.layers.values()), k)


def measure_experts(folder: Path) -> ExpertMeasure:
    """Bytes per expert of every MoE layer, from the headers only."""
    scan = scan_experts(folder)
    measure = ExpertMeasure(sample_expert_tensor=scan.sample_expert_tensor)
    for i, (prefix, tensors) in enumerate(scan.blocks.items()):
        number = layer_number(prefix)
        measure.layers[i if number is None else number] = LayerExperts(
            total_bytes=sum(t.stride for t in tensors) * scan.num_experts,
            num_experts=scan.num_experts,
            quantized=scan.quantized(prefix),
        )
    return measure
