"""The training loop: `train` checks every setting, builds each dictionary's trainer, streams the model's
activations and steps every trainer on each batch (`Run.step`: the loss, Adam, the architecture's constraint, the
count of steps since each feature fired), writing checkpoints in SAELens' format (a CLT's in circuit-tracer's).

Adam runs at a constant learning rate, each step's gradients clipped to total norm `MAX_GRAD_NORM` (SAELens):
without the clip, Adam's second moment (beta2 0.999) remembers the large gradients of the first steps and shrinks
the later ones (docs/benchmarks.md, "Sparse dictionaries: training quality vs SAELens"). A feature silent for more
than `dead_feature_window` steps is dead (TopK's AuxK loss trains it; `resample_dead=True` also re-initialises it).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from hooked.hooks import needs_gradients
from hooked.sae import architectures
from hooked.sae.clt import CLTConfig, CrossLayerTranscoder
from hooked.sae.dictionary import Dictionary, DictionaryConfig
from hooked.sae.training.config import (
    DICTIONARY_OPTIONS,
    DictionarySpec,
    TrainingConfig,
    check_positive,
    dictionary_spec,
    width,
)
from hooked.sae.training.cross_layer import CLTTrainer
from hooked.sae.training.stream import ActivationStream, batch_rows
from hooked.sae.training.tokens import TokenRows, token_rows
from hooked.sae.training.trainers import DictionaryTrainer
from hooked.version import __version__

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

MAX_GRAD_NORM = 1.0  # each step's gradients clipped to this total norm (SAELens 6.54 `sae_trainer.py` `_train_step`)


def train(
    model: HookedTransformer,
    data,
    config: TrainingConfig | None = None,
    **keywords: Any,
) -> Dictionary | CrossLayerTranscoder | list[Dictionary | CrossLayerTranscoder]:
    """Train a sparse dictionary (or several, from one pass) on `model`'s activations (docs/saes.md, "Training").

    The settings are keywords, or one `TrainingConfig` (`config`) holding them (not both: a keyword beside a config
    is refused, naming both). What each does:

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
    c = TrainingConfig.from_call(config, keywords)
    defaults = {name: getattr(c, name) for name in DICTIONARY_OPTIONS}  # each dictionary's, unless it overrides
    dictionaries, batch_tokens, n_tokens, seed = c.dictionaries, c.batch_tokens, c.n_tokens, c.seed
    checkpoint_dir, checkpoint_every, dtype = c.checkpoint_dir, c.checkpoint_every, c.dtype
    if dictionaries is not None and (isinstance(dictionaries, dict) or not isinstance(dictionaries, Sequence)):
        raise TypeError(f"dictionaries= is a list of dicts of settings, not {type(dictionaries).__name__}")
    if dictionaries is not None and not dictionaries:
        raise ValueError("dictionaries= is empty: give one dict of settings per dictionary to train")
    specs = [dictionary_spec(model, defaults, overrides, index) for index, overrides in enumerate(dictionaries or [{}])]
    check_positive("batch_tokens", batch_tokens)
    check_positive("buffer_batches", c.buffer_batches)
    if n_tokens is not None:
        check_positive("n_tokens", n_tokens)
    if checkpoint_every is not None:
        check_positive("checkpoint_every", checkpoint_every)
        if checkpoint_dir is None:
            raise ValueError("checkpoint_every= needs checkpoint_dir=, the folder the checkpoints go to")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype= is a floating torch dtype (torch.float32), not {dtype!r}")
    device = torch.device(c.device) if c.device is not None else model.device
    if checkpoint_dir is not None:
        for spec in specs:
            _check_saveable(spec)
    prepend_bos = model.default_prepend_bos if c.prepend_bos is None else bool(c.prepend_bos)
    rows = token_rows(model, data, c.context_size, prepend_bos, c.attention_mask)

    runs = [Run(spec, build_trainer(spec, model, rows, device, dtype)) for spec in specs]
    points = sorted({point for run in runs for point in run.trainer.points}, key=model.hook_names.index)
    stream = ActivationStream(model, rows, points, batch_tokens, c.buffer_batches, seed, device, dtype)
    directory = None if checkpoint_dir is None else Path(checkpoint_dir)
    bar = _progress_bar(n_tokens, c.progress)
    seen, next_checkpoint = 0, checkpoint_every
    try:
        for batch in stream.batches(repeat=n_tokens is not None):
            if n_tokens is not None and seen + batch_rows(batch) > n_tokens:
                batch = {name: activation[: n_tokens - seen] for name, activation in batch.items()}
            metrics = [run.step(batch) for run in runs]
            seen += batch_rows(batch)
            if bar is not None:
                bar.update(batch_rows(batch))
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


# ============================================================================= the loop's bookkeeping
def build_trainer(
    spec: DictionarySpec, model: HookedTransformer, rows: TokenRows, device: torch.device, dtype: torch.dtype
) -> DictionaryTrainer:
    """The trainer of one SAE, transcoder or cross-layer transcoder: its config records where it reads and writes,
    the data's context and BOS, the model and its weight processing."""
    if spec.cross_layer:
        return _build_clt_trainer(spec, model, rows, device, dtype)
    d_in, flatten = width(model, spec.hook_name)
    d_out = width(model, spec.hook_name_out)[0] if spec.hook_name_out is not None else d_in
    declaration = architectures.get(spec.architecture)
    runs = declaration.runs  # a training-only architecture's (batchtopk) dictionary is another's (jumprelu)
    metadata = {
        **_provenance(model, rows),
        "hook_name": spec.hook_name,
        **({"hook_name_out": spec.hook_name_out} if spec.hook_name_out is not None else {}),
        "training_architecture": spec.architecture,
        **({"training_k": spec.k} if spec.k is not None and runs.k is None else {}),  # k the dictionary has not
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


def _provenance(model: HookedTransformer, rows: TokenRows) -> dict:
    """What every trained dictionary's metadata records of where it came from: the model, the token rows, hooked."""
    return {
        "model_name": str(getattr(model, "name_or_path", "") or type(model).__name__),
        "context_size": rows.context_size,
        "prepend_bos": rows.prepend_bos,
        "dataset_path": rows.description,
        "trained_by": f"hooked {__version__} (hooked.sae.train)",
    }


def _build_clt_trainer(
    spec: DictionarySpec, model: HookedTransformer, rows: TokenRows, device: torch.device, dtype: torch.dtype
):
    n_layers = model.cfg.n_layers
    metadata = _provenance(model, rows)
    cfg = CLTConfig(
        n_layers=n_layers,
        d_in=width(model, spec.hook_name.format(layer=0))[0],
        d_sae=spec.d_sae,
        architecture=spec.architecture,
        d_out=width(model, spec.hook_name_out.format(layer=0))[0],
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
        self.tokens += batch_rows(batch)
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
