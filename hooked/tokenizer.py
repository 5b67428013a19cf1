"""Tokenization from a checkpoint's own tokenizer files, with padding and attention masks.

Uses the `tokenizers` library directly (`tokenizer.json`, or GPT-2's `vocab.json` + `merges.txt`),
so loading a model never imports transformers. Batches of prompts of different lengths are padded
on the LEFT by default, so that the last position of every row is the last real token, and come with an
attention mask; the model derives position ids from it (transformers does not: see docs/hooks.md).
`padding_side="right"` (TransformerLens' default) pads after each prompt instead: positions start at 0
in every row, and position -1 is padding for the shorter prompts.
Token ids given without a mask get one read from the ids (`mask_for`: each row's leading pad ids, or its
trailing ones when the tokenizer's `padding_side` is "right"), as TransformerLens 3.9's
`utils.get_attention_mask` does, except that a batch no tokenizer padded is never masked: GPT-2's BOS,
EOS and pad are one id, so a prompt that begins (or ends) with `<|endoftext|>` has that id next to the
padding, and only the batch can say which is which. Ids that look padded on the other side (rows ending, under
left padding, in pad runs of different lengths) are refused rather than read as tokens.

Text the tokenizer does not know becomes its unknown token (`unk_token_id`; GPT-2's byte-level BPE has
none): `check_known` refuses such text where one token must stand for it (an answer, `to_single_token`).

`model.tokenizer` also answers the Hugging Face tokenizer calls TransformerLens notebooks make
(`encode`, `decode`, `batch_decode`, `__call__`, `bos_token`, `pad_token_id`, `padding_side`,
`name_or_path`, ...); a setting it cannot honour raises instead of being ignored.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from torch import Tensor


class HookedTokenizer:
    """A `tokenizers.Tokenizer` plus the ids that matter to a causal model (bos, eos, pad)."""

    _padding_side = "left"  # a tokenizer pickled before it had a padding side pads on the left

    def __init__(
        self,
        tokenizer: Tokenizer,
        bos_token_id: int | None,
        eos_token_id: int | None,
        pad_token_id: int | None,
        name_or_path: str = "",
        padding_side: str = "left",
    ):
        self.tokenizer = tokenizer
        self._check_padding_side(padding_side)
        self._padding_side = padding_side  # where a batch is padded, and where `mask_for` reads padding
        self.name_or_path = name_or_path  # the directory the files were read from (Hugging Face's attribute)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        # GPT-2 and Qwen3 base models have no pad token; padded positions are masked anyway.
        self.pad_token_id = (
            pad_token_id if pad_token_id is not None else (eos_token_id if eos_token_id is not None else 0)
        )
        self.unk_token_id = _unknown_id(tokenizer)

    @classmethod
    def from_directory(cls, directory: Path, config: dict) -> HookedTokenizer | None:
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

    def encode_batch(
        self, texts: list[str], prepend_bos: bool, max_length: int | None = None, padding_side: str | None = None
    ) -> tuple[Tensor, Tensor]:
        """Token ids [batch pos] padded on `padding_side` (default: the tokenizer's), and the attention mask
        (True = real token).

        `max_length` keeps the first `max_length` tokens of each prompt (BOS included), as
        TransformerLens' `to_tokens(truncate=True)`.
        """
        side = self._side(padding_side)
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
                columns = slice(length - len(row), None) if side == "left" else slice(0, len(row))
                tokens[i, columns] = torch.tensor(row)
                mask[i, columns] = True
        return tokens, mask

    def mask_for(
        self, tokens: Tensor, prepend_bos: bool, strict: bool = True, padding_side: str | None = None
    ) -> Tensor | None:
        """The attention mask of padded token ids, read from the ids themselves (None: no padding).

        Left padding (the default) is each row's leading run of pad ids; right padding (`padding_side="right"`,
        or a tokenizer whose `padding_side` is "right") its trailing run, as TransformerLens 3.9's
        `utils.get_attention_mask`. Ids that can be read as unpadded are: a row is padded only when the
        batch was, and padding makes the rows of a batch differ. One row, or rows whose runs are all as
        long, are never masked (GPT-2's `to_tokens("<|endoftext|>Hello")` is the BOS, then a real
        `<|endoftext|>`). Where the runs differ, each row's run is padding, except that where BOS is the pad
        id (GPT-2) and BOS is prepended, the BOS is real: the last id of a leading run (TransformerLens'
        rule), the first column of a row that is all pad ids under right padding. That reading needs an
        unpadded row, the longest, as every batch the tokenizer pads has; where every run is longer than
        that (rows sliced out of a padded batch without its longest, prompts that begin, or under right
        padding end, with the pad id) the ids cannot tell padding from tokens and this raises, asking for
        the mask (`strict=False` reads them as TransformerLens does instead). Where BOS is the pad id and
        `prepend_bos`, a padded batch with a row that does not begin with it raises too: ids made with
        `prepend_bos=False` are padded with the BOS id, so a padded row's last pad could be a BOS or padding.
        Rows whose runs on the other side differ (right-padded ids read on the left) raise too
        (`_check_other_side`). Read from the values, the
        mask survives `.to()`, `.clone()` and saving, and a slice that keeps the longest row.
        """
        if tokens.numel() == 0 or tokens.ndim < 2:
            return None
        right = self._side(padding_side) == "right"
        is_pad = tokens == self.pad_token_id
        runs = (is_pad.flip(-1) if right else is_pad).long().cumprod(-1).sum(-1)  # [batch]: each row's run of pad ids
        if strict:
            self._check_other_side(tokens, is_pad, runs, right)
        if bool((runs == runs[0]).all()):  # one row, or rows all as long: nothing says any was padded
            return None
        bos_run = 1 if prepend_bos and self.bos_token_id == self.pad_token_id else 0  # real pad ids a run can hold
        # A leading run ends with the BOS; a trailing run holds it only when the row is nothing else.
        least_real = 0 if right else bos_run
        if strict and bos_run and not right and int(runs.min()) == 0:
            row = int((runs == 0).nonzero()[0])
            raise ValueError(
                "these token ids come without an attention_mask and are read as made with prepend_bos=True"
                f" (model.default_prepend_bos, unless the call takes prepend_bos=), but row {row} does not begin"
                f" with the BOS {self.bos_token!r}, which is also the pad id ({self.pad_token_id}): ids made with"
                " prepend_bos=False (model.to_tokens(texts, prepend_bos=False) pads with that id) cannot say whether"
                " a padded row's last pad is a BOS or padding; pass attention_mask= (1 = real token;"
                " model.tokenizer(texts, return_tensors='pt') returns it with the ids), or prepend_bos=False where"
                " the call takes it (model(tokens, prepend_bos=False)), or make the ids with prepend_bos=True"
            )
        if strict and int(runs.min()) > least_real:
            shown = f"{runs.tolist()[:8]}{'...' if len(runs) > 8 else ''}"
            where = "ends with" if right else "begins with" + (" a BOS and more" if bos_run else "")
            raise ValueError(
                f"these token ids come without an attention_mask, and every row {where} {self.pad_token!r} (the"
                f" pad id {self.pad_token_id}; {'trailing' if right else 'leading'} runs of {shown}), so no row is"
                " unpadded, as the longest row of a padded batch is, and the ids cannot tell padding from prompts"
                f" that {'end' if right else 'begin'} with that token; pass attention_mask= (1 = real token;"
                " model.tokenizer(texts, return_tensors='pt') returns it with the ids), or the texts themselves"
            )
        columns = torch.arange(tokens.shape[1], device=tokens.device)
        if right:
            padding = runs.clamp(max=tokens.shape[1] - bos_run)  # [batch]
            mask = columns < tokens.shape[1] - padding[:, None]
        else:
            padding = (runs - bos_run).clamp(min=0)  # [batch]
            mask = columns >= padding[:, None]
        return None if bool(mask.all()) else mask

    def _check_other_side(self, tokens: Tensor, is_pad: Tensor, runs: Tensor, right: bool) -> None:
        """Raise when the ids look padded on the side `mask_for` does not read: rows that end (under left
        padding; begin, under right) in runs of pad ids of different lengths.

        Read on the other side, those pads would be tokens, and position -1 of a short row a pad. Rows that
        are all pad ids read alike on both sides and are left out; runs all as long (every row ends with one
        `<|endoftext|>`) say nothing of padding and pass. Where both ends differ, the ids cannot say which is
        padding, so this raises too.
        """
        other = (is_pad if right else is_pad.flip(-1)).long().cumprod(-1).sum(-1)  # [batch]
        partial = other < tokens.shape[1]  # rows that are not all pad ids
        shown = other[partial]
        if shown.numel() < 2 or bool((shown == shown[0]).all()):
            return
        side, end, wrong = ("right", "begin", "left") if right else ("left", "end", "right")
        both = not bool((runs[partial] == runs[partial][0]).all())
        listed = f"{other.tolist()[:8]}{'...' if len(other) > 8 else ''}"
        raise ValueError(
            f"these token ids come without an attention_mask, and their rows {end} in runs of {self.pad_token!r} (the"
            f" pad id {self.pad_token_id}) of different lengths ({listed}): they look padded on the {wrong}, but"
            f" padding is read from the {side}"
            + (" (where the rows' runs differ too, so the ids cannot say which end is padding)" if both else "")
            + f", so those pads would be read as tokens and a metric at position -1 would read a pad; pass"
            f" attention_mask= (1 = real token; model.tokenizer(texts, return_tensors='pt', padding_side='{wrong}')"
            f" returns it with the ids), or pad on the {side}: model.to_tokens(texts, padding_side='{side}'), or"
            " pass the texts themselves; where those pad ids are real tokens, attention_mask=torch.ones_like(tokens)"
        )

    def check_mask_readable(
        self, tokens: Tensor, mask: Tensor, prepend_bos: bool, padding_side: str | None = None
    ) -> None:
        """Raise when ids handed out without their mask (`to_tokens`) would be read by `mask_for` otherwise.

        Only a batch with a prompt that begins (left padding) or ends (right padding) with the pad token
        does: its row's run of pad ids looks like padding, or its length hides another row's padding.
        """
        side = self._side(padding_side)
        try:
            read = self.mask_for(tokens, prepend_bos, padding_side=side)
        except ValueError:
            return  # the forward refuses these ids without a mask, and says why
        if bool(mask.all()) if read is None else bool(torch.equal(read, mask)):
            return
        if side == "right":
            edge = mask.sum(-1) - 1  # [batch]: each prompt's last token
        else:
            bos_run = 1 if prepend_bos and self.bos_token_id == self.pad_token_id else 0
            edge = (~mask).sum(-1) + bos_run  # [batch]: where each prompt's own text begins
        rows = [
            i
            for i, (row, at) in enumerate(zip(tokens.tolist(), edge.tolist(), strict=True))
            if 0 <= at < len(row) and row[at] == self.pad_token_id
        ]
        which = "prompt " + ", ".join(map(str, rows)) if rows else "a prompt"
        raise ValueError(
            f"{which} of this batch {'ends' if side == 'right' else 'begins'} with {self.pad_token!r}, the pad token,"
            " so the token ids alone do not say which rows are padded (model(tokens) would mask real tokens or"
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

    def __call__(
        self,
        text,
        return_tensors: str | None = None,
        padding: bool | str = True,
        add_special_tokens: bool = True,
        truncation: bool = False,
        max_length: int | None = None,
        padding_side: str | None = None,
    ) -> dict:
        """`tokenizer(texts, return_tensors="pt")`: {"input_ids", "attention_mask"}, padded on `padding_side`
        (default: the tokenizer's own, `self.padding_side`)."""
        side = self._side(padding_side)
        texts = [text] if isinstance(text, str) else list(text)
        tokens, mask = self.encode_batch(
            texts, add_special_tokens and self.bos_token_id is not None, max_length if truncation else None, side
        )
        if padding in (False, "do_not_pad") and len(texts) > 1 and not bool(mask.all()):
            raise ValueError(f"prompts of different lengths need padding=True (this call pads on the {side})")
        mask = mask.long()
        if return_tensors == "pt":
            return {"input_ids": tokens, "attention_mask": mask}
        if return_tensors is not None:
            raise ValueError(f"return_tensors={return_tensors!r} is not supported; use 'pt' or None")
        tokens, mask = tokens.tolist(), mask.tolist()
        return (
            {"input_ids": tokens[0], "attention_mask": mask[0]}
            if isinstance(text, str)
            else {"input_ids": tokens, "attention_mask": mask}
        )

    @property
    def padding_side(self) -> str:
        """Where batches are padded, and where `mask_for` reads padding from ids: "left" (hooked's default,
        -1 is every prompt's last token) or "right" (TransformerLens' default)."""
        return self._padding_side

    @padding_side.setter
    def padding_side(self, side: str) -> None:
        self._check_padding_side(side)
        self._padding_side = side

    def _side(self, padding_side: str | None) -> str:
        """`padding_side` checked, or the tokenizer's own when None."""
        if padding_side is None:
            return self._padding_side
        self._check_padding_side(padding_side)
        return padding_side

    @staticmethod
    def _check_padding_side(side: str) -> None:
        if side not in ("left", "right"):
            raise ValueError(f"padding_side={side!r}: it must be 'left' (hooked's default) or 'right'")

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
