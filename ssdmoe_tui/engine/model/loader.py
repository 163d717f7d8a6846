"""Build an mlx-lm model whose experts stream from the checkpoint's own safetensors.

Order matters: the model is constructed with mlx-lm's classes (parameters are lazy,
nothing is allocated yet), every MoE block's `switch_mlp` is swapped for a
`StreamedSwitch` *before anything is evaluated*, and only then are the non-expert
tensors loaded. So no expert tensor is ever allocated. Quantization follows the
checkpoint's `quantization` config (or the legacy `quantization_config` forms mlx-lm
converts), per-module overrides and nvfp4 global scales included, exactly as
`mlx_lm.utils.load_model` does it; the config and tokenizer come from mlx-lm's public
`load_config` / `load_tokenizer`, so EOS ids match `mlx_lm.load`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ssdmoe_tui.checkpoint import arch
from ssdmoe_tui.checkpoint.config import load_config, load_tokenizer
from ssdmoe_tui.engine.experts.cache import (
    ExpertCache,
    auto_budget,
    slot_memory_bytes,
)
from ssdmoe_tui.engine.experts.device_memory import is_cuda
from ssdmoe_tui.engine.experts.index import ExpertIndex, load_index
from ssdmoe_tui.engine.experts.prefetch import PrefetchGovernor
from ssdmoe_tui.engine.experts.reader import open_reader
from ssdmoe_tui.engine.model import routing_mass as _routing_mass
from ssdmoe_tui.engine.model.page_ahead import AUTO_MIN_TOKENS, page_ahead
from ssdmoe_tui.engine.model.prestage import Prestage
from ssdmoe_tui.engine.model.routing_mass import RoutingMass
from ssdmoe_tui.engine.model.streamed import (
    PrefillGate,
    ProjQuant,
    StepTimes,
    StreamedSwitch,
    computed_from,
    prefetch_rescale,
    prefill_stage_mode,
    ranked_predictor,
    routing_predictor,
)
from ssdmoe_tui.engine.model.timeline import Timeline, timeline_on
from ssdmoe_tui.errors import BadValueError, ModelError, UnsupportedModelError
from ssdmoe_tui.gpu_kernels import first_run_note
from ssdmoe_tui.options import check_k, parse_bytes


@dataclass
class StreamedModel:
    model: nn.Module
    tokenizer: object  # mlx_lm TokenizerWrapper
    config: dict
    path: Path
    index: ExpertIndex
    cache: ExpertCache
    blocks: list[nn.Module]  # the MoE blocks whose top-k we set
    times: StepTimes
    trained_k: int
    dtype: mx.Dtype
    resident_bytes: int
    prefetch: bool = False
    expert_source: str = "shards"  # or "repacked" (`ssdmoe repack`)
    expert_source_note: str = ""  # why a repacked file present was not used
    # router mass kept at the running K (per token); None until a consumer asks for it
    routing_mass: RoutingMass | None = None
    distributed: object = None  # engine.distributed.Distributed in an expert-parallel launch
    # asked by every MoE layer during a prefill chunk that may be stopped (streamed.py)
    prefill_gate: PrefillGate = field(default_factory=PrefillGate)
    family: arch.Architecture | None = None  # its entry of the architecture table
    switches: list = field(default_factory=list)  # each block's StreamedSwitch, in order

    @property
    def model_type(self) -> str:
        return self.config.get("model_type", "?")

    @property
    def hybrid(self) -> bool:
        return self.family is not None and self.family.hybrid

    def router(self, block: nn.Module) -> nn.Module | None:
        """The block's router (the family's `router` attribute), None if it has none."""
        return getattr(block, self.family.router, None) if self.family is not None else None

    def set_k(self, k: int) -> None:
        check_k(k, self.index.num_experts, "K")
        for b in self.blocks:
            set_block_k(b, k, self.family)

    def measure_routing_mass(self, on: bool = True) -> RoutingMass | None:
        """Install (or remove) the router-mass meter (engine/model/routing_mass.py).

        Only a consumer that shows the figure asks for it: the meter costs no kernel and
        no sync, but an unmeasured model keeps mlx-lm's gates untouched. Idempotent."""
        routers = [self.router(b) for b in self.blocks]
        if on and self.routing_mass is None:
            routing = self.family.routing if self.family is not None else "none"
            self.routing_mass = _routing_mass.install(
                self.switches, routers, self.trained_k, routing
            )
        elif not on and self.routing_mass is not None:
            _routing_mass.uninstall(self.switches, routers)
            self.routing_mass = None
        return self.routing_mass

    def close(self) -> None:
        self.cache.close()


def model_architecture(model: nn.Module) -> arch.Architecture | None:
    """The table's entry for a built mlx-lm model (its `model_type`, or its args'; a VL
    wrapper such as Gemma 4's `gemma4` by its text config's, as `arch.family` reads a
    config: without it a real Gemma 4 checkpoint's K was never set on the reference)."""
    args = getattr(model, "args", None)
    text = getattr(args, "text_config", None)
    for mt in (getattr(model, "model_type", None), getattr(args, "model_type", None)):
        if isinstance(mt, str):
            config = {"model_type": mt, **({"text_config": text} if isinstance(text, dict) else {})}
            found = arch.family(config)
            if found is not None:
                return found
    return None


def moe_blocks(model: nn.Module, family: arch.Architecture | None = None) -> list:
    """The routing blocks of a built model (each MoE layer's), in layer order."""
    family = family or model_architecture(model)
    return [site.block for site in arch.switch_sites(model, family)]


def set_block_k(block: nn.Module, k: int, family: arch.Architecture | None = None) -> None:
    """Set K where the family's block reads it (`Architecture.k_paths`, every one).
    Without a family (a model the table does not name), every K path of the table
    that the block has."""
    paths = family.k_paths if family is not None else _ALL_K_PATHS
    done = False
    for path in paths:
        try:
            arch.get_path(block, path)
        except (AttributeError, KeyError):
            continue
        arch.set_path(block, path, k)
        done = True
    if not done and family is not None:
        raise ModelError(
            f"{family.model_type}: no K attribute ({', '.join(paths)}) on its MoE block"
        )


def set_model_k(model: nn.Module, k: int) -> None:
    """Set K on every MoE block of a built mlx-lm model (a resident reference, a bench
    baseline), the way the streamed model sets it."""
    family = model_architecture(model)
    for block in moe_blocks(model, family):
        set_block_k(block, k, family)


_ALL_K_PATHS = tuple(dict.fromkeys(p for a in arch.ARCHITECTURES.values() for p in a.k_paths))


def default_dtype() -> mx.Dtype:
    """float32 activations on CPU (4-bit matmuls with bf16 run ~8x slower there), bf16 on GPU."""
    return mx.float32 if mx.default_device() == mx.cpu else mx.bfloat16


def parse_dtype(name: str | None) -> mx.Dtype:
    if name is None:
        return default_dtype()
    table = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
    if name not in table:
        raise BadValueError(f"unknown dtype {name!r} (use float32, bfloat16 or float16)")
    return table[name]


def cast_model(model: nn.Module, dtype: mx.Dtype) -> None:
    """Cast floating parameters like mlx-lm's convert does (honouring `cast_predicate`).

    Quantized weights are integers and stay as they are; their scales/biases are cast.
    """
    from mlx.utils import tree_map_with_path

    pred = getattr(model, "cast_predicate", lambda _: True)
    model.update(
        tree_map_with_path(
            lambda p, v: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) and pred(p) else v,
            model.parameters(),
        )
    )


def device_name() -> str:
    if mx.default_device() == mx.cpu:
        return "cpu"
    if mx.metal.is_available():
        return "gpu/Metal"
    return "gpu/CUDA"


def _load_config(path: Path) -> dict:
    """mlx-lm's config of a model folder (see checkpoint.config), with the quantization
    resolved the way mlx_lm.load resolves it (a legacy `quantization_config` becomes the
    MLX `quantization` block), or one line saying what is wrong."""
    config = load_config(path)
    if "model_type" not in config:
        raise ModelError(f"{path / 'config.json'}: no model_type")
    arch.check_config_numbers(config, str(path / "config.json"))
    if "quantization" not in config:
        legacy = config.get("quantization_config") or arch.text_config(config).get(
            "quantization_config"
        )
        if isinstance(legacy, dict):
            quant = arch.quantization(config)
            if quant is None:
                method = legacy.get("quant_method", "unknown")
                raise UnsupportedModelError(
                    f"{path}: {method}-quantized weights are not streamed (supported: MLX "
                    f"{', '.join(arch.QUANT_MODES)})"
                )
            config["quantization"] = config["quantization_config"] = quant.as_mlx()
    return config


def _model_classes(config: dict):
    from mlx_lm.utils import _get_classes  # no public equivalent: load_model takes it as a default

    mt = config["model_type"]
    family = arch.family(config)
    if family is None:
        raise UnsupportedModelError(
            f"architecture {mt!r} is not supported for expert streaming: its experts are not "
            f"in a SwitchGLU/SwitchMLP of mlx-lm (`ssdmoe models supported` lists the "
            f"{len(arch.STREAMED)} families streamed)"
        )
    if family.refused:
        raise UnsupportedModelError(f"architecture {mt!r} is not streamed: {family.refused}")
    try:
        return family, *_get_classes(config)
    except ValueError as e:
        raise UnsupportedModelError(f"mlx-lm cannot build {mt!r}: {e}") from e


def _proj_quant(
    config: dict, holder_path: str, switch: str, proj: str, in_dims: int, comp: dict
) -> ProjQuant:
    """Quantization of one expert projection: the config's per-path entry, else inferred from shapes."""
    qcfg = config.get("quantization") or {}
    path = f"{holder_path}.{switch}.{proj}"
    entry = qcfg.get(path)
    w = comp.get(f"{proj}.weight")
    s = comp.get(f"{proj}.scales")
    if w is None or s is None:
        raise UnsupportedModelError(
            f"{path}: experts are not quantized (no scales); ssdmoe streams 4/8-bit mlx-community checkpoints"
        )
    bits = (w.shape[-1] * 32) // in_dims
    group_size = in_dims // s.shape[-1]
    try:
        mode = arch.infer_mode(bits, group_size, s.dtype)
    except ModelError as e:
        raise UnsupportedModelError(f"{path}: {e}") from None
    if isinstance(entry, dict):
        bits = entry.get("bits", bits)
        group_size = entry.get("group_size", group_size)
        mode = entry.get("mode", mode)
    return ProjQuant(group_size=group_size, bits=bits, mode=mode)


def _find_module(model: nn.Module, path: str) -> nn.Module:
    mod = model
    for part in path.split("."):
        if isinstance(mod, list):
            mod = mod[int(part)]
        else:
            mod = mod[part] if isinstance(mod, dict) and part in mod else getattr(mod, part)
    return mod


def load_streamed(
    path: Path,
    *,
    expert_cache: str | int = "auto",
    k: int | None = None,
    dtype: str | None = None,
    reader_queue_depth: int = 16,
    reader: str = "auto",
    direct_io: bool = False,
    policy: str = "auto",
    prefetch: bool = False,
    experts: str = "auto",
    progress: Callable[[str], None] = lambda _: None,
    distributed=None,
    index: ExpertIndex | None = None,
) -> StreamedModel:
    """`experts`: where expert bytes are read from: `auto` (the repacked file when one
    is current, else the shards), `shards`, or `repacked` (an error when none is).
    `distributed` (`engine.distributed.Distributed`): an expert-parallel launch; this
    rank streams only its share of the experts. None: one process holds them all.
    `index`: the header-only index already read for this folder (`open.plan_engine`),
    so a load does not read and content-check the shards' headers a second time."""
    path = Path(path)
    if not path.is_dir():
        raise ModelError(f"model folder not found: {path}")
    config = _load_config(path)
    family, model_class, args_class = _model_classes(config)
    progress("indexing experts")
    if index is None:
        index, _ = load_index(path)
    if index.note:
        progress(index.note)
    act_dtype = parse_dtype(dtype)

    model = model_class(args_class.from_dict(config))
    times = StepTimes()
    read_index, source, source_note = resolve_expert_source(path, index, experts)
    rd = open_reader(queue_depth=reader_queue_depth, direct=direct_io, prefer=reader)
    specs = _switch_specs(model, index, config, family)

    # the K the built model's block holds (checkpoint.arch reads it the same way from a config)
    trained_k = arch.block_k(specs[0].block, family) if specs else 0
    trained_k = trained_k or arch.config_k(config)
    if not trained_k:
        raise ModelError(f"{path / 'config.json'}: no num_experts_per_tok (trained top-k)")
    partition = distributed.partition(index) if distributed is not None else None
    capacity = _cache_capacity(index, trained_k, expert_cache, act_dtype, distributed, partition)
    cache = ExpertCache(read_index, path, capacity, rd, policy=policy, act_dtype=act_dtype)
    gate = PrefillGate()
    blocks = _install_switches(specs, cache, partition, times, prefetch, gate, family)
    if prefetch:
        cache.governor = PrefetchGovernor.from_env(index.num_layers)
    if timeline_on():
        times.timeline = Timeline()

    progress("loading resident weights")
    weights = _resident_weights(path, index, model)
    resident = _load_resident(model, weights, config, path, act_dtype)

    progress("loading tokenizer")
    tokenizer = load_tokenizer(path)
    # MLX-CUDA compiles its kernels at the first forward pass (minutes): say so first
    if note := first_run_note(is_cuda()):
        progress(note)

    sm = StreamedModel(
        model=model,
        tokenizer=tokenizer,
        config=config,
        path=path,
        index=index,
        cache=cache,
        blocks=blocks,
        times=times,
        trained_k=trained_k,
        dtype=act_dtype,
        resident_bytes=resident,
        prefetch=prefetch,
        expert_source=source,
        expert_source_note=source_note,
        distributed=distributed,
        prefill_gate=gate,
        family=family,
        switches=[getattr(s.holder, family.switch) for s in specs],
    )
    if k is not None:
        sm.set_k(k)
    return sm


@dataclass(frozen=True)
class _SwitchSpec:
    """One MoE layer to stream: its layer, the routing block, the module holding mlx-lm's
    SwitchGLU/SwitchMLP (the block itself but for Gemma 4's), that module it replaces,
    the expert MLP's kind (`glu` or `mlp`) and each projection's quantization."""

    layer: int
    block: nn.Module
    holder: nn.Module
    orig: nn.Module
    kind: str
    quant: dict[str, ProjQuant]
    norm: nn.Module | None = None  # the RMSNorm before the block (decode read-ahead's rescale)


def _switch_specs(
    model: nn.Module, index: ExpertIndex, config: dict, family: arch.Architecture
) -> list[_SwitchSpec]:
    """Find the model's module for every expert layer of the index, before anything is
    evaluated (so no expert tensor is allocated), or one line naming the unmatched one."""
    from mlx_lm.models.switch_layers import SwitchGLU, SwitchMLP

    # Components by name for quant inference (shape/dtype only).
    comp_meta = {c.name: _CompMeta(c.shape, c.dtype) for c in index.layers[0].components}
    specs = []
    for li, layer in enumerate(index.layers):
        try:
            holder = _find_module(model, layer.prefix)
            block_path = arch.routing_block_path(layer.prefix, family)
            block = _find_module(model, block_path)
        except (AttributeError, KeyError, IndexError, ValueError) as e:
            raise UnsupportedModelError(
                f"{layer.prefix}: expert tensors do not match any module of {config['model_type']}"
            ) from e
        orig = getattr(holder, family.switch, None)
        if not isinstance(orig, SwitchGLU | SwitchMLP):
            raise UnsupportedModelError(
                f"{layer.prefix}: no SwitchGLU/SwitchMLP under `{family.switch}` "
                f"({config['model_type']} keeps its experts elsewhere)"
            )
        kind = "glu" if isinstance(orig, SwitchGLU) else "mlp"
        projs = ("gate_proj", "up_proj", "down_proj") if kind == "glu" else ("fc1", "fc2")
        built = int(getattr(orig, projs[0]).weight.shape[0])
        if built != index.num_experts:  # the router would pick experts the files lack
            raise ModelError(
                f"{layer.prefix}: the safetensors hold {index.num_experts} experts per layer, "
                f"config.json makes {built}"
            )
        quant = {
            p: _proj_quant(
                config, layer.prefix, family.switch, p, getattr(orig, p).weight.shape[-1], comp_meta
            )
            for p in projs
        }
        norm = None
        if "." in block_path:
            parent = _find_module(model, block_path.rsplit(".", 1)[0])
            norm = getattr(parent, "post_attention_layernorm", None)
        specs.append(_SwitchSpec(li, block, holder, orig, kind, quant, norm))
    return specs


def _cache_capacity(
    index: ExpertIndex,
    trained_k: int,
    expert_cache: str | int,
    act_dtype: mx.Dtype,
    distributed,
    partition,
) -> int:
    """Expert-cache slots: the budget (`auto` or a size) over one slot's memory, at least
    the trained top-k of every layer, at most every expert; a distributed rank holds at
    most the experts it owns."""
    min_slots = max(trained_k, 1) * index.num_layers
    resident_est = index.resident_bytes
    slot_bytes = slot_memory_bytes(index, act_dtype)
    if expert_cache == "auto":  # the rank's owned experts cap a distributed one below
        sharers = distributed.ranks_on_host() if distributed is not None else 1
        budget = auto_budget(index, resident_est, min_slots * slot_bytes, sharers, slot_bytes)
    else:
        budget = parse_bytes(expert_cache, "expert cache")
    capacity = max(min_slots, budget // slot_bytes)
    capacity = min(capacity, index.num_experts * index.num_layers)
    if partition is not None:
        capacity = max(min(capacity, partition.owned_slots), 1)
    return capacity


def _install_switches(
    specs: list[_SwitchSpec],
    cache: ExpertCache,
    partition,
    times: StepTimes,
    prefetch: bool,
    gate: PrefillGate,
    family: arch.Architecture,
) -> list[nn.Module]:
    """Swap every layer's SwitchGLU/SwitchMLP for a streamed one (this rank's share in a
    distributed launch), sharing the model's prefill gate, and chain the routing
    predictors when prefetching; the routing blocks."""
    make_switch = StreamedSwitch if partition is None else partition.make_switch
    blocks: list[nn.Module] = []
    switches = []
    for s in specs:
        sw = make_switch(s.layer, cache, s.kind, s.orig.activation, s.quant, times)
        setattr(s.holder, family.switch, sw)
        sw.set_gate(gate)
        blocks.append(s.block)
        switches.append(sw)
    stage, placement = prefill_stage_mode(), computed_from(cache)
    ahead = None
    if partition is None and stage in ("ahead", "migrate"):
        # one copy stream and one copy in flight for the model, or its page mover
        ahead = Prestage() if stage == "ahead" else page_ahead(placement)
    elif partition is None and stage == "auto" and placement == "host" and is_cuda():
        # a prompt's first chunk gains from its pages moved ahead, later ones lose
        ahead = page_ahead(
            placement, lambda: gate.chunk == 0 and gate.chunk_tokens >= AUTO_MIN_TOKENS
        )
    if ahead is not None:
        for sw in switches:
            sw.set_prestage(ahead)
    rescale = prefetch_rescale()
    for i, (sw, nxt, nxt_sw) in enumerate(
        zip(switches[:-1], blocks[1:], switches[1:], strict=True)
    ):
        predict = routing_predictor(nxt, nxt_sw) if family.up == 0 else None
        if prefetch and predict is not None:
            norms = (specs[i].norm, specs[i + 1].norm) if rescale else (None, None)
            sw.set_predictor(ranked_predictor(nxt, nxt_sw, family.router, *norms))
        # prefill chunks read the next layer's predicted union while this one computes
        sw.set_lookahead(predict)
    return blocks


def _resident_weights(path: Path, index: ExpertIndex, model: nn.Module) -> dict:
    """Every non-expert tensor of the shards, sanitized the way the model class wants."""
    weights = {}
    for shard in index.shards:
        try:
            arrays = mx.load(str(path / shard))
        except Exception as e:  # noqa: BLE001 - mlx raises RuntimeError/ValueError variants
            raise ModelError(f"{path / shard}: cannot read shard ({e})") from e
        for name, arr in arrays.items():
            if not index.is_expert_tensor(name):
                weights[name] = arr
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    return weights


def _quantize_resident(model: nn.Module, config: dict, weights: dict) -> None:
    """Quantize the resident modules as `mlx_lm.utils.load_model` does: the config's
    per-path entries, else inferred from the weights, nvfp4 global scales included."""
    qcfg = config.get("quantization")
    if qcfg is None:
        return
    from mlx_lm.utils import infer_quant_config

    def class_predicate(p, m):
        if p in qcfg:
            return qcfg[p]
        if not hasattr(m, "to_quantized"):
            return False
        if f"{p}.scales" not in weights:
            return False
        params = infer_quant_config(p, m, weights)
        if f"{p}.global_scale" in weights and _takes_global_scale(m):
            params["global_scale"] = True
        return params

    nn.quantize(
        model,
        group_size=qcfg["group_size"],
        bits=qcfg["bits"],
        mode=qcfg.get("mode", "affine"),
        class_predicate=class_predicate,
    )


def _load_resident(
    model: nn.Module, weights: dict, config: dict, path: Path, act_dtype: mx.Dtype
) -> int:
    """Quantize, load (strictly), cast and evaluate the resident weights; their bytes."""
    _quantize_resident(model, config, weights)
    model.eval()
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise ModelError(
            f"{path}: weights do not match {config['model_type']}: {str(e).splitlines()[0]}"
        ) from e
    cast_model(model, act_dtype)
    mx.eval(model.parameters())
    return sum(v.nbytes for _, v in _flat(model.parameters()))


EXPERT_SOURCES = ("auto", "shards", "repacked")


def resolve_expert_source(
    path: Path, index: ExpertIndex, experts: str
) -> tuple[ExpertIndex, str, str]:
    """(index the cache reads through, source name, note on an unused repacked file)."""
    from ssdmoe_tui.engine.experts.repack import find_repacked, packed_index

    if experts not in EXPERT_SOURCES:
        raise BadValueError(f"--experts {experts!r}: use one of {', '.join(EXPERT_SOURCES)}")
    if experts == "shards":
        return index, "shards", ""
    layout, note = find_repacked(path, index)
    if layout is not None:
        return packed_index(index, layout), "repacked", ""
    if experts == "repacked":
        raise ModelError(note or f"{path}: no repacked experts; run `ssdmoe repack --model {path}`")
    return index, "shards", note


def _takes_global_scale(module: nn.Module) -> bool:
    """Only some layers hold an nvfp4 tensor scale (mlx-lm's rule)."""
    return "global_scale" in inspect.signature(module.to_quantized).parameters


@dataclass(frozen=True)
class _CompMeta:
    shape: tuple[int, ...]
    dtype: str


def _flat(params):
    from mlx.utils import tree_flatten

    return tree_flatten(params)
