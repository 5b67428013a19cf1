"""Token rows for training: what `data` may be (token ids, texts, a .txt or .jsonl file, an iterable of texts or
{"text": ...} records), tokenized with the model's tokenizer, joined with a separator (BOS, else EOS) and cut into
rows of `context_size`, each starting with BOS when the model prepends one (SAELens' `concat_and_batch_sequences`);
token rows [n pos] are used as they are, their padding left out."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hooked.sae.training.config import check_positive

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


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
        check_positive("context_size", context_size)
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
