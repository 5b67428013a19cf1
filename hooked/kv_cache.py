"""A key/value cache for incremental forwards: preallocated buffers, written in place, never concatenated.

    cache = KVCache(model, batch_size=1, max_len=64)
    logits = model(prompt_tokens, past_kv_cache=cache)       # the prompt's keys and values are kept
    logits = model(next_token[:, None], past_kv_cache=cache)  # one column: attends to every kept key

Each layer's keys and values live in one buffer [batch kv_head_index capacity d_head] (the layout
attention reads, a view per step). A call writes its columns after the ones already kept; the buffers
grow by doubling when a call would pass the capacity (`hooked.generate` sizes them once, so it never
grows). The cache also keeps which columns are real tokens (padding, on either side) and how many real
tokens each row has, so a continuation's position ids follow on from the prompt's.

A call that raises (a hook error, bad input) leaves the cache as it was: columns are committed only
when the whole forward has run.

TransformerLens' `HookedTransformerKeyValueCache.init_cache(cfg, device, batch_size)` is
`KVCache.init_cache`; the keys held are the ones attention used, after every hook (`hook_k` /
`hook_rot_k`, `hook_v`), so an edit made at a prompt column stays in effect for every later step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hooked.layers import AttentionMask
from hooked.rows import Rows

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


class KVCache:
    """Keys and values of every layer for the columns seen so far (see the module docstring)."""

    def __init__(
        self,
        model: HookedTransformer,
        batch_size: int,
        max_len: int = 64,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"max_len must be a positive int, got {max_len!r}")
        cfg = model.cfg
        self.batch_size = batch_size
        self.device = torch.device(device) if device is not None else model.device
        self.dtype = dtype or model.dtype
        attention = model.blocks[0].attn  # its kv heads: this rank's under tensor parallelism
        self._shape = (batch_size, getattr(attention, "n_kv_heads", attention.n_heads), max_len, cfg.d_head)
        self.keys = [torch.empty(self._shape, device=self.device, dtype=self.dtype) for _ in range(cfg.n_layers)]
        self.values = [torch.empty(self._shape, device=self.device, dtype=self.dtype) for _ in range(cfg.n_layers)]
        self.key_valid = torch.ones(batch_size, max_len, dtype=torch.bool, device=self.device)
        self.length = 0  # columns kept
        self.padded = False  # whether any kept column is padding
        self.next_position = torch.zeros(batch_size, dtype=torch.long, device=self.device)  # real tokens per row
        # [batch 1] what negative `positions=` count back from during generation (each prompt's length);
        # None: the current call's last column, as in a plain forward.
        self.prompt_lengths: Tensor | None = None
        self._pending: tuple[int, int, Tensor] | None = None  # (start, n, valid) of the call running

    @classmethod
    def init_cache(cls, cfg, device: torch.device | str | None = None, batch_size: int = 1) -> KVCache:
        """TransformerLens' constructor: an empty cache for the model `cfg` belongs to (grows as needed)."""
        model = cfg._bound_model()
        return cls(model, batch_size, device=device)

    @property
    def capacity(self) -> int:
        return self.key_valid.shape[1]

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return (
            f"KVCache(batch_size={self.batch_size}, length={self.length}, capacity={self.capacity},"
            f" {len(self.keys)} layers)"
        )

    def layer(self, index: int) -> LayerKV:
        return LayerKV(self, index)

    # ----------------------------------------------------------------- one call
    def begin(self, tokens: Tensor, valid: Tensor | None) -> tuple[Tensor, AttentionMask, Rows]:
        """Reserve columns for `tokens` [batch n]: their position ids, the attention mask and the hooks' rows."""
        batch, n = tokens.shape
        if batch != self.batch_size:
            raise ValueError(
                f"this KV cache holds {self.batch_size} rows, but the input has {batch}; use a cache per batch"
            )
        start = self.length
        self._reserve(start + n)
        if valid is None:
            position_ids = self.next_position[:, None] + torch.arange(n, device=self.device)
            self.key_valid[:, start : start + n] = True
        else:
            valid = valid.to(self.device)
            position_ids = self.next_position[:, None] + (valid.long().cumsum(-1) - 1).clamp(min=0)
            self.key_valid[:, start : start + n] = valid
        self._pending = (start, n, valid)
        padded = self.padded or valid is not None
        mask = AttentionMask(self.key_valid[:, : start + n] if padded else None, n, start + n)
        return position_ids, mask, Rows(position_ids, valid, start, self.prompt_lengths)

    def commit(self) -> None:
        """The call ran to the end: its columns are now kept."""
        start, n, valid = self._pending
        self.length = start + n
        if valid is not None:
            self.padded = True
            self.next_position += valid.sum(-1)
        else:
            self.next_position += n
        self._pending = None

    def abandon(self) -> None:
        """The call raised: forget its columns (they are overwritten by the next call)."""
        self._pending = None

    def _reserve(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        capacity = max(needed, 2 * self.capacity)
        batch, heads, _, d_head = self._shape
        self._shape = (batch, heads, capacity, d_head)
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                new = torch.empty(self._shape, device=self.device, dtype=self.dtype)
                new[:, :, : self.length] = old[:, :, : self.length]
                buffers[i] = new
        key_valid = torch.ones(batch, capacity, dtype=torch.bool, device=self.device)
        key_valid[:, : self.length] = self.key_valid[:, : self.length]
        self.key_valid = key_valid


class LayerKV:
    """One layer's part of a `KVCache`, handed to its attention for one call."""

    __slots__ = ("cache", "index")

    def __init__(self, cache: KVCache, index: int):
        self.cache, self.index = cache, index

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write this call's k, v [batch n kv_head_index d_head]; return every column's [batch L kv_head_index
        d_head] (views)."""
        cache = self.cache
        start, n, _ = cache._pending
        keys, values = cache.keys[self.index], cache.values[self.index]
        keys[:, :, start : start + n] = k.transpose(1, 2)
        values[:, :, start : start + n] = v.transpose(1, 2)
        return keys[:, :, : start + n].transpose(1, 2), values[:, :, : start + n].transpose(1, 2)
