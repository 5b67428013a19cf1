"""A graph's prompt as token ids: one row of ids, without padding, a special token first (circuit-tracer 0.5.0
`replacement_model/common.py` `ensure_tokenized`). A graph has a node per position, so a pad kept would be a token
node and shift every position after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


def unpadded_rows(model: HookedTransformer, tokens: Tensor, attention_mask: Tensor | None) -> list[Tensor]:
    """Each row of ids [n pos] without its padding, read as every entry point reads it (`model.padding_mask`):
    a graph has a node per position, so a pad kept would be a token node and shift every position after it."""
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"token ids are an integer tensor, not {tokens.dtype}")
    mask = model.padding_mask(tokens, attention_mask)
    return list(tokens) if mask is None else [row[keep] for row, keep in zip(tokens, mask, strict=True)]


def prompt_tokens(model: HookedTransformer, prompt, attention_mask: Tensor | None = None) -> Tensor:
    """The prompt's ids [pos], without the padding `attention_mask` marks, a special token first (circuit-tracer
    0.5.0 `replacement_model/common.py` `ensure_tokenized`)."""
    tokenizer = getattr(model, "tokenizer", None)
    if attention_mask is not None:
        if isinstance(prompt, str):
            raise ValueError("attention_mask= goes with token ids; a text prompt has no padding")
        ids = torch.as_tensor(prompt)
        (prompt,) = unpadded_rows(model, ids.reshape(1, -1), torch.as_tensor(attention_mask).reshape(1, -1))
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("this model has no tokenizer, so give the prompt as token ids")
        tokens = torch.tensor(tokenizer.encode(prompt, add_special_tokens=False), dtype=torch.long)
    elif isinstance(prompt, Tensor):
        tokens = prompt.detach().to("cpu", torch.long)
        if tokens.ndim == 2 and tokens.shape[0] == 1:
            tokens = tokens[0]
    elif isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt):
        tokens = torch.tensor(list(prompt), dtype=torch.long)
    else:
        raise TypeError(f"the prompt is text or token ids (a tensor or a list of ints), not {type(prompt).__name__}")
    if tokens.ndim != 1:
        raise ValueError(
            f"an attribution graph explains one prompt; got ids of shape {tuple(tokens.shape)}: give one row"
            " (a graph per prompt: call attribute for each)"
        )
    if tokens.numel() == 0:
        raise ValueError("the prompt is empty")
    if tokenizer is not None:
        special = [tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id]
        special = [t for t in special if t is not None]
        if special and int(tokens[0]) not in special:
            tokens = torch.cat([torch.tensor([special[0]]), tokens])
    bad = tokens[(tokens < 0) | (tokens >= model.cfg.d_vocab)]
    if bad.numel():
        raise ValueError(f"token id {int(bad[0])} is outside this model's vocabulary (0..{model.cfg.d_vocab - 1})")
    if tokens.shape[0] > model.cfg.n_ctx:
        raise ValueError(
            f"the prompt is {tokens.shape[0]} tokens (with the first special token), longer than this model's"
            f" context of {model.cfg.n_ctx}; shorten it"
        )
    return tokens.to(model.device)
