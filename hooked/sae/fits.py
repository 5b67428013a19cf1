"""Whether a dictionary fits a model: the checks every user of a dictionary makes before anything runs, so a
splice (hooked/sae/splice.py) and an attribution graph (hooked/graphs) refuse the same mistakes with the same words.

    reads, writes = hooked.sae.check_fits(model, sae)     # ValueError / KeyError naming the problem and the fix

A dictionary fits a model when every point it reads and writes is a hook point of the model (`hook_point`), the
forward reaches the point it reads no later than the one it writes, its widths are the points' (`check_width`), it
has the model's dtype and device (`check_dtype_device`), it was trained on weights processed as the model's are
wherever that changes its points (`check_processing`), and its metadata names no other model
(`check_model_name`). A cross-layer transcoder or a transcoder set (hooked/sae/transcoders.py) fits when it has one
layer per model layer and each layer fits.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from hooked.sae.clt import CrossLayerTranscoder
from hooked.sae.dictionary import Dictionary

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer
    from hooked.sae.transcoders import TranscoderSet

Spliceable = Dictionary | CrossLayerTranscoder  # one dictionary a splice takes


def check_fits(
    model: HookedTransformer, dictionary: Dictionary | CrossLayerTranscoder | TranscoderSet
) -> tuple[list[str], list[str]]:
    """Refuse `dictionary` (a Dictionary, a CrossLayerTranscoder or a TranscoderSet) unless it fits `model` (module
    docstring); return the points it reads and writes, one per layer (one for a Dictionary), as the model names them.

        reads, writes = check_fits(model, sae)        # an SAE: reads == writes == [sae.hook_name]
    """
    if isinstance(dictionary, Dictionary):
        layers = [(dictionary, dictionary.hook_name, dictionary.hook_name_out)]
    else:  # one layer per model layer: a CLT's layer l, or a set's transcoder l
        kind = "cross-layer transcoder" if isinstance(dictionary, CrossLayerTranscoder) else "transcoder set"
        if dictionary.n_layers != model.cfg.n_layers:
            raise ValueError(
                f"the {kind} has {dictionary.n_layers} layers and the model {model.cfg.n_layers}: it replaces every"
                " layer's MLP, so it needs one transcoder layer per model layer; load the transcoders trained for"
                " this model"
            )
        module = [dictionary] * dictionary.n_layers if kind == "cross-layer transcoder" else list(dictionary)
        layers = list(zip(module, dictionary.hook_names(), dictionary.hook_names_out(), strict=True))
    order = {name: index for index, name in enumerate(model.hook_names)}
    reads, writes = [], []
    for layer, (module, read, write) in enumerate(layers):
        read, write = hook_point(model, read, module, "hook_name"), hook_point(model, write, module, "hook_name_out")
        if isinstance(module, CrossLayerTranscoder):
            if order[read] >= order[write]:
                raise ValueError(
                    f"{module!r}: layer {layer} reads {read}, which the forward does not reach before {write}, the"
                    " point it writes; a transcoder reads a point before the one it replaces"
                )
        elif order[read] > order[write]:  # an SAE reads and writes one point
            raise ValueError(
                f"{module!r} reads {read}, which the forward reaches after {write}, the point it writes; a transcoder"
                " reads a point before the one it replaces"
            )
        heads = isinstance(module, Dictionary) and module.cfg.reshape_activations == "hook_z"
        check_width(model, module, read, module.cfg.d_in, "d_in", "reads", heads)
        check_width(model, module, write, module.cfg.d_out, "d_out", "writes", heads)
        reads.append(read)
        writes.append(write)
    modules = list({id(module): module for module, _, _ in layers}.values())
    for module in modules:
        check_dtype_device(model, module)
    for module in modules:
        points = [p for (m, _, _), r, w in zip(layers, reads, writes, strict=True) if m is module for p in (r, w)]
        check_processing(model, module, points)
    for module in modules:
        check_model_name(model, module)
    return reads, writes


def hook_point(model: HookedTransformer, name: str, dictionary: Spliceable, field: str) -> str:
    """`name` as a hook point of `model` (its own spelling), or a KeyError naming the nearest real ones (SAELens
    skips a dictionary on a missing point silently); `field` is the config field that named it."""
    try:
        return model._check_name(name)
    except KeyError as error:
        raise KeyError(
            f"{dictionary!r}: its {field} {name!r} is not a hook point of this model ({error.args[0]}); give the"
            f" point by hooked's name, e.g. hooked.sae.load(path, {field}='blocks.3.hook_resid_post')"
        ) from None


def check_width(
    model: HookedTransformer, dictionary: Spliceable, name: str, width: int, field: str, verb: str, heads: bool = False
) -> None:
    """Refuse a `width` (`cfg.d_in` or `cfg.d_out`, named by `field`) other than point `name`'s, which the dictionary
    `verb`s ("reads", "writes"); `heads`: a dictionary on hook_z, which reads the heads flattened."""
    # The point's shape past [batch pos], as model.hook_shapes gives it, for this point alone: hook_shapes sizes every
    # point of the model (280 at GPT-2 small: half a millisecond per splice, paid by each run_with_saes).
    sizes = {"batch": 1, "pos": 1, "query_pos": 1, "key_pos": 1, "1": 1, **model.axis_sizes(name)}
    shape = tuple(sizes[axis] for axis in model.hook_dict[name].axes)[2:]
    if heads and len(shape) == 2:
        have = shape[0] * shape[1]
    elif len(shape) == 1:
        have = shape[0]
    else:
        raise ValueError(
            f"{dictionary!r} {verb} {name}, whose activation is [batch pos {' '.join(map(str, shape))}]; a dictionary"
            " reads a vector per position (a dictionary on attn.hook_z sets reshape_activations='hook_z')"
        )
    if have != width:
        raise ValueError(
            f"{dictionary!r}: cfg.{field} is {width}, but {name} of this model is {have} wide; the dictionary was made"
            " for another model or another point (check cfg.hook_name and the model)"
        )


def check_dtype_device(model: HookedTransformer, dictionary: Spliceable) -> None:
    """Refuse a dictionary of another dtype or on another device than the model."""
    if dictionary.dtype != model.dtype or dictionary.device != model.device:
        raise ValueError(
            f"{dictionary!r} is {dictionary.dtype} on {dictionary.device}, the model {model.dtype} on"
            f" {model.device}; convert it first: sae.to(model.dtype).to(model.device)"
        )


def check_processing(model: HookedTransformer, dictionary: Spliceable, points: list[str]) -> None:
    """Refuse a dictionary trained on differently processed weights (fold_ln, centring) than the model has, where the
    difference changes the activations at a point it reads or writes (`points`; hooked.processing.CHANGED_POINTS):
    fold_ln leaves the residual stream as it was, so a residual SAE trained with it splices into a model without it."""
    trained = dictionary.cfg.processing
    if trained is None:
        return
    has = {flag: bool(value) for flag, value in getattr(model, "processing", {}).items()}
    differ = sorted(flag for flag in set(trained) | set(has) if bool(trained.get(flag)) != has.get(flag, False))
    changed = {flag: [p for p in dict.fromkeys(points) if model.processing_changes(flag, p)] for flag in differ}
    differ = [flag for flag in differ if changed[flag]]
    if differ:
        want = ", ".join(f"{flag}={bool(trained.get(flag))}" for flag in differ)
        where = "; ".join(f"{flag} changes {', '.join(changed[flag])}" for flag in differ)
        raise ValueError(
            f"{dictionary!r} was trained on a model with {want}, and this model differs: {where}, so the activations"
            f" there are not the ones the dictionary was trained on. Load the model so (hooked.load(name, {want})) or"
            " reload it unprocessed"
        )


def check_model_name(model: HookedTransformer, dictionary: Spliceable) -> None:
    """Refuse a dictionary whose metadata names another model than this one: with the same widths it splices and
    runs, reading activations it was not trained on (ioi-gpt2's transcoders on ioi-qwen3moe explain none of the
    variance). A model loaded from a local directory is named by the folder, which need not be the model's name:
    there a disagreement is a warning. `dictionary.allow_other_model = True` takes it anyway."""
    recorded = dictionary.cfg.metadata.get("model_name")
    if getattr(dictionary, "allow_other_model", False) or not isinstance(recorded, str):
        return
    agreement = model.name_agreement(recorded)  # the model knows its own name (hooked.weights.sources)
    if agreement in ("same", "unknown"):
        return
    name = model.name_or_path
    message = (
        f"{dictionary!r} was trained on {recorded!r} (cfg.metadata.model_name), and this model is {name!r}: with the"
        " same widths it would splice and run, reading activations it was not trained on. Splice the dictionary made"
        " for this model; to splice this one anyway (to measure how it transfers), set"
        " dictionary.allow_other_model = True"
    )
    if agreement == "other directory":
        warnings.warn(
            message + " (this model was loaded from a directory, whose name may not be the model's)", stacklevel=5
        )
        return
    raise ValueError(message)
