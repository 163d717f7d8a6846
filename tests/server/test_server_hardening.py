"""Issue 23 against a real server (uvicorn on a loopback port, the official `openai` client,
raw httpx): files derived from prompts are 0600 in 0700 folders; a hostile chat template is
one 400 naming the template file, and the engine answers the next request at once."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import time
from pathlib import Path

import httpx
import openai
import pytest

from ssdmoe_tui.options import EngineOptions
from ssdmoe_tui.server.main import ServeOptions
from tests.helpers.server import Running

NESTED = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SSDMOE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SSDMOE_LOCK_DIR", str(tmp_path / "locks"))
    return tmp_path


def _modes(root: Path) -> list[str]:
    """Every file under `root` that is not 0600, every folder that is not 0700."""
    wrong = []
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            mode = stat.S_IMODE(os.stat(os.path.join(dirpath, d)).st_mode)
            if mode != 0o700:
                wrong.append(f"{d}/ {oct(mode)}")
        for f in filenames:
            mode = stat.S_IMODE(os.stat(os.path.join(dirpath, f)).st_mode)
            if mode != 0o600:
                wrong.append(f"{f} {oct(mode)}")
    return wrong


def test_kv_checkpoints_and_history_are_private(checkpoints, isolated):
    old = os.umask(0o022)  # the usual umask: what the files would get without care
    try:
        root = isolated / "sc"
        srv = Running(ServeOptions(EngineOptions(model=str(checkpoints("qwen3_moe"))),
                                   cache_root=root))  # fmt: skip
        try:
            c = srv.client()
            msgs = [{"role": "user", "content": "a private question about my health"}]
            r = c.chat.completions.create(model=srv.model, messages=msgs, max_tokens=3)
            msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": "and another one"}]  # fmt: skip
            c.chat.completions.create(model=srv.model, messages=msgs, max_tokens=2)
        finally:
            srv.stop()
    finally:
        os.umask(old)
    files = [p for p in root.rglob("*") if p.is_file()]
    assert any(p.suffix == ".safetensors" for p in files), files  # a KV checkpoint was saved
    assert _modes(root) == []
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_a_hostile_template_is_a_400_naming_it_and_blocks_nothing(checkpoints, isolated):
    model = isolated / "model"
    shutil.copytree(checkpoints("qwen3_moe"), model)
    (model / "chat_template.jinja").write_text(NESTED, encoding="utf-8")
    srv = Running(ServeOptions(EngineOptions(model=str(model)), cache_root=isolated / "sc"))
    try:
        c = srv.client()
        with pytest.raises(openai.BadRequestError) as bad:
            c.chat.completions.create(
                model=srv.model, messages=[{"role": "user", "content": "hi"}], max_tokens=1
            )
        text = str(bad.value)
        assert "chat_template.jinja" in text and "budget" in text, text
        start = time.monotonic()  # the engine is free: a raw completion is answered at once
        r = httpx.post(srv.url + "/v1/completions", json={"model": srv.model, "prompt": "hi",
                                                          "max_tokens": 1}, timeout=30)  # fmt: skip
        assert r.status_code == 200, r.text
        assert time.monotonic() - start < 10
    finally:
        srv.stop()


def test_only_loopback_names_bound_addresses_and_allowed_hosts_are_answered(checkpoints, isolated):
    """DNS rebinding: a page whose name now resolves to 127.0.0.1 sends its own name as
    Host; the server refuses it before any route (and before the engine)."""

    opts = ServeOptions(EngineOptions(model=str(checkpoints("qwen3_moe"))),
                        cache_root=isolated / "sc", allowed_hosts=("mybox.lan", ".corp.example"))  # fmt: skip
    srv = Running(opts)
    try:
        port = srv.url.rsplit(":", 1)[1]

        def get(host: str) -> httpx.Response:
            return httpx.get(srv.url + "/v1/models", headers={"Host": host}, timeout=30)

        for ok in [f"localhost:{port}", f"127.0.0.1:{port}", "127.0.0.1", f"[::1]:{port}",
                   "LOCALHOST.", "app.localhost", f"mybox.lan:{port}", "a.corp.example",
                   "corp.example"]:  # fmt: skip
            r = get(ok)
            assert r.status_code == 200, (ok, r.text)
        for bad in ["evil.example", f"evil.example:{port}", "localhost.evil.example",
                    "mybox.lan.evil", "10.0.0.5", "xcorp.example"]:  # fmt: skip
            r = get(bad)
            assert r.status_code == 403, (bad, r.text)
            err = r.json()["error"]
            assert err["code"] == "host_not_allowed" and "--allowed-hosts" in err["message"]
        # the official client through a rebound name: refused too
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0,
                          default_headers={"Host": "rebound.attacker.example"})  # fmt: skip
        with pytest.raises(openai.PermissionDeniedError):
            c.models.list()
    finally:
        srv.stop()


def test_host_policy_rules():
    from ssdmoe_tui.server.hosts import HostPolicy, host_name

    assert host_name("[::1]:8080") == "::1" and host_name("LocalHost.:80") == "localhost"
    assert host_name("[::1].evil") == "[::1].evil" and host_name("[::1]:80x") == "[::1]:80x"
    assert not HostPolicy.of(["127.0.0.1"]).allows(host_name("[::1].evil:8080"))
    wild = HostPolicy.of(["0.0.0.0"])
    assert wild.allows("192.168.1.20") and not wild.allows("evil.example")
    lan = HostPolicy.of(["192.168.1.20"])
    assert lan.allows("192.168.1.20") and not lan.allows("192.168.1.21")
    assert HostPolicy.of(["127.0.0.1"], ["*"]).allows("anything.example")


def test_nested_tool_parameters_are_a_400_naming_tools(checkpoints, isolated):
    """`tools[0].function.parameters` nested 500 deep was a 500 (RecursionError)."""
    deep = '{"type": "object", "properties": {"x": ' * 250 + '{"type": "string"}' + "}}" * 250
    body = ('{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, '
            '"tools": [{"type": "function", "function": {"name": "f", "parameters": %s}}]}')  # fmt: skip
    srv = Running(ServeOptions(EngineOptions(model=str(checkpoints("qwen3_moe"))),
                               cache_root=isolated / "sc"))  # fmt: skip
    try:
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=30,
                       content=body % (srv.model, deep),
                       headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "tools" and "tools[0]" in err["message"], err
        ok = httpx.post(srv.url + "/v1/chat/completions", timeout=30, json={
            "model": srv.model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1})  # fmt: skip
        assert ok.status_code == 200, ok.text
    finally:
        srv.stop()


def test_a_read_only_data_folder_is_a_notice_without_a_bare_type(checkpoints, isolated, capfd):
    """The server's cache on a read-only file system: it serves, and says why nothing is
    saved in words (was "OSError: [Errno 30] ...")."""
    import contextlib
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("a read-only folder is a read-only tmpfs mount here, which needs root")
    ro = isolated / "ro"
    ro.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "ssdmoe-ro", str(ro)],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()[:100]}")
    try:
        srv = Running(ServeOptions(EngineOptions(model=str(checkpoints("qwen3_moe"))),
                                   cache_root=ro / "sc"))  # fmt: skip
        try:
            c = srv.client()
            msgs = [{"role": "system", "content": "be brief " * 20},
                    {"role": "user", "content": "hello"}]  # fmt: skip
            out = c.chat.completions.create(model=srv.model, messages=msgs, max_tokens=2)
            msgs += [{"role": "assistant", "content": out.choices[0].message.content},
                     {"role": "user", "content": "again"}]  # fmt: skip
            c.chat.completions.create(model=srv.model, messages=msgs, max_tokens=2)
            srv.server.state.builder.records.flush()
        finally:
            srv.stop()
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["umount", "-l", str(ro)], check=False)
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("ssdmoe")]
    assert lines, err  # something was said about the cache
    assert any("Read-only file system" in ln for ln in lines), lines
    assert not any(re.search(r"\b[A-Z][A-Za-z]*Error\b", ln) for ln in lines), lines


ROUTES = [("GET", "/health"), ("GET", "/v1/models"), ("GET", "/v1/stats"),
          ("POST", "/v1/chat/completions"), ("POST", "/chat/completions"),
          ("POST", "/v1/completions"), ("POST", "/v1/responses"), ("POST", "/v1/messages"),
          ("POST", "/v1/messages/count_tokens"), ("OPTIONS", "/v1/chat/completions"),
          ("POST", "/no/such/route")]  # fmt: skip


def test_a_web_page_cannot_drive_a_keyless_loopback_server(checkpoints, isolated):
    """Issue 34 (1): a browser's simple request (Origin of another site, a text/plain
    body, no preflight) was answered 200 with a completion. Now every route of every API
    refuses a foreign Origin (403) and a body that is not JSON (415) before any handler
    runs: nothing is generated, no checkpoint written; the SDKs still work."""
    import anthropic

    root = isolated / "sc"
    srv = Running(ServeOptions(EngineOptions(model=str(checkpoints("qwen3_moe"))),
                               cache_root=root))  # fmt: skip
    body = {"model": srv.model, "max_tokens": 2, "prompt": "hi", "input": "hi",
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    try:
        for method, path in ROUTES:
            for origin in ("https://evil.example", "null", "http://localhost:3000"):
                r = httpx.request(method, srv.url + path, timeout=30,
                                  content=json.dumps(body), headers={
                                      "origin": origin, "content-type": "text/plain"})  # fmt: skip
                assert r.status_code == 403, (method, path, origin, r.text)
                err = r.json()["error"]
                assert err["code"] == "origin_not_allowed" and "--allowed-origins" in err["message"]
            if method != "POST":
                continue
            for headers in (
                {"content-type": "text/plain"},
                {},
                {"content-type": "application/x-www-form-urlencoded"},
                {"content-type": "multipart/form-data; boundary=x"},
            ):
                r = httpx.post(srv.url + path, content=json.dumps(body), headers=headers,
                               timeout=30)  # fmt: skip
                assert r.status_code == 415, (path, headers, r.text)
                assert r.json()["error"]["code"] == "unsupported_media_type"
                assert "application/json" in r.json()["error"]["message"]
        assert not list(root.rglob("*.safetensors"))  # nothing ran
        # what clients send is answered: both SDKs, JSON with a charset
        c = srv.client()
        assert c.chat.completions.create(model=srv.model, max_tokens=1,
                                         messages=body["messages"]).choices  # fmt: skip
        a = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)
        assert (
            a.messages.create(model=srv.model, max_tokens=1, messages=body["messages"]).content
            is not None
        )
        r = httpx.post(srv.url + "/v1/completions", content=json.dumps(body), timeout=30,
                       headers={"content-type": "Application/JSON; charset=utf-8"})  # fmt: skip
        assert r.status_code == 200, r.text
    finally:
        srv.stop()
