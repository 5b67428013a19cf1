"""Where a dictionary's parameters live in a file, and the one way every reader turns them into a `Dictionary`:
each tensor's presence and shape checked against the config (from the file's header, before anything is
allocated), then the dictionary built once in its final dtype and device and each tensor streamed into its
parameter.

    layout = {"W_enc": Stored("encoder.weight", transposed=True), "W_dec": Stored("W_dec"), ...}
    check(cfg, source, layout, skip=False, config_file="cfg.json")
    dictionary = build(cfg, source, layout, skip=False)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from hooked.sae.dictionary import Dictionary, DictionaryConfig
from hooked.sae.formats.files import TensorSource

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}

# the axes, in the config's words, of the parameters every dictionary has (the rest: its architecture's declaration)
AXES = {"W_enc": ("d_in", "d_sae"), "W_dec": ("d_sae", "d_out"), "b_dec": ("d_out",), "W_skip": ("d_out", "d_in")}


@dataclass(frozen=True)
class Stored:
    """A parameter's tensor in a file: its key, and whether it is stored transposed (F.linear's [out, in])."""

    key: str
    transposed: bool = False


def parameter_axes(cfg: DictionaryConfig, skip: bool) -> dict[str, tuple[str, ...]]:
    """The parameters a dictionary of this config has (`Dictionary.__init__`'s), each with its axes."""
    axes = {name: AXES[name] for name in ("W_enc", "W_dec", "b_dec")} | dict(cfg.declaration.parameters)
    return axes | ({"W_skip": AXES["W_skip"]} if skip else {})


def dtype_name(dtype: torch.dtype | str, field: str = "dtype") -> str:
    """'float32' for torch.float32, 'torch.float32' or 'float32'; anything else refused, naming `field`."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"{field} {dtype!r} is not a dtype a dictionary can have; use one of {', '.join(DTYPES)}")
    return name


def check(
    cfg: DictionaryConfig,
    source: TensorSource,
    layout: dict[str, Stored],
    skip: bool,
    config_file: str,
    extra: Iterable[str] = (),
    model=None,
) -> None:
    """Refuse a file whose tensors do not fit `cfg`: a parameter's tensor missing or of another shape (naming the
    config field it contradicts), or a tensor the format does not explain (`extra`: the ones the reader uses
    itself). Parameters not in `layout` are the reader's to fill. With `model`, also a width that is not the one
    of the point the dictionary reads or writes there."""
    if model is not None:
        check_widths(model, cfg, config_file)
    keys = set(source.keys())
    kind = f"{cfg.architecture} {'transcoder' if cfg.is_transcoder else 'SAE'}{' with a skip' if skip else ''}"
    for name, axes in parameter_axes(cfg, skip).items():
        stored = layout.get(name)
        if stored is None:
            continue
        if stored.key not in keys:
            raise ValueError(
                f"{source.path} has no tensor {stored.key!r}, the {name} of a {kind}; it holds {sorted(keys)}."
                f" Is {config_file} for these weights?"
            )
        shape = source.shape(stored.key)
        have = shape[::-1] if stored.transposed else shape
        want = tuple(getattr(cfg, axis) for axis in axes)
        if have != want:
            wrong = [(axis, h, w) for axis, h, w in zip(axes, have, want, strict=False) if h != w] or [
                (axes[0], have, want)
            ]
            says = "; ".join(f"its {axis} is {h} but {config_file} says {axis}={w}" for axis, h, w in wrong)
            layout_words = f"[{', '.join(reversed(axes) if stored.transposed else axes)}]"
            raise ValueError(
                f"{stored.key} in {source.path} is {list(shape)} ({name}, stored {layout_words}): {says}. The weights"
                f" and the config disagree: fix {wrong[0][0]} in {config_file} or use the weights it was written for"
            )
    unused = keys - {stored.key for stored in layout.values()} - set(extra)
    if unused:
        raise ValueError(
            f"{source.path} holds {sorted(unused)}, which a {kind} does not use; hooked.sae will not drop weights"
            f" silently. Is {config_file} (architecture, skip connection) for these weights?"
        )


def build(cfg: DictionaryConfig, source: TensorSource, layout: dict[str, Stored], skip: bool) -> Dictionary:
    """The dictionary of `cfg`, each parameter in `layout` read from `source` into its dtype and device."""
    dictionary = Dictionary(cfg, skip=skip)
    with torch.no_grad():
        for name, stored in layout.items():
            parameter = getattr(dictionary, name).data
            source.read_into(stored.key, parameter.T if stored.transposed else parameter)
    return dictionary


def check_widths(model, cfg: DictionaryConfig, config_file: str) -> None:
    """Refuse a d_in / d_out that is not the width of the point the dictionary reads / writes in `model`."""
    shapes = model.hook_shapes(batch=1, pos=1)
    for name, width, field in (
        (cfg.hook_name, cfg.d_in, "d_in"),
        (cfg.hook_name_out or cfg.hook_name, cfg.d_out, "d_out"),
    ):
        shape = shapes[name][2:]
        have = shape[0] * shape[1] if cfg.reshape_activations == "hook_z" and len(shape) == 2 else shape[-1]
        if have != width:
            raise ValueError(
                f"{config_file}: {field} is {width}, but {name} of this {type(model).__name__} is {have} wide; the"
                " dictionary was made for another model or another point (check its hook_name and the model)"
            )
