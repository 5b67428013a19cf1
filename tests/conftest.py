"""Shared fixtures: tiny random Hugging Face checkpoints built once per test session.

Nothing is downloaded. transformers builds each reference model from a config, norm weights and
biases are randomised (HF initialises them to 1 and 0, which would hide a dropped norm), and
`save_pretrained` writes config.json + model.safetensors, which `hooked.load` then reads.

The suite runs hooked with its annotations checked (jaxtyping's import hook with beartype, installed
below before hooked is first imported): a call whose arguments or result do not match the annotations,
shapes included, fails the test that made it. Users import hooked unchecked.
"""

import importlib.machinery
import os
import random
import sys

# Before any kernel is decorated: Triton kernels run on CPU tensors through the interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import beartype._check.code.codemain  # noqa: E402
import jaxtyping  # noqa: E402

# The modules that define `@triton.jit` kernels stay unchecked: triton.jit reads the kernel's source and
# globals, so a checking wrapper between them leaves the kernel without its helpers (NameError under the
# interpreter), and `tl.constexpr` parameters are compile-time markers, not Python types. They load through
# the ordinary path finder, ahead of jaxtyping's.
UNCHECKED_MODULES = frozenset(
    {"hooked.kernels.attention.common", "hooked.kernels.attention.forward", "hooked.kernels.attention.backward"}
)


class _UncheckedFinder:
    """Finds the UNCHECKED_MODULES as Python would without the hook; leaves every other module to the next finder."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        return importlib.machinery.PathFinder.find_spec(name, path, target) if name in UNCHECKED_MODULES else None


# beartype checks one item of a container, picked with random.getrandbits, the global generator's: the checker
# would move the draws of code that seeds that generator (TransformerLens' IOIDataset) and of the tests that
# check hooked leaves it alone. Its own generator keeps the global one to the code under test. (A private name of
# beartype 0.23.1, pinned in constraints.txt; BeartypeStrategy.On draws from the global generator too.)
assert hasattr(beartype._check.code.codemain, "getrandbits"), "beartype moved getrandbits: update tests/conftest.py"
beartype._check.code.codemain.getrandbits = random.Random(0).getrandbits
assert "hooked" not in sys.modules, "hooked was imported before tests/conftest.py could install the type checker"
# Every function and dataclass of hooked, checked on each call; an int is a float, as PEP 484 reads annotations.
jaxtyping.install_import_hook("hooked", "beartype.beartype(conf=beartype.BeartypeConf(is_pep484_tower=True))")
sys.meta_path.insert(0, _UncheckedFinder())

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


# Under pytest-xdist (`make test` runs one worker per core) each worker computes on one thread: two workers with a
# thread per core each would fight over the cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matrices gain nothing from a second thread, and on a busy machine waiting for it made the
    property-test files 10x slower: a module that uses this runs on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _unchecked(request):
    """`@pytest.mark.unchecked`: the test hands hooked values outside its annotations on purpose (a bad argument,
    to check the error a user gets, who runs hooked unchecked; a stand-in for a CUDA tensor), so the checker
    stands aside for that test."""
    if request.node.get_closest_marker("unchecked") is None:
        yield
        return
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", False)
