"""`hooked.sae.train`: sparse dictionaries trained on activations streamed from a `hooked` model's own forward.

    sae = hooked.sae.train(model, texts, hook_name="blocks.2.hook_resid_post", architecture="topk", d_sae=1024, k=16)
    tc = hooked.sae.train(model, tokens, hook_name="blocks.1.mlp.hook_in", hook_name_out="blocks.1.hook_mlp_out",
                          architecture="jumprelu", d_sae=512, n_tokens=2_000_000)
    config = hooked.sae.TrainingConfig(hook_name="blocks.2.hook_resid_post", d_sae=1024, k=16)
    sae = hooked.sae.train(model, texts, config)           # the same settings as one object

One concept per module, in the order a run meets them:

1. **What to train** (`config.py`): `TrainingConfig`, every setting in one object; `DictionarySpec`, one dictionary's
   share of it, checked against the model before anything runs.
2. **Tokens** (`tokens.py`): `token_rows`, the data (token ids, texts, a .txt / .jsonl file, an iterable of texts or
   {"text": ...} records) cut into rows of `context_size`.
3. **Activations** (`stream.py`): `ActivationStream`, a forward per batch of rows, each point's activations shuffled
   in a small buffer; every dictionary sees the same batches, so several are trained from one pass.
4. **Trainers** (`trainers.py`): `DictionaryTrainer`, the surface the loop drives, and one subclass per trainable
   architecture (each named by its declaration, hooked/sae/architectures.py), with their losses and autograd
   pieces; a cross-layer transcoder's is `CLTTrainer` (`cross_layer.py`).
5. **The loop** (`loop.py`): `train`, `Run.step` (the loss, Adam, the architecture's constraint, dead features) and
   the checkpoints, in SAELens' format (a CLT's in circuit-tracer's).

The names below are this package's public ones, importable from `hooked.sae.training` as before it was split.
"""

from __future__ import annotations

from hooked.sae.training.config import (
    CLT_READ,
    CLT_WRITE,
    DICTIONARY_OPTIONS,
    TRAINING_OPTIONS,
    DictionarySpec,
    TrainingConfig,
    points_of,
)
from hooked.sae.training.cross_layer import CLTTrainer
from hooked.sae.training.loop import MAX_GRAD_NORM, Run, build_trainer, train
from hooked.sae.training.stream import ActivationStream
from hooked.sae.training.tokens import PAD, TokenRows, token_rows
from hooked.sae.training.trainers import (
    BATCHTOPK_THRESHOLD_RATE,
    DECODER_INIT_NORM,
    GEOMETRIC_MEDIAN_STEPS,
    JUMPRELU_BANDWIDTH,
    JUMPRELU_INIT_THRESHOLD,
    PRE_BYTES,
    RESAMPLE_ENCODER_SCALE,
    BatchTopKTrainer,
    DictionaryTrainer,
    JumpReLU,
    JumpReLUTrainer,
    StandardTrainer,
    StepFunction,
    StepResult,
    TopKEncode,
    TopKTrainer,
    geometric_median,
)

__all__ = [
    "BATCHTOPK_THRESHOLD_RATE",
    "CLT_READ",
    "CLT_WRITE",
    "DECODER_INIT_NORM",
    "DICTIONARY_OPTIONS",
    "GEOMETRIC_MEDIAN_STEPS",
    "JUMPRELU_BANDWIDTH",
    "JUMPRELU_INIT_THRESHOLD",
    "MAX_GRAD_NORM",
    "PAD",
    "PRE_BYTES",
    "RESAMPLE_ENCODER_SCALE",
    "TRAINING_OPTIONS",
    "ActivationStream",
    "BatchTopKTrainer",
    "CLTTrainer",
    "DictionarySpec",
    "DictionaryTrainer",
    "JumpReLU",
    "JumpReLUTrainer",
    "Run",
    "StandardTrainer",
    "StepFunction",
    "StepResult",
    "TokenRows",
    "TopKEncode",
    "TopKTrainer",
    "TrainingConfig",
    "build_trainer",
    "geometric_median",
    "points_of",
    "token_rows",
    "train",
]
