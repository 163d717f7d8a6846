#!/usr/bin/env python3
"""Fuzz the readers of user files (tests/fuzz/harness.py) for a given time.

    python scripts/fuzz.py --seconds 600                 # atheris if installed, else mutator
    python scripts/fuzz.py --seconds 20 --engine mutate --seed 1 --json out.json
    python scripts/fuzz.py --replay                      # every saved finding, once

The time is split evenly over the targets. Every input that breaks a reader's contract
is saved under --save (default tests/fuzz/crashes/<target>/<signature>.bin: commit it,
it becomes a regression case that `make test` replays), once per distinct signature
(target + exception type + where it was raised). Memory is capped (--mem-gib) so an
input that makes a reader allocate wildly is a MemoryError finding, not a dead machine.
Exit status: 1 when anything was found, else 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fuzz.harness import CRASHES, TARGETS, Finding, Target, mutate, run_one  # noqa: E402

_MODULES = {
    "safetensors": ["ssdmoe_tui.engine.experts.index"],
    "kv_checkpoint": ["ssdmoe_tui.sessions.checkpoints"],
    "trace": ["ssdmoe_tui.engine.policy.traces"],
    "conversation": ["ssdmoe_tui.sessions.store"],
    "config": ["ssdmoe_tui.config"],
    "chat_template": ["ssdmoe_tui.prompting.chat_format", "transformers", "mlx_lm.tokenizer_utils"],
    "index_cache": ["ssdmoe_tui.engine.experts.index"],
    "attachment": ["ssdmoe_tui.chat.attachments"],
    "experts": ["ssdmoe_tui.sessions.expert_set"],
    "server_json": ["ssdmoe_tui.chat.wire"],
    "terminal_text": ["ssdmoe_tui.terminal_text", "ssdmoe_tui.errors"],
    "mcp_config": ["ssdmoe_tui.mcp_config", "ssdmoe_tui.config"],
    "tool_call": ["ssdmoe_tui.tools.calls", "ssdmoe_tui.tools.loop", "mlx_lm.tool_parsers"],
}


def cap_memory(gib: float) -> None:
    limit = int(gib * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def signature(target: str, exc: BaseException) -> str:
    """Target + exception type + the innermost project frame that raised it."""
    where = "?"
    for frame in traceback.extract_tb(exc.__traceback__):
        if "ssdmoe_tui" in frame.filename:
            where = f"{Path(frame.filename).name}:{frame.lineno}"
    kind = type(exc).__name__
    if isinstance(exc, Finding):
        kind = "Finding:" + str(exc).split(":")[0]
    return f"{target}|{kind}|{where}"


class Recorder:
    def __init__(self, save: Path | None) -> None:
        self.save = save
        self.seen: dict[str, str] = {}  # signature -> one-line description

    def record(self, target: str, data: bytes, exc: BaseException) -> None:
        sig = signature(target, exc)
        if sig in self.seen:
            return
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        self.seen[sig] = text
        if self.save is not None:
            folder = self.save / target
            folder.mkdir(parents=True, exist_ok=True)
            name = hashlib.sha256(sig.encode()).hexdigest()[:12] + ".bin"
            (folder / name).write_bytes(data)
        print(f"finding: {sig}: {text}", flush=True)


def _try(target: Target, data: bytes, work: Path, rec: Recorder) -> str | None:
    """Run one case; returns the error shape of a clean refusal (for the pool)."""
    from ssdmoe_tui.errors import SsdmoeError

    try:
        run_one(target, data, work)
    except Finding as e:
        rec.record(target.name, data, e)
    except SsdmoeError as e:  # raised past _expect_clean: only in multi-step targets
        return "".join(c for c in str(e) if not c.isdigit())[:80]
    except (Exception, RecursionError, MemoryError) as e:  # noqa: BLE001 - the findings
        rec.record(target.name, data, e)
    return None


def fuzz_mutate(target: Target, seconds: float, seed: int, rec: Recorder) -> int:
    """The seeded mutator: deterministic for a seed, as long as the time allows."""
    rng = random.Random(f"{seed}:{target.name}")
    pool = target.seeds()
    for mod in _MODULES[target.name]:
        __import__(mod)  # imports (MLX for the KV reader) do not eat the target's time
    cases = 0
    end = time.monotonic() + seconds
    with tempfile.TemporaryDirectory(prefix=f"ssdmoe-fuzz-{target.name}-") as tmp:
        work = Path(tmp)
        for data in pool:
            _try(target, data, work, rec)
            cases += 1
        while time.monotonic() < end:
            data = mutate(rng.choice(pool), rng, pool)
            _try(target, data, work, rec)
            cases += 1
            if len(pool) < 512 and rng.random() < 0.02:
                pool.append(data)  # keep some mutants: stacked mutations go deeper
    return cases


def atheris_child(name: str, seconds: float, seed: int, save: Path | None) -> int:
    import atheris

    target = TARGETS[name]
    with atheris.instrument_imports(include=["ssdmoe_tui"]):
        for mod in _MODULES[name]:
            __import__(mod)
    rec = Recorder(save)
    pool = target.seeds()
    work = Path(tempfile.mkdtemp(prefix=f"ssdmoe-fuzz-{name}-"))
    count = [0]

    def one(data: bytes) -> None:
        count[0] += 1
        _try(target, data, work, rec)

    def custom_mutator(data: bytes, max_size: int, mseed: int) -> bytes:
        rng = random.Random(mseed)
        if rng.random() < 0.5:
            return atheris.Mutate(data, max_size)
        return mutate(data or rng.choice(pool), rng, pool, max_size)

    corpus = Path(tempfile.mkdtemp(prefix=f"ssdmoe-corpus-{name}-"))
    for i, data in enumerate(pool):
        (corpus / f"seed-{i}").write_bytes(data)
    args = [
        sys.argv[0],
        str(corpus),
        f"-max_total_time={max(1, int(seconds))}",
        f"-seed={seed}",
        "-rss_limit_mb=0",  # RLIMIT_AS caps memory: a MemoryError is a finding
        "-max_len=65536",
        "-print_final_stats=1",
        f"-artifact_prefix={corpus}/",  # libFuzzer's own crash/slow-unit files stay out of the repo
    ]
    atheris.Setup(args, one, custom_mutator=custom_mutator)
    try:
        atheris.Fuzz()
    except SystemExit:
        pass
    return 0


def run_atheris(target: Target, seconds: float, seed: int, args, rec: Recorder) -> int:
    cmd = [
        sys.executable, __file__, "--atheris-child", target.name, "--seconds", str(seconds),
        "--seed", str(seed), "--mem-gib", str(args.mem_gib),
    ]  # fmt: skip
    if args.save:
        cmd += ["--save", str(args.save)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    out = proc.stdout + proc.stderr
    cases = 0
    for line in out.splitlines():
        if line.startswith("finding: "):
            sig, _, text = line[len("finding: ") :].partition(": ")
            rec.seen.setdefault(sig, text)
            print(line, flush=True)
        if line.startswith("stat::number_of_executed_units:"):
            cases = int(line.split(":")[-1])
    if proc.returncode not in (0, 1) and not cases:
        tail = " / ".join(out.strip().splitlines()[-3:])[:300]
        rec.seen.setdefault(f"{target.name}|atheris-exit-{proc.returncode}|?", tail)
    return cases


def replay(names: list[str], out: Path | None) -> int:
    """Run every saved finding of `names` (tests/fuzz/crashes/<target>/*) once."""
    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="ssdmoe-fuzz-replay-") as tmp:
        for name in names:
            for case in sorted((CRASHES / name).glob("*")):
                rec = Recorder(None)
                work = Path(tmp) / f"{name}-{case.name}"
                work.mkdir()
                _try(TARGETS[name], case.read_bytes(), work, rec)
                key = f"{name}/{case.name}"
                results[key] = next(iter(rec.seen), "ok")
                print(f"{key}: {results[key]}", flush=True)
    if out:
        out.write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(v == "ok" for v in results.values()) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--seconds", type=float, default=60.0, help="total time, split over targets")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated")
    ap.add_argument("--seed", type=int, default=None, help="default: from the clock")
    ap.add_argument("--engine", choices=["auto", "atheris", "mutate"], default="auto")
    ap.add_argument("--save", type=Path, default=CRASHES, help="where findings go")
    ap.add_argument("--no-save", action="store_true", help="report findings only")
    ap.add_argument("--json", type=Path, default=None, help="write the summary here")
    ap.add_argument("--mem-gib", type=float, default=3.0, help="address-space cap")
    ap.add_argument("--replay", action="store_true", help="re-run the saved findings only")
    ap.add_argument("--atheris-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.no_save:
        args.save = None
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    cap_memory(args.mem_gib)
    if args.atheris_child:
        return atheris_child(args.atheris_child, args.seconds, seed, args.save)
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        ap.error(f"unknown target(s) {unknown}; known: {sorted(TARGETS)}")
    if args.replay:
        return replay(names, args.json)
    engine = args.engine
    if engine == "auto":
        try:
            import atheris  # noqa: F401

            engine = "atheris"
        except ImportError:
            engine = "mutate"
    rec = Recorder(args.save)
    per = args.seconds / len(names)
    summary: dict = {"engine": engine, "seed": seed, "seconds": args.seconds, "targets": {}}
    t0 = time.monotonic()
    for name in names:
        start = time.monotonic()
        before = len(rec.seen)
        if engine == "atheris":
            cases = run_atheris(TARGETS[name], per, seed, args, rec)
        else:
            cases = fuzz_mutate(TARGETS[name], per, seed, rec)
        summary["targets"][name] = {
            "cases": cases,
            "seconds": round(time.monotonic() - start, 1),
            "findings": len(rec.seen) - before,
        }
    summary["wall_s"] = round(time.monotonic() - t0, 1)
    summary["cases"] = sum(t["cases"] for t in summary["targets"].values())
    summary["findings"] = [f"{sig}: {text}" for sig, text in rec.seen.items()]
    print(f"{'target':<15}{'cases':>10}{'seconds':>9}{'findings':>10}")
    for name, t in summary["targets"].items():
        print(f"{name:<15}{t['cases']:>10,}{t['seconds']:>9}{t['findings']:>10}")
    print(f"{engine} seed {seed}: {summary['cases']:,} cases in {summary['wall_s']} s, "
          f"{len(rec.seen)} finding(s)")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 1 if rec.seen else 0


if __name__ == "__main__":
    sys.exit(main())
