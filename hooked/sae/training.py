"""`hooked.sae.train`: sparse dictionaries trained on activations streamed from a `hooked` model's own forward.

    sae = hooked.sae.train(model, texts, hook_name="blocks.2.hook_resid_post", architecture="topk", d_sae=1024, k=16)
    tc = hooked.sae.train(model, tokens, hook_name="blocks.1.mlp.hook_in", hook_name_out="blocks.1.hook_mlp_out",
                          architecture="jumprelu", d_sae=512, n_tokens=2_000_000)

What happens, in order (the names are this file's):

1. **Tokens** (`token_rows`): a token tensor ([n pos] rows used as they are, padding left out where an
   `attention_mask` says so or, without one, as the model reads padding from ids; or a [n] stream), a list of texts, a
   local .txt (a text per line) or .jsonl ({"text": ...} per line) file, or any iterable of texts or {"text": ...}
   records. Texts are tokenized with the model's tokenizer, joined with a separator (BOS, else EOS) and cut into
   rows of `context_size`, each starting with BOS when the model prepends one (SAELens'
   `concat_and_batch_sequences`).
2. **Activations** (`ActivationStream`): a forward per batch of rows under `torch.no_grad`, stopping after the
   last block any dictionary reads (`stop_at_layer`); hooks copy each point into a small buffer, which is shuffled
   (the same permutation for every point, so a transcoder's input and target stay paired) and half of it handed
   out per refill, as SAELens' mixing buffer. Every dictionary sees the same batches: several are trained from one
   pass (`dictionaries=[...]`, SAELens' multi-SAE runner), each exactly as it would be alone.
3. **A step** (`Run.step`): the dictionary's loss (`DictionaryTrainer.forward`), Adam, the architecture's
   constraint; the features that fired reset their count of steps since firing; a feature silent for more than
   `dead_feature_window` steps is dead (TopK's AuxK loss trains it; `resample_dead=True` also re-initialises it).

The losses, in SAELens 6.54's terms (`saes/standard_sae.py`, `topk_sae.py`, `batchtopk_sae.py`, `jumprelu_sae.py`;
reconstruction = squared error summed over the output width, averaged over tokens, so coefficients carry over):

- `standard`: ReLU; + l1_coefficient * sum_i f_i ||W_dec_i|| (the L1 weighted by decoder norms; rows are free).
- `topk`: the k largest pre-activations, ReLU; decoder rows at unit norm (eai-sparsify 1.3.3 `sparse_coder.py`: the
  gradient along each row removed before the step, rows renormalised after); + aux_coefficient * AuxK (the dead
  features' top d_out/2 pre-activations reconstruct the residual, scaled by min(dead / (d_out/2), 1)). Trained
  sparse: the encoder's backward and the decoder touch only the k chosen features per token (as eai-sparsify's
  fused encoder), so a step costs one dense product, the encoder's.
- `batchtopk`: the k * tokens largest activations of the whole batch; otherwise as `topk`. Its threshold, an
  exponential average (rate 0.01) of the smallest activation kept, started at the first batch's, is saved as a
  JumpReLU dictionary with that one threshold for every feature, as SAELens saves it.
- `jumprelu`: relu(pre) * (pre > threshold), the threshold learnt through a straight-through estimator with a
  rectangle kernel of width `bandwidth`; + l0_coefficient * L0 (the step function, same estimator); the threshold
  kept >= 0. Decoder rows free (SAELens' JumpReLUTrainingSAE, "step" mode).

Initialisation (SAELens' `initialize_weights`): decoder rows drawn uniformly (its kaiming_uniform_), scaled to
norm 0.1 (1 for the unit-norm architectures), the encoder their transpose (a transcoder's encoder drawn apart). An
SAE's b_dec starts at the geometric median of the first batch (`geometric_median`; SAELens' trainers before 6.0
offered it as `b_dec_init_method="geometric_median"`, 6.54 starts at zero): the centre it subtracts from its input
(`apply_b_dec_to_input`) is then not pulled by the few tokens of outsized norm, such as a GPT-2's first position. A
transcoder's b_dec starts at the mean of the first batch's targets, its b_enc centring its pre-activations on that
batch's mean input (eai-sparsify's trainer). Adam at a constant learning rate, each step's gradients clipped to total
norm `MAX_GRAD_NORM` (SAELens): without the clip, Adam's second moment (beta2 0.999) remembers the large gradients of
the first steps and shrinks the later ones (docs/benchmarks.md, "Sparse dictionaries: training quality vs
SAELens").

The loop drives any object with `DictionaryTrainer`'s surface (`points`, `d_sae`, `feature_shape`, `device`,
`initialize`, `parameters`, `forward` -> `StepResult`, `before_update`, `after_update`, `resample`, `export`) through
`Run`. A cross-layer transcoder is one more such trainer (hooked/sae/clt_training.py), chosen by `cross_layer=True`
with architecture "standard" (relu) or "jumprelu", the activation it runs:

    clt = hooked.sae.train(model, texts, cross_layer=True, architecture="jumprelu", d_sae=4096, l0_coefficient=1e-3)
    hooked.sae.save(clt, "my_clt", format="circuit-tracer")

Its `points` are every layer's input and output (`hook_name` / `hook_name_out` are templates with {layer}, by default
circuit-tracer's 'blocks.{layer}.mlp.hook_in' -> 'blocks.{layer}.hook_mlp_out'), all from one forward per batch of
the same stream; its loss is the sum over layers of each output's squared error (normalised as a transcoder's) plus
the activation's penalty: relu's L1 weights each feature by its decoder norms summed over the layers it writes,
JumpReLU's L0 learns its thresholds as above. Dead features are counted per layer (`num_dead_features_per_layer` in
the metadata); they are not resampled. It returns a `CrossLayerTranscoder` (hooked/sae/clt.py), which splices
(`model.saes([clt])`); its checkpoints are circuit-tracer's CLT folders.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from hooked.hooks import EMBED_STAGE, needs_gradients
from hooked.sae import architectures
from hooked.sae.architectures import TOPK
from hooked.sae.clt import CLTConfig, CrossLayerTranscoder
from hooked.sae.dictionary import Dictionary, DictionaryConfig
from hooked.version import __version__

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

JUMPRELU_BANDWIDTH = 0.05  # SAELens' jumprelu_bandwidth
JUMPRELU_INIT_THRESHOLD = 0.01  # SAELens' jumprelu_init_threshold
BATCHTOPK_THRESHOLD_RATE = 0.01  # SAELens' topk_threshold_lr
DECODER_INIT_NORM = 0.1  # SAELens' decoder_init_norm (Anthropic's April 2024 update)
CLT_READ, CLT_WRITE = "blocks.{layer}.mlp.hook_in", "blocks.{layer}.hook_mlp_out"  # circuit-tracer's CLT points
RESAMPLE_ENCODER_SCALE = 0.2  # Anthropic's resampling: new encoder rows at 0.2 x the live rows' mean norm
MAX_GRAD_NORM = 1.0  # each step's gradients clipped to this total norm (SAELens 6.54 `sae_trainer.py` `_train_step`)
GEOMETRIC_MEDIAN_STEPS = 30  # Weiszfeld iterations for an SAE's b_dec at the first batch's geometric median
PRE_BYTES = 8 * 2**20  # TopK computes its pre-activations this many bytes of rows at a time


# ============================================================================= what to train
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


def train(
    model: HookedTransformer,
    data,
    *,
    hook_name: str | None = None,
    architecture: str = TOPK.name,
    d_sae: int | None = None,
    k: float | None = None,
    hook_name_out: str | None = None,
    skip: bool = False,
    l1_coefficient: float = 1.0,
    l0_coefficient: float = 1.0,
    aux_coefficient: float = 1.0,
    lr: float | None = None,
    batch_tokens: int = 4096,
    n_tokens: int | None = None,
    context_size: int | None = None,
    prepend_bos: bool | None = None,
    attention_mask: Tensor | None = None,
    dictionaries: Sequence[dict[str, Any]] | None = None,
    dead_feature_window: int = 1000,
    resample_dead: bool = False,
    buffer_batches: int = 8,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int | None = None,
    progress: bool = True,
    seed: int = 0,
    cross_layer: bool = False,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Dictionary | CrossLayerTranscoder | list[Dictionary | CrossLayerTranscoder]:
    """Train a sparse dictionary (or several, from one pass) on `model`'s activations; see the module docstring.

    `data`: token ids, texts, a .txt / .jsonl path or an iterable of {"text": ...}; `n_tokens` of them (default: one
    pass; data holding fewer is read again) in batches of `batch_tokens`, rows of `context_size` (default min(128,
    the model's context)), BOS first as `prepend_bos` says (default: the model's). `architecture`, `d_sae`, `k`
    (topk: per token; batchtopk: the batch's mean), `hook_name_out` (a transcoder) and `skip` (its W_skip) say what
    to train; `l1_coefficient` (standard), `l0_coefficient` (jumprelu) and `aux_coefficient` (AuxK, topk and
    batchtopk) weigh the sparsity terms as SAELens does; `lr` is Adam's (default 2e-4 / sqrt(d_sae / 2**14),
    eai-sparsify's rule). A feature silent for more than `dead_feature_window` steps is dead; `resample_dead=True`
    re-initialises the dead ones every that many steps. `buffer_batches` batches are shuffled together.

    `dictionaries=[{"hook_name": ..., "d_sae": ..., ...}, ...]` trains one dictionary per entry, each entry overriding
    the keywords above; a list comes back, in that order. `seed` orders the stream and initialises each dictionary
    (an entry's own `seed` only the latter). `device`, `dtype`: the dictionaries' (default: the model's device).
    `attention_mask` [n pos] goes with token rows [n pos] of prompts of different lengths (`tokens, mask =
    model.tokens_and_mask(texts, None, None)`): the forward runs with it, as at inference, and the padding's
    activations are left out of training (`n_tokens` counts real tokens). Without it, padding is read from the
    rows as the model's forward reads it (`model.padding_mask`), or the rows are refused where the ids cannot say
    which are pads; rows that hold the pad id as a real token (GPT-2's `<|endoftext|>` between documents) take
    `attention_mask=torch.ones_like(rows)`, or go in as a stream, `rows.reshape(-1)`.
    `checkpoint_dir` gets the final dictionaries (`final_<tokens>/`) and, every `checkpoint_every` tokens, one
    `<tokens>/` each, in SAELens' format (cfg.json + sae_weights.safetensors; a subfolder per dictionary when there
    are several). The config records the model's weight processing and where the dictionary reads.
    `cross_layer=True` trains a `CrossLayerTranscoder` over every layer (architecture standard or jumprelu;
    hook_name / hook_name_out are templates with {layer}, by default 'blocks.{layer}.mlp.hook_in' and
    'blocks.{layer}.hook_mlp_out'; its checkpoints are circuit-tracer's folders).
    """
    needs_gradients(model, "hooked.sae.train")
    defaults = dict(
        hook_name=hook_name,
        architecture=architecture,
        d_sae=d_sae,
        k=k,
        hook_name_out=hook_name_out,
        skip=skip,
        l1_coefficient=l1_coefficient,
        l0_coefficient=l0_coefficient,
        aux_coefficient=aux_coefficient,
        lr=lr,
        dead_feature_window=dead_feature_window,
        resample_dead=resample_dead,
        seed=seed,
        cross_layer=cross_layer,
    )
    if dictionaries is not None and (isinstance(dictionaries, dict) or not isinstance(dictionaries, Sequence)):
        raise TypeError(f"dictionaries= is a list of dicts of settings, not {type(dictionaries).__name__}")
    if dictionaries is not None and not dictionaries:
        raise ValueError("dictionaries= is empty: give one dict of settings per dictionary to train")
    specs = [_spec(model, defaults, overrides, index) for index, overrides in enumerate(dictionaries or [{}])]
    _check_positive("batch_tokens", batch_tokens)
    _check_positive("buffer_batches", buffer_batches)
    if n_tokens is not None:
        _check_positive("n_tokens", n_tokens)
    if checkpoint_every is not None:
        _check_positive("checkpoint_every", checkpoint_every)
        if checkpoint_dir is None:
            raise ValueError("checkpoint_every= needs checkpoint_dir=, the folder the checkpoints go to")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype= is a floating torch dtype (torch.float32), not {dtype!r}")
    device = torch.device(device) if device is not None else model.device
    if checkpoint_dir is not None:
        for spec in specs:
            _check_saveable(spec)
    prepend_bos = model.default_prepend_bos if prepend_bos is None else bool(prepend_bos)
    rows = token_rows(model, data, context_size, prepend_bos, attention_mask)

    runs = [Run(spec, build_trainer(spec, model, rows, device, dtype)) for spec in specs]
    points = sorted({point for run in runs for point in run.trainer.points}, key=model.hook_names.index)
    stream = ActivationStream(model, rows, points, batch_tokens, buffer_batches, seed, device, dtype)
    directory = None if checkpoint_dir is None else Path(checkpoint_dir)
    bar = _progress_bar(n_tokens, progress)
    seen, next_checkpoint = 0, checkpoint_every
    try:
        for batch in stream.batches(repeat=n_tokens is not None):
            if n_tokens is not None and seen + _rows(batch) > n_tokens:
                batch = {name: activation[: n_tokens - seen] for name, activation in batch.items()}
            metrics = [run.step(batch) for run in runs]
            seen += _rows(batch)
            if bar is not None:
                bar.update(_rows(batch))
                if runs[0].steps % 10 == 1:
                    bar.set_postfix_str(_describe(metrics))
            if next_checkpoint is not None and seen >= next_checkpoint:
                _checkpoint(runs, directory, str(seen))
                next_checkpoint += checkpoint_every * ((seen - next_checkpoint) // checkpoint_every + 1)
            if n_tokens is not None and seen >= n_tokens:
                break
    finally:
        if bar is not None:
            bar.close()
    if seen == 0:
        raise ValueError(f"the data gave no row of context_size={rows.context_size} tokens to train on")
    if n_tokens is not None and seen < n_tokens:
        warnings.warn(
            f"the data ran out after {seen} of n_tokens={n_tokens} tokens (it can be read only once)", stacklevel=2
        )
    if directory is not None:
        _checkpoint(runs, directory, f"final_{seen}")
    trained = [run.result() for run in runs]
    return trained if dictionaries is not None else trained[0]


def _spec(model: HookedTransformer, defaults: dict, overrides: dict, index: int) -> DictionarySpec:
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
            values[name] = _hook_point(model, values[name], f"{where}{name}")
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
    _check_positive(f"{where}dead_feature_window", values["dead_feature_window"])
    for name in ("l1_coefficient", "l0_coefficient", "aux_coefficient"):
        if not isinstance(values[name], int | float) or values[name] < 0:
            raise ValueError(f"{where}{name}= is a number >= 0, not {values[name]!r}")
    if values["lr"] is not None and (not isinstance(values["lr"], int | float) or values["lr"] <= 0):
        raise ValueError(f"{where}lr= is a positive number (or None for the width's default), not {values['lr']!r}")
    for name in points_of(values, model.cfg.n_layers):
        _width(model, name, where)
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
            _hook_point(model, values[n].format(layer=layer), f"{where}{n}") for n in ("hook_name", "hook_name_out")
        )
        if model.hook_names.index(read) >= model.hook_names.index(write):
            raise ValueError(
                f"{where}a cross-layer transcoder's layer reads a point before the one it writes; {read} does not come"
                f" before {write} (e.g. {CLT_READ!r} -> {CLT_WRITE!r})"
            )


def _hook_point(model: HookedTransformer, name: str, what: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what}= is a hook name (str), not {type(name).__name__}")
    try:
        return model._check_name(name)
    except KeyError as error:
        raise KeyError(f"{what}: {error.args[0]}") from None


def _width(model: HookedTransformer, name: str, where: str = "") -> tuple[int, bool]:
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


def _check_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}= is a positive int, not {value!r}")


# ============================================================================= tokens
@dataclass
class TokenRows:
    """Rows of `context_size` token ids drawn from the data; iterable again when the data is (`reusable`)."""

    documents: Callable[[], Iterator[list[int] | Tensor]]  # each call starts the data over
    context_size: int
    prepend_bos: bool
    bos: int | None
    separator: int | None  # put between two documents of a stream
    as_rows: bool  # the data is already rows [n context_size]: use them as they are
    reusable: bool
    description: str  # what the config records as the data (a path, "texts", "tokens")

    def batches(self, rows_per_batch: int, repeat: bool) -> Iterator[Tensor]:
        """[rows_per_batch context_size] batches (the last may be shorter), the data cycled when `repeat`."""
        while True:
            pending: list[Tensor] = []
            produced = 0
            for row in self._rows():
                pending.append(row)
                produced += 1
                if len(pending) == rows_per_batch:
                    yield torch.stack(pending)
                    pending = []
            if pending:
                yield torch.stack(pending)
            if not (repeat and self.reusable and produced):
                return

    def _rows(self) -> Iterator[Tensor]:
        if self.as_rows:
            yield from self.documents()
            return
        body = self.context_size - (1 if self.prepend_bos else 0)
        head = [self.bos] if self.prepend_bos else []
        buffer: list[int] = []
        for index, document in enumerate(self.documents()):
            ids = document.tolist() if isinstance(document, Tensor) else document
            if index > 0 and self.separator is not None and buffer:
                buffer.append(self.separator)
            buffer.extend(ids)
            while len(buffer) >= body:
                yield torch.tensor(head + buffer[:body], dtype=torch.long)
                del buffer[:body]


PAD = -1  # the id a padding position of masked token rows carries in the stream (`_collect` masks it out)


def token_rows(
    model: HookedTransformer, data, context_size: int | None, prepend_bos: bool, attention_mask: Tensor | None = None
) -> TokenRows:
    """The rows `data` gives, checked before any forward runs (see the module docstring for what `data` may be)."""
    if attention_mask is not None and not (isinstance(data, Tensor) and data.ndim == 2):
        raise ValueError(
            "attention_mask= goes with token rows [n pos] (tokens, mask = model.tokens_and_mask(texts, None, None));"
            " texts and token streams are cut into rows without padding, so they need none"
        )
    limit = getattr(model, "max_positions", None)
    if context_size is not None:
        _check_positive("context_size", context_size)
        if limit is not None and context_size > limit:
            raise ValueError(f"context_size={context_size}, but this model has only {limit} positions")
    tokenizer = getattr(model, "tokenizer", None)
    bos = getattr(tokenizer, "bos_token_id", None)
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(data, Tensor):
        return _tensor_rows(model, data, context_size, prepend_bos, bos, eos, limit, attention_mask)
    if isinstance(data, str | Path):
        path = Path(data)
        if not path.is_file():
            raise FileNotFoundError(
                f"data={str(data)[:60]!r} is not a file; give a .txt (a text per line) or .jsonl ({{'text': ...}} per"
                " line) path, a list of texts (one text too: data=[text]) or token ids"
            )
        if path.suffix not in (".txt", ".jsonl"):
            raise ValueError(
                f"data={str(data)!r}: a file is .txt (a text per line) or .jsonl ({{'text': ...}} per line)"
            )
        texts: Callable[[], Iterator[str]] = (lambda: _jsonl_texts(path)) if path.suffix == ".jsonl" else (
            lambda: _text_lines(path)
        )  # fmt: skip
        reusable, description = True, str(path)
    elif isinstance(data, Iterable):
        if isinstance(data, dict):
            raise TypeError("data= is a dict; give a list of texts, a list of {'text': ...} records or token ids")
        one_shot = iter(data) is data
        if not one_shot and isinstance(data, Sequence) and not data:
            raise ValueError("data= is empty: give texts or token ids to train on")
        if isinstance(data, Sequence) and not isinstance(data[0], str | dict):
            raise TypeError(
                f"data= holds {type(data[0]).__name__}; give texts, {{'text': ...}} records, a token tensor or a path"
            )
        texts = lambda: _record_texts(data)  # noqa: E731  (a one-shot iterator is read once: reusable=False)
        reusable, description = not one_shot, "texts"
    else:
        raise TypeError(
            f"data= cannot be a {type(data).__name__}: give token ids, a list of texts, a .txt / .jsonl path or an"
            " iterable of {'text': ...}"
        )
    if tokenizer is None:
        raise ValueError("texts need the model's tokenizer, and this model has none; pass token ids instead")
    if prepend_bos and bos is None:
        raise ValueError("prepend_bos=True, but this tokenizer has no BOS token; pass prepend_bos=False")
    context_size = context_size or min(128, limit or 128)
    encode = _encoder(tokenizer)
    return TokenRows(
        lambda: _tokenized(texts(), encode), context_size, prepend_bos, bos, bos if bos is not None else eos, False,
        reusable, description,
    )  # fmt: skip


def _tensor_rows(model, data: Tensor, context_size, prepend_bos, bos, eos, limit, mask=None) -> TokenRows:
    if data.dtype.is_floating_point or data.dtype == torch.bool or data.ndim not in (1, 2) or data.numel() == 0:
        raise ValueError(
            f"token ids are an integer tensor [n pos] (rows used as they are) or [n] (a stream cut into rows), not"
            f" {data.dtype} of shape {tuple(data.shape)}"
        )
    low, high = (int(v) for v in torch.aminmax(data))
    if low < 0 or high >= model.cfg.d_vocab:
        raise ValueError(
            f"token id {high if low >= 0 else low} is outside this model's vocabulary (0..{model.cfg.d_vocab - 1})"
        )
    data = data.to("cpu", torch.long)
    if data.ndim == 2:
        if context_size is not None and context_size != data.shape[1]:
            raise ValueError(
                f"the token rows are {data.shape[1]} long but context_size={context_size}; rows are used as they"
                " are (flatten them into a stream, tokens.reshape(-1), to cut other rows)"
            )
        if limit is not None and data.shape[1] > limit:
            raise ValueError(f"the token rows are {data.shape[1]} long, but this model has only {limit} positions")
        if mask is None:  # padding read from the ids as every entry point reads it, or refused (docs/hooks.md)
            mask = model.padding_mask(data, None, prepend_bos)
        if mask is not None:
            if not isinstance(mask, Tensor) or mask.shape != data.shape:
                shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
                raise ValueError(f"attention_mask is {shape}; it needs the token rows' shape {tuple(data.shape)}")
            mask = mask.to("cpu").bool()
            if not mask.any(-1).all():
                raise ValueError(f"attention_mask row {int((~mask.any(-1)).nonzero()[0])} has no real token")
            data = data.masked_fill(~mask, PAD)
        return TokenRows(lambda: iter(data), data.shape[1], False, None, None, True, True, "tokens")
    if prepend_bos and bos is None:
        raise ValueError("prepend_bos=True, but this model's tokenizer has no BOS token; pass prepend_bos=False")
    size = context_size or min(128, limit or 128)
    return TokenRows(lambda: iter([data]), size, prepend_bos, bos, None, False, True, "tokens")


def _encoder(tokenizer) -> Callable[[list[str]], list[list[int]]]:
    """Texts -> ids without special tokens, batched when the tokenizer is `tokenizers`' (hooked's own)."""
    fast = getattr(tokenizer, "tokenizer", None)
    if fast is not None and hasattr(fast, "encode_batch"):
        return lambda texts: [e.ids for e in fast.encode_batch(texts, add_special_tokens=False)]
    return lambda texts: [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def _tokenized(texts: Iterator[str], encode, chunk: int = 256) -> Iterator[list[int]]:
    pending: list[str] = []
    for text in texts:
        pending.append(text)
        if len(pending) == chunk:
            yield from encode(pending)
            pending = []
    if pending:
        yield from encode(pending)


def _record_texts(data: Iterable) -> Iterator[str]:
    for index, record in enumerate(data):
        if isinstance(record, dict):
            if "text" not in record:
                raise ValueError(f"data record {index} has no 'text' field (it has {sorted(record)[:5]})")
            record = record["text"]
        if not isinstance(record, str):
            raise TypeError(f"data item {index} is a {type(record).__name__}, not a text or a {{'text': ...}} record")
        yield record


def _text_lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as file:
        for line in file:
            line = line.rstrip("\n")
            if line:
                yield line


def _jsonl_texts(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number} is not JSON ({error.msg})") from None
                yield from _record_texts([record])


# ============================================================================= activations
class ActivationStream:
    """Batches {hook name: [tokens width]} of `points`, from the model's forward, shuffled in a small buffer.

    The buffer holds `buffer_batches` training batches; each time it is full, a seeded permutation (the same for
    every point) hands out half of it and keeps the rest to mix with the next forwards. Only the rows and the seed
    decide the batches, not which dictionaries read them."""

    def __init__(
        self,
        model: HookedTransformer,
        rows: TokenRows,
        points: list[str],
        batch_tokens: int,
        buffer_batches: int,
        seed: int,
        device: torch.device,
        dtype: torch.dtype,
    ):
        self.model, self.rows, self.points = model, rows, points
        self.batch_tokens, self.buffer_batches = batch_tokens, buffer_batches
        self.seed, self.device, self.dtype = seed, device, dtype
        self.widths = {name: _width(model, name)[0] for name in points}
        stages = [model.hook_dict[name].stage for name in points]
        last = max(stages)
        # stop after the block of the last point read: EMBED_STAGE -> no block; the final norm -> the whole forward
        self.stop_at_layer = (
            0 if last == EMBED_STAGE else (None if last is None or last >= 2 * model.cfg.n_layers else last // 2 + 1)
        )
        if getattr(model, "tensor_parallel", False):
            self.stop_at_layer = None
        self.rows_read = 0  # the token rows run so far, to name a NaN's row

    def batches(self, repeat: bool) -> Iterator[dict[str, Tensor]]:
        rows_per_forward = max(1, math.ceil(self.batch_tokens / self.rows.context_size))
        per_forward = rows_per_forward * self.rows.context_size
        capacity = max(self.buffer_batches * self.batch_tokens, 2 * self.batch_tokens)
        buffers = {
            name: torch.empty(capacity + per_forward, width, device=self.device, dtype=self.dtype)
            for name, width in self.widths.items()
        }
        generator = torch.Generator().manual_seed(self.seed)
        filled = 0
        for tokens in self.rows.batches(rows_per_forward, repeat):
            filled += self._collect(tokens, buffers, filled)
            if filled >= capacity:
                order = torch.randperm(filled, generator=generator).to(self.device)
                handed = (filled // 2 // self.batch_tokens) * self.batch_tokens
                for start in range(0, handed, self.batch_tokens):
                    chosen = order[start : start + self.batch_tokens]
                    yield {name: buffer[chosen] for name, buffer in buffers.items()}
                kept = order[handed:]
                for buffer in buffers.values():
                    buffer[: len(kept)] = buffer[kept]
                filled = len(kept)
        if filled:  # the data ended: what is left, shuffled
            order = torch.randperm(filled, generator=generator).to(self.device)
            for start in range(0, filled, self.batch_tokens):
                chosen = order[start : start + self.batch_tokens]
                yield {name: buffer[chosen] for name, buffer in buffers.items()}

    def _collect(self, tokens: Tensor, buffers: dict[str, Tensor], at: int) -> int:
        """Run the forward on `tokens` [rows pos], copying each real position's activation at each point into its
        buffer from row `at` (padding, id PAD, left out); the count."""
        tokens = tokens.to(self.model.device)
        mask = tokens != PAD  # real tokens, BOS ids included
        tokens = tokens.clamp(min=0)  # any id will do under the mask
        n = int(mask.sum())

        def keep(activation: Tensor, hook) -> None:
            buffers[hook.name][at : at + n].copy_(activation[mask].reshape(n, -1))

        with torch.no_grad(), self.model.hooks(fwd_hooks=[(self.points, keep)]):
            self.model(tokens, attention_mask=mask, return_type=None, stop_at_layer=self.stop_at_layer)
        for name, buffer in buffers.items():
            _check_finite(buffer[at : at + n], mask, name, self.rows_read)
        self.rows_read += tokens.shape[0]
        return n


def _check_finite(kept: Tensor, mask: Tensor, name: str, first_row: int) -> None:
    """Refuse NaN or infinite activations where they enter, before any step reads them: a dictionary trained on them
    would end with NaN weights, and its L0 would still look plausible. Names the point and the rows and positions."""
    bad = ~torch.isfinite(kept).all(-1)
    if not bool(bad.any()):
        return
    where = mask.nonzero()[bad.nonzero().flatten()].tolist()  # [row, position] in this forward's rows
    listed = ", ".join(f"row {first_row + row} position {position}" for row, position in where[:5])
    more = f" and {len(where) - 5} more" if len(where) > 5 else ""
    raise ValueError(
        f"the activations at {name} are NaN or infinite at {len(where)} real position{'s' if len(where) > 1 else ''}"
        f" ({listed}{more}; rows as training cuts the data, counted from 0): a dictionary trained on them would get"
        " NaN weights. Nothing was trained on them. Look for NaN in the model's weights, or for a value overflowing"
        " the model's dtype, on those tokens (model.run_with_cache on them shows where it starts)"
    )


def _rows(batch: dict[str, Tensor]) -> int:
    return next(iter(batch.values())).shape[0]


# ============================================================================= one dictionary's training
@dataclass
class StepResult:
    """What one dictionary's forward on a batch gives the training loop."""

    loss: Tensor  # the total, to backpropagate
    parts: dict[str, Tensor]  # mse, l1 / l0 / auxk
    fired: Tensor  # [d_sae] bool: the features active on some token
    l0: Tensor  # mean active features per token
    fvu: Tensor  # fraction of variance unexplained on this batch
    recons: Tensor  # [tokens d_out], detached: what `resample` reads


@torch.no_grad()
def geometric_median(points: Float[Tensor, "tokens width"], steps: int = GEOMETRIC_MEDIAN_STEPS) -> Tensor:
    """The point minimising the summed Euclidean distance to `points` (Weiszfeld's iteration from their mean, in
    float64; a point the estimate lands on weighs as if 1e-8 away)."""
    x = points.double()
    median = x.mean(0)
    for _ in range(steps):
        weights = 1 / (x - median).norm(dim=-1).clamp_min(1e-8)
        median = (weights[:, None] * x).sum(0) / weights.sum()
    return median.to(points.dtype)


class DictionaryTrainer:
    """How an SAE or a transcoder learns: the surface the training loop drives (see the module docstring).

    Subclasses give the architecture: `encode_for_training` (features and their sparsity penalty) and what the
    decoder's rows are held to."""

    unit_norm_decoder = False

    def __init__(self, spec: DictionarySpec, cfg: DictionaryConfig, generator: torch.Generator):
        self.spec, self.generator = spec, generator
        self.dictionary = Dictionary(cfg, skip=spec.skip)
        self._initialize_weights()

    @property
    def points(self) -> tuple[str, ...]:
        """The hook points whose activations a step reads (a cross-layer transcoder's: every layer's)."""
        return (self.spec.hook_name,) + ((self.spec.hook_name_out,) if self.spec.hook_name_out is not None else ())

    @property
    def d_sae(self) -> int:
        return self.dictionary.cfg.d_sae

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """The shape of the loop's per-feature counts (a cross-layer transcoder's: [n_layers d_sae])."""
        return (self.d_sae,)

    @property
    def device(self) -> torch.device:
        return self.dictionary.device

    def parameters(self) -> list[torch.nn.Parameter]:
        """W_enc, b_enc, W_dec, b_dec, a skip's W_skip, then the rest its architecture declares (a threshold)."""
        d = self.dictionary
        declared = [getattr(d, name) for name in d.declaration.parameters if name != "b_enc"]
        return [d.W_enc, d.b_enc, d.W_dec, d.b_dec] + ([d.W_skip] if d.W_skip is not None else []) + declared

    # ----------------------------------------------------------------- initialisation
    @torch.no_grad()
    def _initialize_weights(self) -> None:
        d, cfg = self.dictionary, self.dictionary.cfg
        norm = 1.0 if self.unit_norm_decoder else DECODER_INIT_NORM
        W_dec = self._uniform(cfg.d_sae, cfg.d_out)
        d.W_dec.copy_(W_dec / W_dec.norm(dim=-1, keepdim=True) * norm)
        if cfg.is_transcoder:
            W_enc = self._uniform(cfg.d_sae, cfg.d_in)
            d.W_enc.copy_((W_enc / W_enc.norm(dim=-1, keepdim=True) * norm).T)
        else:
            d.W_enc.copy_(d.W_dec.T)

    def _uniform(self, *shape: int) -> Tensor:
        return torch.rand(shape, generator=self.generator).mul_(2).sub_(1).to(self.dictionary.dtype)

    @torch.no_grad()
    def initialize(self, batch: dict[str, Tensor]) -> None:
        """Data-dependent initialisation from the first batch: an SAE's b_dec at its geometric median; a
        transcoder's b_dec at the targets' mean, its b_enc centring its pre-activations on the inputs' mean."""
        x, y = self.inputs(batch)
        d = self.dictionary
        d.b_dec.copy_(y.mean(0) if d.cfg.is_transcoder else geometric_median(y))
        if d.cfg.is_transcoder:
            d.b_enc.copy_(-(x.mean(0) @ d.W_enc))

    def inputs(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        x = batch[self.spec.hook_name]
        return x, (batch[self.spec.hook_name_out] if self.spec.hook_name_out is not None else x)

    # ----------------------------------------------------------------- a step
    def encoder_input(self, x: Tensor) -> Tensor:
        d = self.dictionary
        return x - d.b_dec if d.cfg.apply_b_dec_to_input else x

    def forward(self, batch: dict[str, Tensor], dead: Tensor | None) -> StepResult:
        x, y = self.inputs(batch)
        d = self.dictionary
        acts, penalty = self.encode_for_training(self.encoder_input(x))
        recons = acts @ d.W_dec + d.b_dec
        if d.W_skip is not None:
            recons = recons + x @ d.W_skip.T
        mse = (recons - y).pow(2).sum(-1).mean()
        parts = {"mse": mse, **penalty}
        if dead is not None:
            parts.update(self.dead_loss(x, y, recons, dead))
        active = acts > 0
        return self._result(parts, active.any(0), active.sum(-1).float().mean(), recons, y)

    @staticmethod
    def _result(parts: dict[str, Tensor], fired: Tensor, l0: Tensor, recons: Tensor, y: Tensor) -> StepResult:
        recons = recons.detach()
        with torch.no_grad():
            fvu = (recons - y).pow(2).sum() / (y - y.mean(0)).pow(2).sum().clamp_min(1e-12)
        return StepResult(sum(parts.values()), parts, fired, l0, fvu, recons)

    def encode_for_training(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """(features [tokens d_sae], sparsity terms) of the encoder input."""
        raise NotImplementedError

    def dead_loss(self, x: Tensor, y: Tensor, recons: Tensor, dead: Tensor) -> dict[str, Tensor]:
        return {}

    @torch.no_grad()  # a graph through the gradient would chain every step to the last
    def before_update(self) -> None:
        if self.unit_norm_decoder:  # keep the step tangent to the unit sphere of each row (eai-sparsify)
            W, grad = self.dictionary.W_dec, self.dictionary.W_dec.grad
            if grad is not None:
                grad -= (grad * W).sum(-1, keepdim=True) * W

    @torch.no_grad()
    def after_update(self) -> None:
        if self.unit_norm_decoder:
            W = self.dictionary.W_dec
            W /= W.norm(dim=-1, keepdim=True) + torch.finfo(W.dtype).eps

    # ----------------------------------------------------------------- dead features
    @torch.no_grad()
    def resample(self, features: Tensor, batch: dict[str, Tensor], recons: Tensor, optimizer) -> None:
        """Re-initialise `features` (Anthropic's resampling, "Towards Monosemanticity"): each takes a token drawn
        with probability proportional to its squared reconstruction error; the decoder row points along what is
        left unexplained there (the input itself for an SAE), at the live rows' mean norm; the encoder reads the
        token's input direction at 0.2 x the live encoder norm; b_enc 0; Adam's moments for them reset."""
        x, y = self.inputs(batch)
        d = self.dictionary
        error = (y - recons).pow(2).sum(-1)
        if float(error.sum()) <= 0:
            return
        # the generator lives on the CPU, whatever the dictionary's device
        tokens = torch.multinomial(error.cpu(), len(features), replacement=True, generator=self.generator)
        tokens = tokens.to(error.device)
        live = torch.ones(d.cfg.d_sae, dtype=torch.bool, device=d.device)
        live[features] = False
        enc_norm = d.W_enc[:, live].norm(dim=0).mean() if live.any() else torch.tensor(1.0)
        dec_norm = d.W_dec[live].norm(dim=-1).mean() if live.any() else torch.tensor(1.0)
        direction_out = (y - recons)[tokens] if d.cfg.is_transcoder else self.encoder_input(x)[tokens]
        direction_in = self.encoder_input(x)[tokens]
        d.W_dec[features] = direction_out / direction_out.norm(dim=-1, keepdim=True).clamp_min(1e-8) * dec_norm
        scaled = direction_in / direction_in.norm(dim=-1, keepdim=True).clamp_min(1e-8)
        d.W_enc[:, features] = (scaled * enc_norm * RESAMPLE_ENCODER_SCALE).T
        d.b_enc[features] = 0.0
        self._resampled(features)
        for parameter, index in ((d.W_dec, (features,)), (d.W_enc, (slice(None), features)), (d.b_enc, (features,))):
            state = optimizer.state.get(parameter, {})
            for moment in ("exp_avg", "exp_avg_sq"):
                if moment in state:
                    state[moment][index] = 0.0

    def _resampled(self, features: Tensor) -> None:
        pass

    # ----------------------------------------------------------------- the result
    @torch.no_grad()
    def export(self) -> Dictionary:
        """The dictionary as it runs (and saves): a copy, detached from training."""
        d = self.dictionary
        cfg = replace(
            d.cfg,
            metadata=dict(d.cfg.metadata),
            processing=None if d.cfg.processing is None else dict(d.cfg.processing),
        )
        out = Dictionary(cfg, skip=d.W_skip is not None)
        out.load_state_dict(d.state_dict())
        return out.eval()


class StandardTrainer(DictionaryTrainer):
    """ReLU with the L1 of the features weighted by their decoder norms (SAELens' StandardTrainingSAE)."""

    def encode_for_training(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        d = self.dictionary
        pre = x @ d.W_enc + d.b_enc
        acts = F.relu(pre)
        l1 = (acts * d.W_dec.norm(dim=-1)).sum(-1).mean()
        return acts, {"l1": self.spec.l1_coefficient * l1}


class TopKTrainer(DictionaryTrainer):
    """The k largest pre-activations per token, ReLU; unit-norm decoder rows; AuxK on the dead features."""

    unit_norm_decoder = True

    def forward(self, batch: dict[str, Tensor], dead: Tensor | None) -> StepResult:
        x, y = self.inputs(batch)
        d = self.dictionary
        b_dec = d.b_dec if d.cfg.apply_b_dec_to_input else None
        acts, indices = TopKEncode.apply(x, b_dec, d.W_enc, d.b_enc, int(self.spec.k))
        recons = F.embedding_bag(indices, d.W_dec, per_sample_weights=acts, mode="sum") + d.b_dec
        if d.W_skip is not None:
            recons = recons + x @ d.W_skip.T
        parts = {"mse": (recons - y).pow(2).sum(-1).mean()}
        if dead is not None:
            parts.update(self.dead_loss(x, y, recons, dead))
        with torch.no_grad():
            active = acts > 0
            fired = torch.zeros(d.cfg.d_sae, dtype=torch.bool, device=d.device)
            fired[indices[active]] = True
        return self._result(parts, fired, active.sum(-1).float().mean(), recons, y)

    def dead_loss(self, x: Tensor, y: Tensor, recons: Tensor, dead: Tensor) -> dict[str, Tensor]:
        """AuxK (SAELens 6.54 `calculate_topk_aux_loss`, after eai-sparsify): the top d_out/2 dead features of each
        token reconstruct what the live ones left, without b_dec; only the dead columns are computed."""
        d = self.dictionary
        dead_features = dead.nonzero().squeeze(-1)
        k_aux = d.cfg.d_out // 2
        scale = min(len(dead_features) / k_aux, 1.0)
        k_aux = min(k_aux, len(dead_features))
        pre_dead = self.encoder_input(x) @ d.W_enc[:, dead_features] + d.b_enc[dead_features]
        values, chosen = pre_dead.topk(k_aux, dim=-1, sorted=False)
        residual = (y - recons).detach()
        predicted = F.embedding_bag(dead_features[chosen], d.W_dec, per_sample_weights=values, mode="sum")
        return {"auxk": self.spec.aux_coefficient * scale * (predicted - residual).pow(2).sum(-1).mean()}


class BatchTopKTrainer(TopKTrainer):
    """The k x tokens largest activations of the batch (SAELens' BatchTopKTrainingSAE); saved as JumpReLU with the
    running threshold for every feature."""

    def __init__(self, spec: DictionarySpec, cfg: DictionaryConfig, generator: torch.Generator):
        super().__init__(spec, cfg, generator)
        self.threshold: float | None = None  # float64 running minimum of the kept activations

    def forward(self, batch: dict[str, Tensor], dead: Tensor | None) -> StepResult:
        return DictionaryTrainer.forward(self, batch, dead)

    def encode_for_training(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        d = self.dictionary
        pre = x @ d.W_enc + d.b_enc
        acts = F.relu(pre)
        flat = acts.flatten()
        values, indices = flat.topk(min(flat.numel(), int(self.spec.k * acts.shape[0])), sorted=False)
        kept = torch.zeros_like(flat).scatter(0, indices, values).view_as(acts)
        with torch.no_grad():
            positive = values[values > 0]
            if positive.numel():
                smallest = float(positive.min())
                rate = BATCHTOPK_THRESHOLD_RATE
                self.threshold = smallest if self.threshold is None else (1 - rate) * self.threshold + rate * smallest
        return kept, {}

    @torch.no_grad()
    def export(self) -> Dictionary:
        out = super().export()
        out.threshold.fill_(self.threshold or 0.0)
        return out


class JumpReLUTrainer(DictionaryTrainer):
    """relu(pre) * (pre > threshold), threshold learnt by a straight-through estimator; L0 penalty (SAELens'
    JumpReLUTrainingSAE, "step" mode)."""

    def __init__(self, spec: DictionarySpec, cfg: DictionaryConfig, generator: torch.Generator):
        super().__init__(spec, cfg, generator)
        with torch.no_grad():
            self.dictionary.threshold.fill_(JUMPRELU_INIT_THRESHOLD)

    def encode_for_training(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        d = self.dictionary
        with torch.no_grad():  # kept >= 0, projected rather than clamped in the graph (SAELens)
            d.threshold.clamp_(min=0.0)
        pre = x @ d.W_enc + d.b_enc
        acts = JumpReLU.apply(pre, d.threshold, JUMPRELU_BANDWIDTH)
        l0 = StepFunction.apply(pre, d.threshold, JUMPRELU_BANDWIDTH).sum(-1).mean()
        return acts, {"l0": self.spec.l0_coefficient * l0}

    def _resampled(self, features: Tensor) -> None:
        self.dictionary.threshold[features] = JUMPRELU_INIT_THRESHOLD


# ============================================================================= autograd pieces
class TopKEncode(torch.autograd.Function):
    """(relu of the k largest pre-activations [tokens k], their feature indices) of x - b_dec, with a backward that
    touches only the chosen features: W_enc's gradient is a sparse [d_sae tokens] product, b_enc's and b_dec's
    per-feature sums (after eai-sparsify 1.3.3 `fused_encoder.py`, whose index_add the sparse product replaces).
    The pre-activations [tokens d_sae], the step's largest tensor, exist a block of rows at a time (`PRE_BYTES`)."""

    @staticmethod
    def forward(ctx, x, b_dec, W_enc, b_enc, k):
        centred = x - b_dec if b_dec is not None else x
        rows = max(1, PRE_BYTES // (W_enc.shape[1] * W_enc.element_size()))
        chosen = [torch.addmm(b_enc, block, W_enc).topk(k, dim=-1, sorted=False) for block in centred.split(rows)]
        acts = torch.cat([block.values for block in chosen]).relu_()
        indices = torch.cat([block.indices for block in chosen])
        ctx.save_for_backward(centred, W_enc, indices, acts)
        ctx.has_b_dec = b_dec is not None
        ctx.mark_non_differentiable(indices)
        return acts, indices

    @staticmethod
    def backward(ctx, grad_acts, grad_indices):
        centred, W_enc, indices, acts = ctx.saved_tensors
        n, k = indices.shape
        d_sae = W_enc.shape[1]
        grad = (grad_acts * (acts > 0)).reshape(-1)
        features = indices.reshape(-1)
        tokens = torch.arange(n, device=indices.device).repeat_interleave(k)
        by_feature = torch.sparse_coo_tensor(torch.stack([features, tokens]), grad, (d_sae, n), check_invariants=False)
        grad_W_enc = torch.sparse.mm(by_feature, centred).T  # [d_in d_sae]
        grad_b_enc = torch.zeros(d_sae, dtype=grad.dtype, device=grad.device).index_add_(0, features, grad)
        grad_b_dec = -(W_enc @ grad_b_enc) if ctx.has_b_dec else None
        return None, grad_b_dec, grad_W_enc, grad_b_enc, None


def _rectangle(x: Tensor) -> Tensor:
    return ((x > -0.5) & (x < 0.5)).to(x)


class JumpReLU(torch.autograd.Function):
    """relu(x) * (x > threshold); the threshold's gradient through a rectangle kernel of width `bandwidth`
    (SAELens 6.54 `jumprelu_sae.py`, with jumprelu_ste_to_input=False)."""

    @staticmethod
    def forward(ctx, x, threshold, bandwidth):
        ctx.save_for_backward(x, threshold)
        ctx.bandwidth = bandwidth
        return x * (x > threshold)

    @staticmethod
    def backward(ctx, grad_output):
        x, threshold = ctx.saved_tensors
        bandwidth = ctx.bandwidth
        ste = (threshold / bandwidth) * _rectangle((x - threshold) / bandwidth) * grad_output
        return (x > threshold) * grad_output, -ste.sum(0), None


class StepFunction(torch.autograd.Function):
    """The step function (x > threshold) with the same estimator for the threshold (SAELens' `Step`)."""

    @staticmethod
    def forward(ctx, x, threshold, bandwidth):
        ctx.save_for_backward(x, threshold)
        ctx.bandwidth = bandwidth
        return (x > threshold).to(x)

    @staticmethod
    def backward(ctx, grad_output):
        x, threshold = ctx.saved_tensors
        bandwidth = ctx.bandwidth
        ste = (1.0 / bandwidth) * _rectangle((x - threshold) / bandwidth) * grad_output
        return None, -ste.sum(0), None


# ============================================================================= the loop's bookkeeping
def build_trainer(
    spec: DictionarySpec, model: HookedTransformer, rows: TokenRows, device: torch.device, dtype: torch.dtype
) -> DictionaryTrainer:
    """The trainer of one SAE, transcoder or cross-layer transcoder: its config records where it reads and writes,
    the data's context and BOS, the model and its weight processing."""
    if spec.cross_layer:
        return _build_clt_trainer(spec, model, rows, device, dtype)
    d_in, flatten = _width(model, spec.hook_name)
    d_out = _width(model, spec.hook_name_out)[0] if spec.hook_name_out is not None else d_in
    declaration = architectures.get(spec.architecture)
    runs = declaration.runs  # a training-only architecture's (batchtopk) dictionary is another's (jumprelu)
    metadata = {
        "model_name": str(getattr(model, "name_or_path", "") or type(model).__name__),
        "hook_name": spec.hook_name,
        **({"hook_name_out": spec.hook_name_out} if spec.hook_name_out is not None else {}),
        "context_size": rows.context_size,
        "prepend_bos": rows.prepend_bos,
        "dataset_path": rows.description,
        "training_architecture": spec.architecture,
        **({"training_k": spec.k} if spec.k is not None and runs.k is None else {}),  # k the dictionary has not
        "trained_by": f"hooked {__version__} (hooked.sae.train)",
    }
    cfg = DictionaryConfig(
        d_in=d_in,
        d_sae=spec.d_sae,
        hook_name=spec.hook_name,
        architecture=runs.name,
        hook_name_out=spec.hook_name_out,
        d_out=d_out,
        apply_b_dec_to_input=spec.hook_name_out is None,
        k=int(spec.k) if runs.k is not None else None,
        reshape_activations="hook_z" if flatten else "none",
        dtype=str(dtype).removeprefix("torch."),
        device=str(device),
        processing=dict(getattr(model, "processing", {}) or {}),
        metadata=metadata,
    )
    return declaration.trainer_class()(spec, cfg, torch.Generator().manual_seed(spec.seed))


def _build_clt_trainer(
    spec: DictionarySpec, model: HookedTransformer, rows: TokenRows, device: torch.device, dtype: torch.dtype
):
    from hooked.sae.clt_training import CLTTrainer  # it builds on this module

    n_layers = model.cfg.n_layers
    metadata = {
        "model_name": str(getattr(model, "name_or_path", "") or type(model).__name__),
        "context_size": rows.context_size,
        "prepend_bos": rows.prepend_bos,
        "dataset_path": rows.description,
        "trained_by": f"hooked {__version__} (hooked.sae.train)",
    }
    cfg = CLTConfig(
        n_layers=n_layers,
        d_in=_width(model, spec.hook_name.format(layer=0))[0],
        d_sae=spec.d_sae,
        architecture=spec.architecture,
        d_out=_width(model, spec.hook_name_out.format(layer=0))[0],
        hook_name=spec.hook_name,
        hook_name_out=spec.hook_name_out,
        dtype=str(dtype).removeprefix("torch."),
        device=str(device),
        processing=dict(getattr(model, "processing", {}) or {}),
        metadata=metadata,
    )
    return CLTTrainer(spec, cfg, torch.Generator().manual_seed(spec.seed))


class Run:
    """One dictionary in training: its trainer (any object with `DictionaryTrainer`'s surface), Adam, and the
    count of steps since each feature fired."""

    def __init__(self, spec: DictionarySpec, trainer: DictionaryTrainer):
        self.spec, self.trainer = spec, trainer
        self.optimizer = torch.optim.Adam(trainer.parameters(), lr=spec.learning_rate)
        self.steps_since_fired = torch.zeros(trainer.feature_shape, dtype=torch.long, device=trainer.device)
        self.steps, self.initialized, self.tokens = 0, False, 0

    def step(self, batch: dict[str, Tensor]) -> dict[str, float]:
        if not self.initialized:
            self.trainer.initialize(batch)
            self.initialized = True
        dead = self.steps_since_fired > self.spec.dead_feature_window
        with torch.enable_grad():  # also when the caller has turned gradients off (a notebook's no_grad)
            out = self.trainer.forward(batch, dead if bool(dead.any()) else None)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        self.trainer.before_update()
        torch.nn.utils.clip_grad_norm_(self.trainer.parameters(), MAX_GRAD_NORM)
        self.optimizer.step()
        self.trainer.after_update()
        self.steps += 1
        self.tokens += _rows(batch)
        self.steps_since_fired += 1
        self.steps_since_fired[out.fired] = 0
        if self.spec.resample_dead and self.steps % self.spec.dead_feature_window == 0:
            dead = (self.steps_since_fired > self.spec.dead_feature_window).nonzero().squeeze(-1)
            if len(dead):
                self.trainer.resample(dead, batch, out.recons, self.optimizer)
                self.steps_since_fired[dead] = 0
        return {
            "loss": float(out.loss.detach()),
            "l0": float(out.l0),
            "fvu": float(out.fvu),
            "dead": int((self.steps_since_fired > self.spec.dead_feature_window).sum()),
        }

    def result(self) -> Dictionary | CrossLayerTranscoder:
        """The trained dictionary, with SAELens' end-of-training figures in its metadata (a cross-layer
        transcoder's dead features also counted per layer)."""
        out = self.trainer.export()
        dead = self.steps_since_fired > self.spec.dead_feature_window
        out.cfg.metadata.update(
            n_training_tokens=self.tokens, n_training_steps=self.steps, num_dead_features=int(dead.sum())
        )
        if dead.ndim == 2:
            out.cfg.metadata["num_dead_features_per_layer"] = dead.sum(-1).tolist()
        return out


def _describe(metrics: list[dict[str, float]]) -> str:
    def one(m: dict[str, float]) -> str:
        return f"loss {m['loss']:.4g} L0 {m['l0']:.1f} FVU {m['fvu']:.3f} dead {m['dead']}"

    if len(metrics) == 1:
        return one(metrics[0])
    return " | ".join(f"{i}: {one(m)}" for i, m in enumerate(metrics))


def _progress_bar(n_tokens: int | None, progress: bool):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=n_tokens, desc="training", unit="tok", unit_scale=True)


# ============================================================================= checkpoints
def _checkpoint(runs: list[Run], directory: Path, name: str) -> None:
    """Each run's dictionary as it stands, by hooked.sae.save: SAELens' format, a CLT as circuit-tracer's."""
    from hooked.sae.formats import save

    for run in runs:
        folder = directory if len(runs) == 1 else directory / run.spec.label()
        d = run.result()
        save(d, folder / name, format="circuit-tracer" if isinstance(d, CrossLayerTranscoder) else "saelens")


def _check_saveable(spec: DictionarySpec) -> None:
    """Refuse, before training, checkpoints SAELens' format cannot hold (a CLT's are circuit-tracer's)."""
    if spec.cross_layer:
        return
    names = architectures.get(spec.architecture).runs.saelens
    saved_as = None if names is None else (names.transcoder if spec.hook_name_out is not None else names.sae)
    if saved_as is None:
        kind = "transcoder" if spec.hook_name_out is not None else "SAE"
        savable = [
            name
            for name, a in architectures.ARCHITECTURES.items()
            if a.trainer is not None and a.runs.saelens is not None
            and (a.runs.saelens.transcoder if spec.hook_name_out is not None else a.runs.saelens.sae)
        ]  # fmt: skip
        raise ValueError(
            f"SAELens 6.54 has no {spec.architecture} {kind}, so a {spec.architecture} {kind}'s checkpoints cannot be"
            f" written in its format; train architecture= one of {', '.join(map(repr, savable))}, or leave"
            " checkpoint_dir out and keep the returned dictionary"
        )
