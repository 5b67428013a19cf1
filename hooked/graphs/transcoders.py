"""The transcoders an attribution graph runs through, one interface over a per-layer set and a cross-layer
transcoder: where layer l reads and writes, its features' pre-activations, activations, encoder and decoder vectors,
its skip path and decoder bias. Each is checked against the model before anything runs.

A per-layer set is a list of `hooked.sae.Dictionary` transcoders, layer l at index l (what `hooked.sae.load` gives
for circuit-tracer's `transcoder_set` and for a bundled set); a CLT is `hooked.sae.CrossLayerTranscoder`, whose
layer-l features write to every layer m >= l.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hooked.sae import architectures
from hooked.sae.clt import CrossLayerTranscoder
from hooked.sae.dictionary import Dictionary
from hooked.sae.splice import _check_dtype_device, _check_model_name, _check_processing, _check_width, _point

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


class Transcoders:
    """A transcoder set or a CLT seen layer by layer (module docstring)."""

    def __init__(self, transcoders: Sequence[Dictionary] | CrossLayerTranscoder, model: HookedTransformer):
        self.clt = transcoders if isinstance(transcoders, CrossLayerTranscoder) else None
        if self.clt is not None:
            cfg = self.clt.cfg
            self.n_layers, self.d_in, self.d_sae, self.d_out = cfg.n_layers, cfg.d_in, cfg.d_sae, cfg.d_out
            self.hook_in, self.hook_out = cfg.hook_names(), cfg.hook_names_out()
            self.templates = (cfg.hook_name, cfg.hook_name_out)
            self.dictionaries: list[Dictionary] = []
        else:
            self.dictionaries = _dictionary_list(transcoders)
            first = self.dictionaries[0].cfg
            self.n_layers, self.d_in, self.d_sae, self.d_out = (
                len(self.dictionaries),
                first.d_in,
                first.d_sae,
                first.d_out,
            )
            self.hook_in = [d.cfg.hook_name for d in self.dictionaries]
            self.hook_out = [d.cfg.hook_name_out for d in self.dictionaries]
        self._check(model)  # first: a set out of layer order is named as such, not as points differing by layer
        if self.clt is None:
            self.templates = (_template(self.hook_in), _template(self.hook_out))

    # ----------------------------------------------------------------- checks, before anything runs
    def _check(self, model: HookedTransformer) -> None:
        n = model.cfg.n_layers
        kind = "cross-layer transcoder" if self.clt is not None else "transcoder set"
        if self.n_layers != n:
            raise ValueError(
                f"the {kind} has {self.n_layers} layers and the model {n}: an attribution graph replaces every MLP,"
                f" so it needs one transcoder layer per model layer; load the transcoders trained for this model"
            )
        for module, reads, writes in self._named():
            for name, field, width, verb in (
                (reads, "hook_name", self.d_in, "reads"),
                (writes, "hook_name_out", self.d_out, "writes"),
            ):
                _point(model, name, module, field)
                _check_width(model, module, name, width, "d_in" if verb == "reads" else "d_out", verb)
        for layer, (read, write) in enumerate(zip(self.hook_in, self.hook_out, strict=True)):
            for name, role in ((read, "reads"), (write, "writes")):
                if not name.startswith(f"blocks.{layer}."):
                    raise ValueError(
                        f"transcoder layer {layer} {role} {name!r}, a point of another block; layer l of a transcoder"
                        f" set reads and writes blocks.l (give the set in layer order: hooked.sae.load does)"
                    )
        for module in self.modules:
            _check_dtype_device(model, module)
            _check_model_name(model, module)
        for module, reads, writes in self._named():
            _check_processing(model, module, [reads, writes])

    def _named(self):
        """(module, point read, point written) per layer."""
        if self.clt is not None:
            return [(self.clt, r, w) for r, w in zip(self.hook_in, self.hook_out, strict=True)]
        return [(d, d.cfg.hook_name, d.cfg.hook_name_out) for d in self.dictionaries]

    @property
    def modules(self) -> list[torch.nn.Module]:
        return [self.clt] if self.clt is not None else list(self.dictionaries)

    @property
    def dtype(self) -> torch.dtype:
        return self.modules[0].dtype

    @property
    def scan(self) -> str | None:
        """circuit-tracer's `scan`, what names these transcoders for a graph's viewer: the one their files record
        (circuit-tracer's config.yaml), else the path they were loaded from (`hooked.sae.load` keeps it as
        `loaded_from`); None for transcoders made in memory."""
        first = self.modules[0]
        recorded = first.cfg.metadata.get("scan")
        if isinstance(recorded, str) and recorded:
            return recorded
        return getattr(first, "loaded_from", None)

    @property
    def device(self) -> torch.device:
        return self.modules[0].device

    @property
    def has_skip(self) -> bool:
        if self.clt is not None:
            return self.clt.has_skip
        return self.dictionaries[0].W_skip is not None

    # ----------------------------------------------------------------- the arithmetic of layer l
    def pre_activations(self, layer: int, x: Tensor) -> Tensor:
        """Layer `layer`'s features' pre-activations of its input x [..., d_in] (linear in x)."""
        if self.clt is not None:
            return self.clt.pre_activations(layer, x)
        return self.dictionaries[layer].pre_activations(x)

    def activate(self, layer: int, pre: Tensor) -> Tensor:
        if self.clt is not None:
            return self.clt.activate(layer, pre)
        return self.dictionaries[layer].activate(pre)

    def encoder_vectors(self, layer: int, features: Tensor) -> Tensor:
        """[k, d_in]: the input direction each of `features` (of layer `layer`) reads."""
        w_enc = self.clt.layers[layer].W_enc if self.clt is not None else self.dictionaries[layer].W_enc
        return w_enc[:, features].T

    def decoder_rows(self, layer: int, features: Tensor, out_layer: int) -> Tensor:
        """[k, d_out]: what each of `features` of layer `layer` writes to output layer `out_layer`, per unit of
        activation (a per-layer transcoder writes only to its own layer)."""
        if self.clt is not None:
            return self.clt.decoder(layer)[features, out_layer - layer]
        if out_layer != layer:
            raise ValueError(f"a per-layer transcoder of layer {layer} writes to layer {layer}, not {out_layer}")
        return self.dictionaries[layer].W_dec[features]

    def decoder_bias(self, layer: int) -> Tensor:
        module = self.clt.layers[layer] if self.clt is not None else self.dictionaries[layer]
        return module.b_dec

    def skip(self, layer: int, x: Tensor) -> Tensor | None:
        """Layer `layer`'s skip path on its input x, or None without one."""
        if not self.has_skip:
            return None
        if self.clt is not None:
            return self.clt.skip(layer, x)
        return self.dictionaries[layer].skip(x)


def _dictionary_list(transcoders) -> list[Dictionary]:
    if isinstance(transcoders, Dictionary):
        raise TypeError(
            "an attribution graph replaces every MLP, so it takes one transcoder per layer: a list (layer l at index"
            " l, as hooked.sae.load gives a circuit-tracer transcoder set) or a cross-layer transcoder, not one"
            " dictionary"
        )
    if not isinstance(transcoders, Sequence) or not transcoders:
        raise TypeError(
            f"transcoders are a list of hooked.sae transcoders (layer l at index l) or a CrossLayerTranscoder, not"
            f" {type(transcoders).__name__}; load them with hooked.sae.load(path, model=model)"
        )
    for layer, d in enumerate(transcoders):
        if not isinstance(d, Dictionary):
            raise TypeError(
                f"transcoders[{layer}] is a {type(d).__name__}; each must be a hooked.sae transcoder"
                " (hooked.sae.load, or hooked.sae.from_saelens for a SAELens one)"
            )
        cfg = d.cfg
        if not cfg.is_transcoder:
            raise ValueError(
                f"transcoders[{layer}] is an SAE on {cfg.hook_name} (it reconstructs its own input); an attribution"
                " graph replaces each MLP by a transcoder, which reads the MLP's input and writes its output"
            )
        problems = []
        if not cfg.declaration.linear:  # its declaration: pre-activation a column of W_enc, output a row of W_dec
            problems.append(f"architecture {cfg.architecture!r} (one of {', '.join(architectures.linear())})")
        if cfg.normalize_activations != "none":
            problems.append(f"normalize_activations={cfg.normalize_activations!r} (none)")
        if cfg.rescale_acts_by_decoder_norm:
            problems.append("rescale_acts_by_decoder_norm=True (False)")
        if cfg.reshape_activations != "none":
            problems.append(f"reshape_activations={cfg.reshape_activations!r} (none)")
        if problems:
            raise ValueError(
                f"transcoders[{layer}] has {'; '.join(problems)}: an attribution graph needs each feature's"
                " pre-activation linear in the input and its output linear in its activation (a row of W_enc, a row"
                " of W_dec); these settings are not"
            )
    shapes = {(d.cfg.d_in, d.cfg.d_sae, d.cfg.d_out) for d in transcoders}
    if len(shapes) > 1:
        raise ValueError(f"the transcoders differ in (d_in, d_sae, d_out): {sorted(shapes)}; a set has one shape")
    skips = {d.W_skip is not None for d in transcoders}
    if len(skips) > 1:
        raise ValueError("some transcoders of the set have a skip connection and some do not; a set is all or none")
    return list(transcoders)


def _template(names: list[str]) -> str:
    """'blocks.{layer}.hook_mlp_out' from every layer's name."""
    template = names[0].replace("blocks.0.", "blocks.{layer}.", 1)
    if any(template.format(layer=layer) != name for layer, name in enumerate(names)):
        raise ValueError(
            f"the transcoders read or write different points in different layers ({names[:3]}...); layer l of a set"
            " reads and writes the same point of block l"
        )
    return template
