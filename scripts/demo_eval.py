"""Judge a demo checkpoint where it was trained (PyTorch; the GPU machine or the CPU).

    python3 scripts/demo_eval.py --model WORK_OR_CHECKPOINT [--base ssdmoe_tui/models/demo_trained]
        --heldout WORK/heldout --json OUT/eval.json [--quick]

Why here and not `ssdmoe eval` after packaging: the GPU call that fine-tunes the demo
returns weights the lead can only judge on this CPU afterwards, and one bad mix costs a
whole call. This script prints, in the same call, what docs/quality.md reports: held-out
perplexity at the trained K (the done-when: <= vocab/10), the replies to the newcomer
prompts (`demo_dialogues.EVAL_PROMPTS`) with and without a tool listed and what ended
them, how often it calls a tool with and without tools listed, the app test's exchange
(tests/tools/test_demo_tools.py: get_weather for Paris, then an answer with "21 C"), the
raw continuation tests/models/test_demo_trained.py ends, and the LRU locality against a
random twin. Weights from a work folder (bfloat16) are quantized first exactly as the
package step will (`demo_torch.fake_quantize`, bit-exact against mlx), so the figures are
the shipped model's, up to float32 arithmetic in PyTorch against mlx's (greedy near-ties
may flip a token). Prompts are rendered by the checkpoint's own template (transformers).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections import OrderedDict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from demo_dialogues import EVAL_PROMPTS  # noqa: E402

#: The tests' MCP server as the app lists it (tests/tools/mcp_test_server.py, SDK schemas).
TEST_SERVER_TOOLS = [
    {"type": "function", "function": {"name": n, "description": d, "parameters": {
        "type": "object", "properties": {k: {"title": k.capitalize(), "type": t} for k, t in p.items()},
        **({"required": list(p)} if p else {}), "title": f"{n}Arguments"}}}
    for n, d, p in (
        ("get_weather", "The weather for a city.", {"city": "string"}),
        ("slow", "Sleep, then answer.", {"seconds": "number"}),
        ("fail", "Always fails.", {}),
        ("mark", 'Write "ran" to a file.', {"path": "string"}),
        ("secret", "Not for the model.", {}),
    )
]  # fmt: skip
#: The filesystem server's two reading tools (its plain schemas).
FS_TOOLS = [
    {"type": "function", "function": {"name": n, "description": d, "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
        "additionalProperties": False}}}
    for n, d in (
        ("read_file", "Read the complete contents of a file from the file system."),
        ("list_directory", "Get a detailed listing of all files and directories in a specified path."),
    )
]  # fmt: skip
# Held-out phrasings (not the generator's templates): (prompt, tool it needs, argument)
NEEDS_WEATHER = [
    ("What is the weather in Paris?", "Paris"), ("Is it sunny in Rome?", "Rome"),
    ("How cold is it in Kyoto?", "Kyoto"), ("What's the forecast for Oslo?", "Oslo"),
    ("Will it rain in Lisbon today?", "Lisbon"), ("Weather for Madrid?", "Madrid"),
    ("Tell me the weather in Vienna right now.", "Vienna"), ("Is it windy in Dublin?", "Dublin"),
]  # fmt: skip
NEEDS_FILE = [
    ("Read notes.txt for me.", "read_file", "notes.txt"),
    ("What is in todo.md?", "read_file", "todo.md"),
    ("Open ~/work/plan.md and tell me what it says.", "read_file", "~/work/plan.md"),
    ("What files are in /home/me/notes?", "list_directory", "/home/me/notes"),
    ("Show me what is in the folder ./docs.", "list_directory", "./docs"),
    ("Print the contents of report.txt.", "read_file", "report.txt"),
]
NO_TOOL_NEEDED = [
    *[p for p in EVAL_PROMPTS if "weather" not in p],
    "Thanks!", "Good night!", "What does ls do?", "How do I make a new folder?",
    "What is a shell?", "Explain what a compiler does.", "Hi, how are you doing?",
]  # fmt: skip
HELDOUT_FILES = {  # what docs/quality.md's perplexity table reads
    "GPL-3": ROOT / "ssdmoe_tui/bench/texts/gpl3.txt",
    "Apache-2.0": ROOT / "tests/fixtures/heldout/apache-2.0.txt",
    "README.md": ROOT / "README.md",
}
LOCALITY_PROMPTS = (
    "Explain how a program reads a file and writes the result to the screen.",
    "The options of this command are",
    "To search for a word in the buffer, type",
)
RAW_ENDS = ("See also", "Copyright", "NAME", "The options are")
CANNED = "I have no tool for that"


class Demo:
    """A checkpoint as a PyTorch model, its tokenizer and its template."""

    def __init__(self, folder: Path, tokenizer_dir: Path, device: str, random: bool = False):
        import torch
        from demo_torch import build, fake_quantize, read_weights
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast

        self.config = json.loads((tokenizer_dir / "config.json").read_text())
        self.config.pop("quantization", None)
        self.config.pop("quantization_config", None)
        self.k = self.config["num_experts_per_tok"]
        torch.manual_seed(0)
        self.model = build(self.config)
        if not random:
            weights = read_weights(folder)
            if not (folder / "config.json").is_file():  # bfloat16 training weights
                weights = {n: _as_packaged(n, w, fake_quantize) for n, w in weights.items()}
            names = {n: n + ".weight" if ".switch_mlp." in n and not n.endswith(".weight")
                     else n for n in self.model.state_dict()}  # fmt: skip
            self.model.load_state_dict({n: weights[k] for n, k in names.items()})
        else:
            with torch.no_grad():
                for n, w in self.model.named_parameters():
                    if w.ndim >= 2:
                        w.copy_(_as_packaged(n, w, fake_quantize))
        self.model = self.model.to(device).float().eval()
        self.device = device
        self.tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        self.hf = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
        self.ends = {self.tok.token_to_id("<|im_end|>"), self.tok.token_to_id("<|endoftext|>")}

    def logits(self, ids: list[int]):  # -> torch.Tensor [len, vocab]
        import torch

        with torch.no_grad():
            return self.model(torch.tensor([ids], device=self.device))[0].float()

    def generate(self, ids: list[int], max_tokens: int, temp: float = 0.0, seed: int = 0,
                 ignore_eos: bool = False) -> tuple[list[int], str, list[list[list[int]]]]:  # fmt: skip
        """Greedy (or sampled) tokens, what ended them, and each decode step's experts
        per layer."""
        import torch

        gen = torch.Generator(device=self.device).manual_seed(seed)
        out: list[int] = []
        routes: list[list[list[int]]] = []
        for step in range(max_tokens):
            logits = self.logits(ids + out)[-1]
            if step:  # decode steps only (the prompt's routing is a prefill)
                routes.append([inds[-1].tolist() for _, inds in self.model.gates()])
            if temp > 0:
                probs = torch.softmax(logits / temp, -1)
                nxt = int(torch.multinomial(probs, 1, generator=gen))
            else:
                nxt = int(logits.argmax())
            out.append(nxt)
            if nxt in self.ends and not ignore_eos:
                return out, self.tok.id_to_token(nxt), routes
        return out, f"the {max_tokens}-token limit", routes

    def chat(self, messages: list[dict], tools: list[dict] | None, max_tokens: int) -> dict:
        text = self.hf.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                           add_generation_prompt=True)  # fmt: skip
        out, ended, _ = self.generate(self.tok.encode(text).ids, max_tokens)
        body = [t for t in out if t not in self.ends]
        reply = self.tok.decode(body, skip_special_tokens=False)
        return {"reply": reply, "ended_by": ended, "call": parse_call(reply)}

    def perplexity(self, text: str, n: int) -> float:
        """Teacher-forced over the text's first `n` tokens, as `ssdmoe eval` does."""
        import torch
        import torch.nn.functional as F

        ids = self.tok.encode(text).ids[:n]
        logits = self.logits(ids[:-1])
        nll = F.cross_entropy(logits, torch.tensor(ids[1:], device=self.device))
        return math.exp(float(nll))


def _as_packaged(name: str, w, fake_quantize):  # noqa: ANN001, ANN202
    """The weight as the package step quantizes it: norms stay, the router 8-bit (group
    64), every other matrix 4-bit (group 32); mlx-lm's qwen3_moe predicate."""
    if w.ndim < 2 or "norm" in name:
        return w.float()
    if name.endswith("mlp.gate.weight"):
        return fake_quantize(w, 64, 8)
    return fake_quantize(w, 32, 4)


def parse_call(reply: str) -> dict | None:
    """The first `<tool_call>` of a reply as {name, arguments}, {"broken": text} when its
    JSON does not parse, None when there is none."""
    m = re.search(r"<tool_call>\s*(.*?)\s*(</tool_call>|$)", reply, re.S)
    if not m:
        return None
    try:
        call = json.loads(m.group(1))
        return {"name": call.get("name"), "arguments": call.get("arguments")}
    except (json.JSONDecodeError, AttributeError):
        return {"broken": m.group(1)[:120]}


def lru_hit_rate(routes: list[list[list[int]]], budget: int) -> float:
    """A per-layer LRU of `budget` experts replayed on decode steps' routing."""
    hits = total = 0
    caches: list[OrderedDict] = [OrderedDict() for _ in routes[0]] if routes else []
    for step in routes:
        for cache, experts in zip(caches, step, strict=True):
            for e in experts:
                total += 1
                if e in cache:
                    hits += 1
                    cache.move_to_end(e)
                else:
                    cache[e] = None
                    if len(cache) > budget:
                        cache.popitem(last=False)
    return hits / max(1, total)


def evaluate(demo: Demo, heldout: dict[str, str], quick: bool, twin: Demo | None) -> dict:
    """Every figure for one checkpoint (see the module docstring)."""
    t0 = time.monotonic()
    lengths = (64,) if quick else (512, 2048)
    ppl = {f"{name} {n}": round(demo.perplexity(text, n), 1)
           for name, text in heldout.items() for n in lengths}  # fmt: skip
    limit = 24 if quick else 200
    newcomer = {}
    for p in EVAL_PROMPTS:
        msgs = [{"role": "user", "content": p}]
        newcomer[p] = {"no tools": demo.chat(msgs, None, limit),
                       "test server's tools": demo.chat(msgs, TEST_SERVER_TOOLS, limit)}  # fmt: skip
    short = 12 if quick else 60
    sets = {
        "weather, tools listed": [(q, TEST_SERVER_TOOLS, "get_weather", {"city": c})
                                  for q, c in NEEDS_WEATHER],
        "files, tools listed": [(q, FS_TOOLS, n, {"path": a}) for q, n, a in NEEDS_FILE],
        "needs none, tools listed": [(q, TEST_SERVER_TOOLS + FS_TOOLS, None, None)
                                     for q in NO_TOOL_NEEDED],
        "needs none, no tools": [(q, None, None, None) for q in NO_TOOL_NEEDED],
        "tool questions, no tools": [(q, None, None, None)
                                     for q in [w for w, _ in NEEDS_WEATHER] + [f for f, _, _ in NEEDS_FILE]],
    }  # fmt: skip
    if quick:
        sets = {k: v[:2] for k, v in sets.items()}
    rates = {}
    for name, cases in sets.items():
        calls = right = canned = ended = 0
        for q, tools, want_name, want_args in cases:
            r = demo.chat([{"role": "user", "content": q}], tools, short)
            calls += r["call"] is not None
            right += want_name is not None and r["call"] == {
                "name": want_name,
                "arguments": want_args,
            }
            canned += CANNED in r["reply"]
            ended += r["ended_by"] == "<|im_end|>"
        rates[name] = {"prompts": len(cases), "tool calls": calls, "right call": right,
                       "canned no-tool line": canned, "ended by <|im_end|>": ended}  # fmt: skip
    # the app test's exchange: the call, the server's result, the answer (max_tokens 60)
    q = "What is the weather in Paris?"
    first = demo.chat([{"role": "user", "content": q}], TEST_SERVER_TOOLS, short)
    app = {"call": first["call"], "reply": first["reply"]}
    if first["call"] and "name" in first["call"]:
        call = {"name": first["call"]["name"], "arguments": json.dumps(first["call"]["arguments"])}
        msgs = [
            {"role": "user", "content": q},
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": "call_1", "type": "function", "function": call}]},
            {"role": "tool", "name": call["name"], "tool_call_id": "call_1",
             "content": "Paris: 21 C, sunny"},
        ]  # fmt: skip
        second = demo.chat(msgs, TEST_SERVER_TOOLS, short)
        app["answer"], app["answer_ended_by"] = second["reply"], second["ended_by"]
    app["holds"] = bool(
        first["call"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
        and first["reply"].strip().startswith("<tool_call>")
        and "Paris" in app.get("answer", "")
        and "21 C" in app.get("answer", "")
        and app.get("answer_ended_by") == "<|im_end|>"
    )
    raw = {}
    for p in RAW_ENDS:
        out, ended, _ = demo.generate(demo.tok.encode(p).ids, 24 if quick else 300)
        text = demo.tok.decode([t for t in out if t not in demo.ends], skip_special_tokens=False)
        raw[p] = {"ended_by": ended, "tokens": len(out),
                  "clean": "<|" not in text and "<tool_call>" not in text}  # fmt: skip
    steps = 16 if quick else 512
    locality = {}
    for p in LOCALITY_PROMPTS[: 1 if quick else 3]:
        row = {}
        for label, m in (("demo", demo), ("random twin", twin)):
            if m is None:  # the base run: the twin's figure is the new run's
                continue
            _, _, routes = m.generate(m.tok.encode(p).ids, steps + 1, 0.7, 1, ignore_eos=True)
            row[label] = round(100 * lru_hit_rate(routes, 2 * m.k), 1)
        locality[p] = row
    return {"perplexity_k4": ppl, "newcomer": newcomer, "tool_rates": rates, "app_test": app,
            "raw_continuations": raw, "lru_2k_hit_percent": locality,
            "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip


def report(name: str, r: dict) -> None:
    print(f"\n===== {name} ({r['seconds']} s)")
    print("held-out perplexity at K=4 (done-when <= 204.8):")
    for k, v in r["perplexity_k4"].items():
        print(f"  {k:<20} {v:8.1f}{'' if v <= 204.8 else '  OVER'}")
    print("newcomer prompts (greedy):")
    for p, both in r["newcomer"].items():
        for cond, got in both.items():
            print(f"  [{cond}] {p!r} -> {got['reply'][:300]!r}  (ended by {got['ended_by']})")
    print("tool calls:")
    for k, v in r["tool_rates"].items():
        print(f"  {k:<26} " + ", ".join(f"{a} {b}" for a, b in v.items()))
    print(f"app test (get_weather Paris, then '21 C'): {json.dumps(r['app_test'])}")
    print(f"raw continuations: {json.dumps(r['raw_continuations'])}")
    print(f"LRU 2xK hit %: {json.dumps(r['lru_2k_hit_percent'])}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0], allow_abbrev=False)
    ap.add_argument("--model", type=Path, required=True,
                    help="a work folder (trained-NN.safetensors) or a checkpoint folder")  # fmt: skip
    ap.add_argument("--base", type=Path, default=None, help="also evaluate this checkpoint")
    ap.add_argument("--tokenizer", type=Path, default=ROOT / "ssdmoe_tui/models/demo_trained",
                    help="config, tokenizer and template (the shipped demo's)")  # fmt: skip
    ap.add_argument("--heldout", type=Path, default=None,
                    help="prepare's heldout folder (adds the sed+grep manuals)")  # fmt: skip
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="a few tokens of each (plumbing)")
    args = ap.parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    heldout = {k: p.read_text() for k, p in HELDOUT_FILES.items()}
    if args.heldout is not None and (args.heldout / "manuals").is_file():
        heldout["sed+grep manuals"] = (args.heldout / "manuals").read_text()
    twin = Demo(args.tokenizer, args.tokenizer, device, random=True)
    out = {"device": device, "torch": torch.__version__}
    runs = [("new", args.model)] + ([("base", args.base)] if args.base else [])
    for label, folder in runs:
        demo = Demo(folder, args.tokenizer, device)
        out[label] = evaluate(demo, heldout, args.quick, twin if label == "new" else None)
        report(f"{label}: {folder}", out[label])
        if args.json:  # after each, so a call cut short still returns the first
            args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
