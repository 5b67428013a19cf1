"""What every `hooked` language model shares: input handling, tokenization, the hook API, loss.

An architecture file subclasses `HookedTransformer`, declares its blocks and hook points, and
implements three steps: `embed(tokens, position_ids) -> resid`, `block_inputs(position_ids, mask,
dtype)` (what every block takes besides the residual stream) and `unembed_weight`. Each block is two
halves, `attn_half(resid_pre, *inputs) -> resid_mid` and `mlp_half(resid_mid) -> resid_post`, so a
forward can resume from any half-block boundary (`hooked.sweep` computes a shared prefix once).
Everything a user calls (`model(...)`, `run_with_hooks`, `run_with_cache`, `to_tokens`, ...) lives
here once.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal, Union

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from hooked.cache import ActivationCache, run_with_cache
from hooked.hooks import HookedRootModule, Rows, running_rows
from hooked.layers import AttentionMask
from hooked.tokenizer import HookedTokenizer

ModelInput = Union[str, list[str], Int[Tensor, "batch pos"], Int[Tensor, " pos"]]
ReturnType = Literal["logits", "loss", "both", None]


class HookedTransformer(HookedRootModule):
    """Base of every model. Subclasses set `config_class`, `architectures`, `embedding_hook_names`."""

    config_class: ClassVar[type]
    architectures: ClassVar[tuple[str, ...]]  # config.json "architectures" / "model_type" it serves
    embedding_hook_names: ClassVar[tuple[str, ...]]  # the hooks whose sum is resid_pre of block 0
    default_prepend_bos: ClassVar[bool]

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tokenizer: HookedTokenizer | None = None
        self.name_or_path: str | None = None  # the hub id or directory it was loaded from

    # ----------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> "HookedTransformer":
        """Load from a local directory or a hub id, reading safetensors straight into dtype/device."""
        from hooked.weights import load_model

        return load_model(name_or_path, dtype=dtype, device=device, model_class=cls)

    # ----------------------------------------------------------------- forward
    def forward(
        self,
        input: ModelInput,
        *,
        attention_mask: Tensor | None = None,
        prepend_bos: bool | None = None,
        return_type: ReturnType = "logits",
    ):
        """Logits [batch pos d_vocab] for token ids ([batch pos] or [pos]) or text (str or list of str).

        Text is tokenized with left padding; token ids may come with an `attention_mask` (True or 1 =
        real token). Position ids are derived from the mask, so a left-padded row gives the same
        result as the prompt alone. `return_type="loss"` gives the mean next-token cross-entropy
        over real tokens; `"both"` gives (logits, loss).
        """
        if return_type not in ("logits", "loss", "both", None):
            raise ValueError(f"return_type must be 'logits', 'loss', 'both' or None, not {return_type!r}")
        tokens, key_valid = self._tokens_and_mask(input, attention_mask, prepend_bos)
        if key_valid is None:
            position_ids = torch.arange(tokens.shape[1], device=tokens.device)[None].expand_as(tokens)
        else:
            position_ids = (key_valid.long().cumsum(-1) - 1).clamp(min=0)
        mask = AttentionMask(key_valid, tokens.shape[1], tokens.shape[1])
        with running_rows(Rows(position_ids, key_valid)):
            logits = self.forward_tokens(tokens, position_ids, mask)
        if return_type in ("logits", None):
            return logits if return_type else None
        loss = self.loss(logits, tokens, key_valid)
        return loss if return_type == "loss" else (logits, loss)

    def forward_tokens(self, tokens: Tensor, position_ids: Tensor, mask: AttentionMask) -> Float[Tensor, "batch pos d_vocab"]:
        resid = self.embed(tokens, position_ids)
        inputs = self.block_inputs(position_ids, mask, resid.dtype)
        for block in self.blocks:
            resid = block(resid, *inputs)
        return self.unembed(resid)

    def unembed(self, resid: Float[Tensor, "batch pos d_model"], columns: Tensor | None = None) -> Tensor:
        """Final norm, then the unembedding; `columns` (token ids) computes only those logits."""
        weight = self.unembed_weight if columns is None else self.unembed_weight[columns]
        return F.linear(self.ln_final(resid), weight)

    @staticmethod
    def loss(logits: Tensor, tokens: Tensor, key_valid: Tensor | None = None) -> Tensor:
        """Mean next-token cross-entropy, in float32, over positions whose target is a real token."""
        log_probs = F.log_softmax(logits[:, :-1].float(), dim=-1)
        per_token = -log_probs.gather(-1, tokens[:, 1:, None])[..., 0]
        if key_valid is None:
            return per_token.mean()
        weights = (key_valid[:, 1:] & key_valid[:, :-1]).float()
        return (per_token * weights).sum() / weights.sum()

    def _tokens_and_mask(self, input: ModelInput, attention_mask: Tensor | None, prepend_bos: bool | None):
        device = self.device
        if isinstance(input, str) or (isinstance(input, list) and input and all(isinstance(s, str) for s in input)):
            if attention_mask is not None:
                raise ValueError("attention_mask is derived from text inputs; pass it only with token ids")
            tokens, key_valid = self._tokenize(input, prepend_bos)
            tokens, key_valid = tokens.to(device), key_valid.to(device)
        elif isinstance(input, Tensor):
            tokens = input
            if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.is_complex():
                raise TypeError(f"token ids must be an integer tensor, got {tokens.dtype}")
            if tokens.ndim == 1:
                tokens = tokens[None]
            if tokens.ndim != 2:
                raise ValueError(f"token ids must be [batch pos] or [pos], got shape {tuple(input.shape)}")
            if attention_mask is None and self.tokenizer is not None:  # left padding, read from the ids
                attention_mask = self.tokenizer.mask_for(tokens, self.default_prepend_bos if prepend_bos is None else prepend_bos)
            key_valid = None
            if attention_mask is not None:
                attention_mask = attention_mask[None] if attention_mask.ndim == 1 else attention_mask
                if attention_mask.shape != tokens.shape:
                    raise ValueError(
                        f"attention_mask has shape {tuple(attention_mask.shape)} but the tokens have {tuple(tokens.shape)}"
                    )
                key_valid = attention_mask.to(device=device, dtype=torch.bool)
            tokens = tokens.to(device=device, dtype=torch.long)
        else:
            raise TypeError(
                f"model input must be a str, a list of str or a tensor of token ids, not {type(input).__name__}"
                + (" (an empty list)" if isinstance(input, list) and not input else "")
            )
        self._check_tokens(tokens)
        if key_valid is not None and bool(key_valid.all()):
            key_valid = None
        if key_valid is not None and not bool(key_valid.any(-1).all()):
            raise ValueError("attention_mask has a row with no real token; remove that row")
        return tokens, key_valid

    def _check_tokens(self, tokens: Tensor) -> None:
        if tokens.numel() == 0:
            raise ValueError(f"empty input (token ids of shape {tuple(tokens.shape)}): give at least one token")
        low, high = (int(x) for x in torch.aminmax(tokens))  # one reduction, one device sync
        if low < 0 or high >= self.cfg.d_vocab:
            bad = high if high >= self.cfg.d_vocab else low
            raise ValueError(f"token id {bad} is out of range for this model's vocabulary of {self.cfg.d_vocab} (ids 0..{self.cfg.d_vocab - 1})")
        max_positions = self.max_positions
        if max_positions is not None and tokens.shape[1] > max_positions:
            raise ValueError(
                f"the input has {tokens.shape[1]} positions but this model has only {max_positions}"
                " position embeddings; truncate the input"
            )

    @property
    def max_positions(self) -> int | None:
        """Longest input the model can take (None: no hard limit)."""
        return None

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    # ----------------------------------------------------------------- hooks and caching
    def run_with_cache(self, *model_args, **kwargs) -> tuple[Tensor, ActivationCache]:
        """Run once and keep activations: `logits, cache = model.run_with_cache(tokens)`.

        Keyword options as TransformerLens: names_filter (name, list or filter function), device,
        remove_batch_dim, incl_bwd (needs return_type="loss"), pos_slice. Everything else goes to
        the forward.
        """
        return run_with_cache(self, *model_args, **kwargs)

    def hook_shapes(self, batch: int = 1, pos: int = 8) -> dict[str, tuple[int, ...]]:
        """Every hook name with its shape for an input of [batch pos], from the declared axes."""
        sizes = {"batch": batch, "pos": pos, "query_pos": pos, "key_pos": pos, "1": 1, **self.axis_sizes()}
        return {name: tuple(sizes[axis] for axis in point.axes) for name, point in self.hook_dict.items()}

    def axis_sizes(self) -> dict[str, int]:
        cfg = self.cfg
        return {"d_model": cfg.d_model, "head_index": cfg.n_heads, "kv_head_index": cfg.n_kv_heads,
                "d_head": cfg.d_head, "d_mlp": cfg.d_mlp, "d_vocab": cfg.d_vocab}

    # ----------------------------------------------------------------- tokenization
    def _require_tokenizer(self) -> HookedTokenizer:
        if self.tokenizer is None:
            raise RuntimeError("this model has no tokenizer (the checkpoint directory had no tokenizer files); pass token ids")
        return self.tokenizer

    def _tokenize(self, input: str | list[str], prepend_bos: bool | None) -> tuple[Tensor, Tensor]:
        texts = [input] if isinstance(input, str) else list(input)
        return self._require_tokenizer().encode(texts, self.default_prepend_bos if prepend_bos is None else prepend_bos)

    def to_tokens(self, input: str | list[str], prepend_bos: bool | None = None, move_to_device: bool = True) -> Tensor:
        """Token ids [batch pos]; a batch is padded on the left, and `model(tokens)` reads the mask from the
        ids (the leading pad ids of each row; see `HookedTokenizer.mask_for`), however the tensor travelled."""
        tokens, _ = self._tokenize(input, prepend_bos)
        return tokens.to(self.device) if move_to_device and tokens.device != self.device else tokens

    def to_str_tokens(self, input, prepend_bos: bool | None = None):
        """The tokens as strings: a list for one prompt or 1-D ids, a list of lists for a batch."""
        tokenizer = self._require_tokenizer()
        if isinstance(input, str):
            tokens, _ = self._tokenize(input, prepend_bos)
            return [tokenizer.token_to_str(t) for t in tokens[0].tolist()]
        if isinstance(input, list) and all(isinstance(s, str) for s in input):
            return [self.to_str_tokens(s, prepend_bos) for s in input]
        ids = torch.as_tensor(input)
        if ids.ndim == 2:
            return [[tokenizer.token_to_str(t) for t in row] for row in ids.tolist()]
        return [tokenizer.token_to_str(t) for t in ids.reshape(-1).tolist()]

    def to_string(self, tokens) -> str | list[str]:
        tokenizer = self._require_tokenizer()
        ids = torch.as_tensor(tokens)
        if ids.ndim == 2:
            return [tokenizer.decode(row) for row in ids.tolist()]
        return tokenizer.decode(ids.reshape(-1).tolist())

    def to_single_token(self, string: str) -> int:
        """The id of a string that is exactly one token (raises if it is several)."""
        tokens, _ = self._tokenize(string, prepend_bos=False)
        if tokens.shape[1] != 1:
            raise ValueError(f"{string!r} is {tokens.shape[1]} tokens ({self.to_str_tokens(string, prepend_bos=False)}), not one")
        return int(tokens[0, 0])

    # ----------------------------------------------------------------- unembedding helpers
    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        return self.unembed_weight.T

    # TransformerLens' stacked weights, [n_layers, ...]: copies, built on each access.
    def _stack_blocks(self, module: str, name: str) -> Tensor:
        return torch.stack([getattr(getattr(block, module), name) for block in self.blocks])

    W_Q = property(lambda self: self._stack_blocks("attn", "W_Q"), doc="[n_layers head_index d_model d_head]")
    W_K = property(lambda self: self._stack_blocks("attn", "W_K"), doc="[n_layers kv_head_index d_model d_head]")
    W_V = property(lambda self: self._stack_blocks("attn", "W_V"), doc="[n_layers kv_head_index d_model d_head]")
    W_O = property(lambda self: self._stack_blocks("attn", "W_O"), doc="[n_layers head_index d_head d_model]")
    W_in = property(lambda self: self._stack_blocks("mlp", "W_in"), doc="[n_layers d_model d_mlp] (dense MLPs)")
    W_out = property(lambda self: self._stack_blocks("mlp", "W_out"), doc="[n_layers d_mlp d_model] (dense MLPs)")

    def tokens_to_residual_directions(self, tokens) -> Tensor:
        """The direction in the normalised residual stream that reads out each token's logit.

        It includes the final norm's weight (weights are loaded unfolded): [d_model] for one token,
        [..., d_model] for a tensor of tokens.
        """
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        tokens = torch.as_tensor(tokens, device=self.unembed_weight.device)
        return self.unembed_weight[tokens] * self.ln_final.weight

    def logit_bias_terms(self, tokens) -> Tensor:
        """The part of a token's logit no residual component writes: final-norm bias @ W_U (+ b_U)."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        tokens = torch.as_tensor(tokens, device=self.unembed_weight.device)
        bias = getattr(self.ln_final, "bias", None)
        if bias is None:
            return torch.zeros(tokens.shape, dtype=self.dtype, device=tokens.device)
        return self.unembed_weight[tokens] @ bias
