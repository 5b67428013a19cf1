"""What every `hooked` language model shares: input handling, tokenization, the hook API, loss.

An architecture file subclasses `HookedTransformer`, declares its blocks and hook points, and
implements three steps: `resid_from_tokens(tokens, position_ids) -> resid`, `block_inputs(position_ids,
mask, dtype)` (what every block takes besides the residual stream) and `unembed_weight`. Each block is two
halves, `attn_half(resid_pre, *inputs) -> resid_mid` and `mlp_half(resid_mid) -> resid_post`, so a
forward can resume from any half-block boundary (`hooked.sweep` computes a shared prefix once).
Everything a user calls (`model(...)`, `run_with_hooks`, `run_with_cache`, `to_tokens`, ...) lives
here once.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from hooked.cache import ActivationCache, accumulated_bias, run_with_cache
from hooked.hooks import EMBED_STAGE, AssertionKeyError, HookedRootModule, HookPoint
from hooked.kv_cache import KVCache, LayerKV
from hooked.layers import AttentionMask, position_ids_for
from hooked.models.building import BuildingMethods, BuildsFromConfig
from hooked.models.tokens import TokenMethods
from hooked.models.weight_views import WeightStacks
from hooked.processing import changes_activations, unprocessed
from hooked.rows import Rows, running_rows
from hooked.tokenizer import HookedTokenizer

ModelInput = str | list[str] | Int[Tensor, "batch pos"] | Int[Tensor, " pos"]
ReturnType = Literal["logits", "loss", "both", None]
NO_ATTN_IN = (
    "hooked has no hook_attn_in: attention reads the normalised blocks.{i}.hook_resid_pre; hook"
    " blocks.{i}.ln1.hook_normalized to change what attention alone sees"
)


class DecoderBlock(nn.Module):
    """A block as its two halves (the module docstring): `attn_half(resid_pre, *inputs, kv=...)` -> resid_mid and
    `mlp_half(resid_mid)` -> resid_post, so a forward can stop or resume between them. Every family's block is one."""

    def forward(self, resid_pre: Tensor, *inputs, kv: LayerKV | None = None) -> Tensor:
        return self.mlp_half(self.attn_half(resid_pre, *inputs, kv=kv))


class HookedTransformer(BuildingMethods, TokenMethods, WeightStacks, HookedRootModule, metaclass=BuildsFromConfig):
    """Base of every model. Subclasses set `config_class`, `architectures`, `embedding_hook_names`."""

    config_class: ClassVar[type]
    family: ClassVar[str]  # the Hugging Face model_type: hooked.testing.random_model(family), the docs
    # hooked.testing's random models: default config sizes, hypothesis draws (`draw_sizes`), and parameters
    # drawn wider than the usual N(0, 0.2), by name suffix (a router, so top-k is decided by margins).
    random_sizes: ClassVar[dict]
    random_std: ClassVar[dict[str, float]] = {}
    transformer_lens_names: ClassVar[dict[str, tuple[str, ...]]] = {}  # TransformerLens' official names -> aliases
    hook_docs: ClassVar[dict[str, str]] = {}  # the family's own hook meanings, for docs/hooks-reference.md
    title: ClassVar[str] = ""  # how the docs name the family ("GPT-2"; default the class name)
    docs_sizes: ClassVar[dict] = {}  # random_model sizes of the reference page's model (default random_sizes)
    architectures: ClassVar[tuple[str, ...]]  # config.json "architectures" / "model_type" it serves
    embedding_hook_names: ClassVar[tuple[str, ...]]  # the hooks whose sum is resid_pre of block 0
    # GPT-2, Qwen3 and Qwen3-MoE never edit a hooked tensor in place (HookedRootModule.edits_hooked_tensors;
    # tests/core/test_cache.py checks each point after the forward). A new architecture must keep it so, or set True.
    edits_hooked_tensors: ClassVar[bool] = False
    # `model.generate`'s defaults where the caller leaves them out. hooked's own models (`hooked.load`) decode
    # greedily and quietly; a model built the TransformerLens way (`HookedTransformer.from_pretrained`,
    # `from_pretrained_no_processing`, `HookedTransformer(cfg)`) samples and shows a progress bar, as
    # TransformerLens 3.9's `generate` does (hooked.models.building.TRANSFORMER_LENS_GENERATE).
    generate_defaults: dict = {}

    # The checkpoint's layout, read by hooked.weights: key pattern -> parameter name, without the unembedding,
    # which `checkpoint_renames` adds when the config unties it; a tied checkpoint may still carry lm_head.weight
    # (a copy of the embedding), ignored then, with `checkpoint_extra_ignored`. `checkpoint_stacked`: per-expert
    # keys -> one stacked parameter (Qwen3-MoE, Mixtral). GPT-2 and GPT-NeoX declare their own renames.
    checkpoint_table: ClassVar[tuple[tuple[str, str], ...]] = ()
    checkpoint_extra_ignored: ClassVar[tuple[str, ...]] = ()
    checkpoint_stacked: ClassVar[tuple[tuple, ...]] = ()

    @property
    def checkpoint_renames(self) -> tuple[tuple[str, str], ...]:
        head = () if self.cfg.tie_word_embeddings else ((r"lm_head\.weight", r"lm_head.weight"),)
        return self.checkpoint_table + head

    @property
    def checkpoint_ignored(self) -> tuple[str, ...]:
        return self.checkpoint_extra_ignored + ((r"lm_head\.weight",) if self.cfg.tie_word_embeddings else ())

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        cfg._bind(self)
        self.tokenizer: HookedTokenizer | None = None
        self.name_or_path: str | None = None  # the hub id or directory it was loaded from
        # Set by `hooked.load(..., tp=N)`: this process's place in its tensor- and data-parallel
        # groups (hooked.distributed.Parallel); None for a model in one process.
        self.parallel = None
        # The unembedding's own weights when it is not the embedding (an untied checkpoint, or after weight
        # processing, which changes W_E and W_U differently); None while tied. Set by the architecture.
        self.lm_head: nn.Linear | None = None
        # TransformerLens' weight processing applied to this model (hooked.processing): flag -> done.
        self.processing: dict[str, bool] = unprocessed()
        if (
            cfg.use_hook_tokens
        ):  # declared first: it fires first (TransformerLens 3.9, HookedTransformer.input_to_embed)
            self.hook_tokens = HookPoint("batch pos")  # the token ids; a hook may replace them (token_ids)

    @property
    def unembed_weight(self) -> Float[Tensor, "d_vocab d_model"]:
        """The unembedding: the token embedding while tied, `lm_head`'s own weight once untied (an untied checkpoint,
        or after weight processing, which changes W_E and W_U differently)."""
        return self.token_embedding_weight if self.lm_head is None else self.lm_head.weight

    @property
    def token_embedding_weight(self) -> Tensor:
        """The token embedding parameter [d_vocab d_model] itself: `W_E`, unless the model derives `W_E` from it
        (Gemma's W_E is the table times sqrt(d_model)). Tensor parallelism finds the table to cut by it."""
        return self.W_E

    def setup_hooks(self) -> None:
        super().setup_hooks()
        self._record_stages()
        self.set_use_split_qkv_input(False)  # as TransformerLens: a default cache leaves these out
        self.set_use_attn_result(False)
        self.set_use_hook_mlp_in(False)

    # ----------------------------------------------------------------- what a default cache keeps
    # TransformerLens' switches. Each is answered: a no-op where hooked already behaves so, an error
    # naming the hooked way where it has no such hook point.
    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """TransformerLens' switch for `blocks.{i}.attn.hook_result` ([batch pos head_index d_model]).

        The point always exists and is computed whenever a hook listens to it; the switch decides only
        whether `run_with_cache()` without a names_filter keeps it (off by default, as TransformerLens':
        it is n_heads copies of the residual stream per layer, and `cache.stack_head_results` computes
        it from `hook_z` when it is absent)."""
        for block in self.blocks:
            block.attn.hook_result.cached_by_default = bool(use_attn_result)

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """TransformerLens' switch for `blocks.{i}.hook_q_input` / `hook_k_input` / `hook_v_input`.

        Those points always exist here and are computed whenever a hook listens to them
        (`hooked.layers.attention_input`); the switch decides only whether `run_with_cache()` without a
        names_filter keeps them.
        """
        for block in self.blocks:
            for point in (block.hook_q_input, block.hook_k_input, block.hook_v_input):
                point.cached_by_default = bool(use_split_qkv_input)

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """TransformerLens' switch for `blocks.{i}.hook_mlp_in`: computed whenever a hook listens; on, a
        `run_with_cache()` without a names_filter keeps it too."""
        if use_hook_mlp_in and any(block.mlp is None for block in self.blocks):
            raise ValueError("this model is attention-only (cfg.attn_only): its blocks have no MLP, so no hook_mlp_in")
        for block in self.blocks:
            if block.mlp is not None:
                block.hook_mlp_in.cached_by_default = bool(use_hook_mlp_in)

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        if use_attn_in:
            raise ValueError(NO_ATTN_IN)

    def _check_name(self, name: str) -> str:
        # TransformerLens 3.9 refuses `hook_attn_in` with an assert until `set_use_attn_in(True)`; here it never
        # exists, and the error is both a KeyError and the AssertionError that TransformerLens code catches.
        if isinstance(name, str) and name.endswith("hook_attn_in") and name not in self.hook_dict:
            raise AssertionKeyError(f"{name!r} is not a hook point: {NO_ATTN_IN}")
        return super()._check_name(name)

    def set_ungroup_grouped_query_attention(self, ungroup_grouped_query_attention: bool) -> None:
        if ungroup_grouped_query_attention:
            raise ValueError(
                "hooked keeps grouped k/v heads (kv_head_index); head h reads k/v head h // (n_heads // n_kv_heads)"
            )

    @classmethod
    def draw_sizes(cls, draw, st, n_layers: int, n_heads: int) -> dict:
        """Config fields of a hypothesis-drawn random model (hooked.testing.models), given its layers and
        heads; `st` is hypothesis.strategies (passed in: model files do not import hypothesis)."""
        raise NotImplementedError(f"{cls.__name__} declares no draw_sizes")

    def _record_stages(self) -> None:
        """Record on every hook point the first stage of the forward that fires it (read by hooked.sweep):
        -1 the embedding, 2L / 2L+1 the attention / MLP half of block L (the block class declares which of
        its children `mlp_half` computes, `mlp_stage`), 2 * n_layers the final norm."""
        for point in self.hook_dict.values():
            point.stage = EMBED_STAGE
        for layer, block in enumerate(self.blocks):
            mlp_stage = getattr(type(block), "mlp_stage", None)
            if mlp_stage is None:
                raise TypeError(
                    f"{type(block).__name__} declares no `mlp_stage` (the children its mlp_half computes): "
                    "see docs/adding-a-model.md"
                )
            for child_name, child in block.named_children():
                for module in child.modules():
                    if isinstance(module, HookPoint):
                        module.stage = 2 * layer + int(child_name in mlp_stage)
        for module in self.ln_final.modules():
            if isinstance(module, HookPoint):
                module.stage = 2 * len(self.blocks)

    @property
    def tensor_parallel(self) -> bool:
        """Whether this process holds a shard of the model (loaded with tp > 1)."""
        return self.parallel is not None and self.parallel.tp_size > 1

    def __setstate__(self, state: dict) -> None:  # unpickled or deep-copied: the config points at this model
        super().__setstate__(state)
        self.cfg._bind(self)

    @property
    def default_prepend_bos(self) -> bool:
        """Whether text gets a BOS token when `prepend_bos` is not given: `cfg.default_prepend_bos`."""
        return self.cfg.default_prepend_bos

    # ----------------------------------------------------------------- forward
    def forward(
        self,
        input: ModelInput | Float[Tensor, "batch pos d_model"],  # the residual stream with start_at_layer
        *,
        attention_mask: Tensor | None = None,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        return_type: ReturnType = "logits",
        loss_per_token: bool = False,
        past_kv_cache: KVCache | None = None,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
        tokens: Tensor | None = None,
    ):
        """Logits [batch pos d_vocab] for token ids ([batch pos] or [pos]) or text (str or list of str).

        Text is tokenized with left padding (`padding_side="right"`, or a tokenizer whose `padding_side` is
        "right", pads after each prompt); token ids may come with an `attention_mask` (True or 1 = real
        token), else their padding is read from the ids on that side (`HookedTokenizer.mask_for`).
        Position ids are derived from the mask, so a padded row gives the same result as the prompt alone.
        `return_type="loss"` gives the mean next-token cross-entropy
        over real tokens (with `loss_per_token=True`, [batch pos-1] with 0 where the target or the
        predicting token is padding, as TransformerLens); `"both"` gives (logits, loss).

        `past_kv_cache` (a `hooked.KVCache`) continues a sequence: the input's columns attend to every
        column the cache holds and are then kept in it; their positions follow on from it. Only the
        first call's ids are read for leading padding; a continuation's tokens are real unless an
        `attention_mask` says otherwise.

        `start_at_layer` / `stop_at_layer` run `blocks[start_at_layer:stop_at_layer]` only, as TransformerLens:
        with `start_at_layer` the input is the residual stream [batch pos d_model] entering that block (an
        `attention_mask` marks its padding; `tokens` are needed for a loss), and with `stop_at_layer` the
        residual stream leaving the last block run is returned, before the final norm, whatever `return_type`.
        """
        if return_type not in ("logits", "loss", "both", None):
            raise ValueError(f"return_type must be 'logits', 'loss', 'both' or None, not {return_type!r}")
        if start_at_layer is not None or stop_at_layer is not None:
            if past_kv_cache is not None:
                raise ValueError("start_at_layer / stop_at_layer cannot be combined with past_kv_cache")
            return self._forward_layers(
                input,
                start_at_layer,
                stop_at_layer,
                attention_mask,
                prepend_bos,
                return_type,
                loss_per_token,
                tokens,
                padding_side,
            )
        if tokens is not None:
            raise ValueError("tokens= is for the loss of a forward with start_at_layer; pass the ids as the input")
        if past_kv_cache is not None and len(past_kv_cache):
            if prepend_bos is None:
                prepend_bos = False  # a continuation: no BOS in the middle of a sequence
            if attention_mask is None and isinstance(input, Tensor):
                attention_mask = torch.ones(input.shape, dtype=torch.bool, device=input.device)
        tokens, key_valid = self.tokens_and_mask(input, attention_mask, prepend_bos, padding_side)
        # tokens: after any hook on hook_tokens, the loss's targets (as TransformerLens 3.9 forward)
        if past_kv_cache is not None:
            logits, tokens = self._forward_cached(tokens, key_valid, past_kv_cache, with_ids=True)
        else:
            logits, tokens = self._forward_whole(tokens, key_valid, with_ids=True)
        if return_type in ("logits", None):
            return logits if return_type else None
        loss = self.loss(logits, tokens, key_valid, per_token=loss_per_token)
        return loss if return_type == "loss" else (logits, loss)

    def _forward_whole(
        self,
        tokens: Tensor,
        key_valid: Tensor | None,
        lengths: Tensor | None = None,
        last_only: bool = False,
        with_ids: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """One forward over every column of `tokens` (no KV cache); `lengths` as `Rows.lengths`. `with_ids`: also
        the ids embedded (`token_ids`: after hook_tokens)."""
        position_ids = position_ids_for(tokens, key_valid)
        mask = AttentionMask(key_valid, tokens.shape[1], tokens.shape[1])
        with running_rows(Rows(position_ids, key_valid, 0, lengths)):
            tokens = self.token_ids(tokens)
            logits = self.forward_tokens(tokens, position_ids, mask, last_only=last_only)
        return (logits, tokens) if with_ids else logits

    def _forward_layers(
        self,
        input,
        start_at_layer: int | None,
        stop_at_layer: int | None,
        attention_mask: Tensor | None,
        prepend_bos: bool | None,
        return_type: ReturnType,
        loss_per_token: bool,
        tokens: Tensor | None,
        padding_side: str | None = None,
    ):
        """`forward` over `blocks[start_at_layer:stop_at_layer]` (TransformerLens' slicing, negative indices too)."""
        if self.tensor_parallel and start_at_layer is not None:
            raise ValueError("start_at_layer is not supported under tensor parallelism (tp > 1); stop_at_layer is")
        if start_at_layer is None:
            if tokens is not None:
                raise ValueError("tokens= is for the loss of a forward with start_at_layer; pass the ids as the input")
            tokens, key_valid = self.tokens_and_mask(input, attention_mask, prepend_bos, padding_side)
            resid = None
        else:
            if (
                not isinstance(input, Tensor)
                or not input.is_floating_point()
                or input.ndim != 3
                or input.shape[-1] != self.cfg.d_model
            ):
                raise ValueError(
                    f"with start_at_layer the input is the residual stream [batch pos d_model={self.cfg.d_model}],"
                    f" not {tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__}"
                )
            resid, key_valid = input, None
            if attention_mask is not None:
                if attention_mask.shape != input.shape[:2]:
                    raise ValueError(
                        f"attention_mask has shape {tuple(attention_mask.shape)} but the residual stream"
                        f" has [batch pos] = {tuple(input.shape[:2])}"
                    )
                key_valid = (
                    None if bool(attention_mask.all()) else attention_mask.to(device=input.device, dtype=torch.bool)
                )
            if return_type in ("loss", "both") and stop_at_layer is None and tokens is None:
                raise ValueError(
                    "return_type='loss' or 'both' with start_at_layer needs tokens= (the ids, for the targets)"
                )
        batch_pos = (resid if resid is not None else tokens).shape[:2]
        position_ids = position_ids_for(torch.empty(batch_pos, device=self.device), key_valid)
        mask = AttentionMask(key_valid, batch_pos[1], batch_pos[1])
        with running_rows(Rows(position_ids, key_valid, 0, None)):
            if resid is None:
                tokens = self.token_ids(tokens)
                resid = self.resid_from_tokens(tokens, position_ids)
            inputs = self.block_inputs(position_ids, mask, resid.dtype)
            for block in self.blocks[start_at_layer:stop_at_layer]:
                resid = block(resid, *inputs)
            if stop_at_layer is not None:
                return resid
            logits = self.logits_from_resid(resid)
        if return_type in ("logits", None):
            return logits if return_type else None
        loss = self.loss(logits, tokens.to(logits.device), key_valid, per_token=loss_per_token)
        return loss if return_type == "loss" else (logits, loss)

    def _forward_cached(
        self, tokens: Tensor, key_valid: Tensor | None, cache: KVCache, last_only: bool = False, with_ids: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """One call on a KV cache: logits of the new columns (the last one alone with `last_only`); `with_ids`
        also the ids embedded (after hook_tokens)."""
        position_ids, mask, rows = cache.begin(tokens, key_valid)
        try:
            with running_rows(rows):
                tokens = self.token_ids(tokens)
                logits = self.forward_tokens(tokens, position_ids, mask, cache, last_only)
        except BaseException:
            cache.abandon()
            raise
        cache.commit()
        return (logits, tokens) if with_ids else logits

    def token_ids(self, tokens: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
        """`hook_tokens` (with `cfg.use_hook_tokens`): the ids a forward embeds, after any hook on them.

        Every path from ids to the embedding calls this once, inside the forward's rows (hooks read positions):
        a forward (whose loss then reads the hook's ids as targets, as TransformerLens 3.9
        `HookedTransformer.forward`), each generation step (the new ids with a KV cache) and
        `model.embed(tokens, position_ids)` (sweeps). A hook gets a copy, so an in-place edit never changes
        the caller's tensor; its ids must be in the vocabulary.
        """
        if not self.cfg.use_hook_tokens or not self.hook_tokens.listening:
            return tokens
        tokens = self.hook_tokens(tokens.clone())  # HookPoint refuses another shape, dtype or device
        low, high = (int(x) for x in torch.aminmax(tokens))
        if low < 0 or high >= self.cfg.d_vocab:
            raise ValueError(
                f"a hook on hook_tokens returned token id {high if high >= self.cfg.d_vocab else low}, out of"
                f" range for this model's vocabulary of {self.cfg.d_vocab} (ids 0..{self.cfg.d_vocab - 1})"
            )
        return tokens

    def forward_tokens(
        self,
        tokens: Tensor,
        position_ids: Tensor,
        mask: AttentionMask,
        kv: KVCache | None = None,
        last_only: bool = False,
    ) -> Float[Tensor, "batch pos d_vocab"]:
        """The forward from token ids; with `kv`, each block's attention also reads and extends the cache.
        `last_only` unembeds the last column alone (what a decode step needs)."""
        resid = self.resid_from_tokens(tokens, position_ids)
        inputs = self.block_inputs(position_ids, mask, resid.dtype)
        for index, block in enumerate(self.blocks):
            resid = block(resid, *inputs, kv=None if kv is None else kv.layer(index))
        if not last_only:
            return self.logits_from_resid(resid)
        final_norm_hooked = any(point.listening for point in (self.ln_final.hook_scale, self.ln_final.hook_normalized))
        return self.logits_from_resid(resid if final_norm_hooked else resid[:, -1:])[
            :, -1:
        ]  # hooks there see every column

    def logits_from_resid(self, resid: Float[Tensor, "batch pos d_model"], columns: Tensor | None = None) -> Tensor:
        """Final norm, then the unembedding; `columns` (token ids) computes only those logits."""
        if self.tensor_parallel:  # this rank holds some vocabulary rows: hooked.distributed
            from hooked.distributed import vocab_parallel_logits

            return vocab_parallel_logits(
                self.parallel, self.ln_final(resid), self.unembed_weight, self.cfg.d_vocab, columns
            )
        weight, bias = self.unembed_weight, self.unembed_bias
        if columns is not None:
            weight, bias = weight[columns], None if bias is None else bias[columns]
        return F.linear(self.ln_final(resid), weight, bias)

    @property
    def unembed_bias(self) -> Float[Tensor, " d_vocab"] | None:
        """The unembedding's bias, b_U: None, except after weight processing folded LayerNorm's bias into it."""
        return None if self.lm_head is None else self.lm_head.bias

    def untie_unembedding(self, bias: bool = False) -> None:
        """Give the unembedding weights of its own, a copy of the tied embedding (and with `bias`, a zero
        bias): weight processing changes W_E and W_U differently, as TransformerLens keeps them apart."""
        if self.lm_head is None:
            weight = self.unembed_weight
            head = nn.Linear(self.cfg.d_model, self.cfg.d_vocab, bias=False, device="meta")
            head.weight = nn.Parameter(weight.detach().clone(), requires_grad=weight.requires_grad)
            self.lm_head = head
        if bias and self.lm_head.bias is None:
            weight = self.lm_head.weight
            self.lm_head.bias = nn.Parameter(weight.new_zeros(weight.shape[0]), requires_grad=weight.requires_grad)

    def _unembed_rows(self, tokens: Tensor) -> Tensor:
        """Rows `tokens` of the unembedding, [..., d_model] (whole rows on every rank under tensor parallelism)."""
        if self.tensor_parallel:
            from hooked.distributed import vocab_rows

            return vocab_rows(self.parallel, self.unembed_weight, self.parallel.vocab_start(self.cfg.d_vocab), tokens)
        return self.unembed_weight[tokens]

    def loss_fn(
        self,
        logits: Float[Tensor, "batch pos d_vocab"],
        tokens: Int[Tensor, "batch pos"],
        attention_mask: Tensor | None = None,
        per_token: bool = False,
    ) -> Tensor:
        """TransformerLens' `model.loss_fn`: `utils.lm_cross_entropy_loss` of the logits against the ids."""
        return lm_cross_entropy_loss(logits, tokens.to(logits.device), attention_mask, per_token)

    @staticmethod
    def loss(logits: Tensor, tokens: Tensor, key_valid: Tensor | None = None, per_token: bool = False) -> Tensor:
        """Mean next-token cross-entropy, in float32, over positions whose target is a real token
        (`per_token`: [batch pos-1], 0 where the target or the predicting token is padding)."""
        log_probs = F.log_softmax(logits[:, :-1].float(), dim=-1)
        per_position = -log_probs.gather(-1, tokens[:, 1:, None])[..., 0]
        if key_valid is None:
            return per_position if per_token else per_position.mean()
        weights = (key_valid[:, 1:] & key_valid[:, :-1]).float()
        return per_position * weights if per_token else (per_position * weights).sum() / weights.sum()

    def tokens_and_mask(
        self,
        input: ModelInput,
        attention_mask: Tensor | None,
        prepend_bos: bool | None,
        padding_side: str | None = None,
    ):
        """Token ids [batch pos] on the model's device and the key mask (None when unpadded), checked.
        `padding_side` (default: the tokenizer's) is where text is padded and where ids' padding is read.

        Under tensor parallelism the ranks of a group then agree: if one rank's input was bad, every
        rank raises; if their inputs differ, every rank raises (hooked.distributed).
        """
        if not self.tensor_parallel:
            return self._tokens_and_mask_checked(input, attention_mask, prepend_bos, padding_side)
        error, result, fingerprint = None, None, None
        try:
            result = self._tokens_and_mask_checked(input, attention_mask, prepend_bos, padding_side)
            tokens, key_valid = result
            weights = torch.arange(1, tokens.numel() + 1, device=tokens.device).view_as(tokens)
            hooked_points = tuple(name for name, point in self.hook_dict.items() if point.listening)
            fingerprint = (
                tuple(tokens.shape),
                int((tokens * weights).sum()),
                None if key_valid is None else int((key_valid * weights).sum()),
                hooked_points,
            )
        except Exception as caught:
            error = caught
        self.parallel.agree(error, fingerprint, "a forward (tokens, mask and hooked points)")
        return result

    def _tokens_and_mask_checked(
        self,
        input: ModelInput,
        attention_mask: Tensor | None,
        prepend_bos: bool | None,
        padding_side: str | None = None,
    ):
        device = self.device
        if padding_side is not None:
            HookedTokenizer._check_padding_side(padding_side)
        if isinstance(input, str) or (isinstance(input, list) and input and all(isinstance(s, str) for s in input)):
            if attention_mask is not None:
                raise ValueError("attention_mask is derived from text inputs; pass it only with token ids")
            tokens, key_valid = self._tokenize(input, prepend_bos, padding_side=padding_side)
            tokens, key_valid = tokens.to(device), key_valid.to(device)
        elif isinstance(input, Tensor):
            tokens = input
            if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.is_complex():
                raise TypeError(f"token ids must be an integer tensor, got {tokens.dtype}")
            if tokens.ndim == 1:
                tokens = tokens[None]
            if tokens.ndim != 2:
                raise ValueError(f"token ids must be [batch pos] or [pos], got shape {tuple(input.shape)}")
            key_valid = self.padding_mask(tokens, attention_mask, prepend_bos, padding_side)
            key_valid = None if key_valid is None else key_valid.to(device)
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

    def processing_changes(self, flag: str, point: str) -> bool:
        """Whether TransformerLens' weight-processing flag `flag` changes the activation at hook point `point`
        (hooked.processing.CHANGED_POINTS): fold_ln changes `mlp.hook_in` alone. A dictionary trained with other
        processing than this model's is refused only where it reads or writes such a point."""
        return changes_activations(flag, point)

    def name_agreement(self, recorded: str) -> str:
        """Whether this model is the one a file's `model_name` records: "same", "other", "other directory" (loaded
        from a directory, whose name need not be the model's) or "unknown" (hooked.weights.sources.name_agreement)."""
        from hooked.weights.sources import name_agreement  # the weights' loader imports the models

        return name_agreement(self.name_or_path, recorded)

    def padding_mask(
        self,
        tokens: Int[Tensor, "batch pos"],
        attention_mask: Tensor | None = None,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
    ) -> Bool[Tensor, "batch pos"] | None:
        """The mask of token ids (True = real token; None: nothing is padding), on the ids' device: the one
        padding rule of every entry point that takes ids (the forward and what runs it, `hooked.sae.train`,
        `hooked.graphs.attribute_batch`), so one tensor reads alike everywhere (docs/hooks.md, "Inputs,
        padding and BOS").

        `attention_mask` ([batch pos] or [pos]; 1 = real token) is taken as given; without it the padding is
        read from the ids (`HookedTokenizer.mask_for`: each row's leading pad ids, or trailing ones where
        `padding_side`, default the tokenizer's, is "right"; the last of a leading run is the BOS where BOS is
        the pad id and `prepend_bos`, default `default_prepend_bos`), and ids that cannot say which of their
        ids are padding are refused, naming the fix.
        """
        if attention_mask is None:
            if self.tokenizer is None:
                return None
            prepend_bos = self.default_prepend_bos if prepend_bos is None else prepend_bos
            mask = self.tokenizer.mask_for(tokens, prepend_bos, padding_side=padding_side)
        else:
            mask = attention_mask[None] if attention_mask.ndim == 1 else attention_mask
            if mask.shape != tokens.shape:
                raise ValueError(
                    f"attention_mask has shape {tuple(attention_mask.shape)} but the tokens have {tuple(tokens.shape)}"
                )
        if mask is None or bool(mask.all()):
            return None
        mask = mask.to(device=tokens.device, dtype=torch.bool)
        if not bool(mask.any(-1).all()):
            raise ValueError("attention_mask has a row with no real token; remove that row")
        return mask

    def _check_tokens(self, tokens: Tensor) -> None:
        if tokens.numel() == 0:
            raise ValueError(f"empty input (token ids of shape {tuple(tokens.shape)}): give at least one token")
        low, high = (int(x) for x in torch.aminmax(tokens))  # one reduction, one device sync
        if low < 0 or high >= self.cfg.d_vocab:
            bad = high if high >= self.cfg.d_vocab else low
            raise ValueError(
                f"token id {bad} is out of range for this model's vocabulary of {self.cfg.d_vocab} (ids "
                f"0..{self.cfg.d_vocab - 1})"
            )
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
    def run_with_cache(self, *model_args, **kwargs) -> tuple[Tensor | tuple[Tensor, Tensor] | None, ActivationCache]:
        """Run once and keep activations: `logits, cache = model.run_with_cache(tokens)`.

        Keyword options as TransformerLens: names_filter (name, list or filter function), device,
        remove_batch_dim, incl_bwd (needs return_type="loss"), pos_slice; and `sparse` (names kept as sparse
        tensors) and `stop_after` (names after which the forward ends: hooked/cache.py). Everything else goes to the
        forward.
        """
        return run_with_cache(self, *model_args, **kwargs)

    # ----------------------------------------------------------------- sparse dictionaries (hooked/sae/splice.py)
    def saes(self, saes=(), use_error_term: bool | None = None):
        """SAELens' `with model.saes(saes=[sae]):` splice dictionaries for the block (docs/saes.md)."""
        from hooked.sae.splice import saes as splice

        return splice(self, saes, use_error_term=use_error_term)

    def run_with_saes(self, *model_args, saes=(), use_error_term: bool | None = None, **kwargs):
        """SAELens' `run_with_saes`: the forward with `saes` spliced for this call."""
        from hooked.sae.splice import run_with_saes

        return run_with_saes(self, *model_args, saes=saes, use_error_term=use_error_term, **kwargs)

    def run_with_cache_with_saes(
        self, *model_args, saes=(), use_error_term: bool | None = None, sparse_features: bool = False, **kwargs
    ):
        """SAELens' `run_with_cache_with_saes`: `run_with_cache` with `saes` spliced for this call
        (`sparse_features=True`: their `hook_sae_acts_post` kept as sparse tensors, hooked/sae/splice.py)."""
        from hooked.sae.splice import run_with_cache_with_saes

        return run_with_cache_with_saes(
            self, *model_args, saes=saes, use_error_term=use_error_term, sparse_features=sparse_features, **kwargs
        )

    def run_with_hooks_with_saes(
        self, *model_args, saes=(), fwd_hooks=(), bwd_hooks=(), use_error_term: bool | None = None, **kwargs
    ):
        """SAELens' `run_with_hooks_with_saes`: `run_with_hooks` with `saes` spliced for this call, so the hooks
        may name their points (hooked/sae/splice.py)."""
        from hooked.sae.splice import run_with_hooks_with_saes

        hooks = {"fwd_hooks": fwd_hooks, "bwd_hooks": bwd_hooks}
        return run_with_hooks_with_saes(self, *model_args, saes=saes, use_error_term=use_error_term, **hooks, **kwargs)

    def add_sae(self, sae, use_error_term: bool | None = None) -> None:
        """SAELens' `add_sae`: splice `sae` until `reset_saes()`."""
        from hooked.sae.splice import add_sae

        add_sae(self, sae, use_error_term=use_error_term)

    def reset_saes(self, saes=None) -> None:
        """SAELens' `reset_saes`: take out what `add_sae` spliced (all, or those in `saes`)."""
        from hooked.sae.splice import reset_saes

        reset_saes(self, saes)

    def generate(self, input="", max_new_tokens: int = 10, **kwargs):
        """Continue `input` by `max_new_tokens` tokens with a KV cache; hooks fire on the prompt and every step.

        `input` is text (str or list of str, left-padded), or token ids [batch pos] / [pos] with an
        optional `attention_mask`. Keyword arguments: `do_sample` (greedy unless True; a model built the
        TransformerLens way samples unless told otherwise: `generate_defaults`), `temperature`, `top_k`,
        `top_p`, `seed`, `freq_penalty`, `stop_at_eos` (finished rows are filled with the end-of-sequence
        token; generation stops when every row has finished), `eos_token_id`, `return_type` ("input": text
        for text, ids for ids; "tokens"; "str"), `verbose` (a progress bar), `prepend_bos`, `fwd_hooks`
        (hooks for this call only, as run_with_hooks), `use_past_kv_cache` (False: a full forward per step),
        and `return_cache=True` (with `names_filter`), which also returns an `ActivationCache` of every
        prompt and generated position, equal to one forward over the final sequence.
        See `hooked.generation` and docs/generation.md.
        """
        from hooked.generation import generate

        return generate(self, input, max_new_tokens, **{**self.generate_defaults, **kwargs})

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> Tensor:
        """Output biases written to the residual stream before block `layer` ([d_model]), as TransformerLens."""
        return accumulated_bias(self, layer, mlp_input, include_mlp_biases)

    def hook_shapes(self, batch: int = 1, pos: int = 8) -> dict[str, tuple[int, ...]]:
        """Every hook name with its shape for an input of [batch pos], from the declared axes."""
        sizes = {"batch": batch, "pos": pos, "query_pos": pos, "key_pos": pos, "1": 1, **self.axis_sizes()}
        return {
            name: tuple({**sizes, **point.sizes}[axis] for axis in point.axes) for name, point in self.hook_dict.items()
        }

    def axis_sizes(self, point: str | None = None) -> dict[str, int]:
        """The size of every axis this model's hook points have, but batch and positions: {"d_model": 768, ...},
        as its config declares them (`ModelConfig.axis_fields`). With a hook name, also the sizes that point
        alone knows (a spliced dictionary's `d_sae`, hooked.sae)."""
        sizes = {axis: getattr(self.cfg, name) for axis, name in self.cfg.axis_fields.items()}
        if point is not None and point in self.hook_dict:
            sizes.update(self.hook_dict[point].sizes)
        return sizes

    # ----------------------------------------------------------------- tokenization


def lm_cross_entropy_loss(
    logits: Float[Tensor, "batch pos d_vocab"],
    tokens: Int[Tensor, "batch pos"],
    attention_mask: Tensor | None = None,
    per_token: bool = False,
) -> Tensor:
    """Next-token cross-entropy: the mean over predicted positions, or [batch pos-1] with `per_token`.

    With `attention_mask`, positions whose token or next token is padding count as 0 and are left
    out of the mean, as TransformerLens does.
    """
    log_probs = F.log_softmax(logits, dim=-1)
    predicted = log_probs[..., :-1, :].gather(-1, tokens[..., 1:, None])[..., 0]  # [batch pos-1]
    if attention_mask is not None:
        if attention_mask.shape != tokens.shape:
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)} but the tokens have {tuple(tokens.shape)}"
            )
        attention_mask = attention_mask.bool()
        next_token_mask = attention_mask[:, :-1] & attention_mask[:, 1:]
        predicted = predicted.masked_fill(~next_token_mask, 0.0)
        n_tokens = next_token_mask.sum().item()
    else:
        n_tokens = predicted.numel()
    return -predicted if per_token else -predicted.sum() / n_tokens
