# ssdmoe-tui developer tasks.

# --- native expert reader (ssdmoe_tui/engine/_native) ---
NATIVE_DIR := ssdmoe_tui/engine/_native
NATIVE_EXT := $(if $(filter Darwin,$(shell uname -s)),dylib,so)
NATIVE_LIB := $(NATIVE_DIR)/libssdmoe_reader.$(NATIVE_EXT)
NATIVE_CC ?= $(or $(CC),cc)

.PHONY: native
native: $(NATIVE_LIB)

$(NATIVE_LIB): $(NATIVE_DIR)/ssdmoe_reader.c $(NATIVE_DIR)/ssdmoe_reader.h
	$(NATIVE_CC) -O2 -Wall -Wextra -shared -fPIC -pthread -o $@.tmp $(NATIVE_DIR)/ssdmoe_reader.c && mv -f $@.tmp $@

# --- setup / run / test ---------------------------------------------------------
# `make run`  : set up a venv and open the chat on the embedded demo model.
# `make test` : set up a venv and run the whole test suite.
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
comma := ,
EXTRAS := $(if $(filter Linux,$(shell uname -s)),cpu,)
DEV_EXTRAS := $(if $(EXTRAS),$(EXTRAS)$(comma)dev,dev)

.PHONY: setup run test lint
$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(VPY)
	$(VPY) -m pip install -q -e ".[$(DEV_EXTRAS)]"
	touch $@

setup: $(VENV)/.installed native

run: setup
	$(VENV)/bin/ssdmoe

test: setup
	$(VPY) -m pytest -q tests

lint: setup
	$(VENV)/bin/ruff check ssdmoe_tui tests scripts

# `make fuzz FUZZ_SECONDS=600`: fuzz the readers of user files (scripts/fuzz.py) with
# atheris where it installs, else the seeded mutator; findings land in tests/fuzz/crashes/.
FUZZ_SECONDS ?= 60
.PHONY: fuzz
fuzz: setup
	-$(VPY) -m pip install -q atheris 2>/dev/null || echo "atheris does not install here: using the seeded mutator"
	$(VPY) scripts/fuzz.py --seconds $(FUZZ_SECONDS)
