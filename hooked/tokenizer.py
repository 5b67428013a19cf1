"""Tokenization from a checkpoint's own tokenizer files, with left padding and attention masks.

Uses the `tokenizers` library directly (`tokenizer.json`, or GPT-2's `vocab.json` + `merges.txt`),
so loading a model never imports transformers. Batches of prompts of different lengths are padded
on the LEFT, so that the last position of every row is the last real token, and come with an
attention mask; the model derives position ids from it (transformers does not: see docs/hooks.md).
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import torch
from torch import Tensor
from tokenizers import Tokenizer, decoders, models, pre_tokenizers


class HookedTokenizer:
    """A `tokenizers.Tokenizer` plus the ids that matter to a causal model (bos, eos, pad)."""

    def __init__(self, tokenizer: Tokenizer, bos_token_id: int | None, eos_token_id: int | None, pad_token_id: int | None):
        self.tokenizer = tokenizer
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        # GPT-2 and Qwen3 base models have no pad token; padded positions are masked anyway.
        self.pad_token_id = pad_token_id if pad_token_id is not None else (eos_token_id if eos_token_id is not None else 0)
        # The attention masks of the padded batches `encode` returned, so `model(tokens)` finds them.
        # Keyed by id with a weak reference: tensors compare elementwise, so they can't be dict keys.
        self._masks: dict[int, tuple[weakref.ref, Tensor]] = {}

    @classmethod
    def from_directory(cls, directory: Path, config: dict) -> "HookedTokenizer | None":
        """The checkpoint's tokenizer, or None when the directory has no tokenizer files."""
        if (directory / "tokenizer.json").exists():
            tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        elif (directory / "vocab.json").exists() and (directory / "merges.txt").exists():
            tokenizer = Tokenizer(models.BPE.from_file(str(directory / "vocab.json"), str(directory / "merges.txt")))
            tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tokenizer.decoder = decoders.ByteLevel()
        else:
            return None
        tokenizer.no_padding()
        tokenizer.no_truncation()
        special = _special_tokens(directory)
        ids = {}
        for role in ("bos", "eos", "pad"):
            token_id = config.get(f"{role}_token_id")
            if token_id is None and special.get(role) is not None:
                token_id = tokenizer.token_to_id(special[role])
            if isinstance(token_id, list):
                token_id = token_id[0]
            ids[role] = token_id
        return cls(tokenizer, ids["bos"], ids["eos"], ids["pad"])

    def encode(self, texts: list[str], prepend_bos: bool) -> tuple[Tensor, Tensor]:
        """Token ids [batch pos] padded on the left, and the attention mask (True = real token)."""
        if prepend_bos and self.bos_token_id is None:
            raise ValueError("prepend_bos=True, but this tokenizer has no BOS token; pass prepend_bos=False")
        rows = [encoding.ids for encoding in self.tokenizer.encode_batch(texts, add_special_tokens=False)]
        if prepend_bos:
            rows = [[self.bos_token_id, *row] for row in rows]
        length = max(len(row) for row in rows)
        if length == 0:
            raise ValueError("every prompt is empty and no BOS token was prepended: there is nothing to run")
        tokens = torch.full((len(rows), length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.bool)
        for i, row in enumerate(rows):
            if row:
                tokens[i, length - len(row):] = torch.tensor(row)
                mask[i, length - len(row):] = True
        if not mask.all():
            key = id(tokens)
            self._masks[key] = (weakref.ref(tokens, lambda _: self._masks.pop(key, None)), mask)
        return tokens, mask

    def mask_for(self, tokens: Tensor) -> Tensor | None:
        """The attention mask of a padded batch this tokenizer produced, if `tokens` is one."""
        reference, mask = self._masks.get(id(tokens), (None, None))
        return mask if reference is not None and reference() is tokens else None

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def token_to_str(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)


def _special_tokens(directory: Path) -> dict[str, str | None]:
    """bos/eos/pad token strings from tokenizer_config.json or special_tokens_map.json."""
    found: dict[str, str | None] = {}
    for filename in ("special_tokens_map.json", "tokenizer_config.json"):
        path = directory / filename
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        for role in ("bos", "eos", "pad"):
            value = data.get(f"{role}_token")
            if isinstance(value, dict):
                value = value.get("content")
            if value is not None:
                found[role] = value
    return found
