"""A sparse dictionary's architecture is one declaration: an `Architecture` in the table `ARCHITECTURES`, which
everything that depends on the architecture reads (the dictionary's parameters and arithmetic, the weight folds, the
file formats, training, attribution graphs). Nothing outside this file compares an architecture's name; a new one is
one `register_architecture(Architecture(...))` (docs/adding-an-architecture.md).

    ARCHITECTURES["jumprelu"].parameters     # {'b_enc': ('d_sae',), 'threshold': ('d_sae',)}
    dictionary.cfg.declaration.linear       # True: its encoder column is what a feature reads

The declared architectures, in SAELens 6.54's terms (`saes/standard_sae.py`, `gated_sae.py`, `topk_sae.py`,
`jumprelu_sae.py`, `batchtopk_sae.py`), for the encoder input x (after the dictionary's normalisation and, where
`apply_b_dec_to_input`, minus b_dec):

| name | parameters beyond W_enc, W_dec, b_dec | pre-activation | activation |
|---|---|---|---|
| `standard` | b_enc | x W_enc + b_enc | relu(pre) |
| `gated` | b_gate, b_mag, r_mag | x (W_enc exp(r_mag)) + b_mag | relu(pre) where x W_enc + b_gate > 0 |
| `topk` | b_enc | x W_enc + b_enc | relu of the k largest (by pre ||W_dec row||: rescale_acts_by_decoder_norm) |
| `jumprelu` | b_enc, threshold | x W_enc + b_enc | relu(pre) where pre > threshold |
| `batchtopk` | (trains a jumprelu) | | the k x tokens largest of a batch; runs as jumprelu with one threshold |
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from hooked.sae.dictionary import Dictionary

# what a declaration's functions take: the dictionary (its parameters by name), then tensors [..., d_in] / [..., d_sae]
PreActivation = Callable[["Dictionary", Tensor], Tensor]
Activation = Callable[["Dictionary", Tensor, Tensor | None, bool], Tensor]
InputShift = Callable[["Dictionary", Tensor], None]
AXES = ("d_in", "d_sae", "d_out")  # the config's widths a declared parameter's shape is written in


@dataclass(frozen=True)
class SAELensNames:
    """An architecture's `architecture` in SAELens 6.54's cfg.json (`saes/*_sae.py`, `saes/transcoder.py`); None
    where SAELens has no such dictionary (it is then neither read nor written as one)."""

    sae: str | None = None
    transcoder: str | None = None
    skip_transcoder: str | None = None
    also: tuple[str, ...] = ()  # more SAE names read as this one (matryoshka_batchtopk: batchtopk's checkpoint)
    default_k: int | None = None  # k where the config leaves it out (TopKSAEConfig's 100)
    rescale_by_default: bool = False  # rescale_acts_by_decoder_norm where the config leaves it out
    running_threshold: str | None = None  # a training checkpoint's key for the one threshold it runs with


@dataclass(frozen=True)
class Architecture:
    """One dictionary architecture: what it stores, how it computes, how its weights fold, and how the file formats,
    the trainer and the attribution graphs know it. `activation=None` declares one that is only trained, into a
    dictionary of `runs_as`."""

    name: str  # DictionaryConfig.architecture, train(architecture=...)
    parameters: Mapping[str, tuple[str, ...]]  # the encoder's parameters beyond W_enc, W_dec, b_dec: name -> axes
    activation: Activation | None  # (dictionary, pre, x, overwrite) -> features; x: the normalised input
    pre_activation: PreActivation | None = None  # (dictionary, centred x) -> pre; None: x W_enc + b_enc
    k: Literal["per_token", "batch_mean"] | None = None  # takes k=: an int per token, or a batch's mean per token
    ranked: bool = False  # features compete (top k): rescaling one changes which win
    scaled_with_feature: tuple[str, ...] = ()  # parameters multiplied by a feature's scale when it moves into W_enc
    shift_input: InputShift | None = None  # (dictionary, offset W_enc [d_sae]): biases absorb x -> x - offset
    linear: bool = False  # pre-activation a column of W_enc on the input, output a row of W_dec per unit (graphs)
    cross_layer: bool = False  # a cross-layer transcoder runs it (circuit-tracer's relu and JumpReLU)
    runs_as: str | None = None  # a training-only architecture: the one its trained dictionary is
    trainer: str | type | None = None  # its trainer class, or "module:Class" imported when training; None: not trained
    saelens: SAELensNames | None = None
    circuit_tracer: str | None = None  # config.yaml's `activation` of a circuit-tracer transcoder set; None: none

    def __post_init__(self):
        for name, axes in self.parameters.items():
            if name in ("W_enc", "W_dec", "b_dec", "W_skip") or not set(axes) <= set(AXES):
                raise ValueError(
                    f"architecture {self.name!r}: parameter {name} {axes}; declare the encoder's parameters beyond"
                    f" W_enc, W_dec, b_dec (and a skip's W_skip), with axes among {', '.join(AXES)}"
                )
        unknown = set(self.scaled_with_feature) - set(self.parameters)
        if unknown:
            raise ValueError(f"architecture {self.name!r}: scaled_with_feature names {sorted(unknown)}, not parameters")
        if (self.activation is None) == (self.runs_as is None):
            raise ValueError(
                f"architecture {self.name!r}: declare an activation (a dictionary runs it) or runs_as (it is only"
                " trained, into a dictionary of another architecture), one of the two"
            )

    @property
    def runs(self) -> Architecture:
        """The architecture its dictionaries run as: itself, or a training-only one's `runs_as`."""
        return self if self.runs_as is None else get(self.runs_as)

    def trainer_class(self) -> type:
        """The class that trains it (hooked.sae.training's `DictionaryTrainer` surface)."""
        if self.trainer is None:
            raise ValueError(
                f"architecture {self.name!r} cannot be trained; hooked.sae.train trains {', '.join(trainable())}"
            )
        if isinstance(self.trainer, str):
            module, _, name = self.trainer.partition(":")
            return getattr(importlib.import_module(module), name)
        return self.trainer

    def pre_activations(self, dictionary: Dictionary, x: Tensor) -> Tensor:
        if self.pre_activation is not None:
            return self.pre_activation(dictionary, x)
        return (x @ dictionary.W_enc).add_(dictionary.b_enc)  # in place: one pass over [... d_sae] fewer

    def shift(self, dictionary: Dictionary, offset: Tensor) -> None:
        """Fold an input offset into the biases: the dictionary reads x - offset, `offset` given as offset W_enc."""
        if self.shift_input is not None:
            self.shift_input(dictionary, offset)
        else:
            dictionary.b_enc.sub_(offset)


# ============================================================================= the table
ARCHITECTURES: dict[str, Architecture] = {}


def register_architecture(architecture: Architecture) -> Architecture:
    """Add `architecture` to `ARCHITECTURES` (refused where its name or one of its file names is taken)."""
    if architecture.name in ARCHITECTURES:
        raise ValueError(f"architecture {architecture.name!r} is declared already; choose another name")
    if architecture.runs_as is not None and architecture.runs_as not in ARCHITECTURES:
        raise ValueError(f"architecture {architecture.name!r} runs as {architecture.runs_as!r}, which is not declared")
    taken = saelens_names()
    clashes = [name for name in _saelens_spellings(architecture) if name in taken]
    clashes += [
        architecture.circuit_tracer
        for other in ARCHITECTURES.values()
        if architecture.circuit_tracer is not None and other.circuit_tracer == architecture.circuit_tracer
    ]
    if clashes:
        raise ValueError(f"architecture {architecture.name!r}: the file name(s) {clashes} belong to another already")
    ARCHITECTURES[architecture.name] = architecture
    return architecture


def unregister_architecture(name: str) -> None:
    """Remove a declaration (and nothing that runs as it may stay)."""
    users = [other.name for other in ARCHITECTURES.values() if other.runs_as == name]
    if users:
        raise ValueError(f"architecture {name!r} is what {users} run as; unregister those first")
    del ARCHITECTURES[name]


def get(name: str) -> Architecture:
    """The declaration of `name`, or a ValueError listing the declared ones."""
    found = ARCHITECTURES.get(name)
    if found is None:
        raise ValueError(
            f"architecture {name!r} is not one hooked.sae knows; it knows {', '.join(runnable())}"
            f" (and trains {', '.join(trainable())}); a new one is declared in hooked/sae/architectures.py"
        )
    return found


def runnable() -> list[str]:
    """The architectures a `Dictionary` runs (not the training-only ones)."""
    return [name for name, a in ARCHITECTURES.items() if a.activation is not None]


def trainable() -> list[str]:
    return [name for name, a in ARCHITECTURES.items() if a.trainer is not None]


def cross_layer() -> list[str]:
    return [name for name, a in ARCHITECTURES.items() if a.cross_layer]


def linear() -> list[str]:
    return [name for name, a in ARCHITECTURES.items() if a.linear]


def with_k() -> list[str]:
    return [name for name, a in ARCHITECTURES.items() if a.k is not None]


def _saelens_spellings(architecture: Architecture) -> list[str]:
    names = architecture.saelens
    if names is None:
        return []
    return [n for n in (names.sae, *names.also, names.transcoder, names.skip_transcoder) if n is not None]


def saelens_names() -> dict[str, tuple[Architecture, bool, bool]]:
    """SAELens' cfg.json `architecture` -> (its declaration, a transcoder, with a skip)."""
    found = {}
    for architecture in ARCHITECTURES.values():
        names = architecture.saelens
        if names is None:
            continue
        for name in (names.sae, *names.also):
            if name is not None:
                found[name] = (architecture, False, False)
        if names.transcoder is not None:
            found[names.transcoder] = (architecture, True, False)
        if names.skip_transcoder is not None:
            found[names.skip_transcoder] = (architecture, True, True)
    return found


def circuit_tracer_names() -> dict[str, Architecture]:
    """circuit-tracer's config.yaml `activation` -> its declaration."""
    return {a.circuit_tracer: a for a in ARCHITECTURES.values() if a.circuit_tracer is not None}


# ============================================================================= the arithmetic of each
def _relu(dictionary: Dictionary, pre: Tensor, x: Tensor | None, overwrite: bool) -> Tensor:
    # overwrite: `pre` is the caller's temporary, so the ReLU may write into it (at d_sae wide, a fresh tensor
    # costs as much as a tenth of the encoder's product)
    return pre.relu_() if overwrite else F.relu(pre)


def _jumprelu(dictionary: Dictionary, pre: Tensor, x: Tensor | None, overwrite: bool) -> Tensor:
    return F.relu(pre) * (pre > dictionary.threshold)


def _topk(dictionary: Dictionary, pre: Tensor, x: Tensor | None, overwrite: bool) -> Tensor:
    # rank (by contribution to the output under rescale_acts_by_decoder_norm), keep k, relu
    ranked = pre * dictionary.W_dec.norm(dim=-1) if dictionary.cfg.rescale_acts_by_decoder_norm else pre
    values, indices = ranked.topk(dictionary.cfg.k, dim=-1)
    return torch.zeros_like(pre).scatter_(-1, indices, F.relu(values))  # into the zeros: no copy of them


def _gated_pre(dictionary: Dictionary, x: Tensor) -> Tensor:
    return x @ (dictionary.W_enc * dictionary.r_mag.exp()) + dictionary.b_mag  # the magnitude path


def _gated(dictionary: Dictionary, pre: Tensor, x: Tensor | None, overwrite: bool) -> Tensor:
    gate = (dictionary.centred(x) @ dictionary.W_enc + dictionary.b_gate) > 0
    return gate.to(pre.dtype) * F.relu(pre)


def _gated_shift(dictionary: Dictionary, offset: Tensor) -> None:
    dictionary.b_gate.sub_(offset)
    dictionary.b_mag.sub_(offset * dictionary.r_mag.exp())


FEATURE = ("d_sae",)
STANDARD = register_architecture(
    Architecture(
        name="standard",
        parameters={"b_enc": FEATURE},
        activation=_relu,
        scaled_with_feature=("b_enc",),
        linear=True,
        cross_layer=True,
        trainer="hooked.sae.training.trainers:StandardTrainer",
        saelens=SAELensNames(sae="standard", transcoder="transcoder", skip_transcoder="skip_transcoder"),
        circuit_tracer="relu",
    )
)
GATED = register_architecture(
    Architecture(
        name="gated",
        parameters={"b_gate": FEATURE, "b_mag": FEATURE, "r_mag": FEATURE},
        pre_activation=_gated_pre,
        activation=_gated,
        scaled_with_feature=("b_gate", "b_mag"),  # r_mag scales W_enc's copy, which is scaled already
        shift_input=_gated_shift,
        saelens=SAELensNames(sae="gated"),
    )
)
TOPK = register_architecture(
    Architecture(
        name="topk",
        parameters={"b_enc": FEATURE},
        activation=_topk,
        k="per_token",
        ranked=True,
        scaled_with_feature=("b_enc",),
        linear=True,
        trainer="hooked.sae.training.trainers:TopKTrainer",
        saelens=SAELensNames(sae="topk", default_k=100),
        circuit_tracer="topk",
    )
)
JUMPRELU = register_architecture(
    Architecture(
        name="jumprelu",
        parameters={"b_enc": FEATURE, "threshold": FEATURE},
        activation=_jumprelu,
        scaled_with_feature=("b_enc", "threshold"),
        linear=True,
        cross_layer=True,
        trainer="hooked.sae.training.trainers:JumpReLUTrainer",
        saelens=SAELensNames(
            sae="jumprelu", transcoder="jumprelu_transcoder", skip_transcoder="jumprelu_skip_transcoder"
        ),
        circuit_tracer="jumprelu",
    )
)
BATCHTOPK = register_architecture(
    Architecture(
        name="batchtopk",
        parameters={},  # its dictionary's are jumprelu's
        activation=None,
        runs_as="jumprelu",  # with the running threshold for every feature, as SAELens saves it
        k="batch_mean",
        trainer="hooked.sae.training.trainers:BatchTopKTrainer",
        saelens=SAELensNames(
            sae="batchtopk",
            also=("matryoshka_batchtopk",),
            rescale_by_default=True,
            running_threshold="topk_threshold",
        ),
    )
)
