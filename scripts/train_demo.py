"""Train the embedded demo model: a tiny qwen3_moe that has actually learned English.

    nice -n 15 python scripts/train_demo.py --out build/demo-trained [--steps N] [--seed 0]

Why: every other checkpoint here has random weights, so routing, cache and quality
figures measured on them are floors. This script trains a few-million-parameter
`qwen3_moe` (mlx-lm's own model class) on English text that ships with the operating
system under licences that allow it, and writes it 4-bit in the mlx-community layout
with a ChatML template. The result ships in the package (ssdmoe_tui/models/demo_trained/).

Training text (all offline, see docs/quality.md for the licences):
- Vim's help files in /usr/share/vim/vim90/doc (Vim licence / Open Publication License);
- the GNU manuals in /usr/share/info (GNU Free Documentation License), less their
  licence appendices and less the held-out manuals;
- the Python 3 standard library's docstrings and pydoc topics (the language reference),
  from the interpreter running this script (PSF License).
Held out, never seen in training: the GNU General Public License v3 text
(/usr/share/common-licenses/GPL-3; verbatim copying is permitted, a copy is in
tests/fixtures/heldout/) and the manuals named in HELDOUT_MANUALS.

The loss is next-token cross-entropy, optionally plus a Switch-style load-balancing term
(`--balance`). The shipped demo is trained without it (0.0): at 0.01-0.02 the routing
becomes near-uniform and loses the locality real MoEs have (LRU hit rate no better than a
random twin's); at 0 the experts are used unevenly (balance statistic ~3.2, where 1 is
uniform and 8 is every token on the same 4) but far from collapsed. Seeded; fixed step
count; the weights of the step with the best validation loss are kept.

The shipped demo: `--phase prepare` here, `--phase train --steps 3000` on the lent H200
(mlx-cuda, ~45 s), `--phase package` here. `--phase all` does all three on one machine.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import math
import random
import re
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: The trained model's shape (a few million parameters; dims divisible by the group size).
CONFIG: dict = {
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 192,
    "num_hidden_layers": 4,
    "intermediate_size": 384,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 48,
    "rms_norm_eps": 1e-6,
    "vocab_size": 2048,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_experts_per_tok": 4,
    "num_experts": 32,
    "moe_intermediate_size": 96,
    "norm_topk_prob": True,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    # Both end a reply, as in Qwen3's own generation_config: <|im_end|> ends a turn,
    # <|endoftext|> a document (a raw continuation, `/v1/completions`, reaches it).
    "eos_token_id": [2, 0],
}

INFO_DIR = Path("/usr/share/info")
HELDOUT_MANUALS = ("sed.info", "grep.info")
HELDOUT_LICENCE = Path("/usr/share/common-licenses/GPL-3")
_SKIP_NODES = ("GNU Free Documentation License", "Copying This Manual", "Copying")


def _prose_paragraphs(text: str) -> list[str]:
    """Paragraphs of running text: lines joined, menus, tables and code dropped."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in block.splitlines() if ln.strip()]
        if not lines or any(
            ln.startswith(("* ", "File:", "\x1f", "Tag Table", "--")) for ln in lines
        ):
            continue
        para = " ".join(lines)
        if "\t" in para:  # tables
            continue
        para = re.sub(r"\s{2,}", " ", para)
        letters = sum(c.isalpha() or c == " " for c in para)
        if len(para) < 60 or letters < 0.85 * len(para) or para.count(" ") < 8:
            continue
        out.append(para)
    return out


def _info_manual(path: Path) -> str:
    raw = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
    nodes = raw.split("\x1f")
    keep = []
    for node in nodes:
        head = node.strip().splitlines()[0] if node.strip() else ""
        if any(f"Node: {s}" in head for s in _SKIP_NODES):
            continue
        keep.append(node)
    return "\n".join(keep)


def info_texts(heldout: bool) -> list[str]:
    paras: list[str] = []
    for f in sorted(INFO_DIR.glob("*.info*.gz")):
        base = re.sub(r"(-\d+)?\.gz$", "", f.name)
        if (base in HELDOUT_MANUALS) != heldout:
            continue
        paras += _prose_paragraphs(_info_manual(f))
    return paras


def python_texts() -> list[str]:
    """Docstrings of the standard library and the pydoc topics (the language reference)."""
    paras: list[str] = []
    try:
        from pydoc_data.topics import topics

        for t in topics.values():
            paras += _prose_paragraphs(t)
    except ImportError:
        pass
    lib = Path(sysconfig.get_paths()["stdlib"])
    for f in sorted(lib.glob("*.py")) + sorted(lib.glob("*/*.py")):
        if any(p in f.parts for p in ("test", "tests", "idlelib", "site-packages", "lib2to3")):
            continue
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    paras += _prose_paragraphs(doc)
    return paras


VIM_DOC = Path("/usr/share/vim/vim90/doc")


def vim_texts() -> list[str]:
    """Vim's help files (Vim licence; the manuals under the Open Publication License),
    with help markup removed: *tags* dropped, |links| and `code` kept as words."""
    paras: list[str] = []
    for f in sorted(VIM_DOC.glob("*.txt")):
        text = f.read_text(encoding="utf-8", errors="replace")
        text = re.sub(r"\*[^*\s]+\*", "", text)
        text = re.sub(r"\|([^|\s]+)\|", r"\1", text)
        text = re.sub(r"`([^`]+)`", r"\1", text)
        paras += _prose_paragraphs(text)
    return paras


def build_corpus(out: Path) -> tuple[list[str], dict]:
    train = info_texts(heldout=False) + python_texts() + vim_texts()
    held = info_texts(heldout=True)
    (out / "heldout").mkdir(parents=True, exist_ok=True)
    (out / "heldout" / "manuals.txt").write_text("\n\n".join(held) + "\n")
    if HELDOUT_LICENCE.is_file():
        (out / "heldout" / "gpl3.txt").write_text(HELDOUT_LICENCE.read_text())
    stats = {
        "train_paragraphs": len(train),
        "train_chars": sum(map(len, train)),
        "heldout_manual_paragraphs": len(held),
    }
    return train, stats


def train_tokenizer(paras: list[str], out: Path, vocab_size: int):
    from ssdmoe_tui.models.demo import CHATML_TEMPLATE, SPECIAL_TOKENS, save_tokenizer, train_bpe

    tok = train_bpe(paras, vocab_size, SPECIAL_TOKENS)
    save_tokenizer(tok, out, SPECIAL_TOKENS, CHATML_TEMPLATE)
    return tok


def as_documents(paras: list[str], rng: random.Random) -> list[str]:
    """Plain paragraphs, and a quarter as one-turn chats (user: the first sentence,
    assistant: the rest, then <|im_end|>), so the demo learns to answer and to stop."""
    docs = []
    for p in paras:
        m = re.match(r"(.{20,200}?[.?!])\s+(.{40,})", p)
        if m and rng.random() < 0.25:
            docs.append(
                f"<|im_start|>user\n{m.group(1)}<|im_end|>\n"
                f"<|im_start|>assistant\n{m.group(2)}<|im_end|>\n"
            )
        else:
            docs.append(p + "\n")
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


def prepare(out: Path, work: Path, seed: int) -> None:
    """Corpus, tokenizer (into `out`), token ids (train and validation) into `work`."""
    import numpy as np

    rng = random.Random(seed)
    paras, stats = build_corpus(work)
    rng.shuffle(paras)
    n_val = max(50, len(paras) // 50)
    val, paras = paras[:n_val], paras[n_val:]
    tok = train_tokenizer(paras, out, CONFIG["vocab_size"])
    eot = tok.token_to_id("<|endoftext|>")

    def ids_of(docs: list[str]) -> np.ndarray:
        ids: list[int] = []
        for enc in tok.encode_batch(docs):
            ids.extend(enc.ids)
            ids.append(eot)
        return np.array(ids, dtype=np.int32)

    train_ids = ids_of(as_documents(paras, rng))
    val_ids = ids_of([p + "\n" for p in val])
    np.save(work / "train.npy", train_ids)
    np.save(work / "val.npy", val_ids)
    stats.update(train_tokens=int(train_ids.size), val_tokens=int(val_ids.size))
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
    data = mx.load(str(work / "train.npy"))
    val = mx.load(str(work / "val.npy"))
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


def package(out: Path, work: Path, group_size: int, bits: int) -> None:
    """bfloat16, then mlx-lm's quantize_model (the model's own predicate: the router
    stays at 8 bits as in mlx-community's Qwen3 MoE checkpoints), then one shard."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map
    from mlx_lm.utils import _get_classes, quantize_model, save_config

    model_class, args_class = _get_classes(CONFIG)
    model = model_class(args_class.from_dict(CONFIG))
    model.load_weights(str(work / "trained.safetensors"))
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
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--bits", type=int, default=4)
    args = ap.parse_args(argv)
    out = Path(args.out)
    work = Path(args.work) if args.work else out.with_name(out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    if args.phase in ("all", "prepare"):
        prepare(out, work, args.seed)
    if args.phase in ("all", "train"):
        train(work, args)
    if args.phase in ("all", "package"):
        package(out, work, args.group_size, args.bits)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
