"""TransformerLens' `HookedTransformerConfig(...)` then `HookedTransformer(cfg)`: a randomly initialised model
of the family the config describes.

    cfg = hooked.HookedTransformerConfig(n_layers=2, d_model=64, d_head=16, n_ctx=32, d_vocab=100,
                                         act_fn="gelu_new", normalization_type="LN", seed=0)
    model = hooked.HookedTransformer(cfg)     # a hooked.GPT2, weights drawn as TransformerLens draws them

hooked implements architectures, not a configurable transformer, so a config is matched to one of them (each
family's config class declares the fields it takes, `from_transformer_lens`):

| TransformerLens fields | family |
|---|---|
| `normalization_type="LN"`, `positional_embedding_type="standard"`, `act_fn` `"gelu_new"`, `"gelu"` or `"relu"`, d_model = n_heads * d_head | `GPT2` |
| the same with `attn_only=True` (any `act_fn`: there is no MLP) | `GPT2` with attention-only blocks (no ln2, MLP or resid_mid, as TransformerLens 3.9's `TransformerBlock`) |
| `normalization_type="RMS"`, `positional_embedding_type="rotary"`, `act_fn="silu"`, `gated_mlp=True`, `use_qk_norm=True`, `final_rms=True` | `Qwen3` |
| the same with `use_qk_norm=False` | `Llama` |
| `normalization_type="LN"`, `positional_embedding_type="rotary"`, an even `rotary_dim`, `parallel_attn_mlp` either way | `GPTNeoX` |

`use_hook_tokens=True` gives either model TransformerLens' `hook_tokens` on the token ids (`cfg.use_hook_tokens`).
`tokenizer_name=` loads that tokenizer (a hub id, from the cache offline, or a directory) onto the model and, without
`d_vocab`, takes its size from it, as TransformerLens does.
Anything else (`normalization_type=None`, `act_fn="solu_ln"`, shortformer or alibi positions,
`LNPre`, GPT-2 with grouped-query heads, mixtures of experts, sliding windows)
is refused with the field that no family has. Fields that only change how TransformerLens runs (`device`,
`dtype`, `seed`, `use_attn_result`, ...) are honoured or accepted; fields with a non-default value that
would change the function are refused, never ignored.

Initialisation follows TransformerLens' `init_mode="gpt2"`: every weight matrix and embedding from
N(0, initializer_range) (default 0.8 / sqrt(d_model)), biases 0, norm weights 1; `seed` seeds torch when
the config is made, as TransformerLens does. The draws are hooked's own (the parameters are laid out
differently), so the same seed does not give TransformerLens' numbers, only their distribution.
"""  # noqa: E501  (a Markdown table: its rows cannot wrap)

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from hooked.models.base import HookedTransformer
from hooked.models.config import ModelConfig

# TransformerLens 3.9 fields that change the function, with the value every hooked family has (its default).
_FIXED = {
    "use_local_attn": False,
    "attention_dir": "causal",
    "post_embedding_ln": False,
    "num_experts": None,
    "experts_per_token": None,
    "use_attn_scale": True,
    "attn_scale": -1.0,
    "clip_qkv": None,
    "use_logn_attn": False,
    "use_dynamic_ntk_rope": False,
    "rotary_adjacent_pairs": False,
    "use_normalization_before_and_after": False,
    "use_yarn_rope": False,
    "use_attention_sinks": False,
    "d_vocab_out": -1,
    "init_mode": "gpt2",
    "window_size": None,
    "attn_types": None,
    "original_architecture": None,
    "n_devices": 1,
}
# Fields that do not change the function (or that hooked sets from the model), accepted with any value.
_ACCEPTED = {
    "model_name",
    "use_attn_result",
    "use_split_qkv_input",
    "use_hook_mlp_in",
    "use_attn_in",
    "from_checkpoint",
    "checkpoint_index",
    "checkpoint_label_type",
    "checkpoint_value",
    "n_params",
    "tokenizer_prepends_bos",
    "default_prepend_bos",
    "trust_remote_code",
    "init_weights",
    "ungroup_grouped_query_attention",
    "uses_rms_norm",
    "layer_norm_folding",
    "train_seq_length",
}


@dataclass(frozen=True)
class HookedTransformerConfigSpec:
    """What `HookedTransformerConfig(...)` returns: the family's config and how to initialise the model.
    Reads through to the family config (`cfg.d_head`, `cfg.act_fn`, ...) with TransformerLens' names."""

    family: ModelConfig  # the family's own config (GPT2Config, Qwen3Config, ...)
    initializer_range: float
    init_weights: bool = True
    device: str | torch.device | None = None
    dtype: torch.dtype = torch.float32
    tie_word_embeddings: bool = False  # W_U is W_E (TransformerLens' default: an unembedding of its own)
    extra: dict[str, Any] = field(default_factory=dict)  # accepted TransformerLens fields, readable back
    tokenizer_name: str | None = None  # the hub id or directory the model's tokenizer is loaded from
    tokenizer: Any = field(default=None, repr=False, compare=False)  # that tokenizer (a HookedTokenizer)

    def build_model(self, tokenizer=None, move_to_device: bool = True, default_padding_side: str = "right"):
        """`HookedTransformer(cfg)`: the family's model with randomly initialised weights (module docstring)."""
        model = HookedTransformer.from_config(
            self.family,
            tokenizer,
            move_to_device,
            default_padding_side,
            initializer_range=self.initializer_range,
            init_weights=self.init_weights,
            tie_word_embeddings=self.tie_word_embeddings,
            device=self.device,
            dtype=self.dtype,
        )
        if self.tokenizer is not None:  # tokenizer_name's, as TransformerLens' HookedTransformer(cfg) sets it
            model.set_tokenizer(copy.copy(self.tokenizer), default_padding_side)  # each model its own padding side
        return model

    def __getattr__(self, name: str):  # only for names the dataclass lacks
        if name.startswith("__") or name in ("family", "extra", "tokenizer"):  # copy / pickle probe before fields exist
            raise AttributeError(name)
        if name in self.extra:
            return self.extra[name]
        return getattr(self.family, name)


def HookedTransformerConfig(  # noqa: N802  (TransformerLens' class name; here a function returning a spec)
    d_model: int,
    d_head: int,
    n_layers: int,
    n_ctx: int,
    n_heads: int = -1,
    d_mlp: int | None = None,
    d_vocab: int = -1,
    act_fn: str | None = "relu",
    normalization_type: str | None = "LN",
    positional_embedding_type: str = "standard",
    eps: float = 1e-5,
    n_key_value_heads: int | None = None,
    gated_mlp: bool = False,
    use_qk_norm: bool = False,
    final_rms: bool = False,
    rotary_dim: int | None = None,
    rotary_base: float = 10000,
    tie_word_embeddings: bool = False,
    scale_attn_by_inverse_layer_idx: bool = False,
    initializer_range: float = -1.0,
    seed: int | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    attn_only: bool = False,
    use_hook_tokens: bool = False,
    parallel_attn_mlp: bool = False,
    tokenizer_name: str | None = None,
    **fields: Any,
) -> HookedTransformerConfigSpec:
    """TransformerLens' config, mapped to the family it describes (module docstring); raises naming what no family
    has."""
    for name, value in fields.items():
        if name in _FIXED:
            if value != _FIXED[name] and not (name == "d_vocab_out" and value == d_vocab):
                raise ValueError(f"HookedTransformerConfig: {name}={value!r} is not supported: {_why(name)}")
        elif name not in _ACCEPTED:
            raise TypeError(f"HookedTransformerConfig got an unexpected keyword argument {name!r}")
    if n_heads == -1:
        if d_model % d_head:
            raise ValueError(f"d_model ({d_model}) must be divisible by d_head ({d_head})")
        n_heads = d_model // d_head
    tokenizer = None if tokenizer_name is None else named_tokenizer(tokenizer_name)
    if d_vocab <= 0 and tokenizer is not None:  # TransformerLens: the largest id in the vocabulary, plus one
        d_vocab = max(tokenizer.get_vocab().values()) + 1
    if d_vocab <= 0:
        raise ValueError("HookedTransformerConfig: give d_vocab, or tokenizer_name= to infer it from a tokenizer")
    d_mlp = 4 * d_model if d_mlp is None else d_mlp
    tl = dict(
        d_model=d_model,
        d_head=d_head,
        n_layers=n_layers,
        n_ctx=n_ctx,
        n_heads=n_heads,
        d_mlp=d_mlp,
        d_vocab=d_vocab,
        act_fn=act_fn,
        normalization_type=normalization_type,
        positional_embedding_type=positional_embedding_type,
        eps=eps,
        n_key_value_heads=n_key_value_heads,
        gated_mlp=gated_mlp,
        use_qk_norm=use_qk_norm,
        final_rms=final_rms,
        rotary_dim=rotary_dim,
        rotary_base=rotary_base,
        tie_word_embeddings=tie_word_embeddings,
        scale_attn_by_inverse_layer_idx=scale_attn_by_inverse_layer_idx,
        attn_only=bool(attn_only),
        parallel_attn_mlp=bool(parallel_attn_mlp),
    )
    family = family_config(tl)
    if seed is not None:
        torch.manual_seed(seed)  # TransformerLens seeds when the config is made, so the model's draw is reproducible
    initializer_range = 0.8 / math.sqrt(d_model) if initializer_range < 0 else initializer_range
    extra = {k: v for k, v in fields.items() if k in _ACCEPTED}
    family.default_prepend_bos = fields.get("default_prepend_bos", True)
    family.set_use_hook_tokens(bool(use_hook_tokens))
    return HookedTransformerConfigSpec(
        family,
        initializer_range,
        bool(fields.get("init_weights", True)),
        device,
        dtype,
        tie_word_embeddings,
        {"seed": seed, **extra},
        tokenizer_name=tokenizer_name,
        tokenizer=tokenizer,
    )


def named_tokenizer(name: str):
    """TransformerLens' `tokenizer_name`: the tokenizer of a hub id (its files only, from the cache offline) or of
    a local directory, as `hooked.load` reads a checkpoint's."""
    import json

    from hooked.tokenizer import HookedTokenizer
    from hooked.weights.sources import resolve

    directory = resolve(name, tokenizer_only=True)
    config = json.loads((directory / "config.json").read_text()) if (directory / "config.json").exists() else {}
    tokenizer = HookedTokenizer.from_directory(directory, config)
    if tokenizer is None:
        raise ValueError(
            f"HookedTransformerConfig: tokenizer_name={name!r}, but {directory} has no tokenizer files (tokenizer.json,"
            " or vocab.json and merges.txt)"
        )
    tokenizer.name_or_path = name  # the name given, as a Hugging Face tokenizer keeps it
    return tokenizer


def family_config(tl: dict[str, Any]):
    """The config of the family whose shape TransformerLens' fields `tl` describe: each family's config class
    declares `from_transformer_lens(tl)` -> (config, []) when it is that family, (None, problems) when it
    has the family's shape but fields the family lacks, (None, None) when it is not that family's shape."""
    from hooked.models import MODEL_CLASSES

    near = {}
    for model_class in MODEL_CLASSES:
        family, problems = model_class.config_class.from_transformer_lens(tl)
        if family is not None:
            return family
        if problems:
            near.setdefault(model_class.__name__, problems)
    if near:
        raise ValueError(
            "HookedTransformerConfig: "
            + "; ".join(
                f"this config is {name}-shaped, but hooked's {name} has no " + "; no ".join(problems)
                for name, problems in near.items()
            )
        )
    described = ", ".join(f"{key}={tl[key]!r}" for key in ("normalization_type", "positional_embedding_type", "act_fn"))
    shapes = "; ".join(
        f"{model_class.__name__} ({model_class.config_class.transformer_lens_shape})"
        for model_class in MODEL_CLASSES
        if getattr(model_class.config_class, "transformer_lens_shape", None)
    )
    raise ValueError(f"HookedTransformerConfig: no hooked family has {described}; hooked implements {shapes}")


def _why(name: str) -> str:
    from hooked.models import MODEL_CLASSES

    if name in ("n_devices", "original_architecture"):
        return "hooked builds no multi-device model here; load a checkpoint with hooked.load for those"
    # A family whose config gives this field another value (or computes it) has the feature, from a checkpoint only.
    having = [
        model_class.title or model_class.__name__
        for model_class in MODEL_CLASSES
        if getattr(model_class.config_class, name, _FIXED[name]) != _FIXED[name]
    ]
    if having:
        return (
            f"checkpoints of hooked's {', '.join(having)} can set it, and hooked builds those from a checkpoint"
            " only (hooked.load(path) or HookedTransformer.from_pretrained(path)), not from a HookedTransformerConfig"
        )
    return "no hooked family has it"
