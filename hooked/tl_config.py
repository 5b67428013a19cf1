"""TransformerLens' `HookedTransformerConfig(...)` then `HookedTransformer(cfg)`: a randomly initialised model
of the family the config describes.

    cfg = hooked.HookedTransformerConfig(n_layers=2, d_model=64, d_head=16, n_ctx=32, d_vocab=100,
                                         act_fn="gelu_new", normalization_type="LN", seed=0)
    model = hooked.HookedTransformer(cfg)     # a hooked.GPT2, weights drawn as TransformerLens draws them

hooked implements architectures, not a configurable transformer, so a config is matched to one of them:

| TransformerLens fields | family |
|---|---|
| `normalization_type="LN"`, `positional_embedding_type="standard"`, `act_fn` `"gelu_new"` or `"gelu"`, d_model = n_heads * d_head | `GPT2` |
| the same with `attn_only=True` (any `act_fn`: there is no MLP) | `GPT2` with attention-only blocks (no ln2, MLP or resid_mid, as TransformerLens 3.9's `TransformerBlock`) |
| `normalization_type="RMS"`, `positional_embedding_type="rotary"`, `act_fn="silu"`, `gated_mlp=True`, `use_qk_norm=True`, `final_rms=True` | `Qwen3` |

`use_hook_tokens=True` gives either model TransformerLens' `hook_tokens` on the token ids (`cfg.use_hook_tokens`).
Anything else (`normalization_type=None`, `act_fn="relu"` or `"solu_ln"`, shortformer or alibi positions,
`LNPre`, GPT-2 with grouped-query heads, a Llama-style rotary model without q/k norms, mixtures of experts)
is refused with the field that no family has. Fields that only change how TransformerLens runs (`device`,
`dtype`, `seed`, `use_attn_result`, ...) are honoured or accepted; fields with a non-default value that
would change the function are refused, never ignored.

Initialisation follows TransformerLens' `init_mode="gpt2"`: every weight matrix and embedding from
N(0, initializer_range) (default 0.8 / sqrt(d_model)), biases 0, norm weights 1; `seed` seeds torch when
the config is made, as TransformerLens does. The draws are hooked's own (the parameters are laid out
differently), so the same seed does not give TransformerLens' numbers, only their distribution.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hooked.models.transformer_lens import TRANSFORMER_LENS_GENERATE
from hooked.models.gpt2 import GPT2, Conv1D, GPT2Config
from hooked.models.qwen3 import Qwen3, Qwen3Config

# TransformerLens 3.9 fields that change the function, with the value every hooked family has (its default).
_FIXED = {
    "parallel_attn_mlp": False, "use_local_attn": False, "attention_dir": "causal",
    "post_embedding_ln": False, "num_experts": None, "experts_per_token": None, "use_attn_scale": True,
    "attn_scale": -1.0, "clip_qkv": None, "use_logn_attn": False, "use_dynamic_ntk_rope": False,
    "rotary_adjacent_pairs": False, "use_normalization_before_and_after": False, "use_yarn_rope": False,
    "use_attention_sinks": False, "d_vocab_out": -1, "init_mode": "gpt2", "window_size": None, "attn_types": None,
    "tokenizer_name": None, "original_architecture": None, "n_devices": 1,
}
# Fields that do not change the function (or that hooked sets from the model), accepted with any value.
_ACCEPTED = {
    "model_name", "use_attn_result", "use_split_qkv_input", "use_hook_mlp_in", "use_attn_in",
    "from_checkpoint", "checkpoint_index", "checkpoint_label_type", "checkpoint_value", "n_params",
    "tokenizer_prepends_bos", "default_prepend_bos", "trust_remote_code", "init_weights", "ungroup_grouped_query_attention",
    "uses_rms_norm", "layer_norm_folding", "train_seq_length",
}


@dataclass(frozen=True)
class HookedTransformerConfigSpec:
    """What `HookedTransformerConfig(...)` returns: the family's config and how to initialise the model.
    Reads through to the family config (`cfg.d_head`, `cfg.act_fn`, ...) with TransformerLens' names."""

    family: GPT2Config | Qwen3Config
    initializer_range: float
    init_weights: bool = True
    device: str | torch.device | None = None
    dtype: torch.dtype = torch.float32
    tie_word_embeddings: bool = False  # W_U is W_E (TransformerLens' default: an unembedding of its own)
    extra: dict[str, Any] = field(default_factory=dict)  # accepted TransformerLens fields, readable back

    def __getattr__(self, name: str):  # only for names the dataclass lacks
        if name.startswith("__") or name in ("family", "extra"):  # copy / pickle probe before fields exist
            raise AttributeError(name)
        if name in self.extra:
            return self.extra[name]
        return getattr(self.family, name)


def HookedTransformerConfig(  # noqa: N802  (TransformerLens' class name; here a function returning a spec)
    d_model: int, d_head: int, n_layers: int, n_ctx: int, n_heads: int = -1, d_mlp: int | None = None,
    d_vocab: int = -1, act_fn: str | None = "relu", normalization_type: str | None = "LN",
    positional_embedding_type: str = "standard", eps: float = 1e-5, n_key_value_heads: int | None = None,
    gated_mlp: bool = False, use_qk_norm: bool = False, final_rms: bool = False, rotary_dim: int | None = None,
    rotary_base: float = 10000, tie_word_embeddings: bool = False, scale_attn_by_inverse_layer_idx: bool = False,
    initializer_range: float = -1.0, seed: int | None = None, device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32, attn_only: bool = False, use_hook_tokens: bool = False, **fields: Any,
) -> HookedTransformerConfigSpec:
    """TransformerLens' config, mapped to GPT-2 or Qwen3 (module docstring); raises naming what no family has."""
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
    if d_vocab <= 0:
        raise ValueError("HookedTransformerConfig: give d_vocab (hooked builds no tokenizer to infer it from)")
    d_mlp = 4 * d_model if d_mlp is None else d_mlp
    describe = (f"normalization_type={normalization_type!r}, positional_embedding_type={positional_embedding_type!r},"
                f" act_fn={act_fn!r}")
    if (normalization_type, positional_embedding_type) == ("LN", "standard"):
        problems = [f"act_fn={act_fn!r} (GPT-2 has gelu_new or gelu)"
                    if act_fn not in ("gelu_new", "gelu") and not attn_only else None,  # no MLP: act_fn unused
                    f"d_model={d_model} != n_heads * d_head = {n_heads * d_head}" if n_heads * d_head != d_model else None,
                    "gated_mlp=True" if gated_mlp else None, "use_qk_norm=True" if use_qk_norm else None,
                    f"n_key_value_heads={n_key_value_heads}" if n_key_value_heads not in (None, n_heads) else None]
        _refuse_if(problems, "GPT-2")
        family = GPT2Config(n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_mlp=d_mlp, d_vocab=d_vocab, n_ctx=n_ctx,
                            layer_norm_eps=eps, activation=act_fn, attn_only=bool(attn_only),
                            scale_attn_by_inverse_layer_idx=scale_attn_by_inverse_layer_idx)
    elif (normalization_type, positional_embedding_type) == ("RMS", "rotary"):
        problems = ["attn_only=True (Qwen3 blocks have an MLP; attention-only models are GPT-2-shaped: LN, standard)"
                    if attn_only else None,
                    f"act_fn={act_fn!r} (Qwen3 has silu)" if act_fn != "silu" else None,
                    "gated_mlp=False (Qwen3's MLP is gated)" if not gated_mlp else None,
                    "use_qk_norm=False (Qwen3 normalises each head's q and k)" if not use_qk_norm else None,
                    "final_rms=False (Qwen3's final norm is RMSNorm)" if not final_rms else None,
                    f"rotary_dim={rotary_dim} (Qwen3 rotates all of d_head={d_head})"
                    if rotary_dim not in (None, d_head) else None,
                    "scale_attn_by_inverse_layer_idx=True" if scale_attn_by_inverse_layer_idx else None]
        _refuse_if(problems, "Qwen3")
        family = Qwen3Config(n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_kv_heads=n_key_value_heads or n_heads,
                             d_head=d_head, d_mlp=d_mlp, d_vocab=d_vocab, rms_norm_eps=eps, rope_theta=float(rotary_base),
                             tie_word_embeddings=tie_word_embeddings, max_position_embeddings=n_ctx)
    else:
        raise ValueError(f"HookedTransformerConfig: no hooked family has {describe}; hooked implements GPT-2"
                         " (LN, standard, gelu_new) and Qwen3 (RMS, rotary, silu, gated, q/k norms)")
    if seed is not None:
        torch.manual_seed(seed)  # TransformerLens seeds when the config is made, so the model's draw is reproducible
    initializer_range = 0.8 / math.sqrt(d_model) if initializer_range < 0 else initializer_range
    extra = {k: v for k, v in fields.items() if k in _ACCEPTED}
    family.default_prepend_bos = fields.get("default_prepend_bos", True)
    family._set_use_hook_tokens(bool(use_hook_tokens))
    return HookedTransformerConfigSpec(family, initializer_range, bool(fields.get("init_weights", True)), device, dtype,
                                       tie_word_embeddings, {"seed": seed, **extra})


def _why(name: str) -> str:
    if name in ("tokenizer_name", "n_devices", "original_architecture"):
        return "hooked builds no tokenizer or multi-device model here; load a checkpoint with hooked.load for those"
    return "no hooked family (GPT-2, Qwen3) has it"


def _refuse_if(problems: list[str | None], family: str) -> None:
    problems = [p for p in problems if p]
    if problems:
        raise ValueError(f"HookedTransformerConfig: this config is {family}-shaped, but hooked's {family} has no "
                         + "; no ".join(problems))


def build_model(cfg: HookedTransformerConfigSpec | GPT2Config | Qwen3Config, tokenizer=None, move_to_device: bool = True,
                default_padding_side: str = "right"):
    """`HookedTransformer(cfg)`: the family's model with randomly initialised weights (module docstring)."""
    if tokenizer is not None:
        raise ValueError("HookedTransformer(cfg, tokenizer=...) is not supported: hooked reads tokenizers from checkpoints")
    if isinstance(cfg, (GPT2Config, Qwen3Config)):
        cfg = HookedTransformerConfigSpec(cfg, 0.8 / math.sqrt(cfg.d_model))
    if not isinstance(cfg, HookedTransformerConfigSpec):
        raise TypeError(f"HookedTransformer(cfg) takes hooked.HookedTransformerConfig(...), got {type(cfg).__name__}")
    family = dataclasses.replace(cfg.family)  # a config is bound to its one model: never share it
    family._set_use_hook_tokens(cfg.family.use_hook_tokens)  # not a dataclass field: replace() drops it
    model = (GPT2 if isinstance(family, GPT2Config) else Qwen3)(family)
    if isinstance(model, GPT2) and not cfg.tie_word_embeddings:
        model.untie_unembedding()  # Qwen3 unties from its own config
    if cfg.init_weights:
        init_weights(model, cfg.initializer_range)
    device = cfg.device if cfg.device is not None else "cpu"
    model.generate_defaults = dict(TRANSFORMER_LENS_GENERATE)
    return model.to(device=device if move_to_device else "cpu", dtype=cfg.dtype).eval()


@torch.no_grad()
def init_weights(model: nn.Module, initializer_range: float) -> None:
    """TransformerLens' "gpt2" initialisation: weights and embeddings N(0, initializer_range), biases 0,
    norm weights (anything 1-D not named bias) 1."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, Conv1D, nn.Embedding)):
            module.weight.normal_(0.0, initializer_range)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        elif not any(True for _ in module.children()):
            for name, parameter in module.named_parameters(recurse=False):
                if parameter.ndim > 1:
                    parameter.normal_(0.0, initializer_range)
                else:
                    parameter.zero_() if name == "bias" else parameter.fill_(1.0)
