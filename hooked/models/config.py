"""What every architecture's config shares (`ModelConfig`): fields fixed once the model is built, and
TransformerLens' names for them. Each family's config dataclass subclasses it (hooked/models/<family>.py)."""

from __future__ import annotations

import dataclasses
import operator
import weakref
from typing import TYPE_CHECKING, ClassVar

import torch

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

# The axes a mixture-of-experts family adds to `ModelConfig.axis_fields`: experts, the slots a token routes to,
# and each expert's MLP width.
EXPERT_AXIS_FIELDS = {"n_experts": "n_experts", "top_k": "top_k", "d_expert_mlp": "d_expert_mlp"}


def alias(field: str, doc: str | None = None) -> property:
    """A read-only property holding the config attribute `field` under another name, TransformerLens' for the
    same setting (`eps = alias("rms_norm_eps")`): the value is stored once, under hooked's name."""
    return property(operator.attrgetter(field), doc=doc or f"TransformerLens' name for `{field}`.")


class ModelConfig:
    """What every architecture's config dataclass shares: fields fixed once built, TransformerLens' names.

    A field cannot be reassigned, except `default_prepend_bos`, which TransformerLens notebooks set
    (`model.cfg.default_prepend_bos = False`) and which `to_tokens` and the forward then use.
    `device` and `tokenizer_name` are the model's, read through the model the config was built into.
    """

    settable_fields: ClassVar[tuple[str, ...]] = ("default_prepend_bos",)
    # TransformerLens' name: the logits are `cap * tanh(logits / cap)` when positive (Gemma 2's
    # final_logit_softcapping); -1.0 for none. Weight processing reads it (a shift of the logits is not
    # harmless under a cap).
    output_logits_soft_cap: ClassVar[float] = -1.0

    def __setattr__(self, name: str, value) -> None:
        if name not in self.__dataclass_fields__:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")
        if name in self.__dict__ and name not in self.settable_fields:
            raise dataclasses.FrozenInstanceError(
                f"cannot assign to field {name!r}: the architecture is fixed once the model is built;"
                f" only {', '.join(self.settable_fields)} can be set"
            )
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __getstate__(self) -> dict:  # the model link is a weakref, which cannot be pickled; the model rebinds
        return {k: v for k, v in self.__dict__.items() if k != "_model"}

    def _bind(self, model: HookedTransformer) -> None:
        object.__setattr__(self, "_model", weakref.ref(model))

    def _set_normalization_type(self, normalization_type: str) -> None:
        """Weight processing folded the norms' weights ("LNPre" / "RMSPre", TransformerLens' names): an
        attribute of this config alone, so a config copied with `dataclasses.replace` builds an unprocessed model."""
        object.__setattr__(self, "normalization_type", normalization_type)

    def set_use_hook_tokens(self, use_hook_tokens: bool) -> None:
        """TransformerLens' `use_hook_tokens`, read by the model built from this config (it declares
        `hook_tokens` only when True); set by `HookedTransformerConfig(use_hook_tokens=True)`."""
        object.__setattr__(self, "use_hook_tokens", bool(use_hook_tokens))

    def _bound_model(self) -> HookedTransformer:
        model = self.__dict__.get("_model")
        model = model() if model is not None else None
        if model is None:
            raise AttributeError("this config is not part of a model, so it has no device or tokenizer")
        return model

    @property
    def device(self) -> torch.device:
        """The device of the model's weights (TransformerLens keeps it on the config)."""
        return self._bound_model().device

    @property
    def tokenizer_name(self) -> str | None:
        """Where the model's tokenizer was read from (the hub id or directory it was loaded from; for a model built
        from a config, its tokenizer's `name_or_path`, e.g. TransformerLens' `tokenizer_name`)."""
        model = self._bound_model()
        if model.name_or_path is None and model.tokenizer is not None:
            return model.tokenizer.name_or_path or None
        return model.name_or_path

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's weights."""
        return self._bound_model().dtype

    @property
    def model_name(self) -> str:
        """TransformerLens' short name: the last part of the hub id or directory (`"Qwen3-0.6B"`), `"custom"`
        for a model built in memory."""
        name = self._bound_model().name_or_path
        return "custom" if name is None else str(name).rstrip("/").split("/")[-1]

    # TransformerLens' fields for options no hooked architecture takes: constants here.
    n_devices = 1  # one device per process (tensor parallelism: hooked.load(path, tp=N))
    attention_dir = "causal"
    attn_only = False
    parallel_attn_mlp = False
    use_hook_tokens = False  # True: the model has `hook_tokens` on the token ids (HookedTransformerConfig)

    transformer_lens_shape: ClassVar[str | None] = None  # the TransformerLens fields that pick this family, for errors

    # Axis -> the field that sizes it: `model.axis_sizes()`, which hook shapes, selector ranges and the component
    # kinds (hooked/interventions/kinds.py, counted along these axes) read. A family with more axes extends it.
    axis_fields: ClassVar[dict[str, str]] = {
        "d_model": "d_model",
        "head_index": "n_heads",
        "kv_head_index": "n_kv_heads",
        "d_head": "d_head",
        "d_mlp": "d_mlp",
        "d_vocab": "d_vocab",
    }

    @classmethod
    def from_transformer_lens(cls, tl: dict) -> tuple[ModelConfig | None, list[str] | None]:
        """This family's config from TransformerLens' `HookedTransformerConfig` fields (hooked.transformer_lens.config):
        (config, []) when `tl` describes this family; (None, problems) when it has this family's shape but
        fields it lacks, each named; (None, None) when it is not this family's shape."""
        return None, None

    def is_sparse(self, layer: int) -> bool:
        """Whether block `layer`'s MLP is a mixture of experts (a sparse family's config says which)."""
        return False

    d_vocab_out = alias("d_vocab")
    n_key_value_heads = alias("n_kv_heads")
