"""circuit-tracer 0.5.0 in a venv of its own, for the tests that compare hooked with it.

circuit-tracer pins transformers<=4.57.3 (hooked's tests run transformers 5), so it gets a venv of its own, built
once and kept at ~/.cache/hooked-tests/circuit-tracer-venv (HOOKED_CIRCUIT_TRACER_VENV moves it): `pip install
torch==2.13.0 circuit-tracer==0.5.0 transformers==4.57.3` with the machine's own pip configuration (here its
local wheel of the CPU torch), about a minute. The two sides exchange tensors and JSON through files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

VENV = Path(
    os.environ.get("HOOKED_CIRCUIT_TRACER_VENV", Path.home() / ".cache" / "hooked-tests" / "circuit-tracer-venv")
)
PINS = ["torch==2.13.0", "circuit-tracer==0.5.0", "transformers==4.57.3"]


def venv_python() -> Path:
    """The venv's python with circuit-tracer 0.5.0 importable, built if missing; failing, with pip's words, if it
    cannot be (the peer is the reference, and PyPI is reachable wherever the suite runs)."""
    python = VENV / "bin" / "python"
    check = [str(python), "-c", "import importlib.metadata as m, circuit_tracer; print(m.version('circuit-tracer'))"]
    if python.exists() and subprocess.run(check, capture_output=True, text=True).stdout.strip() == "0.5.0":
        return python
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(VENV)],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PINS],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            pytest.fail(f"circuit-tracer 0.5.0 could not be installed ({' '.join(step)}): {done.stderr[-1500:]}")
    done = subprocess.run(check, capture_output=True, text=True)
    if done.stdout.strip() != "0.5.0":
        pytest.fail(f"circuit-tracer 0.5.0 installed but does not import: {done.stderr[-1500:]}")
    return python


def run_circuit_tracer(script: str, *args: str) -> None:
    """Run `script` (Python source) in the venv, without hooked on its path and offline; fail with its stderr."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    done = subprocess.run([str(venv_python()), "-c", script, *args], capture_output=True, text=True, env=env, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
