"""Cross-layer transcoders (CLTs): one sparse dictionary over every layer of a model, whose layer-l features read
layer l's input point and write to the output point of every layer m >= l (circuit-tracer 0.5.0,
`transcoder/cross_layer_transcoder.py`). For the input x_l [..., d_in] at layer l's read point:

    pre_l = x_l W_enc_l + b_enc_l                                      layer l's hook_sae_acts_pre
    acts_l = relu(pre_l), or JumpReLU: pre_l * (pre_l > threshold_l)  layer l's hook_sae_acts_post
    out_m = sum_{l <= m} acts_l W_dec_l[:, m - l] + b_dec_m            layer m's hook_sae_recons
            (+ x_m W_skip_m, a skip CLT)                               layer m's hook_sae_output

with W_enc_l [d_in, d_sae] and W_dec_l [d_sae, n_layers - l, d_out]: slice m - l of layer l's decoder writes
to layer m. The JumpReLU is circuit-tracer's, `pre * (pre > threshold)`; it equals SAELens' `relu(pre) * (pre >
threshold)` wherever the threshold is not negative. circuit-tracer's CLTs read `blocks.L.mlp.hook_in` (the MLP's
input after ln2) or `hook_resid_mid` and write `blocks.L.hook_mlp_out`; the hook names here are templates with
`{layer}`, in hooked's spelling.

Spliced into a model (`model.saes([clt])`, hooked/sae/splice.py), layer m's hook points are named under its
output point, as SAELens names a transcoder's: `blocks.3.hook_mlp_out.hook_sae_acts_post` holds the features
layer 3 reads, so `L3.mlp_out.F12` addresses one of them as it would a transcoder's feature. Because layer m's
output needs every earlier layer's features, a forward must pass every read point from layer 0 on: the points'
`stage` is the first read point's (a sweep's variant on a feature starts there), and a forward that starts part
way (a sweep variant joining after the first read) is refused with the fix named, never run on missing features.

Decoders hold most of a CLT's weights (n_layers (n_layers + 1) / 2 d_sae d_out); a CLT read from disk reads each
layer's decoder when it is first used (`decoder(layer)`), as circuit-tracer's `lazy_decoder` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from hooked.hooks import HookedRootModule, HookPoint
from hooked.sae import architectures
from hooked.sae.architectures import JUMPRELU
from hooked.sae.dictionary import POINT_NAMES, add_sae_points

# circuit-tracer's files are read and written in hooked/sae/formats/circuit_tracer_clt.py (hooked.sae.load, save).


@dataclass
class CLTConfig:
    """What a cross-layer transcoder is: its layer count, widths, activation and the points it reads and writes.

    `hook_name` and `hook_name_out` are hooked's point names with `{layer}` for the layer; `processing` records
    the weight processing of the model it was trained on, as `DictionaryConfig.processing` (None: unknown)."""

    n_layers: int
    d_in: int
    d_sae: int  # features per layer
    architecture: str = JUMPRELU.name
    d_out: int | None = None
    hook_name: str = "blocks.{layer}.mlp.hook_in"
    hook_name_out: str = "blocks.{layer}.hook_mlp_out"
    dtype: str = "float32"
    device: str = "cpu"
    processing: dict[str, bool] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not architectures.get(self.architecture).cross_layer:
            raise ValueError(
                f"a cross-layer transcoder's architecture is one of {', '.join(architectures.cross_layer())} (relu, or"
                f" circuit-tracer's JumpReLU), not {self.architecture!r}"
            )
        if self.n_layers < 1:
            raise ValueError(f"a cross-layer transcoder spans at least one layer, not n_layers={self.n_layers}")
        for name, value in (("hook_name", self.hook_name), ("hook_name_out", self.hook_name_out)):
            if "{layer}" not in value:
                raise ValueError(
                    f"{name} {value!r} names one point; a cross-layer transcoder has one per layer, so give a"
                    " template with {layer}: 'blocks.{layer}.mlp.hook_in', 'blocks.{layer}.hook_mlp_out'"
                )
        if self.d_out is None:
            self.d_out = self.d_in

    def hook_names(self) -> list[str]:
        """The point each layer reads, layer 0 first."""
        return [self.hook_name.format(layer=layer) for layer in range(self.n_layers)]

    def hook_names_out(self) -> list[str]:
        """The point each layer's output replaces, layer 0 first."""
        return [self.hook_name_out.format(layer=layer) for layer in range(self.n_layers)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def recorded_scan(transcoders: nn.Module) -> str | None:
    """circuit-tracer's `scan`, what names a CLT or a transcoder set (by its first transcoder) for a graph's viewer:
    the one their files record (circuit-tracer's config.yaml, kept in `cfg.metadata`), else the path they were loaded
    from (`hooked.sae.load` keeps it as `loaded_from`); None for transcoders made in memory."""
    recorded = transcoders.cfg.metadata.get("scan")
    if isinstance(recorded, str) and recorded:
        return recorded
    return getattr(transcoders, "loaded_from", None)


class CLTLayer(nn.Module):
    """Layer `layer` of a CLT: its features' encoder and their decoders to layers layer..n_layers-1, the bias
    of output `layer`, an optional skip, and the hook points named under its output point when spliced."""

    def __init__(self, cfg: CLTConfig, layer: int, skip: bool, dtype: torch.dtype):
        super().__init__()
        kw = {"dtype": dtype, "device": cfg.device}
        d_in, d_sae, d_out = cfg.d_in, cfg.d_sae, cfg.d_out
        self.layer = layer
        self.W_enc = nn.Parameter(torch.zeros(d_in, d_sae, **kw))
        self.b_enc = nn.Parameter(torch.zeros(d_sae, **kw))
        thresholded = "threshold" in architectures.get(cfg.architecture).parameters  # circuit-tracer's JumpReLU
        self.threshold = nn.Parameter(torch.zeros(d_sae, **kw)) if thresholded else None
        # None until first used in a CLT read lazily from disk (`decoder_source` reads it: CrossLayerTranscoder.decoder)
        self.W_dec = nn.Parameter(torch.zeros(d_sae, cfg.n_layers - layer, d_out, **kw))
        self.b_dec = nn.Parameter(torch.zeros(d_out, **kw))
        self.W_skip = nn.Parameter(torch.zeros(d_in, d_out, **kw)) if skip else None
        self.decoder_source: Callable[[torch.dtype, torch.device], Tensor] | None = None
        add_sae_points(self, d_in, d_sae, d_out)

    def sae_points(self) -> list[HookPoint]:
        return [getattr(self, name) for name in POINT_NAMES]


@dataclass
class CLTForward:
    """What a CLT carries from layer to layer within one forward: each layer's input and features so far."""

    rows: tuple[int, ...] = ()  # the leading shape ([batch pos]) of the forward that layer 0 read
    inputs: list[Tensor] = field(default_factory=list)  # x_l as the hooks left it (the skip reads it)
    acts: list[Tensor] = field(default_factory=list)  # acts_l as the hooks left it
    clean_acts: list[Tensor] = field(default_factory=list)  # without any hook of the CLT, for the error term
    clean_inputs: list[Tensor] = field(default_factory=list)
    listening: bool = False  # a hook of the CLT listens: the error term's reference is computed apart

    def start(self, rows: tuple[int, ...], listening: bool) -> None:
        """Begin a forward (layer 0 reads), dropping whatever an earlier one left."""
        self.rows, self.listening = rows, listening
        for kept in (self.inputs, self.acts, self.clean_acts, self.clean_inputs):
            kept.clear()


class CrossLayerTranscoder(HookedRootModule):
    """A cross-layer transcoder: `encode(x)` [n_layers, ..., d_in] -> features [n_layers, ..., d_sae],
    `decode(f, x)` -> [n_layers, ..., d_out], `clt(x)` both; `model.saes([clt])` splices it (layer l read at
    `cfg.hook_names()[l]`, output m written at `cfg.hook_names_out()[m]`).

        clt = hooked.sae.load("path/to/clt")     # circuit-tracer's files
        logits, cache = model.run_with_cache_with_saes(tokens, saes=[clt])
        cache["blocks.3.hook_mlp_out.hook_sae_acts_post"]               # layer 3's features
    """

    edits_hooked_tensors = False

    def __init__(self, cfg: CLTConfig, *, skip: bool = False):
        super().__init__()
        self.cfg = cfg
        dtype = getattr(torch, cfg.dtype) if isinstance(cfg.dtype, str) else cfg.dtype
        self.layers = nn.ModuleList(CLTLayer(cfg, layer, skip, dtype) for layer in range(cfg.n_layers))
        self.use_error_term = False  # as Dictionary's: run_with_saes(use_error_term=None) reads it
        self.allow_other_model = False  # as Dictionary's: splice although cfg.metadata.model_name names another model
        self.loaded_from: str | None = None  # as Dictionary's: the path hooked.sae.load read it from
        self.setup_hooks()

    # ----------------------------------------------------------------- what it is
    @property
    def hook_name(self) -> str:
        """The point layer 0 reads (every layer's: `cfg.hook_names()`)."""
        return self.cfg.hook_names()[0]

    @property
    def hook_name_out(self) -> str:
        """The point layer 0's output replaces (every layer's: `cfg.hook_names_out()`)."""
        return self.cfg.hook_names_out()[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].W_enc.dtype

    @property
    def device(self) -> torch.device:
        return self.layers[0].W_enc.device

    @property
    def has_skip(self) -> bool:
        return self.layers[0].W_skip is not None

    @property
    def n_layers(self) -> int:
        return self.cfg.n_layers

    @property
    def d_in(self) -> int:
        return self.cfg.d_in

    @property
    def d_sae(self) -> int:
        """Features per layer."""
        return self.cfg.d_sae

    @property
    def d_out(self) -> int:
        return self.cfg.d_out

    def hook_names(self) -> list[str]:
        """The point each layer reads, layer 0 first (as a TranscoderSet's)."""
        return self.cfg.hook_names()

    def hook_names_out(self) -> list[str]:
        """The point each layer's output replaces, layer 0 first."""
        return self.cfg.hook_names_out()

    @property
    def feature_input_hook(self) -> str:
        """Where layer l reads, with `{layer}` for l: 'blocks.{layer}.mlp.hook_in' (circuit-tracer's name)."""
        return self.cfg.hook_name

    @property
    def feature_output_hook(self) -> str:
        """Where layer l writes, with `{layer}` for l: 'blocks.{layer}.hook_mlp_out'."""
        return self.cfg.hook_name_out

    @property
    def scan(self) -> str | None:
        """What names these transcoders for a graph's viewer (circuit-tracer's `scan`): `recorded_scan`."""
        return recorded_scan(self)

    def check_linear(self) -> None:
        """As a TranscoderSet's (hooked/sae/transcoders.py): a CLT's features always are vectors (relu and JumpReLU
        read along a column of W_enc and write along rows of W_dec), so nothing to refuse."""

    def sae_points(self, layer: int) -> list[HookPoint]:
        """Layer `layer`'s hook points, in SAELens' order (input, acts_pre, acts_post, recons, error, output)."""
        return self.layers[layer].sae_points()

    def decoder(self, layer: int) -> Float[Tensor, "d_sae n_out d_out"]:
        """W_dec of `layer` [d_sae, n_layers - layer, d_out], read from its file on first use if it was loaded
        lazily (in the CLT's dtype and on its device as they are then)."""
        module = self.layers[layer]
        if module.W_dec is None:
            module.W_dec = nn.Parameter(module.decoder_source(self.dtype, self.device))
            module.decoder_source = None
        return module.W_dec

    def extra_repr(self) -> str:
        c = self.cfg
        skip = ", skip" if self.has_skip else ""
        where = f"{c.hook_name} -> {c.hook_name_out}"
        return f"{c.architecture}, n_layers={c.n_layers}, d_in={c.d_in}, d_sae={c.d_sae}{skip}, at {where}"

    def __repr__(self) -> str:
        return f"CrossLayerTranscoder({self.extra_repr()})"

    # ----------------------------------------------------------------- the arithmetic, one layer at a time
    def pre_activations(self, layer: int, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        module = self.layers[layer]
        return x @ module.W_enc + module.b_enc

    def activate(self, layer: int, pre: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_sae"]:
        """relu, or circuit-tracer's JumpReLU `pre * (pre > threshold)`."""
        threshold = self.layers[layer].threshold
        return F.relu(pre) if threshold is None else pre * (pre > threshold)

    def source_layers(self, layer: int) -> range:
        """The layers whose features write to output `layer`: every layer up to it."""
        return range(layer + 1)

    def encoder_vectors(self, layer: int, features: Tensor) -> Float[Tensor, "k d_in"]:
        """The input direction each of `features` (indices, of layer `layer`) reads: its column of W_enc."""
        return self.layers[layer].W_enc[:, features].T

    def decoder_rows(self, layer: int, features: Tensor, out_layer: int) -> Float[Tensor, "k d_out"]:
        """What each of `features` (indices, of layer `layer`) writes to output `out_layer` >= layer, per unit of
        activation."""
        if not layer <= out_layer < self.cfg.n_layers:
            raise ValueError(
                f"layer {layer}'s features write to layers {layer}..{self.cfg.n_layers - 1}, not {out_layer}"
            )
        return self.decoder(layer)[features, out_layer - layer]

    def decoder_bias(self, layer: int) -> Float[Tensor, " d_out"]:
        """b_dec of output `layer`."""
        return self.layers[layer].b_dec

    def encode_layer(self, layer: int, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        """The features layer `layer` reads from its input `x`."""
        return self.activate(layer, self.pre_activations(layer, x))

    def decode_layer(self, layer: int, acts: list[Tensor]) -> Float[Tensor, "... d_out"]:
        """Output `layer` (without the skip) from the features of layers 0..layer: acts[l] is layer l's."""
        out = self.layers[layer].b_dec
        for source in range(layer + 1):
            out = out + acts[source] @ self.decoder(source)[:, layer - source]
        return out

    def skip(self, layer: int, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        """A skip CLT's linear path at `layer`, x W_skip (circuit-tracer's `inputs @ W_skip[layer]`)."""
        return x @ self.layers[layer].W_skip

    def encode(self, x: Float[Tensor, "n_layers ... d_in"]) -> Float[Tensor, "n_layers ... d_sae"]:
        """Every layer's features from every layer's input (circuit-tracer's `CrossLayerTranscoder.encode`)."""
        self._check_stacked(x, "encode")
        return torch.stack([self.encode_layer(layer, x[layer]) for layer in range(self.cfg.n_layers)])

    def decode(
        self, acts: Float[Tensor, "n_layers ... d_sae"], x: Tensor | None = None
    ) -> Float[Tensor, "n_layers ... d_out"]:
        """Every layer's output from every layer's features (and, for a skip CLT, inputs `x`)."""
        self._check_stacked(acts, "decode")
        if self.has_skip and x is None:
            raise ValueError("this CLT has a skip connection, so decoding needs the inputs too: clt.decode(acts, x)")
        outs = [self.decode_layer(layer, list(acts)) for layer in range(self.cfg.n_layers)]
        if self.has_skip:
            outs = [out + self.skip(layer, x[layer]) for layer, out in enumerate(outs)]
        return torch.stack(outs)

    def forward(self, x: Float[Tensor, "n_layers ... d_in"]) -> Float[Tensor, "n_layers ... d_out"]:
        """Every layer's output from every layer's input, through the hook points (circuit-tracer's `forward`)."""
        self._check_stacked(x, "forward")
        state = CLTForward()
        for layer in range(self.cfg.n_layers):
            self.read(layer, x[layer], state)
        return torch.stack([self.write(layer, None, state) for layer in range(self.cfg.n_layers)])

    def _check_stacked(self, x: Tensor, what: str) -> None:
        if x.ndim < 2 or x.shape[0] != self.cfg.n_layers:
            raise ValueError(
                f"CrossLayerTranscoder.{what} takes every layer's tensors stacked, [n_layers={self.cfg.n_layers}, ...,"
                f" width], not {tuple(x.shape)}; one layer's: encode_layer(layer, x), decode_layer(layer, acts)"
            )

    # ----------------------------------------------------------------- spliced: one read and one write per layer
    def read(self, layer: int, x: Tensor, state: CLTForward, use_error_term: bool = False) -> None:
        """Layer `layer` reads its input `x` [..., d_in] through its hook points; its features join `state`."""
        if layer == 0:
            listening = any(point.listening for module in self.layers for point in module.sae_points()[:4])
            state.start(tuple(x.shape[:-1]), listening)
        else:
            self._check_rows(state, layer, x, reading=True)
        module = self.layers[layer]
        x_hooked = module.hook_sae_input(x)
        pre = module.hook_sae_acts_pre(self.pre_activations(layer, x_hooked))
        state.inputs.append(x_hooked)
        state.acts.append(module.hook_sae_acts_post(self.activate(layer, pre)))
        if use_error_term and state.listening:  # the error term's reference: this CLT with none of its hooks
            with torch.no_grad():
                state.clean_inputs.append(x)
                state.clean_acts.append(self.encode_layer(layer, x))

    def write(self, layer: int, x_out: Tensor | None, state: CLTForward, use_error_term: bool = False) -> Tensor:
        """Output `layer` through its hook points, from `state`'s features of layers 0..layer. With
        `use_error_term`, plus the error `x_out - output` taken without gradient and with no hook of this CLT
        running (as Dictionary's), so edits of any layer's features reach the output and gradients reach them."""
        if x_out is not None:
            self._check_rows(state, layer, x_out, reading=False)
        module = self.layers[layer]
        out = module.hook_sae_recons(self.decode_layer(layer, state.acts))
        if self.has_skip:
            out = out + self.skip(layer, state.inputs[layer])
        if use_error_term:
            with torch.no_grad():
                clean = out
                if state.listening:
                    clean = self.decode_layer(layer, state.clean_acts)
                    clean = clean + self.skip(layer, state.clean_inputs[layer]) if self.has_skip else clean
                error = x_out - clean
            out = out + module.hook_sae_error(error)  # outside no_grad: the sum keeps the features' gradient
        out = module.hook_sae_output(out)
        if layer == self.cfg.n_layers - 1:
            state.start((), False)  # the forward is through: hold no activations past it
        return out

    def _check_rows(self, state: CLTForward, layer: int, activation: Tensor, reading: bool) -> None:
        """Refuse to go on unless the layers before (a read) or up to (a write) `layer` read these rows in this
        forward: one that started part way, or a sweep variant's rows that joined after the first read, would
        decode from missing features."""
        needed = layer if reading else layer + 1
        have = len(state.acts)
        if (have == needed if reading else have >= needed) and state.rows == tuple(activation.shape[:-1]):
            return
        what = "reads its input" if reading else "writes its output"
        first = self.cfg.hook_names()[0]
        had = f"layers 0..{have - 1} read rows {list(state.rows)}" if have else "no layer has read"
        raise RuntimeError(
            f"{self!r}: layer {layer} {what} for rows {list(activation.shape[:-1])}, but {had} in this forward;"
            f" a cross-layer transcoder needs every layer from 0 on to read the same rows. A forward that starts"
            f" part way (run_stage) cannot run it; in hooked.sweep, give a variant whose first hook comes after"
            f" {first} a hook there too (a no-op, `lambda activation, hook: None`), so its rows join before the"
            " transcoder's first read"
        )
