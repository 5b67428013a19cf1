"""From config.json to a model skeleton: read the config, choose the model class, build it on the meta device.

config.json is the file transformers writes beside the weights (`PretrainedConfig.to_json_file`); its
`architectures` list (`["GPT2LMHeadModel"]`) or `model_type` names the class, matched against what each
registered family declares (`architectures` on the classes in hooked.models.MODEL_CLASSES, see
docs/adding-a-model.md). The family's config dataclass reads the rest (`config_class.from_hf`).
Building on the meta device (https://pytorch.org/docs/stable/meta.html) gives every parameter its
name and shape without memory, so the checkpoint can be checked against the model before anything is
allocated; the loader then assigns the tensors it read.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch

from hooked.models import MODEL_CLASSES
from hooked.weights.errors import CheckpointError


def read_config(directory: Path) -> dict:
    """The checkpoint's config.json as a dict; a missing, malformed or non-object file raises CheckpointError."""
    path = directory / "config.json"
    if not path.exists():
        raise CheckpointError(f"{directory} has no config.json")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(
            f"{path} is not valid JSON ({error}); fix or re-download the checkpoint's config.json"
        ) from None
    if not isinstance(config, dict):
        raise CheckpointError(
            f"{path} holds a JSON {type(config).__name__}, not an object of settings; fix or re-download it"
        )
    return config


def architecture_for(config: dict):
    """The model class serving a config.json, or an error naming the supported ones."""
    names = [*(config.get("architectures") or []), config.get("model_type", "")]
    for model_class in MODEL_CLASSES:
        if any(name in model_class.architectures for name in names):
            return model_class
    supported = sorted(
        {arch for model_class in MODEL_CLASSES for arch in model_class.architectures if arch[0].isupper()}
    )
    raise CheckpointError(f"architecture {names} is not supported by hooked; supported: {', '.join(supported)}")


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    """Skip torch.nn.init's random fills while building on meta: every value is overwritten by the
    checkpoint, and a random fill on a meta tensor imports torch._dynamo (over a second)."""
    names = [name for name in dir(torch.nn.init) if name.endswith("_") and not name.startswith("_")]
    saved = {name: getattr(torch.nn.init, name) for name in names}
    for name in names:
        setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def build_on_meta(model_class, config: dict, use_hook_tokens: bool = False):
    """The model a config.json describes, on the meta device: shapes only, no memory, no init. `use_hook_tokens`
    gives it TransformerLens' `hook_tokens` on the token ids."""
    cfg = model_class.config_class.from_hf(config)
    cfg.set_use_hook_tokens(use_hook_tokens)
    with torch.device("meta"), _no_init():
        return model_class(cfg)
