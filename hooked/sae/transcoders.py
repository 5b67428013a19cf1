"""A transcoder set: one per-layer transcoder for every layer of a model, layer l at index l (circuit-tracer 0.5.0,
`transcoder/single_layer_transcoder.py` `TranscoderSet`), seen layer by layer through the same methods as a
cross-layer transcoder's (hooked/sae/clt.py), so what reads transcoders layer by layer (an attribution graph,
hooked/graphs) asks one interface the same questions of either:

    n_layers, d_in, d_sae, d_out, dtype, device, has_skip, scan
    hook_names(), hook_names_out()                  the point layer l reads, the point it writes
    feature_input_hook, feature_output_hook         the same as templates, 'blocks.{layer}.mlp.hook_in'
    pre_activations(l, x), activate(l, pre)         layer l's features of its input x [..., d_in]
    encoder_vectors(l, features)                    [k, d_in]: the input direction each feature reads
    source_layers(m)                                the layers whose features write to output m
    decoder_rows(l, features, m)                    [k, d_out]: what each feature of layer l writes to output m
    decoder_bias(l), skip(l, x)                     output l's bias, its skip path x W_skip
    check_linear()                                  refuse features an attribution graph cannot read as vectors

A set is a sequence of its transcoders, so `model.saes(transcoder_set)` splices each; `as_transcoders` turns what a
user passes (a list of `Dictionary` transcoders, a set, or a CLT) into one of the two, and
`hooked.sae.check_fits(model, transcoders)` checks either against a model.

    tc = hooked.sae.TranscoderSet(hooked.sae.load("path/to/transcoder_set", model=model))
    tc.decoder_rows(3, torch.tensor([12, 40]), 3)  # [2, d_out]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hooked.sae import architectures
from hooked.sae.clt import CrossLayerTranscoder, recorded_scan
from hooked.sae.dictionary import Dictionary


class TranscoderSet(Sequence[Dictionary]):
    """One `Dictionary` transcoder per layer, layer l at index l, of one shape, reading and writing the same point of
    block l (module docstring: what it answers). Checked on construction; `check_fits(model, set)` checks it against
    a model."""

    def __init__(self, transcoders: Sequence[Dictionary]):
        if isinstance(transcoders, Dictionary):
            raise TypeError(
                "a transcoder set replaces every MLP, so it takes one transcoder per layer: a list (layer l at index"
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
            if not d.cfg.is_transcoder:
                raise ValueError(
                    f"transcoders[{layer}] is an SAE on {d.cfg.hook_name} (it reconstructs its own input); a transcoder"
                    " set replaces each MLP by a transcoder, which reads the MLP's input and writes its output"
                )
        self.transcoders = list(transcoders)
        shapes = {(d.cfg.d_in, d.cfg.d_sae, d.cfg.d_out) for d in self.transcoders}
        if len(shapes) > 1:
            raise ValueError(f"the transcoders differ in (d_in, d_sae, d_out): {sorted(shapes)}; a set has one shape")
        if len({d.W_skip is not None for d in self.transcoders}) > 1:
            raise ValueError("some transcoders of the set have a skip connection and some do not; a set is all or none")
        # first: a set out of layer order is named as such, not as points differing by layer
        for layer, (read, write) in enumerate(zip(self.hook_names(), self.hook_names_out(), strict=True)):
            for name, role in ((read, "reads"), (write, "writes")):
                if not name.startswith(f"blocks.{layer}."):
                    raise ValueError(
                        f"transcoder layer {layer} {role} {name!r}, a point of another block; layer l of a transcoder"
                        f" set reads and writes blocks.l (give the set in layer order: hooked.sae.load does)"
                    )
        self.feature_input_hook = _template(self.hook_names())
        self.feature_output_hook = _template(self.hook_names_out())

    # ----------------------------------------------------------------- a sequence of transcoders
    def __len__(self) -> int:
        return len(self.transcoders)

    def __getitem__(self, layer):
        return self.transcoders[layer]

    def __iter__(self) -> Iterator[Dictionary]:
        return iter(self.transcoders)

    def __repr__(self) -> str:
        return f"TranscoderSet({len(self)} x {self.transcoders[0].extra_repr()})"

    def parameters(self) -> Iterator[nn.Parameter]:
        """Every transcoder's parameters, layer 0's first."""
        for d in self.transcoders:
            yield from d.parameters()

    # ----------------------------------------------------------------- what it is
    @property
    def n_layers(self) -> int:
        return len(self.transcoders)

    @property
    def d_in(self) -> int:
        return self.transcoders[0].cfg.d_in

    @property
    def d_sae(self) -> int:
        """Features per layer."""
        return self.transcoders[0].cfg.d_sae

    @property
    def d_out(self) -> int:
        return self.transcoders[0].cfg.d_out

    @property
    def dtype(self) -> torch.dtype:
        return self.transcoders[0].dtype

    @property
    def device(self) -> torch.device:
        return self.transcoders[0].device

    @property
    def has_skip(self) -> bool:
        return self.transcoders[0].W_skip is not None

    @property
    def scan(self) -> str | None:
        """What names these transcoders for a graph's viewer (circuit-tracer's `scan`): `recorded_scan` of layer 0."""
        return recorded_scan(self.transcoders[0])

    def hook_names(self) -> list[str]:
        """The point each layer reads, layer 0 first."""
        return [d.cfg.hook_name for d in self.transcoders]

    def hook_names_out(self) -> list[str]:
        """The point each layer's output replaces, layer 0 first."""
        return [d.cfg.hook_name_out for d in self.transcoders]

    def check_linear(self) -> None:
        """Refuse transcoders whose features are not vectors: an attribution graph (hooked.graphs) reads feature f's
        pre-activation along a row of W_enc and its output along a row of W_dec, which these settings break."""
        for layer, d in enumerate(self.transcoders):
            cfg, problems = d.cfg, []
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
                    " pre-activation linear in the input and its output linear in its activation (a row of W_enc, a"
                    " row of W_dec); these settings are not"
                )

    # ----------------------------------------------------------------- the arithmetic of layer l
    def pre_activations(self, layer: int, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        """Layer `layer`'s features' pre-activations of its input x (linear in x, for a linear architecture)."""
        return self.transcoders[layer].pre_activations(x)

    def activate(self, layer: int, pre: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_sae"]:
        return self.transcoders[layer].activate(pre)

    def source_layers(self, layer: int) -> list[int]:
        """The layers whose features write to output `layer`: its own alone."""
        return [layer]

    def encoder_vectors(self, layer: int, features: Tensor) -> Float[Tensor, "k d_in"]:
        """The input direction each of `features` (indices, of layer `layer`) reads: its column of W_enc."""
        return self.transcoders[layer].W_enc[:, features].T

    def decoder_rows(self, layer: int, features: Tensor, out_layer: int) -> Float[Tensor, "k d_out"]:
        """What each of `features` (indices, of layer `layer`) writes to output `out_layer` per unit of activation;
        a per-layer transcoder writes only to its own layer."""
        if out_layer != layer:
            raise ValueError(f"a per-layer transcoder of layer {layer} writes to layer {layer}, not {out_layer}")
        return self.transcoders[layer].W_dec[features]

    def decoder_bias(self, layer: int) -> Float[Tensor, " d_out"]:
        return self.transcoders[layer].b_dec

    def skip(self, layer: int, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        """A skip set's linear path at `layer`, x W_skip^T."""
        return self.transcoders[layer].skip(x)


def as_transcoders(
    transcoders: Sequence[Dictionary] | TranscoderSet | CrossLayerTranscoder,
) -> TranscoderSet | CrossLayerTranscoder:
    """What a user passes for the transcoders of every layer, as a TranscoderSet or a CrossLayerTranscoder (the
    two that answer the per-layer questions); a list becomes a set, checked."""
    if isinstance(transcoders, (TranscoderSet, CrossLayerTranscoder)):
        return transcoders
    return TranscoderSet(transcoders)


def _template(names: list[str]) -> str:
    """'blocks.{layer}.hook_mlp_out' from every layer's name."""
    template = names[0].replace("blocks.0.", "blocks.{layer}.", 1)
    if any(template.format(layer=layer) != name for layer, name in enumerate(names)):
        raise ValueError(
            f"the transcoders read or write different points in different layers ({names[:3]}...); layer l of a set"
            " reads and writes the same point of block l"
        )
    return template
