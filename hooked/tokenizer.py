"""Tokenization from a checkpoint's own tokenizer files, with left padding and attention masks.

Uses the `tokenizers` library directly (`tokenizer.json`, or GPT-2's `vocab.json` + `merges.txt`),
so loading a model never imports transformers. Batches of prompts of different lengths are padded
on the LEFT, so that the last position of every row is the last real token, and come with an
attention mask; the model derives position ids from it (transformers does not: see docs/hooks.md).
Token ids given without a mask get one read from the ids (`mask_for`), as TransformerLens does, except
that a batch no tokenizer padded is never masked: GPT-2's BOS, EOS and pad are one id, so a prompt that
begins with `<|endoftext|>` starts with that id twice, and only the batch can say whether the first is
padding.

Text the tokenizer does not know becomes its unknown token (`unk_token_id`; GPT-2's byte-level BPE has
none): `check_known` refuses such text where one token must stand for it (an answer, `to_single_token`).

`model.tokenizer` also answers the Hugging Face tokenizer calls TransformerLens notebooks make
(`encode`, `decode`, `batch_decode`, `__call__`, `bos_token`, `pad_token_id`, `padding_side`,
`name_or_path`, ...); a setting it cannot honour (right padding) raises instead of being ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor
from tokenizers import Tokenizer, decoders, models, pre_tokenizers


class HookedTokenizer:
    """A `tokenizers.Tokenizer` plus the ids that matter to a causal model (bos, eos, pad)."""

    def __init__(self, tokenizer: Tokenizer, bos_token_id: int | None, eos_token_id: int | None, pad_token_id: int | None,
                 name_or_path: str = ""):
        self.tokenizer = tokenizer
        self.name_or_path = name_or_path  # the directory the files were read from (Hugging Face's attribute)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        # GPT-2 and Qwen3 base models have no pad token; padded positions are masked anyway.
        self.pad_token_id = pad_token_id if pad_token_id is not None else (eos_token_id if eos_token_id is not None else 0)
        self.unk_token_id = _unknown_id(tokenizer)

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
        return cls(tokenizer, ids["bos"], ids["eos"], ids["pad"], str(directory))

    def encode_batch(self, texts: list[str], prepend_bos: bool, max_length: int | None = None) -> tuple[Tensor, Tensor]:
        """Token ids [batch pos] padded on the left, and the attention mask (True = real token).

        `max_length` keeps the first `max_length` tokens of each prompt (BOS included), as
        TransformerLens' `to_tokens(truncate=True)`.
        """
        if prepend_bos and self.bos_token_id is None:
            raise ValueError("prepend_bos=True, but this tokenizer has no BOS token; pass prepend_bos=False")
        rows = [encoding.ids for encoding in self.tokenizer.encode_batch(texts, add_special_tokens=False)]
        if prepend_bos:
            rows = [[self.bos_token_id, *row] for row in rows]
        if max_length is not None:
            rows = [row[:max_length] for row in rows]
        length = max(len(row) for row in rows)
        if length == 0:
            raise ValueError("every prompt is empty and no BOS token was prepended: there is nothing to run")
        tokens = torch.full((len(rows), length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.bool)
        for i, row in enumerate(rows):
            if row:
                tokens[i, length - len(row):] = torch.tensor(row)
                mask[i, length - len(row):] = True
        return tokens, mask

    def mask_for(self, tokens: Tensor, prepend_bos: bool, strict: bool = True) -> Tensor | None:
        """The attention mask of left-padded token ids, read from the ids themselves (None: no padding).

        Ids that can be read as unpadded are: a row is padded only when the batch was, and padding makes
        the rows of a batch differ. One row, or rows whose leading runs of pad ids are all as long, are never
        masked (GPT-2's `to_tokens("<|endoftext|>Hello")` is the BOS, then a real `<|endoftext|>`). Where
        the runs differ, each row's run is padding, except that where BOS is the pad id (GPT-2) and BOS is
        prepended, the run's last id is the BOS (TransformerLens 3.9 `utils.get_attention_mask`). That
        reading needs an unpadded row, the longest, as every batch the tokenizer pads has; where every run
        is longer than the BOS (rows sliced out of a padded batch without its longest, prompts that begin
        with the pad id) the ids cannot tell padding from tokens and this raises, asking for the mask
        (`strict=False` reads them as TransformerLens does instead). Read from the values, the mask
        survives `.to()`, `.clone()` and saving, and a slice that keeps the longest row.
        """
        if tokens.numel() == 0 or tokens.ndim < 2:
            return None
        runs = (tokens == self.pad_token_id).long().cumprod(-1).sum(-1)  # [batch]: each row's leading pad ids
        if bool((runs == runs[0]).all()):  # one row, or rows all as long: nothing says any was padded
            return None
        bos_run = 1 if prepend_bos and self.bos_token_id == self.pad_token_id else 0  # the real ids a run ends with
        if strict and int(runs.min()) > bos_run:
            shown = f"{runs.tolist()[:8]}{'...' if len(runs) > 8 else ''}"
            raise ValueError(
                f"these token ids come without an attention_mask, and every row begins with {'a BOS and more ' if bos_run else ''}"
                f"{self.pad_token!r} (the pad id {self.pad_token_id}; leading runs of {shown}), so no row is unpadded,"
                " as the longest row of a padded batch is, and the ids cannot tell padding from prompts that begin"
                " with that token; pass attention_mask= (1 = real token; model.tokenizer(texts, return_tensors='pt')"
                " returns it with the ids), or the texts themselves"
            )
        padding = (runs - bos_run).clamp(min=0)  # [batch]
        mask = torch.arange(tokens.shape[1], device=tokens.device) >= padding[:, None]
        return None if bool(mask.all()) else mask

    def check_mask_readable(self, tokens: Tensor, mask: Tensor, prepend_bos: bool) -> None:
        """Raise when ids handed out without their mask (`to_tokens`) would be read by `mask_for` otherwise.

        Only a batch with a prompt that begins with the pad token does: its row's leading pad ids look like
        padding, or its length hides another row's padding.
        """
        try:
            read = self.mask_for(tokens, prepend_bos)
        except ValueError:
            return  # the forward refuses these ids without a mask, and says why
        if bool(mask.all()) if read is None else bool(torch.equal(read, mask)):
            return
        bos_run = 1 if prepend_bos and self.bos_token_id == self.pad_token_id else 0
        first_real = (~mask).sum(-1) + bos_run  # [batch]: where each prompt's own text begins
        rows = [i for i, (row, start) in enumerate(zip(tokens.tolist(), first_real.tolist()))
                if start < len(row) and row[start] == self.pad_token_id]
        which = "prompt " + ", ".join(map(str, rows)) if rows else "a prompt"
        raise ValueError(
            f"{which} of this batch begins with {self.pad_token!r}, the pad token, so"
            " the token ids alone do not say which rows are padded (model(tokens) would mask real tokens or"
            " read padding); pass the texts themselves (model(texts), model.generate(texts)), or keep the"
            " tokenizer's mask: batch = model.tokenizer(texts, return_tensors='pt'), then"
            " model(batch['input_ids'], attention_mask=batch['attention_mask'])"
        )

    def maps_to_unknown(self, text: str, ids: Sequence[int]) -> bool:
        """Whether `text`, tokenized to `ids`, became the unknown token (it is not that token written out)."""
        return self.unk_token_id is not None and self.unk_token_id in ids and text.strip() != self.unk_token

    def check_known(self, text: str, ids: Sequence[int]) -> None:
        """Raise when `text` became the unknown token in `ids`: the tokenizer does not know it.

        Every text the tokenizer does not know becomes that one id, so an answer read through it scores
        the unknown token, whatever the answer. The unknown token written out (`"<|unk|>"`) is itself.
        """
        if not self.maps_to_unknown(text, ids):
            return
        unknown = self.unk_token_id
        pieces = [self.tokenizer.id_to_token(token) for token in ids]
        raise ValueError(
            f"{text!r} is not in this tokenizer's vocabulary: it tokenizes to {pieces}, and {self.unk_token!r}"
            f" (id {unknown}) is the unknown token, the id of every text the tokenizer does not know; use words"
            f" from model.tokenizer.get_vocab(), or pass the id {unknown} itself to mean the unknown token"
        )

    def token_to_str(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    # ------------------------------------------------------------ the Hugging Face tokenizer surface
    def encode(self, text, prepend_bos: bool | None = None, add_special_tokens: bool = True):
        """`encode("text") -> list[int]` as TransformerLens' tokenizer: BOS first (when the tokenizer has
        one) unless `add_special_tokens=False`. `encode(list_of_texts, prepend_bos=...)` is the batch form,
        `encode_batch`."""
        if not isinstance(text, str):
            return self.encode_batch(list(text), bool(prepend_bos))
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        with_bos = add_special_tokens if prepend_bos is None else prepend_bos
        return [self.bos_token_id, *ids] if with_bos and self.bos_token_id is not None else ids

    def decode(self, ids, skip_special_tokens: bool = False, **kwargs) -> str:
        """Text of token ids (a list, a 0-d or 1-d tensor, or an int)."""
        ids = torch.as_tensor(ids).reshape(-1).tolist()
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def batch_decode(self, rows, skip_special_tokens: bool = False, **kwargs) -> list[str]:
        return [self.decode(row, skip_special_tokens) for row in rows]

    def __call__(self, text, return_tensors: str | None = None, padding: bool | str = True,
                 add_special_tokens: bool = True, truncation: bool = False, max_length: int | None = None,
                 padding_side: str | None = None) -> dict:
        """`tokenizer(texts, return_tensors="pt")`: {"input_ids", "attention_mask"}, padded on the left."""
        self._check_padding_side(padding_side or "left")
        texts = [text] if isinstance(text, str) else list(text)
        tokens, mask = self.encode_batch(texts, add_special_tokens and self.bos_token_id is not None,
                                         max_length if truncation else None)
        if padding in (False, "do_not_pad") and len(texts) > 1 and not bool(mask.all()):
            raise ValueError("prompts of different lengths need padding=True (hooked pads on the left)")
        mask = mask.long()
        if return_tensors == "pt":
            return {"input_ids": tokens, "attention_mask": mask}
        if return_tensors is not None:
            raise ValueError(f"return_tensors={return_tensors!r} is not supported; use 'pt' or None")
        tokens, mask = tokens.tolist(), mask.tolist()
        return {"input_ids": tokens[0], "attention_mask": mask[0]} if isinstance(text, str) else {"input_ids": tokens, "attention_mask": mask}

    @property
    def padding_side(self) -> str:
        return "left"

    @padding_side.setter
    def padding_side(self, side: str) -> None:
        self._check_padding_side(side)

    @staticmethod
    def _check_padding_side(side: str) -> None:
        if side != "left":
            raise ValueError(
                f"padding_side={side!r}: hooked pads on the left only, so that position -1 is every prompt's last"
                " token and the forward can read the mask from the ids (each row's leading pad ids);"
                " right-padded ids would be read as real tokens"
            )

    def _token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.tokenizer.id_to_token(token_id)

    bos_token = property(lambda self: self._token(self.bos_token_id))
    eos_token = property(lambda self: self._token(self.eos_token_id))
    pad_token = property(lambda self: self._token(self.pad_token_id))
    unk_token = property(lambda self: self._token(self.unk_token_id))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return self.tokenizer.get_vocab(with_added_tokens=True)

    vocab = property(get_vocab)

    def convert_ids_to_tokens(self, ids: int | Sequence[int]):
        if isinstance(ids, int):
            return self.tokenizer.id_to_token(ids)
        return [self.tokenizer.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]):
        if isinstance(tokens, str):
            return self.tokenizer.token_to_id(tokens)
        return [self.tokenizer.token_to_id(t) for t in tokens]


def _unknown_id(tokenizer: Tokenizer) -> int | None:
    """The id the tokenizer's model gives text outside its vocabulary, or None when it has none.

    Read from the model (`unk_token` of WordLevel, WordPiece and BPE, `unk_id` of Unigram), the one
    that emits it, not from special_tokens_map.json: GPT-2's names `<|endoftext|>` as its unk_token,
    though its byte-level BPE never emits it (that id is its BOS, EOS and pad).
    """
    model = tokenizer.model
    if hasattr(model, "unk_token"):
        return None if model.unk_token is None else tokenizer.token_to_id(model.unk_token)
    return json.loads(tokenizer.to_str())["model"].get("unk_id")  # Unigram keeps it in its serialised form


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
