"""What to train: `TrainingConfig`, every setting of `hooked.sae.train` in one object (as eai-sparsify's
`TrainConfig`), and `DictionarySpec`, one dictionary's share of it, each checked against the model before anything
runs.

    config = TrainingConfig(hook_name="blocks.2.hook_resid_post", architecture="topk", d_sae=1024, k=16)
    sae = hooked.sae.train(model, texts, config)
    wider = hooked.sae.train(model, texts, dataclasses.replace(config, d_sae=4096))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from hooked.sae import architectures
from hooked.sae.architectures import TOPK

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

CLT_READ, CLT_WRITE = "blocks.{layer}.mlp.hook_in", "blocks.{layer}.hook_mlp_out"  # circuit-tracer's CLT points


@dataclass(frozen=True)
class TrainingConfig:
    """Every setting of `hooked.sae.train(model, data, config)` (its docstring says what each does). The first block
    says what to train, the defaults of each entry of `dictionaries`; the second the data, the run and its output.
    Frozen: vary one with `dataclasses.replace(config, k=32)`."""

    hook_name: str | None = None  # the point the dictionary reads ({layer} template for a CLT)
    architecture: str = TOPK.name  # one of hooked.sae.architectures.trainable()
    d_sae: int | None = None  # features (per layer, for a CLT)
    k: float | None = None  # topk: features per token; batchtopk: their mean over a batch
    hook_name_out: str | None = None  # set: a transcoder from hook_name to this point
    skip: bool = False  # a transcoder's linear skip path, x W_skip^T
    l1_coefficient: float = 1.0  # standard
    l0_coefficient: float = 1.0  # jumprelu
    aux_coefficient: float = 1.0  # topk, batchtopk: AuxK
    lr: float | None = None  # None: 2e-4 / sqrt(d_sae / 2**14), eai-sparsify's rule for Adam
    dead_feature_window: int = 1000  # steps without firing after which a feature counts as dead
    resample_dead: bool = False  # re-initialise the dead features every dead_feature_window steps
    seed: int = 0  # the stream's order and each dictionary's initialisation
    cross_layer: bool = False  # a cross-layer transcoder over every layer

    batch_tokens: int = 4096  # tokens per step
    n_tokens: int | None = None  # None: one pass over the data
    context_size: int | None = None  # None: min(128, the model's context)
    prepend_bos: bool | None = None  # None: the model's default
    attention_mask: Tensor | None = None  # [n pos], with token rows [n pos] of prompts of different lengths
    dictionaries: Sequence[dict[str, Any]] | None = None  # one dict of the settings above per dictionary
    buffer_batches: int = 8  # batches shuffled together
    checkpoint_dir: str | Path | None = None  # final_<tokens>/ (and <tokens>/ every checkpoint_every tokens)
    checkpoint_every: int | None = None
    progress: bool = True  # a tqdm bar
    device: torch.device | str | None = None  # the dictionaries' (None: the model's)
    dtype: torch.dtype = torch.float32  # the dictionaries'

    @classmethod
    def from_call(cls, config: TrainingConfig | None, keywords: dict[str, Any]) -> TrainingConfig:
        """`train`'s config: the one given, or one built from its keywords, never both (a keyword beside a config
        could mean "override it" or be a leftover, so it is refused, naming both)."""
        unknown = sorted(set(keywords) - set(TRAINING_OPTIONS))
        if unknown:
            raise TypeError(
                f"train() got unknown keyword(s) {unknown}; its settings are {', '.join(TRAINING_OPTIONS)}"
                " (hooked.sae.TrainingConfig's fields)"
            )
        if config is None:
            return cls(**keywords)
        if not isinstance(config, TrainingConfig):
            raise TypeError(f"config= is a hooked.sae.TrainingConfig, not {type(config).__name__}")
        if keywords:
            given = ", ".join(f"{name}=" for name in keywords)
            raise TypeError(
                f"train() was given config= and the keyword(s) {given} too; set them in the config"
                f" (dataclasses.replace(config, {given.split(', ')[0]}...)) or pass keywords without a config"
            )
        return config


TRAINING_OPTIONS = tuple(f.name for f in fields(TrainingConfig))


@dataclass(frozen=True)
class DictionarySpec:
    """One dictionary's settings: `train`'s keywords, or one entry of its `dictionaries=` over them."""

    hook_name: str
    architecture: str
    d_sae: int
    k: float | None  # topk: features per token; batchtopk: their mean over a batch
    hook_name_out: str | None  # set: a transcoder from hook_name to this point
    skip: bool  # a transcoder's linear skip path, x W_skip^T
    l1_coefficient: float  # standard
    l0_coefficient: float  # jumprelu
    aux_coefficient: float  # topk, batchtopk: AuxK
    lr: float | None  # None: 2e-4 / sqrt(d_sae / 2**14), eai-sparsify's rule for Adam
    dead_feature_window: int  # steps without firing after which a feature counts as dead
    resample_dead: bool
    seed: int  # initialisation and resampling
    cross_layer: bool = False  # a cross-layer transcoder: hook_name, hook_name_out are templates with {layer}

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else 2e-4 / math.sqrt(self.d_sae / 2**14)

    def label(self) -> str:
        if self.cross_layer:
            return f"clt-{self.architecture}-{self.d_sae}"
        where = self.hook_name if self.hook_name_out is None else f"{self.hook_name}-{self.hook_name_out}"
        return f"{where}-{self.architecture}-{self.d_sae}"


DICTIONARY_OPTIONS = tuple(f.name for f in fields(DictionarySpec))
assert set(DICTIONARY_OPTIONS) <= set(TRAINING_OPTIONS), "each dictionary setting is a TrainingConfig field"


def dictionary_spec(model: HookedTransformer, defaults: dict, overrides: dict, index: int) -> DictionarySpec:
    """The settings of one dictionary, checked against the model before anything runs."""
    where = "" if not overrides else f"dictionaries[{index}]: "
    if not isinstance(overrides, dict):
        raise TypeError(f"{where}each entry of dictionaries= is a dict of settings, not {type(overrides).__name__}")
    unknown = sorted(set(overrides) - set(DICTIONARY_OPTIONS))
    if unknown:
        raise TypeError(
            f"{where}unknown setting(s) {unknown}; a dictionary's settings are {', '.join(DICTIONARY_OPTIONS)}"
            " (the data, batch and checkpoint keywords are train()'s own)"
        )
    values = {**defaults, **overrides}
    if values["cross_layer"]:
        _cross_layer_points(model, values, where)
    elif values["hook_name"] is None:
        raise ValueError(
            f"{where}hook_name= is needed: the point the dictionary reads, e.g. 'blocks.1.hook_resid_post'"
        )
    for name in ("hook_name", "hook_name_out"):
        if values[name] is not None and not values["cross_layer"]:
            values[name] = hook_point(model, values[name], f"{where}{name}")
    architecture = values["architecture"]
    declaration = architectures.ARCHITECTURES.get(architecture)
    if declaration is None or declaration.trainer is None:
        raise ValueError(
            f"{where}architecture {architecture!r} cannot be trained; choose one of"
            f" {', '.join(architectures.trainable())} (a transcoder is one of them with hook_name_out=)"
        )
    d_sae = values["d_sae"]
    if isinstance(d_sae, bool) or not isinstance(d_sae, int) or d_sae < 1:
        raise ValueError(f"{where}d_sae= is the number of features, a positive int, not {d_sae!r}")
    k = values["k"]
    per_token = declaration.k == "per_token"
    if per_token and (isinstance(k, bool) or not isinstance(k, int) or not 0 < k <= d_sae):
        raise ValueError(f"{where}a {architecture} dictionary needs k=, an int in 1..d_sae ({d_sae}), not {k!r}")
    if declaration.k == "batch_mean" and (isinstance(k, bool) or not isinstance(k, int | float) or not 0 < k <= d_sae):
        raise ValueError(f"{where}a {architecture} dictionary needs k=, the mean features per token in (0, {d_sae}]")
    if declaration.k is None and k is not None:
        raise ValueError(
            f"{where}k={k} is for {' and '.join(architectures.with_k())}; {architecture} sets its sparsity by a"
            " coefficient"
        )
    if values["skip"] and values["hook_name_out"] is None:
        raise ValueError(f"{where}skip=True is a transcoder's linear path: give hook_name_out= too")
    out = values["hook_name_out"]
    if (
        out is not None
        and not values["cross_layer"]
        and model.hook_names.index(values["hook_name"]) >= model.hook_names.index(out)
    ):
        raise ValueError(
            f"{where}a transcoder reads a point before the one it writes; {values['hook_name']} does not come before"
            f" {out} (e.g. blocks.1.mlp.hook_in -> blocks.1.hook_mlp_out)"
        )
    check_positive(f"{where}dead_feature_window", values["dead_feature_window"])
    for name in ("l1_coefficient", "l0_coefficient", "aux_coefficient"):
        if not isinstance(values[name], int | float) or values[name] < 0:
            raise ValueError(f"{where}{name}= is a number >= 0, not {values[name]!r}")
    if values["lr"] is not None and (not isinstance(values["lr"], int | float) or values["lr"] <= 0):
        raise ValueError(f"{where}lr= is a positive number (or None for the width's default), not {values['lr']!r}")
    for name in points_of(values, model.cfg.n_layers):
        width(model, name, where)
    return DictionarySpec(**values)


def points_of(values: dict, n_layers: int) -> list[str]:
    """The points a dictionary with these settings reads and writes (a cross-layer transcoder's: every layer's)."""
    names = [values["hook_name"]] + ([values["hook_name_out"]] if values["hook_name_out"] is not None else [])
    if values["cross_layer"]:
        return [name.format(layer=layer) for name in names for layer in range(n_layers)]
    return names


def _cross_layer_points(model: HookedTransformer, values: dict, where: str) -> None:
    """A cross-layer transcoder's templates (circuit-tracer's points by default), each layer's points checked."""
    values["hook_name"] = values["hook_name"] or CLT_READ
    values["hook_name_out"] = values["hook_name_out"] or CLT_WRITE
    declaration = architectures.ARCHITECTURES.get(values["architecture"])
    if declaration is None or not declaration.cross_layer:
        raise ValueError(
            f"{where}a cross-layer transcoder is architecture 'standard' (relu, L1) or 'jumprelu' (L0), not"
            f" {values['architecture']!r}"
        )
    if values["resample_dead"]:
        raise ValueError(f"{where}resample_dead=True is not offered for a cross-layer transcoder; leave it False")
    for name in ("hook_name", "hook_name_out"):
        template = values[name]
        if not isinstance(template, str) or "{layer}" not in template:
            raise ValueError(
                f"{where}{name}={template!r}: a cross-layer transcoder reads and writes a point per layer, so give a"
                f" template with {{layer}}, e.g. {CLT_READ!r} -> {CLT_WRITE!r}"
            )
    for layer in range(model.cfg.n_layers):
        read, write = (
            hook_point(model, values[n].format(layer=layer), f"{where}{n}") for n in ("hook_name", "hook_name_out")
        )
        if model.hook_names.index(read) >= model.hook_names.index(write):
            raise ValueError(
                f"{where}a cross-layer transcoder's layer reads a point before the one it writes; {read} does not come"
                f" before {write} (e.g. {CLT_READ!r} -> {CLT_WRITE!r})"
            )


def hook_point(model: HookedTransformer, name: str, what: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what}= is a hook name (str), not {type(name).__name__}")
    try:
        return model._check_name(name)
    except KeyError as error:
        raise KeyError(f"{what}: {error.args[0]}") from None


def width(model: HookedTransformer, name: str, where: str = "") -> tuple[int, bool]:
    """The vector width a dictionary at `name` reads or writes, and whether it flattens heads (attn.hook_z)."""
    shape = model.hook_shapes(batch=1, pos=1)[name][2:]
    if len(shape) == 1:
        return shape[0], False
    if len(shape) == 2 and name.endswith("hook_z"):
        return shape[0] * shape[1], True
    raise ValueError(
        f"{where}{name} is [batch pos {' '.join(map(str, shape))}]; a dictionary reads one vector per position"
        " (a residual stream, an MLP's input or output, attn.hook_z)"
    )


def check_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}= is a positive int, not {value!r}")
