"""The demo's training step in PyTorch, for the lent GPU machine (`--backend torch`).

Why PyTorch there: the GPU machine has it installed, so a run needs no wheels carried
and compiles no kernels first (MLX-CUDA spent about three of its minutes compiling on a
fresh machine), and the carried data can use the whole transfer. The model is mlx-lm's
`qwen3_moe` written again, layer for layer (RMSNorm, q/k norms per head, RoPE on halves
as `nn.RoPE(traditional=False)`, softmax router, top-K renormalised, SwiGLU experts), and
its weights are saved under mlx-lm's names and shapes (`switch_mlp.*_proj.weight` as
[experts, out, in]), so `--phase package` loads them into mlx-lm's own class.
`check_logits.json` (logits of a fixed input) lets the CPU side confirm the two agree.

The experts run densely (every expert on every token, weighted by the router's top-K
scores, zero elsewhere): for 32 experts of width 128 that is cheap on the GPU and has the
same outputs and gradients as running only the chosen ones.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any


def build(config: dict[str, Any], dropout: float = 0.0):  # -> torch.nn.Module
    """mlx-lm's qwen3_moe in PyTorch; `dropout` (training only: mlx-lm's model has none,
    and needs none at inference) on each block's output before the residual sum."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    d, n_h, n_kv = (
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
    )
    hd, eps = config["head_dim"], config["rms_norm_eps"]
    n_e, k, inter = (
        config["num_experts"],
        config["num_experts_per_tok"],
        config["moe_intermediate_size"],
    )

    class RMSNorm(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            xf = x.float()
            out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            return (out * self.weight.float()).to(x.dtype)

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = nn.Linear(d, n_h * hd, bias=False)
            self.k_proj = nn.Linear(d, n_kv * hd, bias=False)
            self.v_proj = nn.Linear(d, n_kv * hd, bias=False)
            self.o_proj = nn.Linear(n_h * hd, d, bias=False)
            self.q_norm = RMSNorm(hd)
            self.k_norm = RMSNorm(hd)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            q = self.q_norm(self.q_proj(x).view(b, t, n_h, hd)).transpose(1, 2)
            kk = self.k_norm(self.k_proj(x).view(b, t, n_kv, hd)).transpose(1, 2)
            v = self.v_proj(x).view(b, t, n_kv, hd).transpose(1, 2)
            q, kk = rope(q, cos, sin), rope(kk, cos, sin)
            kk = kk.repeat_interleave(n_h // n_kv, dim=1)
            v = v.repeat_interleave(n_h // n_kv, dim=1)
            o = F.scaled_dot_product_attention(q, kk, v, is_causal=True, scale=hd**-0.5)
            return self.o_proj(o.transpose(1, 2).reshape(b, t, n_h * hd))

    class SwitchGLU(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj = nn.Parameter(torch.empty(n_e, inter, d))
            self.up_proj = nn.Parameter(torch.empty(n_e, inter, d))
            self.down_proj = nn.Parameter(torch.empty(n_e, d, inter))

        def forward(self, x, weights):  # x [N, d], weights [N, E] (zero off the top K)
            if not x.is_cuda:  # the CPU: run each expert on its own tokens only
                out = torch.zeros_like(x)
                for e in range(n_e):
                    rows = weights[:, e].nonzero().flatten()
                    if rows.numel():
                        xe = x[rows]
                        h = F.silu(xe @ self.gate_proj[e].T) * (xe @ self.up_proj[e].T)
                        out.index_add_(0, rows, (h @ self.down_proj[e].T) * weights[rows, e, None])
                return out
            g = torch.einsum("nd,eid->nei", x, self.gate_proj.to(x.dtype))
            u = torch.einsum("nd,eid->nei", x, self.up_proj.to(x.dtype))
            h = F.silu(g) * u * weights.to(x.dtype)[..., None]
            return torch.einsum("nei,edi->nd", h, self.down_proj.to(x.dtype))

    class MoE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = nn.Linear(d, n_e, bias=False)
            self.switch_mlp = SwitchGLU()

        def forward(self, x):
            b, t, _ = x.shape
            flat = x.reshape(b * t, d)
            probs = torch.softmax(self.gate(flat).float(), dim=-1)
            top, inds = probs.topk(k, dim=-1)
            if config["norm_topk_prob"]:
                top = top / top.sum(-1, keepdim=True)
            weights = torch.zeros_like(probs).scatter(-1, inds, top)
            self.last = (probs, inds)
            return self.switch_mlp(flat, weights).view(b, t, d)

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.self_attn = Attention()
            self.mlp = MoE()
            self.input_layernorm = RMSNorm(d)
            self.post_attention_layernorm = RMSNorm(d)

        def forward(self, x, cos, sin):
            a = self.self_attn(self.input_layernorm(x), cos, sin)
            h = x + F.dropout(a, dropout, self.training)
            m = self.mlp(self.post_attention_layernorm(h))
            return h + F.dropout(m, dropout, self.training)

    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(config["vocab_size"], d)
            self.layers = nn.ModuleList(Layer() for _ in range(config["num_hidden_layers"]))
            self.norm = RMSNorm(d)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = Inner()
            self.lm_head = nn.Linear(d, config["vocab_size"], bias=False)

        def forward(self, ids):
            t = ids.shape[1]
            inv = config["rope_theta"] ** (-torch.arange(0, hd, 2, device=ids.device).float() / hd)
            ang = torch.arange(t, device=ids.device).float()[:, None] * inv[None, :]
            cos, sin = ang.cos(), ang.sin()
            x = self.model.embed_tokens(ids)
            for layer in self.model.layers:
                x = layer(x, cos, sin)
            return self.lm_head(self.model.norm(x))

        def gates(self):
            return [layer.mlp.last for layer in self.model.layers]

    def rope(x, cos, sin):  # mlx nn.RoPE(traditional=False): rotate the two halves
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        c, s = cos[None, None], sin[None, None]
        return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).to(x.dtype)

    model = Model()
    n_layers = config["num_hidden_layers"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                continue
            std = 0.02
            if name.endswith(("o_proj.weight", "down_proj")):
                std = 0.02 / math.sqrt(2 * n_layers)
            p.normal_(0.0, std)
    return model


def mlx_state(model) -> dict[str, Any]:  # noqa: ANN001
    """The weights under mlx-lm's names, as float32 numpy arrays."""
    out = {}
    for name, p in model.state_dict().items():
        key = name
        if ".switch_mlp." in name and not name.endswith(".weight"):
            key = name + ".weight"
        out[key] = p.detach().float().cpu().numpy()
    return out


def dequantize(w, scales, biases, bits: int):  # -> torch.Tensor
    """mlx's affine dequantization (`mx.dequantize`): `w` packs 32 // bits values per
    uint32, lowest bits first; each group of inputs has its scale and bias."""
    import torch

    if 32 % bits:
        raise ValueError(f"{bits}-bit packing is not supported here")
    words = w.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    q = ((words[..., None] >> shifts) & ((1 << bits) - 1)).flatten(-2).float()
    groups = scales.shape[-1]
    q = q.view(*q.shape[:-1], groups, q.shape[-1] // groups)
    out = q * scales.float()[..., None]
    if scales.dtype == torch.bfloat16:  # mx.dequantize's arithmetic: in the scales' dtype
        return (out.bfloat16() + biases[..., None]).float().flatten(-2)
    return (out + biases.float()[..., None]).flatten(-2)


def fake_quantize(w, group_size: int, bits: int):  # -> torch.Tensor
    """`w` as mlx-lm's package step leaves it: cast to bfloat16, `mx.quantize` (affine:
    the group's larger-magnitude end is the bias and zero stays exact), then
    `mx.dequantize`; bit-exact against mlx 0.32 on the CPU (scripts/demo_eval.py uses it
    to judge the checkpoint that will ship, not its bfloat16 weights)."""
    import torch

    shape, n = w.shape, (1 << bits) - 1
    g = w.bfloat16().float().reshape(-1, group_size)
    hi, lo = g.amax(-1), g.amin(-1)
    delta = ((hi - lo) / n).clamp_min(1e-7)
    low_edge = lo.abs() > hi.abs()
    scale = torch.where(low_edge, delta, -delta)
    edge = torch.where(low_edge, lo, hi)
    q0 = torch.round(edge / scale)
    scale = torch.where(q0 != 0, edge / q0, scale)
    q = torch.clamp(torch.round((g - edge[:, None]) / scale[:, None]), 0, n)
    out = (q * scale.bfloat16().float()[:, None]).bfloat16() + edge.bfloat16()[:, None]
    return out.float().reshape(shape)


def read_weights(folder: Path) -> dict[str, Any]:
    """Float weights under mlx-lm's names from a work folder (trained-NN.safetensors) or
    a quantized checkpoint folder (model*.safetensors with scales and biases, the bits
    per module from its config.json's `quantization`)."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("trained-*.safetensors")) or sorted(
        folder.glob("model*.safetensors")
    )
    if not files:
        raise SystemExit(f"{folder}: no trained-NN.safetensors or model.safetensors")
    saved: dict[str, Any] = {}
    for f in files:
        saved.update(load_file(str(f)))
    quant: dict[str, Any] = {}
    if (folder / "config.json").is_file():
        quant = json.loads((folder / "config.json").read_text()).get("quantization") or {}
    out = {}
    for key, t in saved.items():
        if key.endswith((".scales", ".biases")):
            continue
        base = key.removesuffix(".weight")
        if f"{base}.scales" in saved:
            bits = (quant.get(base) or quant).get("bits", 4)
            t = dequantize(t, saved[f"{base}.scales"], saved[f"{base}.biases"], bits)
        out[key] = t.float()
    return out


def load_weights(model, folder: Path) -> None:  # noqa: ANN001
    """Load `read_weights(folder)` into the trainer's model (mlx-lm's names)."""
    saved = read_weights(folder)
    names = {n: n + ".weight" if ".switch_mlp." in n and not n.endswith(".weight") else n
             for n in model.state_dict()}  # fmt: skip
    model.load_state_dict({n: saved[k].float() for n, k in names.items()})


def save_shards(state: dict[str, Any], folder: Path, max_bytes: int = 14 << 20) -> list[str]:
    """bfloat16 safetensors in shards under max_bytes (what comes back from the GPU
    machine is at most 16 MiB a file)."""
    import torch
    from safetensors.torch import save_file

    shards: list[dict[str, Any]] = [{}]
    size = 0
    for key, arr in state.items():
        t = torch.from_numpy(arr).to(torch.bfloat16).contiguous()
        if size + t.numel() * 2 > max_bytes and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][key] = t
        size += t.numel() * 2
    names = []
    for i, shard in enumerate(shards):
        name = f"trained-{i:02d}.safetensors"
        save_file(shard, str(folder / name))
        names.append(name)
    return names


def train_torch(work: Path, config: dict[str, Any], args: Any) -> None:
    """Train on work/train.npy; keep the weights of the best validation step (or, with
    --keep-last, of the last) in work/trained-NN.safetensors; stop at --steps or after --minutes (the learning rate
    then decays over the last quarter of the time), whichever comes first."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    data = torch.from_numpy(np.load(work / "train.npy").astype(np.int64)).to(dev)
    val = torch.from_numpy(np.load(work / "val.npy").astype(np.int64)).to(dev)
    model = build(config, args.dropout)
    if args.init is not None:  # a fine-tune: the kept weights of an earlier run
        load_weights(model, Path(args.init))
    model = model.to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters on {dev}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), fused=dev == "cuda",
    )  # fmt: skip
    amp = torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda")
    seq, batch = args.seq, args.batch
    offsets = torch.arange(seq + 1, device=dev)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    n_e = config["num_experts"]

    def balance_stat() -> float:
        total = 0.0
        for probs, inds in model.gates():
            f = torch.bincount(inds.reshape(-1), minlength=n_e).float() / inds.numel()
            total += float(n_e * (f * probs.mean(0)).sum())
        return total / len(model.gates())

    doc_starts = None
    if args.doc_starts > 0:  # the token after each <|endoftext|> (id 0), room for a row
        doc_starts = (data[: data.numel() - seq - 1] == 0).nonzero().flatten() + 1
    n_val = min((val.numel() - 1) // (seq + 1), 96)
    val_starts = torch.arange(n_val, device=dev) * (seq + 1)

    @torch.no_grad()
    def val_loss() -> float:
        model.eval()
        total = 0.0
        for i in range(0, n_val, 16):
            b = val[val_starts[i : i + 16, None] + offsets[None, :]]
            with amp:
                logits = model(b[:, :-1])
            total += float(
                F.cross_entropy(logits.float().flatten(0, 1), b[:, 1:].flatten(), reduction="sum")
            )
        model.train()
        return total / (n_val * seq)

    budget = args.minutes * 60 if args.minutes else float("inf")
    warmup = max(1, min(args.steps // 20, 300))
    t0 = time.monotonic()
    best, log = (float("inf"), 0), []
    kept: dict[str, Any] = {}
    step = 0
    for step in range(1, args.steps + 1):
        el = time.monotonic() - t0
        frac = max(step / args.steps, el / budget)
        if step <= warmup:
            lr = args.lr * step / warmup
        elif frac < 0.75:
            lr = args.lr
        else:  # linear decay to 5 % over the last quarter (of steps or of time)
            lr = args.lr * (0.05 + 0.95 * max(0.0, 1 - frac) / 0.25)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, data.numel() - seq - 1, (batch,), device=dev, generator=gen)
        if doc_starts is not None:  # some rows begin at a document, as a chat does in the app
            n = int(batch * args.doc_starts)
            pick = torch.randint(0, doc_starts.numel(), (n,), device=dev, generator=gen)
            starts[:n] = doc_starts[pick]
        b = data[starts[:, None] + offsets[None, :]]
        with amp:
            logits = model(b[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), b[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = frac >= 1.0 or step == args.steps
        if step % args.eval_every == 0 or done:
            v = val_loss()
            el = time.monotonic() - t0
            line = (
                f"step {step} train ce {loss.item():.3f} val ce {v:.3f} (ppl {math.exp(v):.1f}) "
                f"balance {balance_stat():.2f} lr {lr:.2e} {step * batch * seq / el:.0f} tok/s {el:.0f} s"
            )
            print(line, flush=True)
            log.append(line)
            if v < best[0] or (done and args.keep_last):
                best = (v, step)
                kept = {n: p.detach().clone() for n, p in model.state_dict().items()}
                for old in work.glob("trained-*.safetensors"):
                    old.unlink()
                save_shards(mlx_state(model), work)
        if done:
            break
    # logits of a fixed input under the kept weights (bfloat16, as saved), for the CPU
    # side to compare with mlx-lm's model
    model.load_state_dict({n: v.to(torch.bfloat16).float() for n, v in kept.items()})
    probe = val[:64].view(1, -1)
    with torch.no_grad():
        model.eval()
        ref = model.float()(probe)[0].cpu().numpy()
    (work / "check_logits.json").write_text(json.dumps(
        {"ids": probe[0].tolist(), "logits_first_rows": ref[:8].tolist(),
         "logits_last_row": ref[-1].tolist()}
    ))  # fmt: skip
    summary = {
        "parameters": int(n_params),
        "steps": step,
        "kept_step": best[1],
        "val_ce": round(best[0], 4),
        "batch": batch,
        "seq": seq,
        "lr": args.lr,
        "weight_decay": args.weight_decay,
        "balance": 0.0,
        "dropout": args.dropout,
        "seed": args.seed,
        "train_seconds": round(time.monotonic() - t0, 1),
        "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
        "torch": torch.__version__,
        "log": log,
    }
    (work / "train.json").write_text(json.dumps(summary, indent=2) + "\n")
