"""`ssdmoe requant` and `ssdmoe bench --fit` on the embedded trained demo: the 3- and
2-bit copies load and generate in plain mlx-lm, the bench prints A streamed beside B
resident (or why B cannot run), and bad inputs get one line each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ssdmoe_tui.cli import main
from ssdmoe_tui.models.demo import TRAINED_DIR

HELDOUT = Path(__file__).resolve().parents[1] / "fixtures" / "heldout" / "gpl3.txt"
SMALL_BENCH = [
    "--prompt-tokens", "24", "--decode-tokens", "6", "--disk-mib", "1", "--no-warmup",
    "--baseline", "skip",
]  # fmt: skip


def _requant(src: Path, out: Path, bits: int) -> int:
    return main(["requant", "--model", str(src), "--bits", str(bits), "--out", str(out)])


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("requant")
    out = {}
    for bits in (3, 2):
        assert _requant(TRAINED_DIR, root / f"demo-{bits}bit", bits) == 0
        out[bits] = root / f"demo-{bits}bit"
    return out


@pytest.mark.parametrize("bits", [3, 2])
def test_requant_loads_in_plain_mlx_lm_and_generates(copies, bits):
    import mlx_lm

    out = copies[bits]
    q = json.loads((out / "config.json").read_text())["quantization"]
    src = json.loads((TRAINED_DIR / "config.json").read_text())["quantization"]
    assert (q["bits"], q["group_size"], q["mode"]) == (bits, src["group_size"], "affine")
    gates = {k: v for k, v in src.items() if k.endswith("mlp.gate")}
    assert gates and all(q[k] == v for k, v in gates.items())  # routers keep their 8 bits
    assert not list(out.parent.glob(".*.partial"))  # the temp folder was renamed
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    assert size < (TRAINED_DIR / "model.safetensors").stat().st_size
    model, tokenizer = mlx_lm.load(str(out))
    assert model.model.layers[0].mlp.switch_mlp.up_proj.bits == bits
    assert model.model.layers[0].mlp.gate.bits == 8
    text = mlx_lm.generate(model, tokenizer, "The options of this command are", max_tokens=8)
    assert len(tokenizer.encode(text)) >= 1


def test_bench_fit_prints_both_rows_with_quality(copies, tmp_path, capsys):
    out = tmp_path / "fit.json"
    rc = main(
        ["bench", "--model", str(TRAINED_DIR), "--fit", str(copies[3]), "--json", str(out),
         "--quality", str(HELDOUT), "--quality-tokens", "64", *SMALL_BENCH]
    )  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "stream or fit at K=4" in printed
    rows = [x for x in printed.splitlines() if x.startswith(("A streamed  ", "B resident  "))]
    assert len(rows) == 2 and "cannot run" not in printed
    r = json.loads(out.read_text())
    assert r["conditions"]["ks"] == [4]  # --fit: the trained K only
    fit = r["fit"]
    a, b = fit["streamed"], fit["resident"]
    assert a["status"] == b["status"] == "ran"
    assert a["decode_tok_s"] == r["configs"][0]["decode_tok_s"]  # the bench's own row
    for row in (a, b):
        assert row["decode_tok_s"] > 0 and row["prefill_tok_s"] > 0
        assert row["peak_mlx_memory_bytes"] > 0 and row["checkpoint_bytes"] > 0
    assert b["quantization"]["bits"] == 3 and a["quantization"]["bits"] == 4
    assert b["checkpoint_bytes"] < a["checkpoint_bytes"]
    assert b["generated_tokens"] == 6 and 0 <= b["tokens_common_prefix_with_streamed"] <= 6
    q = fit["quality"]
    assert q["positions"] == 63 and q["text_tokens"] == 64
    # A's perplexity here is the bench's own quality figure at the same K
    assert q["streamed"]["perplexity"] == pytest.approx(
        r["quality"]["by_k"]["4"]["perplexity"], rel=1e-3
    )
    assert 0 < q["resident"]["agreement_with_streamed"] <= 1
    assert q["resident"]["kl_from_streamed"] > 0  # 3 bits are not 4 bits


def test_bench_fit_says_cannot_run_when_b_does_not_fit(copies, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SSDMOE_TEST_AVAILABLE_MEMORY", str(1 << 20))  # 1 MiB: B is 3 MiB
    out = tmp_path / "fit.json"
    rc = main(
        ["bench", "--model", str(TRAINED_DIR), "--fit", str(copies[2]), "--json", str(out),
         *SMALL_BENCH]
    )  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("B resident"))
    assert "cannot run: needs " in line and "1.0 MiB available" in line
    b = json.loads(out.read_text())["fit"]["resident"]
    assert b["status"].startswith("cannot run: needs ")
    assert b["needs_bytes"] > b["available_bytes"] == 1 << 20
    assert "decode_tok_s" not in b and "prefill_tok_s" not in b  # no number invented


def _error(capsys, argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and err and "Traceback" not in "\n".join(err), err
    assert [x for x in err if "error" in x] == err[-1:], err  # progress lines, then one error
    return err[-1]


def test_requant_bad_inputs_one_line_each(copies, tmp_path, capsys, checkpoints):
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"model_type": "llama"}))
    out = str(tmp_path / "out")
    cases = [
        (["--model", str(tmp_path / "missing"), "--bits", "3"], "missing"),
        (["--model", str(dense), "--bits", "3"], "dense"),
        (["--model", str(TRAINED_DIR), "--bits", "7"], "--bits 7"),
        (["--model", str(TRAINED_DIR), "--bits", "4"], "--bits 4"),
        (["--model", str(TRAINED_DIR), "--bits", "3", "--group-size", "48"], "--group-size 48"),
        (["--model", str(TRAINED_DIR), "--bits", "3", "--shard-size", "lots"], "--shard-size"),
    ]
    for args, named in cases:
        assert named in _error(capsys, ["requant", *args, "--out", out])
    msg = _error(capsys, ["requant", "--model", str(TRAINED_DIR), "--bits", "3",
                          "--out", str(copies[3])])  # fmt: skip
    assert str(copies[3]) in msg and "already exists" in msg
    assert not (tmp_path / "out").exists()
    bench = ["bench", "--model", str(TRAINED_DIR), *SMALL_BENCH]
    assert "missing" in _error(capsys, [*bench, "--fit", str(tmp_path / "missing")])
    other = checkpoints("qwen3_moe")  # another qwen3_moe shape: not a copy of the demo
    assert "not a copy of --model" in _error(capsys, [*bench, "--fit", str(other)])


def test_requant_on_a_full_disk_leaves_nothing(tmp_path, capsys):
    from tests.helpers.disk import small_disk

    with small_disk(tmp_path / "disk", 1024) as disk:  # 1 MiB: the copy needs 3 MiB
        out = disk / "demo-2bit"
        msg = _error(capsys, ["requant", "--model", str(TRAINED_DIR), "--bits", "2",
                              "--out", str(out)])  # fmt: skip
        assert msg.startswith(f"ssdmoe: error: disk full: {out} needs ")
        assert not out.exists() and not [p.name for p in disk.iterdir() if "partial" in p.name]


def test_a_killed_requant_is_swept_by_the_next(tmp_path):
    """A killed writer's `.NAME.p<pid>.partial` is removed by the next requant there; a
    live writer's is left alone."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    out = tmp_path / "demo-3bit"
    dead = tmp_path / f".{out.name}.p{proc.pid}.partial"
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"\0" * 4096)
    live = tmp_path / f".{out.name}.p{os.getppid()}.partial"
    live.mkdir()
    assert _requant(TRAINED_DIR, out, 3) == 0
    assert not dead.exists() and live.is_dir() and (out / "config.json").is_file()
