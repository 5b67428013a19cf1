"""Shared fixtures: tiny random Hugging Face checkpoints built once per test session.

Nothing is downloaded. transformers builds each reference model from a config, norm weights and
biases are randomised (HF initialises them to 1 and 0, which would hide a dropped norm), and
`save_pretrained` writes config.json + model.safetensors, which `hooked.load` then reads.
"""

import os

# Before any kernel is decorated: Triton kernels run on CPU tensors through the interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import hooked  # noqa: E402
from hooked.testing import build_gpt2_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory) -> Path:
    """A 2-layer GPT-2 checkpoint with its own byte-level BPE tokenizer."""
    return build_gpt2_checkpoint(tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="session")
def gpt2(gpt2_dir) -> hooked.GPT2:
    """The hooked model of `gpt2_dir` in float32. Tests must leave no hook on it."""
    return hooked.load(gpt2_dir)


@pytest.fixture(autouse=True)
def _no_hook_left_behind(request):
    """Every test ends with no hook registered on the shared model: leaks fail the test that made them."""
    yield
    if "gpt2" in request.fixturenames:
        model = request.getfixturevalue("gpt2")
        leaked = [name for name, point in model.hook_dict.items() if point._fwd or point._bwd]
        model.reset_hooks(including_permanent=True)
        model.zero_grad(set_to_none=True)  # a test's .backward() must not leave gradients for the next
        assert not leaked, f"hooks left registered after the test: {leaked}"


@pytest.fixture
def tokens(gpt2) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, gpt2.cfg.d_vocab, (3, 11), generator=generator)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matrices gain nothing from a second thread, and on a busy machine waiting for it made the
    property-test files 10x slower: a module that uses this runs on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
