"""The native expert reader, compiled by the package build with the flags in
native/cflags.txt (the one set the Makefile's sanitize build and the run-time fallback
build use too). It is a plain shared library that ssdmoe_tui.engine.experts.reader loads with
ctypes, built as an extension module so that wheels carry it for their platform.
`optional`: without a compiler the install still succeeds and the reader falls back
(see reader.py)."""

from pathlib import Path

from setuptools import Extension, setup

FLAGS = (Path(__file__).parent / "native" / "cflags.txt").read_text().split()

setup(
    ext_modules=[
        Extension(
            "ssdmoe_tui.engine.experts._ssdmoe_reader",
            sources=["native/ssdmoe_reader.c"],
            depends=["native/ssdmoe_reader.h"],
            extra_compile_args=FLAGS,
            extra_link_args=["-pthread"],
            optional=True,
        )
    ]
)
