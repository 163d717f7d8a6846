"""Train the embedded demo model: a tiny qwen3_moe that has actually learned English.

    python scripts/train_demo.py --out build/demo --phase prepare          # here (CPU)
    python3 train_demo.py --out /tmp/x --work WORK --phase train --minutes 6.3 \
        --batch 16 --seq 2048 --dropout 0.1                                # the GPU machine
    python scripts/train_demo.py --out build/demo --phase package          # here

Why: every other checkpoint here has random weights, so routing, cache and quality
figures measured on them are floors. This script trains a `qwen3_moe` of 14.5 M
parameters (mlx-lm's own architecture) on English text that ships with the operating
system and Python (`scripts/demo_corpus.py`: manual pages, package documentation, GNU
manuals, Vim's help, Python's docstrings, licence texts; what is held out and why is
there) plus tool-use dialogues in its chat template's format (`scripts/demo_dialogues.py`),
and writes it 4-bit in the mlx-community layout with that template. The result ships in
the package (ssdmoe_tui/models/demo_trained/); docs/quality.md has the measurements.

Phases: `prepare` (corpus, decontamination against the held-out texts, the BPE, token
ids as uint16), `train` (`--backend torch`, the GPU machine's own PyTorch:
scripts/demo_torch.py; or `--backend mlx`, mlx-lm's class on any mlx device), `package`
(mlx-lm loads the weights, checks its logits against the trainer's, quantizes). `--init`
and `--tokenizer-from` fine-tune an earlier run's weights with its tokenizer.

The loss is next-token cross-entropy, optionally plus a Switch-style load-balancing term
(`--balance`, mlx backend). The shipped demo is trained without it: at 0.01-0.02 the
routing becomes near-uniform and loses the locality real MoEs have (LRU hit rate no better
than a random twin's). Seeded; the weights of the step with the best validation loss are
kept (or the last, `--keep-last`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

#: The trained model's shape (a few million parameters; dims divisible by the group size).
CONFIG: dict = {
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rms_norm_eps": 1e-6,
    "vocab_size": 2048,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_experts_per_tok": 4,
    "num_experts": 32,
    "moe_intermediate_size": 128,
    "norm_topk_prob": True,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    # Both end a reply, as in Qwen3's own generation_config: <|im_end|> ends a turn,
    # <|endoftext|> a document (a raw continuation, `/v1/completions`, reaches it).
    "eos_token_id": [2, 0],
}


def train_tokenizer(paras: list[str], out: Path, vocab_size: int, rng: random.Random):
    """The BPE, trained on a sample of about 16 M characters (all of it takes minutes on
    two cores and merges much the same), saved with the demo's template."""
    from ssdmoe_tui.models.demo import DEMO_TEMPLATE, SPECIAL_TOKENS, save_tokenizer, train_bpe

    sample = rng.sample(paras, min(len(paras), 16_000_000 // 240))
    tok = train_bpe(sample, vocab_size, SPECIAL_TOKENS)
    save_tokenizer(tok, out, SPECIAL_TOKENS, DEMO_TEMPLATE)
    return tok


def as_documents(
    sources: dict[str, list[str]],
    rng: random.Random,
    with_tools=None,  # noqa: ANN001
    chat_share: float = 0.25,
) -> list[str]:
    """Runs of up to eight consecutive paragraphs of one source (most often one file),
    so the model sees context longer than a paragraph; one run in four becomes a
    one-turn chat instead (user: its first sentence, assistant: the rest, then
    <|im_end|>), so the demo learns to answer and to stop. `with_tools(q, a)`, when
    given, renders a third of those chats with tools offered and none called: a
    question no tool fits is answered in words."""
    docs = []
    for paras in sources.values():
        i = 0
        while i < len(paras):
            n = rng.randint(1, 8)
            run, i = paras[i : i + n], i + n
            m = re.match(r"(.{20,200}?[.?!])\s+(.{40,})", run[0])
            if m and rng.random() < chat_share:
                rest = "\n\n".join([m.group(2), *run[1:3]])
                if with_tools is not None and rng.random() < 1 / 3:
                    docs.append(with_tools(m.group(1), rest))
                    continue
                docs.append(
                    f"<|im_start|>user\n{m.group(1)}<|im_end|>\n"
                    f"<|im_start|>assistant\n{rest}<|im_end|>\n"
                )
            else:
                docs.append("\n\n".join(run) + "\n")
    return docs


_GATES: list = []


def _patch_router_probe() -> None:
    """Keep each MoE block's router softmax for the load-balancing term."""
    import mlx.core as mx
    from mlx_lm.models import qwen3_moe

    block = qwen3_moe.Qwen3MoeSparseMoeBlock
    if getattr(block, "_ssdmoe_probe", False):
        return

    def call(self, x):
        logits = self.gate(x)
        gates = mx.softmax(logits, axis=-1, precise=True)
        k = self.top_k
        inds = mx.stop_gradient(mx.argpartition(gates, kth=-k, axis=-1)[..., -k:])
        scores = mx.take_along_axis(gates, inds, axis=-1)
        if self.norm_topk_prob:
            scores = scores / mx.sum(scores, axis=-1, keepdims=True)
        _GATES.append((gates, inds))
        y = self.switch_mlp(x, inds)
        return (y * scores[..., None]).sum(axis=-2).astype(y.dtype)

    block.__call__ = call
    block._ssdmoe_probe = True


def balance_loss(n_experts: int, k: int):
    import mlx.core as mx

    total = 0.0
    for gates, inds in _GATES:
        p = gates.reshape(-1, n_experts).mean(axis=0)
        onehot = (inds.reshape(-1, k)[..., None] == mx.arange(n_experts)).astype(gates.dtype)
        f = mx.stop_gradient(onehot.sum(axis=1).mean(axis=0) / k)
        total = total + n_experts * (f * p).sum()
    return total / max(1, len(_GATES))


def prepare(
    out: Path,
    work: Path,
    seed: int,
    dialogues: int,
    tokenizer_from: Path | None = None,
) -> None:
    """Corpus, tokenizer (into `out`: trained, or `tokenizer_from`'s for a fine-tune),
    token ids (train and validation, uint16) and the held-out texts into `work`."""
    import numpy as np
    from demo_corpus import Decontaminator, heldout_texts, man_summaries, training_sources
    from demo_dialogues import chat_with_tools, mix, render
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    held = heldout_texts(ROOT)
    (work / "heldout").mkdir(parents=True, exist_ok=True)
    for name, text in held.items():
        (work / "heldout" / name.replace(":", "-")).write_text(text)
    clean = Decontaminator(held.values())
    sources = {name: clean.clean(paras) for name, paras in training_sources().items()}
    seen: set[str] = set()
    for name, paras in sources.items():  # each paragraph once (man pages repeat a lot)
        sources[name] = [p for p in paras if not (p in seen or seen.add(p))]
    every = [p for paras in sources.values() for p in paras]
    if tokenizer_from is not None:  # a fine-tune keeps its model's tokenizer
        from tokenizers import Tokenizer

        from ssdmoe_tui.models.demo import copy_tokenizer

        copy_tokenizer(tokenizer_from, out)
        tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    else:
        tok = train_tokenizer(every, out, CONFIG["vocab_size"], rng)
    eot = tok.token_to_id("<|endoftext|>")
    hf = PreTrainedTokenizerFast.from_pretrained(str(out))
    docs = as_documents(sources, rng, lambda q, a: render(hf, *chat_with_tools(rng, q, a)))
    rng.shuffle(docs)
    n_val = max(50, len(docs) // 50)
    val, docs = docs[:n_val], docs[n_val:]
    chats = mix(hf, dialogues, man_summaries(), rng)
    docs += chats
    rng.shuffle(docs)

    def ids_of(texts: list[str]) -> np.ndarray:
        ids: list[int] = []
        for enc in tok.encode_batch(texts):
            ids.extend(enc.ids)
            ids.append(eot)
        return np.array(ids, dtype=np.uint16)

    train_ids, val_ids = ids_of(docs), ids_of(val)
    np.save(work / "train.npy", train_ids)
    np.save(work / "val.npy", val_ids)
    stats = {
        "paragraphs": {name: len(p) for name, p in sources.items()},
        "chars": {name: sum(map(len, p)) for name, p in sources.items()},
        "dropped_for_heldout_overlap": clean.dropped,
        "chat_dialogues": dialogues,
        "chat_dialogue_tokens": int(sum(len(e.ids) for e in tok.encode_batch(chats))),
        "train_tokens": int(train_ids.size),
        "val_tokens": int(val_ids.size),
        "heldout": sorted(held),
    }
    (work / "corpus.json").write_text(json.dumps(stats, indent=2) + "\n")
    print(f"corpus: {stats}", flush=True)


def train(work: Path, args: argparse.Namespace) -> None:
    """Train with mlx (any device); only mlx and mlx-lm's model class are needed here.

    Keeps the weights of the step with the lowest validation loss (a slice of the
    training sources, not the held-out text) in work/trained.safetensors."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3_moe

    mx.random.seed(args.seed)
    data = mx.load(str(work / "train.npy")).astype(mx.int32)
    val = mx.load(str(work / "val.npy")).astype(mx.int32)
    _patch_router_probe()
    model = qwen3_moe.Model(qwen3_moe.ModelArgs.from_dict(CONFIG))
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    print(f"model: {n_params / 1e6:.2f} M parameters on {mx.default_device()}", flush=True)

    warmup = max(1, args.steps // 20)
    schedule = optim.join_schedules(
        [
            optim.linear_schedule(1e-5, args.lr, warmup),
            optim.cosine_decay(args.lr, args.steps - warmup, args.lr * 0.05),
        ],
        [warmup],
    )
    opt = optim.AdamW(learning_rate=schedule, weight_decay=args.weight_decay)
    n_e, k = CONFIG["num_experts"], CONFIG["num_experts_per_tok"]

    def loss_fn(model, x, y):
        _GATES.clear()
        logits = model(x)
        ce = nn.losses.cross_entropy(logits, y, reduction="mean")
        bal = balance_loss(n_e, k)
        _GATES.clear()
        return ce + args.balance * bal, (ce, bal)

    grad_fn = nn.value_and_grad(model, loss_fn)
    state = [model.state, opt.state, mx.random.state]

    def step(x, y):
        (_, (ce, bal)), grads = grad_fn(model, x, y)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        opt.update(model, grads)
        return ce, bal

    step = mx.compile(step, inputs=state, outputs=state)
    offsets = mx.arange(args.seq + 1)

    def batch_of(ids, starts):
        b = ids[starts[:, None] + offsets[None, :]]
        return b[:, :-1], b[:, 1:]

    n_val = (val.size - args.seq - 1) // (args.seq + 1)
    val_starts = mx.arange(min(n_val, 64)) * (args.seq + 1)

    def val_loss() -> float:
        total = 0.0
        for i in range(0, val_starts.size, 16):
            x, y = batch_of(val, val_starts[i : i + 16])
            _GATES.clear()
            total += nn.losses.cross_entropy(model(x), y, reduction="sum").item()
            _GATES.clear()
        return total / (val_starts.size * args.seq)

    t0 = time.monotonic()
    best = (float("inf"), 0)
    log = []
    for i in range(1, args.steps + 1):
        starts = mx.random.randint(0, data.size - args.seq - 1, (args.batch,))
        ce, bal = step(*batch_of(data, starts))
        mx.eval(state, ce, bal)
        if i % args.eval_every == 0 or i == args.steps:
            v = val_loss()
            el = time.monotonic() - t0
            tps = i * args.batch * args.seq / el
            line = (
                f"step {i}/{args.steps} train ce {ce.item():.3f} val ce {v:.3f} "
                f"(ppl {math.exp(v):.1f}) balance {bal.item():.3f} {tps:.0f} tok/s {el:.0f} s"
            )
            print(line, flush=True)
            log.append(line)
            if v < best[0]:
                best = (v, i)
                # bfloat16, the dtype the checkpoint is quantized from anyway
                params = {n: v.astype(mx.bfloat16) for n, v in tree_flatten(model.parameters())}
                mx.save_safetensors(str(work / "trained.safetensors"), params)
    summary = {
        "parameters": int(n_params),
        "steps": args.steps,
        "kept_step": best[1],
        "val_ce": round(best[0], 4),
        "batch": args.batch,
        "seq": args.seq,
        "lr": args.lr,
        "weight_decay": args.weight_decay,
        "balance": args.balance,
        "seed": args.seed,
        "train_seconds": round(time.monotonic() - t0, 1),
        "device": str(mx.default_device()),
        "mlx": mx.__version__,
        "log": log,
    }
    (work / "train.json").write_text(json.dumps(summary, indent=2) + "\n")


def check_logits(model, work: Path) -> None:  # noqa: ANN001
    """mlx-lm's model against the trainer's own logits on the same ids (torch backend):
    the two implementations must agree before the weights are quantized."""
    import mlx.core as mx
    import numpy as np

    path = work / "check_logits.json"
    if not path.is_file():
        return
    ref = json.loads(path.read_text())
    model.update(tree_map_f32(model.parameters()))
    got = np.array(model(mx.array([ref["ids"]]))[0].astype(mx.float32))
    want = np.array(ref["logits_first_rows"] + [ref["logits_last_row"]])
    diff = float(np.abs(got[list(range(8)) + [-1]] - want).max())
    scale = float(np.abs(want).max())
    print(f"logits vs the trainer's: max difference {diff:.4f} (largest logit {scale:.2f})")
    if diff > 0.02 * max(1.0, scale):
        raise SystemExit(f"{path}: mlx-lm's model disagrees with the trainer's ({diff:.3f})")


def tree_map_f32(params):  # noqa: ANN001, ANN201
    import mlx.core as mx
    from mlx.utils import tree_map

    return tree_map(
        lambda v: v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v, params
    )


def earlier_runs(previous: Path, training: dict) -> dict:
    """The runs a fine-tune's weights come from, read from the training.json that
    `prepare --tokenizer-from` copied beside the tokenizer: `pretraining` (the first run)
    and `finetunes` (those between it and this one). Empty for a run from scratch, or
    when that file already records this run (package run twice)."""
    if not previous.is_file():
        return {}
    prev = json.loads(previous.read_text())
    if prev.get("training") == training:
        return {k: prev[k] for k in ("pretraining", "finetunes") if k in prev}
    if "pretraining" not in prev:  # the base was itself trained from scratch
        return {"pretraining": prev["training"]} if "training" in prev else {}
    return {"pretraining": prev["pretraining"],
            "finetunes": [*prev.get("finetunes", []), prev["training"]]}  # fmt: skip


def package(out: Path, work: Path, group_size: int, bits: int) -> None:
    """bfloat16, then mlx-lm's quantize_model (the model's own predicate: the router
    stays at 8 bits as in mlx-community's Qwen3 MoE checkpoints), then one shard."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map
    from mlx_lm.utils import _get_classes, quantize_model, save_config

    model_class, args_class = _get_classes(CONFIG)
    model = model_class(args_class.from_dict(CONFIG))
    shards = sorted(work.glob("trained*.safetensors"))  # torch: trained-NN, mlx: trained
    model.load_weights([kv for f in shards for kv in mx.load(str(f)).items()])
    check_logits(model, work)
    model.update(
        tree_map(
            lambda v: v.astype(mx.bfloat16) if mx.issubdtype(v.dtype, mx.floating) else v,
            model.parameters(),
        )
    )
    model, qcfg = quantize_model(model, dict(CONFIG), group_size, bits)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    total = sum(v.nbytes for v in weights.values())
    index = {
        "metadata": {"total_size": total},
        "weight_map": {name: "model.safetensors" for name in sorted(weights)},
    }
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=4))
    save_config(qcfg, out / "config.json")
    summary = {
        "corpus": json.loads((work / "corpus.json").read_text()),
        "training": json.loads((work / "train.json").read_text()),
        "quantization": {"bits": bits, "group_size": group_size, "mode": "affine"},
    }
    summary.update(earlier_runs(out / "training.json", summary["training"]))
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out} ({total / 2**20:.1f} MiB of weights)", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0], allow_abbrev=False)
    ap.add_argument("--out", required=True, help="the checkpoint folder to write")
    ap.add_argument("--work", default=None, help="corpus and training files (default OUT.work)")
    ap.add_argument(
        "--phase", default="all", choices=("all", "prepare", "train", "package"),
        help="prepare (corpus, tokenizer), train (mlx only: runs on a GPU machine), package",
    )  # fmt: skip
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument(
        "--balance",
        type=float,
        default=0.0,
        help="load-balancing coefficient (0: none, the shipped demo)",
    )
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument(
        "--dialogues", type=int, default=10000,
        help="chat dialogues in the mix (scripts/demo_dialogues.py: small talk, plain"
        " answers, tool calls, tools listed and not needed)",
    )  # fmt: skip
    ap.add_argument(
        "--backend", default="torch", choices=("torch", "mlx"),
        help="train with PyTorch (the GPU machine's own; no kernels to compile) or mlx",
    )  # fmt: skip
    ap.add_argument("--dropout", type=float, default=0.0, help="torch: residual dropout")
    ap.add_argument("--tokenizer-from", type=Path, default=None, help="prepare: reuse it")
    ap.add_argument(
        "--init", type=Path, default=None,
        help="torch: start from these weights (a work folder's trained-NN.safetensors, or a"
        " quantized checkpoint folder such as the shipped demo, dequantized)",
    )  # fmt: skip
    ap.add_argument(
        "--doc-starts", type=float, default=0.0,
        help="torch: share of a batch's rows that begin at a document (0: random starts)",
    )  # fmt: skip
    ap.add_argument(
        "--keep-last", action="store_true",
        help="torch: keep the last step's weights (a fine-tune whose validation split overlaps"
        " its base's training text)",
    )  # fmt: skip
    ap.add_argument("--minutes", type=float, default=0.0, help="torch: stop after this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--bits", type=int, default=4)
    args = ap.parse_args(argv)
    out = Path(args.out)
    work = Path(args.work) if args.work else out.with_name(out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    if args.phase in ("all", "prepare"):
        prepare(out, work, args.seed, args.dialogues, args.tokenizer_from)
    if args.phase in ("all", "train"):
        if args.backend == "torch":
            from demo_torch import train_torch

            train_torch(work, CONFIG, args)
        else:
            train(work, args)
    if args.phase in ("all", "package"):
        package(out, work, args.group_size, args.bits)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
