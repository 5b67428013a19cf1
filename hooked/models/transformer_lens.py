"""TransformerLens' loading and switches on every model: `HookedTransformer.from_pretrained` (processed, as
TransformerLens' default), `from_pretrained_no_processing`, `process_weights_` and the `set_use_*` switches.
A mixin of `HookedTransformer` (hooked/models/base.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hooked.processing import process_weights
from hooked.tokenizer import HookedTokenizer

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

# TransformerLens 3.9's HookedTransformer.generate defaults, taken by a model built the TransformerLens way.
TRANSFORMER_LENS_GENERATE = {"do_sample": True, "verbose": True}


class TransformerLensMethods:
    # ----------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        refactor_factored_attn_matrices: bool = False,
        checkpoint_index: int | None = None,
        checkpoint_value: int | None = None,
        hf_model=None,
        device: torch.device | str | None = None,
        n_devices: int = 1,
        tokenizer=None,
        move_to_device: bool = True,
        fold_value_biases: bool = True,
        default_prepend_bos: bool | None = None,
        default_padding_side: str = "left",
        dtype: torch.dtype | str = torch.float32,
        first_n_layers: int | None = None,
        **from_pretrained_kwargs,
    ) -> "HookedTransformer":
        """Load from a local directory, a hub id or a TransformerLens model name, processed as TransformerLens does.

        Takes TransformerLens 3.9's keyword arguments with its defaults: the norms are folded into the
        next weights, the writing weights and the unembedding centred, the value biases folded
        (`hooked.processing`; `from_pretrained_no_processing` or `hooked.load` keep the checkpoint's own
        weights). Every other argument is either honoured or refused; none is ignored. On the base class
        the architecture is read from config.json, as `hooked.load`.

            model = hooked.HookedTransformer.from_pretrained("gpt2-small")   # hub id "gpt2"
        """
        from hooked.weights import load_model

        refused = {"checkpoint_index": checkpoint_index, "checkpoint_value": checkpoint_value, "hf_model": hf_model,
                   "tokenizer": tokenizer, "first_n_layers": first_n_layers}
        refused = [name for name, value in refused.items() if value is not None]
        if n_devices != 1:
            refused.append("n_devices")
        if not move_to_device:
            refused.append("move_to_device=False")
        refused += list(from_pretrained_kwargs)
        if refused:
            raise ValueError(
                f"hooked.HookedTransformer.from_pretrained does not support {', '.join(refused)}; it reads the"
                " checkpoint's own safetensors and tokenizer files onto one device (see docs/hooks.md)"
                + ("; to split a model over several devices, run under torchrun and load it with hooked.load(path,"
                   " tp=N) (docs/scaling.md)" if n_devices != 1 else "")
            )
        HookedTokenizer._check_padding_side(default_padding_side)
        model_class = cls if getattr(cls, "config_class", None) is not None else None  # None: read config.json
        processing = dict(fold_ln=fold_ln, center_writing_weights=center_writing_weights, center_unembed=center_unembed,
                          fold_value_biases=fold_value_biases,
                          refactor_factored_attn_matrices=refactor_factored_attn_matrices)
        model = load_model(name_or_path, dtype=dtype, device=device or "cpu", model_class=model_class, processing=processing)
        if default_prepend_bos is not None:
            model.cfg.default_prepend_bos = default_prepend_bos
        if model.tokenizer is not None:
            model.tokenizer.padding_side = default_padding_side
        model.generate_defaults = dict(TRANSFORMER_LENS_GENERATE)
        return model

    @classmethod
    def from_pretrained_no_processing(cls, name_or_path: str | Path, **kwargs) -> "HookedTransformer":
        """TransformerLens' unprocessed load: `from_pretrained` with every processing flag False (the
        checkpoint's own weights, as `hooked.load` gives them)."""
        for name in ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases",
                     "refactor_factored_attn_matrices"):
            kwargs.setdefault(name, False)
        return cls.from_pretrained(name_or_path, **kwargs)

    def process_weights_(self, fold_ln: bool = True, center_writing_weights: bool = True, center_unembed: bool = True,
                         refactor_factored_attn_matrices: bool = False, fold_value_biases: bool = True) -> None:
        """Process this model's weights in place, as TransformerLens' `process_weights_` (its defaults; value
        biases are folded there too). See `hooked.processing.process_weights`; refused on a processed model."""
        process_weights(self, fold_ln=fold_ln, center_writing_weights=center_writing_weights, center_unembed=center_unembed,
                        fold_value_biases=fold_value_biases, refactor_factored_attn_matrices=refactor_factored_attn_matrices)

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
            raise ValueError(
                "hooked has no hook_attn_in: attention reads the normalised blocks.{i}.hook_resid_pre; hook"
                " blocks.{i}.ln1.hook_normalized to change what attention alone sees"
            )

    def set_ungroup_grouped_query_attention(self, ungroup_grouped_query_attention: bool) -> None:
        if ungroup_grouped_query_attention:
            raise ValueError(
                "hooked keeps grouped k/v heads (kv_head_index); head h reads k/v head h // (n_heads // n_kv_heads)"
            )
