"""The model construction shared by the ported TransformerLens tests.

TransformerLens' tests load hub models (`gpt2`, `solu-1l`, `solu-2l`, `tiny-stories-1M`, ...); nothing is
downloaded here. Each port loads instead a tiny random GPT-2 checkpoint (`hooked.testing.build_gpt2_checkpoint`)
with `hooked.HookedTransformer.from_pretrained(directory)` (or `from_pretrained_no_processing`, as the upstream
test did). The checkpoint's byte-level BPE tokenizer is trained on hooked's test corpus plus the prompts
of the upstream tests, so that the words they use as single tokens (the IOI names, " some") are single tokens
here too. `n_positions=1024` as GPT-2's and solu-1l's `n_ctx`, which `test_to_tokens_truncate` asserts.
Hard-coded numbers of the real models (token ids, `d_vocab`, tokenized prompts) are recomputed in the ported test by
TransformerLens 3.9 on the same checkpoint (`tests.transformer_lens.tl_reference.tl_gpt2`).
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import hooked
import hooked.testing

UPSTREAM_PROMPTS = [
    "Hello World! Hello world! Hello, world! Hi World!",
    "How are you today? I'm fine, thank you. I am happy.",
    "When John and Mary went to the shops, Mary gave the bag to John",
    "When Tom and James went to the park, James gave the ball to Tom",
    "When Dan and Sid went to the shops, Sid gave an apple to Dan",
    "After Martin and Amy went to the park, Amy gave a drink to Martin",
    "There were some biomolecules. The circumference is the perimeter of the circle.",
    "Italy is in Europe. Pyeongchang Olympics was held in 2018. 2023-09-09 287594812673495",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.",
] * 20 + [" some", "biomolecules"] * 50
VOCAB_SIZE = 600


@functools.cache
def checkpoint(n_layer: int = 2) -> Path:
    """A random GPT-2 checkpoint with `n_layer` layers (built once per test session, per depth)."""
    directory = Path(tempfile.mkdtemp(prefix=f"tl_suite_gpt2_{n_layer}l_"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return hooked.testing.build_gpt2_checkpoint(
        directory,
        n_layer=n_layer,
        n_positions=1024,
        corpus=hooked.testing.CORPUS + UPSTREAM_PROMPTS,
        vocab_size=VOCAB_SIZE,
    )
