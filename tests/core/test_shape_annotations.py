"""hooked's annotations are checked in the tests: tests/conftest.py installs jaxtyping's import hook with
beartype before hooked is first imported, so a call whose tensors do not have the annotated shapes fails,
where plain PyTorch would run it and return a wrong answer. A user's `import hooked` checks nothing."""

import inspect
import subprocess
import sys
import typing
from pathlib import Path

import jaxtyping
import pytest
import torch
from torch import Tensor

from hooked import utils
from hooked.testing import ARCHITECTURES, random_model

# Both calls below, in a plain interpreter as a user runs hooked: no checker, and no error from PyTorch.
WRONG_SHAPES_UNCHECKED = """
import torch
import hooked
from hooked import utils
from hooked.models.gpt2 import GPT2Config

model = hooked.GPT2(GPT2Config(n_layers=1, d_model=8, n_heads=2, d_mlp=16, d_vocab=11, n_ctx=8))
print(tuple(model.blocks[0].mlp(torch.randn(5, 8)).shape))
print(utils.lm_cross_entropy_loss(torch.randn(2, 6, 11), torch.zeros(2, 4, dtype=torch.long)).ndim)
"""


def test_a_tensor_without_an_annotated_axis_fails_the_call(gpt2):
    x = torch.randn(5, gpt2.cfg.d_model)  # [pos d_model]: no batch axis, which the MLP's matmuls would not notice
    with pytest.raises(jaxtyping.TypeCheckError, match="batch pos d_model"):
        gpt2.blocks[0].mlp(x)


def test_one_axis_name_is_one_size_across_a_calls_arguments(gpt2):
    logits = torch.randn(2, 6, gpt2.cfg.d_vocab)
    tokens = torch.zeros(2, 4, dtype=torch.long)  # pos 4 where the logits have 6: the loss would read 3 of 5
    with pytest.raises(jaxtyping.TypeCheckError, match="tokens"):
        utils.lm_cross_entropy_loss(logits, tokens)
    utils.lm_cross_entropy_loss(logits, torch.zeros(2, 6, dtype=torch.long))  # the same pos passes


def test_a_users_import_checks_nothing():
    result = subprocess.run(
        [sys.executable, "-c", WRONG_SHAPES_UNCHECKED],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["(5,", "8)", "0"]


def _shape_annotation(attribute) -> object | None:
    """A property's return annotation when it names axes (a jaxtyping array type, alone or in a union)."""
    if not isinstance(attribute, property) or attribute.fget is None:
        return None
    try:
        annotation = typing.get_type_hints(inspect.unwrap(attribute.fget)).get("return")
    except NameError:  # an annotation naming what is imported for type checkers only
        return None
    arrays = [a for a in (annotation, *typing.get_args(annotation)) if isinstance(a, type)]
    return annotation if any(issubclass(a, jaxtyping.AbstractArray) for a in arrays) else None


@pytest.mark.parametrize("family", ARCHITECTURES)
def test_weight_properties_have_the_sizes_their_axes_name(family):
    """A property has no argument for its axis names to agree with, so the checker reads "head_index d_model
    d_head" as any three sizes: here the names are bound to the model's own sizes first."""
    model = random_model(family)
    sizes = {**model.axis_sizes(), **({"n_ctx": model.cfg.n_ctx} if hasattr(model.cfg, "n_ctx") else {})}
    checked = set()
    for module in model.modules():
        for cls in type(module).__mro__:
            for name, attribute in vars(cls).items():
                annotation = _shape_annotation(attribute)
                if annotation is None or (cls, name) in checked:
                    continue
                with jaxtyping.jaxtyped("context"):
                    assert isinstance(
                        torch.empty(()).expand(*sizes.values()), jaxtyping.Shaped[Tensor, " ".join(sizes)]
                    )
                    value = getattr(module, name)
                    assert isinstance(value, annotation), f"{cls.__name__}.{name}: {tuple(value.shape)}, {sizes}"
                checked.add((cls, name))
    assert len(checked) >= 4  # the embedding and unembedding at least
