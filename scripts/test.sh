#!/usr/bin/env bash
# The whole test suite, Rust then Python: what CI runs (.ci/run) and what the
# README's test command is.
#
# The Python tests run in a virtual environment, .venv at the repository root
# (FERROCOLL_VENV overrides it), created on first use with numpy, pytest,
# maturin and torch from the Python package index; the ferrocoll package is
# built from python/ (pip install ./python) every time, so it tests this
# checkout. FERROCOLL_SKIP_PYTHON=1 runs only the Rust tests.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== Rust: cargo test --workspace"
cargo test --workspace

if [[ "${FERROCOLL_SKIP_PYTHON:-0}" == "1" ]]; then
    exit 0
fi

venv="${FERROCOLL_VENV:-.venv}"
python="${PYTHON:-python3}"
if [[ ! -x "$venv/bin/python" ]]; then
    echo "== Python: creating $venv (numpy, pytest, maturin, torch; torch brings its CUDA libraries, ~5 GB)"
    "$python" -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import numpy, pytest, torch" 2>/dev/null; then
    "$venv/bin/pip" install --quiet --upgrade pip
    "$venv/bin/pip" install --quiet numpy pytest maturin torch
fi

echo "== Python: pip install ./python"
"$venv/bin/pip" install --quiet --force-reinstall --no-deps ./python

echo "== Python: pytest python/tests"
# From the repository root, so `import ferrocoll` finds the installed package,
# not the sources in python/ (which lack the compiled extension).
"$venv/bin/pytest" -q python/tests
