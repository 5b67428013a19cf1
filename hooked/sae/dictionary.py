"""One in-memory model of a sparse dictionary: an SAE (reads and rewrites one hook point) or a transcoder (reads
one point, writes another), with the encoder activations SAELens, eai-sparsify, Gemma Scope and circuit-tracer
use. Every file format is a small reader into this class (hooked/sae/formats/).

The arithmetic, in SAELens 6.54's terms (`saes/sae.py`, `saes/*_sae.py`), for an input x [..., d_in]:

    x' = norm_in(x) - b_dec * apply_b_dec_to_input        (a transcoder never subtracts b_dec)
    pre = x' W_enc + b_enc                                 hook_sae_acts_pre
    acts = activation(pre)                                 hook_sae_acts_post
    recons = norm_out(acts W_dec + b_dec)                  hook_sae_recons
    output = recons + x W_skip^T                           (a skip transcoder; SAELens' splice leaves it out)

with the pre-activation and `activation` of the architecture's declaration (hooked/sae/architectures.py: standard,
gated, topk, jumprelu, and any registered there). `normalize_activations`: `constant_norm_rescale` scales x to norm
sqrt(d_in) and `layer_norm` standardises it, both undone on the output; SAELens' `expected_average_only_in` is a
constant folded into the weights by the reader. `rescale_acts_by_decoder_norm` (TopK) ranks features by
pre * ||W_dec row|| and decodes acts / ||W_dec row||.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hooked.hooks import HookedRootModule, HookPoint
from hooked.sae import architectures
from hooked.sae.architectures import STANDARD, Architecture

RUN_TIME_NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm")
POINT_NAMES = (
    "hook_sae_input",
    "hook_sae_acts_pre",
    "hook_sae_acts_post",
    "hook_sae_recons",
    "hook_sae_error",
    "hook_sae_output",
)


def add_sae_points(module: nn.Module, d_in: int, d_sae: int, d_out: int) -> None:
    """Give `module` SAELens' six hook points (POINT_NAMES), each knowing the sizes of its dictionary's axes."""
    axes = ("batch pos d_in", "batch pos d_sae", "batch pos d_sae", "batch pos d_out", "", "")  # error, output: the
    for name, point_axes in zip(POINT_NAMES, axes, strict=True):  # written point's axes, set when spliced
        point = HookPoint(point_axes)
        point.sizes = {"d_in": d_in, "d_sae": d_sae, "d_out": d_out}
        setattr(module, name, point)


class Metadata(dict):
    """What a dictionary's file recorded besides its shape (`cfg.metadata`): a dict whose keys also read as
    attributes, a key it lacks as None, as SAELens 6.54's `SAEMetadata` (`sae_lens/saes/sae.py`), so
    `sae.cfg.metadata.model_name` works as there. `metadata.hook_name` / `hook_name_out` are where the dictionary
    reads and writes, its config's `hook_name` / `hook_name_out` (hooked's names: `hook_name=` at load may override
    the file's record, which stays at `metadata["hook_name"]`); they are set through the config, not here."""

    def __init__(self, *args, config: DictionaryConfig | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "_config", config)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in ("hook_name", "hook_name_out") and self._config is not None:
            return getattr(self._config, name)
        return self.get(name)

    def __setattr__(self, name: str, value) -> None:
        if name in ("hook_name", "hook_name_out"):
            raise AttributeError(
                f"metadata.{name} is where the dictionary sits, its config's {name}: set sae.cfg.{name} (before it"
                " is spliced), not the metadata"
            )
        self[name] = value


@dataclass
class DictionaryConfig:
    """What a dictionary is: its widths, activation, the hook points it reads and writes, and how it was made.

    Hook names are `hooked`'s (the readers translate SAELens', circuit-tracer's and eai-sparsify's names). A
    transcoder has `hook_name_out` (its output point) and `d_out`; an SAE has neither (it rewrites `hook_name`).
    `processing` records the weight processing of the model the dictionary was trained on (`fold_ln`,
    `center_writing_weights`, ...: hooked.processing's flags), None where the file does not say; splicing refuses
    a dictionary whose recorded processing differs from the model's.
    """

    d_in: int
    d_sae: int
    hook_name: str
    architecture: str = STANDARD.name
    hook_name_out: str | None = None
    d_out: int | None = None
    apply_b_dec_to_input: bool = False
    normalize_activations: str = "none"
    rescale_acts_by_decoder_norm: bool = False
    k: int | None = None
    reshape_activations: str = "none"  # "hook_z": the input is [..., head_index, d_head], flattened to d_in
    dtype: str = "float32"
    device: str = "cpu"
    processing: dict[str, bool] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)  # what the file recorded besides (Metadata, above)

    def __post_init__(self):
        declaration = architectures.get(self.architecture)
        if declaration.activation is None:
            raise ValueError(
                f"architecture {self.architecture!r} is only trained; its dictionary is a {declaration.runs_as} one"
                f" (a dictionary runs {', '.join(architectures.runnable())}; a transcoder is one of them with"
                " hook_name_out set)"
            )
        if self.normalize_activations not in RUN_TIME_NORMALIZATIONS:
            raise ValueError(
                f"normalize_activations {self.normalize_activations!r}: a dictionary runs with one of"
                f" {', '.join(RUN_TIME_NORMALIZATIONS)} (a reader folds SAELens' expected_average_only_in into the"
                " weights)"
            )
        if declaration.k is not None and (self.k is None or not 0 < self.k <= self.d_sae):
            raise ValueError(f"a {self.architecture} dictionary needs k in 1..d_sae ({self.d_sae}), not {self.k}")
        if declaration.k is None and self.k is not None:
            raise ValueError(
                f"k={self.k} is given but the architecture is {self.architecture!r}, which takes none (k is"
                f" {' and '.join(map(repr, architectures.with_k()))}'s)"
            )
        if self.reshape_activations not in ("none", "hook_z"):
            raise ValueError(f"reshape_activations is 'none' or 'hook_z', not {self.reshape_activations!r}")
        if self.d_out is None:
            self.d_out = self.d_in
        if self.hook_name_out is None and self.d_out != self.d_in:
            raise ValueError(f"an SAE rewrites its own point, so d_out ({self.d_out}) must equal d_in ({self.d_in})")

    def __setattr__(self, name: str, value) -> None:
        if name == "metadata":  # a plain dict given or assigned reads as SAELens' metadata does
            value = Metadata(value or {}, config=self)
        super().__setattr__(name, value)

    @property
    def is_transcoder(self) -> bool:
        return self.hook_name_out is not None

    @property
    def declaration(self) -> Architecture:
        """The declaration of `architecture` (hooked/sae/architectures.py): what every reader asks about it."""
        return architectures.get(self.architecture)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Dictionary(HookedRootModule):
    """A sparse dictionary: `encode(x)` -> features [..., d_sae], `decode(f)` -> [..., d_out], `sae(x)` both.

    Spliced into a model (`model.saes([sae])`, hooked/sae/splice.py) its hook points are named under the point
    it writes, as SAELens names them: `blocks.3.hook_resid_post.hook_sae_acts_post`.
    """

    edits_hooked_tensors = False

    def __init__(self, cfg: DictionaryConfig, *, skip: bool = False):
        super().__init__()
        self.cfg = cfg
        dtype = getattr(torch, cfg.dtype) if isinstance(cfg.dtype, str) else cfg.dtype
        kw = {"dtype": dtype, "device": cfg.device}
        d_in, d_sae, d_out = cfg.d_in, cfg.d_sae, cfg.d_out
        self.W_enc = nn.Parameter(torch.zeros(d_in, d_sae, **kw))
        self.W_dec = nn.Parameter(torch.zeros(d_sae, d_out, **kw))
        self.b_dec = nn.Parameter(torch.zeros(d_out, **kw))
        self.declaration = cfg.declaration
        sizes = {"d_in": d_in, "d_sae": d_sae, "d_out": d_out}
        for name, axes in self.declaration.parameters.items():  # b_enc, a threshold, a gated SAE's three, ...
            setattr(self, name, nn.Parameter(torch.zeros([sizes[axis] for axis in axes], **kw)))
        self.W_skip = nn.Parameter(torch.zeros(d_out, d_in, **kw)) if skip else None
        self.use_error_term = False  # SAELens' SAE attribute: run_with_saes(use_error_term=None) reads it
        self.allow_other_model = False  # True: splice although cfg.metadata.model_name names another model
        self.loaded_from: str | None = None  # the path hooked.sae.load read it from, as given
        add_sae_points(self, d_in, d_sae, d_out)
        self.setup_hooks()

    # ----------------------------------------------------------------- what it is
    @property
    def hook_name(self) -> str:
        return self.cfg.hook_name

    @property
    def hook_name_out(self) -> str:
        """The point it writes: a transcoder's output point, an SAE's own."""
        return self.cfg.hook_name_out or self.cfg.hook_name

    @property
    def dtype(self) -> torch.dtype:
        return self.W_enc.dtype

    @property
    def device(self) -> torch.device:
        return self.W_enc.device

    def sae_points(self) -> list[HookPoint]:
        return [getattr(self, name) for name in POINT_NAMES]

    def extra_repr(self) -> str:
        c = self.cfg
        kind = "transcoder" if c.is_transcoder else "SAE"
        where = f"{c.hook_name} -> {c.hook_name_out}" if c.is_transcoder else c.hook_name
        extra = f", k={c.k}" if c.k else ""
        skip = ", skip" if self.W_skip is not None else ""
        return f"{c.architecture} {kind}, d_in={c.d_in}, d_sae={c.d_sae}{extra}{skip}, at {where}"

    # ----------------------------------------------------------------- the arithmetic
    def flatten_input(self, x: Tensor) -> Tensor:
        """[..., head_index, d_head] -> [..., d_in] for a dictionary on hook_z; anything else unchanged."""
        return x.flatten(-2) if self.cfg.reshape_activations == "hook_z" else x

    def normalize(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The run-time input normalisation and what `denormalize` needs to undo it on the output."""
        how = self.cfg.normalize_activations
        if how == "constant_norm_rescale":  # SAELens: x * sqrt(d_in) / ||x||
            scale = math.sqrt(self.cfg.d_in) / x.norm(dim=-1, keepdim=True)
            return x * scale, (scale,)
        if how == "layer_norm":  # SAELens' run_time_activation_ln_in, eps 1e-5, unbiased std
            mu = x.mean(dim=-1, keepdim=True)
            centred = x - mu
            std = centred.std(dim=-1, keepdim=True)
            return centred / (std + 1e-5), (mu, std)
        return x, ()

    def denormalize(self, y: Tensor, state: tuple[Tensor, ...]) -> Tensor:
        how = self.cfg.normalize_activations
        if how == "constant_norm_rescale":
            return y / state[0]
        if how == "layer_norm":
            return y * state[1] + state[0]
        return y

    def centred(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_in"]:
        """The encoder's input: normalised input `x` less b_dec where `apply_b_dec_to_input` (never a transcoder)."""
        if self.cfg.apply_b_dec_to_input and not self.cfg.is_transcoder:
            return x - self.b_dec
        return x

    def pre_activations(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        """The encoder's pre-activation of normalised input `x` (the declaration's; a gated SAE's magnitude path)."""
        return self.declaration.pre_activations(self, self.centred(x))

    def activate(
        self, pre: Float[Tensor, "... d_sae"], x: Tensor | None = None, overwrite: bool = False
    ) -> Float[Tensor, "... d_sae"]:
        """The features from their pre-activations, by the declaration's activation (`x`, the normalised input, for
        an activation that reads it: the gated SAE's gate).

        `overwrite=True`: `pre` is the caller's temporary, which no one else holds, so the activation may write into
        it (a relu does: at d_sae wide, a fresh tensor costs as much as a tenth of the encoder's product)."""
        return self.declaration.activation(self, pre, x, overwrite)

    def decode_linear(self, acts: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_out"]:
        """acts W_dec + b_dec (TopK under rescale_acts_by_decoder_norm: acts / ||W_dec row|| first)."""
        if self.cfg.rescale_acts_by_decoder_norm:
            acts = acts / self.W_dec.norm(dim=-1)
        return acts @ self.W_dec + self.b_dec

    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        """The features of input `x` (for a dictionary on hook_z, x may be [..., head_index, d_head])."""
        x, _ = self.normalize(self.flatten_input(x))
        return self.activate(self.pre_activations(x), x, overwrite=True)

    def decode(self, acts: Float[Tensor, "... d_sae"], norm: tuple[Tensor, ...] | None = None) -> Tensor:
        """The reconstruction from features [..., d_sae] (without a skip transcoder's skip term, which needs x).

        A dictionary that normalises its input at run time (`constant_norm_rescale`, `layer_norm`) decodes into
        the input's scale, so it needs that input's statistics: `decode(f, norm=sae.normalize(x)[1])`. The result is
        flat [..., d_out] also for a dictionary on hook_z (the forward gives the point's own shape)."""
        if self.cfg.normalize_activations != "none" and norm is None:
            raise ValueError(
                f"this dictionary normalises its input at run time ({self.cfg.normalize_activations}), so decoding"
                " needs the input's statistics: sae.decode(f, norm=sae.normalize(x)[1]), or sae(x) for both"
            )
        return self.denormalize(self.decode_linear(acts), norm or ())

    def skip(self, x: Tensor) -> Tensor:
        """A skip transcoder's linear path, x W_skip^T (zero where there is none)."""
        return self.flatten_input(x) @ self.W_skip.T

    def forward(self, x: Tensor, x_out: Tensor | None = None, use_error_term: bool | None = None) -> Tensor:
        """The dictionary's output for input `x`, through its hook points: the reconstruction (plus a skip
        transcoder's skip term). With `use_error_term`, plus the error `x_out - reconstruction` (`x_out`: the
        activation it replaces, x itself for an SAE), taken without gradient and with no hook of this dictionary
        running, so edits of the features change the output and gradients reach the features, as SAELens' SAE.

        That reference needs a second encoding only when a hook listens before the features (`hook_sae_input`,
        `hook_sae_acts_pre`); hooks at `hook_sae_acts_post` or `hook_sae_recons` alone (a feature ablation) leave
        the features as first computed, so those are kept (copied: a hook may edit in place) and decoded again."""
        use_error_term = self.use_error_term if use_error_term is None else use_error_term
        before = self.hook_sae_input.listening or self.hook_sae_acts_pre.listening
        flat = self.hook_sae_input(self.flatten_input(x))
        normed, state = self.normalize(flat)
        pre = self.hook_sae_acts_pre(self.pre_activations(normed))
        acts = self.activate(pre, normed, overwrite=not self.hook_sae_acts_pre.listening)
        after = self.hook_sae_acts_post.listening or self.hook_sae_recons.listening
        unhooked = acts.detach().clone() if use_error_term and after and not before else None
        acts = self.hook_sae_acts_post(acts)
        recons = self.hook_sae_recons(self.decode_linear(acts))
        out = self.denormalize(recons, state)
        if self.W_skip is not None:
            out = out + flat @ self.W_skip.T
        target = x if x_out is None else x_out
        if self.cfg.reshape_activations == "hook_z":
            out = out.unflatten(-1, target.shape[-2:])
        if use_error_term:
            with torch.no_grad():
                if before:
                    clean = self._plain(x).reshape(target.shape)
                elif after:
                    clean = self._output(unhooked, flat, state).reshape(target.shape)
                else:
                    clean = out
                error = target - clean
            out = out + self.hook_sae_error(error)  # outside no_grad: the sum keeps the features' gradient
        return self.hook_sae_output(out)

    def _output(self, acts: Tensor, flat: Tensor, state: tuple[Tensor, ...]) -> Tensor:
        """The output from features `acts` of the flat input `flat` (normalised with `state`), no hook running."""
        out = self.denormalize(self.decode_linear(acts), state)
        return out if self.W_skip is None else out + flat @ self.W_skip.T

    def _plain(self, x: Tensor) -> Tensor:
        """The output for `x` with no hook of this dictionary running (the error term's reference)."""
        flat = self.flatten_input(x)
        normed, state = self.normalize(flat)
        return self._output(self.activate(self.pre_activations(normed), normed, overwrite=True), flat, state)

    # ----------------------------------------------------------------- conveniences
    @torch.no_grad()
    def fold_scaling_factor(self, factor: float) -> None:
        """Fold a constant input scale into the weights, so the dictionary reads unscaled activations: SAELens'
        `fold_activation_norm_scaling_factor` (the input was multiplied by `factor` in training)."""
        self.W_enc.mul_(factor)
        self.W_dec.div_(factor)
        self.b_dec.div_(factor)  # a skip term, (x factor) W_skip^T / factor, is unchanged

    def fold_activation_norm_scaling_factor(self, scaling_factor: float) -> None:
        """SAELens' name for `fold_scaling_factor`."""
        self.fold_scaling_factor(scaling_factor)

    @torch.no_grad()
    def fold_W_dec_norm(self) -> Tensor:
        """Give every decoder row norm 1 without changing the output (SAELens 6.54's `fold_W_dec_norm`, the same
        arithmetic): each row of W_dec divided by its norm (at least 1e-8), the feature's encoder column and the
        parameters its declaration scales with the feature (`scaled_with_feature`: b_enc, a JumpReLU threshold, a
        gated SAE's b_gate and b_mag) multiplied by it, so each feature's activation is
        multiplied by its decoder norm and comparable across features (a TopK dictionary that ranks by contribution,
        `rescale_acts_by_decoder_norm=True`, reports pre-activation times norm already: its features stay as they
        were). Returns the norms [d_sae].

        A dictionary whose features compete (`ranked`: TopK) and rank by pre-activation
        (`rescale_acts_by_decoder_norm=False`) is refused, as in SAELens: scaling the pre-activations would change
        which k features win."""
        if self.declaration.ranked and not self.cfg.rescale_acts_by_decoder_norm:
            raise ValueError(
                f"fold_W_dec_norm would change which features a {self.cfg.architecture} dictionary keeps (it ranks"
                " pre-activations, which the norms would scale); it is safe only with rescale_acts_by_decoder_norm=True"
            )
        norms = self.W_dec.norm(dim=-1).clamp(min=1e-8)
        self.W_dec.div_(norms[:, None])
        self.W_enc.mul_(norms)
        for name in self.declaration.scaled_with_feature:
            getattr(self, name).mul_(norms)
        return norms

    def __repr__(self) -> str:
        return f"Dictionary({self.extra_repr()})"
