"""One sampling object across the wire: what a remote engine sends for a
`SamplingOptions` (`as_request`, chat/remote.py) the server's schema takes back whole
(`parse_chat` -> `Sampling.options`), every setting by its name."""

from __future__ import annotations

from dataclasses import fields

from ssdmoe_tui.options import SamplingOptions
from ssdmoe_tui.server.schema import parse_chat

HI = [{"role": "user", "content": "hi"}]


def test_every_sampling_setting_crosses_the_wire_and_back():
    every = SamplingOptions(
        max_tokens=33,
        temp=0.7,
        top_p=0.9,
        seed=5,
        top_k=20,
        min_p=0.05,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        stop=("END",),
    )
    # A setting added to SamplingOptions must be set here too, so it is carried.
    assert all(getattr(every, f.name) != f.default for f in fields(SamplingOptions))
    req = parse_chat({"model": "m", "messages": HI, **every.as_request()}, "m")
    assert req.sampling.options(33, 0.0) == every


def test_defaults_are_left_out_so_the_server_keeps_its_own():
    plain = SamplingOptions(max_tokens=8)
    assert plain.as_request() == {"max_tokens": 8, "temperature": 0.0}
    req = parse_chat({"model": "m", "messages": HI, **plain.as_request()}, "m")
    assert req.sampling.options(8, 0.0) == plain
    # A request without a temperature gets the server's default.
    req = parse_chat({"model": "m", "messages": HI}, "m")
    assert req.sampling.options(16, 0.6) == SamplingOptions(max_tokens=16, temp=0.6)
