# ssdmoe-tui developer tasks.
VENV := .venv
VPY := $(VENV)/bin/python

# --- native expert reader (native/) --------------------------------------------------
# The package build compiles native/ssdmoe_reader.c (setup.py) with native/cflags.txt, the
# one set of flags; `make native` rebuilds it in place after the C source changed.
NATIVE_SRC := native/ssdmoe_reader.c native/ssdmoe_reader.h native/cflags.txt
NATIVE_CFLAGS := $(shell cat native/cflags.txt)
NATIVE_CC ?= $(or $(CC),cc)

.PHONY: native sanitize
native: $(VENV)/.installed

# `make sanitize`: the reader built with AddressSanitizer + UndefinedBehaviorSanitizer
# (any report aborts), and tests/engine/test_reader.py run against it via SSDMOE_READER_LIB.
SAN_LIB := build/sanitize/libssdmoe_reader.so
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g
sanitize: setup
	mkdir -p $(dir $(SAN_LIB))
	$(NATIVE_CC) $(NATIVE_CFLAGS) $(SAN_FLAGS) -shared -fPIC -o $(SAN_LIB) native/ssdmoe_reader.c
	SSDMOE_READER_LIB=$(abspath $(SAN_LIB)) \
	LD_PRELOAD="$$($(NATIVE_CC) -print-file-name=libasan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	$(VPY) -m pytest -q -s -p no:cacheprovider tests/engine/test_reader.py

# --- setup / run / test ---------------------------------------------------------
# `make run`       : set up a venv and open the chat on the embedded demo model.
# `make test`      : set up a venv and run the suite but the slow exploratory runs
#                    (pytest -m "not slow"; <= 8 minutes on 2 quiet CPU cores).
# `make test-slow` : the slow exploratory runs alone (-m slow); .ci/run runs both.
# `make test-fast` : the edit-test loop (< 2 minutes): no slow run, no app pilot test, no
#                    real server, no multi-process launch (-m "not slow and not heavy").
# Markers are registered in pyproject.toml; tests/conftest.py marks whole folders heavy.
PYTHON ?= python3
comma := ,
EXTRAS := $(if $(filter Linux,$(shell uname -s)),cpu,)
DEV_EXTRAS := $(if $(EXTRAS),$(EXTRAS)$(comma)dev,dev)

.PHONY: setup run test test-slow test-fast lint
# pip's own output (and setuptools' editable-install banner) goes to $(VENV)/install.log,
# shown only when the install fails: the first thing `make run` prints is one line.
INSTALL_LOG := $(VENV)/install.log
$(VPY):
	@echo "make: creating $(VENV) and installing ssdmoe into it (a minute or two; log: $(INSTALL_LOG))"
	@$(PYTHON) -m venv $(VENV)
	@$(VPY) -m pip install -q --upgrade pip > $(INSTALL_LOG) 2>&1 \
		|| { cat $(INSTALL_LOG); echo "make: pip upgrade failed (log: $(INSTALL_LOG))"; exit 1; }

$(VENV)/.installed: pyproject.toml setup.py $(NATIVE_SRC) | $(VPY)
	@echo "make: installing ssdmoe and its dependencies into $(VENV) (log: $(INSTALL_LOG))"
	@$(VPY) -m pip install -q -e ".[$(DEV_EXTRAS)]" >> $(INSTALL_LOG) 2>&1 \
		|| { cat $(INSTALL_LOG); echo "make: install failed (log: $(INSTALL_LOG))"; exit 1; }
	@touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/ssdmoe

# The suite runs on TEST_WORKERS pytest-xdist workers (0: in one process). About a third of
# its time is spent waiting (on servers, subprocesses, the app's pilot), so two workers on
# two cores take about half the time of one, and a third takes up what the two leave idle
# (13-16 % of the CPU; here 7 min 35 s against 8 min 13 s quiet). `--dist loadscope` keeps a
# module's tests on one worker, so a module-scoped server or engine is started once, not
# once a worker.
TEST_WORKERS ?= 3
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope)

test: setup
	$(VPY) -m pytest -q $(XDIST) -m "not slow" tests

test-slow: setup
	$(VPY) -m pytest -q -m slow tests

test-fast: setup
	$(VPY) -m pytest -q $(XDIST) -m "not slow and not heavy" tests

lint: setup
	$(VENV)/bin/ruff check ssdmoe_tui tests scripts
	$(VENV)/bin/ruff format --check ssdmoe_tui tests scripts

# `make fuzz FUZZ_SECONDS=600`: fuzz the readers of user files (scripts/fuzz.py) with
# atheris where it installs, else the seeded mutator; findings land in tests/fuzz/crashes/.
FUZZ_SECONDS ?= 60
.PHONY: fuzz
fuzz: setup
	-$(VPY) -m pip install -q atheris 2>/dev/null || echo "atheris does not install here: using the seeded mutator"
	$(VPY) scripts/fuzz.py --seconds $(FUZZ_SECONDS)

# `make bench-quick`: the hot-path guard (CPU, <= 90 s): resident mlx-lm, a small expert
# cache and every expert held, alternating in one process (medians), plus the per-MoE-layer
# overhead; JSON in build/bench-quick.json. Every hot-path commit quotes its figures.
.PHONY: bench-quick
bench-quick: setup
	mkdir -p build
	$(VPY) -m ssdmoe_tui.cli bench --quick --json build/bench-quick.json
