"""Text in and out of a model: `to_tokens`, `to_str_tokens`, `to_string`, `to_single_token`, ...

TransformerLens' tokenization methods, as a mixin of `HookedTransformer` (hooked/models/base.py). They
read the model's `tokenizer` (a `hooked.tokenizer.HookedTokenizer`, None for a model built without one),
`cfg` and `default_prepend_bos`; the padding rule they follow is in `docs/hooks.md` ("Inputs, padding
and BOS"), and right padding (`padding_side="right"`) in `docs/transformer-lens.md`.
"""

from __future__ import annotations

import torch
from jaxtyping import Int
from torch import Tensor

from hooked.hooks import AssertionValueError
from hooked.tokenizer import HookedTokenizer


class TokenMethods:
    """The tokenization methods every model has (a mixin: the state is the model's)."""

    def _require_tokenizer(self) -> HookedTokenizer:
        if self.tokenizer is None:
            raise RuntimeError(
                "this model has no tokenizer (the checkpoint directory had no tokenizer files); pass token ids"
            )
        return self.tokenizer

    def set_tokenizer(self, tokenizer, default_padding_side: str = "left") -> None:
        """Use `tokenizer` from now on, as TransformerLens' `set_tokenizer`: a `HookedTokenizer`, or a Hugging Face
        fast tokenizer (its `tokenizers.Tokenizer` is copied, with its bos / eos / pad ids and `name_or_path`).
        `default_padding_side` ("left", hooked's default, or "right") becomes the tokenizer's `padding_side`:
        where `to_tokens` pads, and where the forward reads padding from ids given without a mask."""
        HookedTokenizer._check_padding_side(default_padding_side)
        if not isinstance(tokenizer, HookedTokenizer):
            backend = getattr(tokenizer, "backend_tokenizer", None)
            if backend is None:
                raise TypeError(
                    f"set_tokenizer takes a hooked.HookedTokenizer or a Hugging Face fast tokenizer (one with a"
                    f" backend_tokenizer), not {type(tokenizer).__name__}"
                )
            from tokenizers import Tokenizer

            backend = Tokenizer.from_str(backend.to_str())  # a copy: the caller's tokenizer keeps its padding settings
            backend.no_padding()
            backend.no_truncation()
            tokenizer = HookedTokenizer(
                backend,
                tokenizer.bos_token_id,
                tokenizer.eos_token_id,
                tokenizer.pad_token_id,
                str(getattr(tokenizer, "name_or_path", "")),
            )
        tokenizer.padding_side = default_padding_side
        self.tokenizer = tokenizer

    def _tokenize(
        self, input: str | list[str], prepend_bos: bool | None, truncate: bool = False, padding_side: str | None = None
    ) -> tuple[Tensor, Tensor]:
        texts = [input] if isinstance(input, str) else list(input)
        prepend_bos = self.default_prepend_bos if prepend_bos is None else prepend_bos
        return self._require_tokenizer().encode_batch(
            texts, prepend_bos, self.cfg.n_ctx if truncate else None, padding_side
        )

    def to_tokens(
        self,
        input: str | list[str],
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        move_to_device: bool = True,
        truncate: bool = True,
    ) -> Int[Tensor, "batch pos"]:
        """Token ids [batch pos]; a batch is padded on `padding_side` ("left" or "right"; default: the
        tokenizer's `padding_side`, "left" unless set), and `model(tokens)` reads the mask from the ids (each
        row's leading pad ids, or trailing ones when the tokenizer's side is "right"; see
        `HookedTokenizer.mask_for`), however the tensor travelled.

        `truncate` keeps each prompt's first `cfg.n_ctx` tokens. A batch whose ids would not give back its
        mask (a prompt that begins, or under right padding ends, with the pad token, GPT-2's
        `<|endoftext|>`) raises, saying how to keep the mask; so does one that would give back another mask
        read with `default_prepend_bos`, as the calls that take no `prepend_bos=` read ids. Where BOS is
        the pad id, a padded batch made with `prepend_bos=False` (the default being True) is refused by
        those calls, naming the fix: pass its `attention_mask=` (or `prepend_bos=False` where the call
        takes it). Ids padded on the other side than the tokenizer's are read as the tokenizer's side
        says: pass their `attention_mask=` to the model.
        """
        tokenizer = self._require_tokenizer()
        side = tokenizer._side(padding_side)
        tokens, mask = self._tokenize(input, prepend_bos, truncate, side)
        prepend_bos = self.default_prepend_bos if prepend_bos is None else prepend_bos
        tokenizer.check_mask_readable(tokens, mask, prepend_bos, side)
        if prepend_bos != self.default_prepend_bos:  # as the calls that take no prepend_bos= read the ids
            tokenizer.check_mask_readable(tokens, mask, self.default_prepend_bos, side)
        return tokens.to(self.device) if move_to_device and tokens.device != self.device else tokens

    def to_str_tokens(self, input, prepend_bos: bool | None = None, padding_side: str | None = None):
        """The tokens as strings, as TransformerLens: a list for a string or for ids of shape [pos] / [1 pos]
        (squeezed), a list of lists for a list of strings. Ids [batch pos] with batch > 1 give a list per
        row (TransformerLens refuses them)."""
        tokenizer = self._require_tokenizer()
        tokenizer._side(padding_side)  # checked; one prompt at a time has no padding
        if isinstance(input, str):
            tokens, _ = self._tokenize(input, prepend_bos, truncate=True)
            return [tokenizer.token_to_str(t) for t in tokens[0].tolist()]
        if isinstance(input, list) and all(isinstance(s, str) for s in input):
            return [self.to_str_tokens(s, prepend_bos, padding_side) for s in input]
        ids = torch.as_tensor(input).squeeze()
        if ids.ndim == 2:
            return [[tokenizer.token_to_str(t) for t in row] for row in ids.tolist()]
        return [tokenizer.token_to_str(t) for t in ids.reshape(-1).tolist()]

    def to_single_str_token(self, int_token: int) -> str:
        """The string of one token id."""
        if not isinstance(int_token, int):
            raise TypeError(f"to_single_str_token takes an int token id, not {type(int_token).__name__}")
        return self._require_tokenizer().token_to_str(int_token)

    def get_token_position(
        self,
        single_token: str | int | Tensor,
        input: str | Tensor,
        mode: str = "first",
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
    ) -> int:
        """Where `single_token` first (or last) occurs in one prompt: a string, ids [pos] or [1 pos]."""
        if mode not in ("first", "last"):
            raise ValueError(f"mode must be 'first' or 'last', not {mode!r}")
        tokens = self.to_tokens(input, prepend_bos, padding_side) if isinstance(input, str) else torch.as_tensor(input)
        if tokens.ndim == 2:
            if tokens.shape[0] != 1:
                raise AssertionValueError(f"ids of rank two must have shape [1, pos], not {tuple(tokens.shape)}")
            tokens = tokens[0]
        if isinstance(single_token, str):
            single_token = self.to_single_token(single_token)
        elif isinstance(single_token, Tensor):
            single_token = int(single_token.item())
        positions = torch.nonzero(tokens == single_token)[:, 0]
        if len(positions) == 0:
            # TransformerLens 3.9's message first (its tests match it), then which token
            shown = "" if self.tokenizer is None else f"{self.to_single_str_token(int(single_token))!r} "
            raise AssertionValueError(f"The token does not occur in the prompt: {shown}(id {single_token})")
        return int(positions[0] if mode == "first" else positions[-1])

    def to_string(self, tokens) -> str | list[str]:
        tokenizer = self._require_tokenizer()
        ids = torch.as_tensor(tokens)
        if ids.ndim == 2:
            return [tokenizer.decode(row) for row in ids.tolist()]
        return tokenizer.decode(ids.reshape(-1).tolist())

    def to_single_token(self, string: str) -> int:
        """The id of a string that is exactly one token (raises if it is several, or the unknown token)."""
        tokens, _ = self._tokenize(string, prepend_bos=False)
        self.tokenizer.check_known(string, tokens[0].tolist())
        if tokens.shape[1] != 1:
            raise AssertionValueError(
                f"{string!r} is {tokens.shape[1]} tokens ({self.to_str_tokens(string, prepend_bos=False)}), not one"
            )
        return int(tokens[0, 0])
