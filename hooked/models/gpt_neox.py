"""GPT-NeoX / Pythia (`GPTNeoXForCausalLM`) with a hook point on every activation TransformerLens names.

Numerics follow Hugging Face transformers 5.24 `models/gpt_neox/modeling_gpt_neox.py`: LayerNorms with
bias; one fused `query_key_value` projection whose output is laid out per head as [n_heads, 3, d_head]
(head h's q, k and v side by side, not three blocks as GPT-2's c_attn); rotary embeddings over the first
`rotary_dim = int(d_head * rotary_pct)` dimensions of each head only (half-split pairs, cos/sin computed
in float32 and cast), the rest passed through; attention scaled by d_head**-0.5 with the softmax in
float32; a two-layer MLP with biases (`hidden_act`, Pythia's exact-erf "gelu"); and, with
`use_parallel_residual` (every Pythia model), a parallel block: attention and MLP both read resid_pre and
resid_post = (mlp_out + attn_out) + resid_pre, in that order. Without it the block is sequential, as
GPT-2's. An untied unembedding (`embed_out` on disk, `lm_head` in transformers 5.24 and here) unless
`tie_word_embeddings`. Float32 logits are bit-identical to `GPTNeoXForCausalLM`
(tests/families/test_gpt_neox_parity.py).

Hooks follow TransformerLens 3.9 (`pretrained/weight_conversions/neox.py`, `components/transformer_block.py`):
a parallel block has no `hook_resid_mid` (nothing there is ever a sum the model forms), and its
`hook_mlp_in` holds resid_pre, which ln2 reads. See docs/gpt-neox.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from hooked.factored import ov_circuit, qk_circuit
from hooked.hooks import HookPoint
from hooked.kv_cache import LayerKV
from hooked.layers import (
    AttentionMask,
    LayerNorm,
    Projection,
    QueryKeyPath,
    Split,
    attend,
    attention_input,
    gelu_new,
    heads_output,
    mlp_input,
    writable,
)
from hooked.models.base import DecoderBlock, HookedTransformer
from hooked.models.config import ModelConfig, alias
from hooked.rotary import RotaryEmbedding, apply_rotary, turn_leading


# ============================================================================= config
def gelu_fast(x: Tensor) -> Tensor:
    """transformers' FastGELUActivation (GPT-NeoX-20B's `hidden_act`), in its operation order."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


# transformers 5.24 `activations.ACT2CLS` names whose function hooked has, as the same arithmetic.
ACTIVATIONS = {
    "gelu": F.gelu,  # GELUActivation: exact erf (Pythia)
    "gelu_fast": gelu_fast,  # FastGELUActivation (GPT-NeoX-20B)
    "gelu_new": gelu_new,  # NewGELUActivation: the tanh formula, in its operation order
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GELUTanh
    "relu": F.relu,
    "silu": F.silu,  # SiLUActivation
    "swish": F.silu,  # nn.SiLU
}
Activation = Literal["gelu", "gelu_fast", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish"]


@dataclass
class GPTNeoXConfig(ModelConfig):
    n_layers: int  # transformer blocks (num_hidden_layers)
    d_model: int  # residual stream width (hidden_size)
    n_heads: int  # attention heads (num_attention_heads); d_head = d_model / n_heads
    d_mlp: int  # MLP width (intermediate_size)
    d_vocab: int  # vocabulary size
    rotary_dim: int  # leading dims of each head RoPE turns: int(d_head * rotary_pct), even
    rope_theta: float = 10000.0  # RoPE base (rotary_emb_base)
    layer_norm_eps: float = 1e-5
    activation: Activation = "gelu"  # hidden_act
    use_parallel_residual: bool = True  # attention and MLP both read resid_pre (every Pythia model)
    attention_bias: bool = True  # biases on query_key_value and dense
    tie_word_embeddings: bool = False  # unembedding = the token embedding (Pythia: untied embed_out)
    max_position_embeddings: int = 2048  # informative only: RoPE has no hard limit
    default_prepend_bos: bool = False  # as TransformerLens 3.9 for GPTNeoXForCausalLM; settable

    # TransformerLens' names for what the architecture fixes
    normalization_type = "LN"
    positional_embedding_type = "rotary"
    original_architecture = "GPTNeoXForCausalLM"
    gated_mlp = False
    final_rms = False
    rotary_adjacent_pairs = False  # NeoX pairs dimension i with i + rotary_dim / 2

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    n_kv_heads = alias("n_heads")

    @property
    def act_fn(self) -> str:
        return "silu" if self.activation == "swish" else self.activation

    parallel_attn_mlp = alias("use_parallel_residual")
    n_ctx = alias(
        "max_position_embeddings",
        "Where `to_tokens(truncate=True)` cuts: the config's length (TransformerLens' n_ctx).",
    )
    eps = alias("layer_norm_eps")
    rotary_base = alias("rope_theta")

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model (hidden_size) {self.d_model} is not divisible by n_heads (num_attention_heads) {self.n_heads}"
            )
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.d_head:
            raise ValueError(
                f"rotary_dim {self.rotary_dim} (int(d_head {self.d_head} * rotary_pct)) must be even and in"
                f" 2..{self.d_head}: RoPE turns pairs of dimensions; choose rotary_pct so it is"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"hidden_act {self.activation!r} is not supported by hooked's GPT-NeoX; supported: "
                f"{', '.join(ACTIVATIONS)}"
            )

    transformer_lens_shape: ClassVar[str] = (
        "normalization_type='LN', positional_embedding_type='rotary', an even rotary_dim,"
        f" act_fn one of {', '.join(ACTIVATIONS)}"
    )

    @classmethod
    def from_transformer_lens(cls, tl: dict) -> tuple[GPTNeoXConfig | None, list[str] | None]:
        """TransformerLens' fields for GPTNeoXForCausalLM (loading_from_pretrained.convert_hf_model_config): LayerNorm,
        rotary over `rotary_dim` dims in half-split pairs, biases everywhere; `parallel_attn_mlp` picks the block."""
        if (tl["normalization_type"], tl["positional_embedding_type"]) != ("LN", "rotary"):
            return None, None
        d_model, n_heads, d_head, rotary_dim = tl["d_model"], tl["n_heads"], tl["d_head"], tl["rotary_dim"]
        problems = [
            "attn_only=True (GPT-NeoX blocks have an MLP)" if tl["attn_only"] else None,
            f"act_fn={tl['act_fn']!r} (GPT-NeoX has {', '.join(ACTIVATIONS)})"
            if tl["act_fn"] not in ACTIVATIONS
            else None,
            "gated_mlp=True (GPT-NeoX's MLP is not gated)" if tl["gated_mlp"] else None,
            "use_qk_norm=True" if tl["use_qk_norm"] else None,
            "final_rms=True (GPT-NeoX's final norm is a LayerNorm)" if tl["final_rms"] else None,
            f"n_key_value_heads={tl['n_key_value_heads']}" if tl["n_key_value_heads"] not in (None, n_heads) else None,
            f"d_model={d_model} != n_heads * d_head = {n_heads * d_head}" if n_heads * d_head != d_model else None,
            f"rotary_dim={rotary_dim} (GPT-NeoX turns an even number of a head's {d_head} dims)"
            if rotary_dim is None or rotary_dim % 2 or not 0 < rotary_dim <= d_head
            else None,
            "scale_attn_by_inverse_layer_idx=True" if tl["scale_attn_by_inverse_layer_idx"] else None,
        ]
        problems = [problem for problem in problems if problem]
        if problems:
            return None, problems
        return cls(
            n_layers=tl["n_layers"],
            d_model=d_model,
            n_heads=n_heads,
            d_mlp=tl["d_mlp"],
            d_vocab=tl["d_vocab"],
            rotary_dim=rotary_dim,
            rope_theta=float(tl["rotary_base"]),
            layer_norm_eps=tl["eps"],
            activation=tl["act_fn"],
            use_parallel_residual=tl["parallel_attn_mlp"],
            attention_bias=True,
            tie_word_embeddings=tl["tie_word_embeddings"],
            max_position_embeddings=tl["n_ctx"],
        ), []

    @classmethod
    def from_hf(cls, config: dict) -> GPTNeoXConfig:
        """Read a config.json: hub layout (`rotary_pct`, `rotary_emb_base`) or transformers 5's `rope_parameters`."""
        hidden_act = config.get("hidden_act", "gelu")
        if hidden_act not in ACTIVATIONS:
            raise ValueError(
                f"GPT-NeoX hidden_act {hidden_act!r} is not supported by hooked; supported: {', '.join(ACTIVATIONS)}"
            )
        d_model, n_heads = config["hidden_size"], config["num_attention_heads"]
        if d_model % n_heads:
            raise ValueError(f"hidden_size {d_model} is not divisible by num_attention_heads {n_heads}")
        head_dim = config.get("head_dim")
        if (
            head_dim is not None and head_dim != d_model // n_heads
        ):  # transformers' attention ignores it, its RoPE reads it
            raise ValueError(
                f"head_dim {head_dim} differs from hidden_size / num_attention_heads = {d_model // n_heads};"
                " GPT-NeoX's attention always uses the latter: remove head_dim"
            )
        theta, rotary_pct = _rope_from_hf(config)
        rotary_dim = int(d_model // n_heads * rotary_pct)  # transformers' truncation (TransformerLens rounds)
        if rotary_dim % 2 or rotary_dim == 0:
            raise ValueError(
                f"rotary_pct / partial_rotary_factor {rotary_pct} gives {rotary_dim} rotary dimensions of a"
                f" head of {d_model // n_heads}; hooked needs an even, non-zero number"
            )
        return cls(
            n_layers=config["num_hidden_layers"],
            d_model=d_model,
            n_heads=n_heads,
            d_mlp=config["intermediate_size"],
            d_vocab=config["vocab_size"],
            rotary_dim=rotary_dim,
            rope_theta=theta,
            layer_norm_eps=config.get("layer_norm_eps", 1e-5),
            activation=hidden_act,
            use_parallel_residual=config.get("use_parallel_residual", True),
            attention_bias=config.get("attention_bias", True),
            tie_word_embeddings=config.get("tie_word_embeddings", False),
            max_position_embeddings=config.get("max_position_embeddings", 2048),
        )


def _rope_from_hf(config: dict) -> tuple[float, float]:
    """(rope_theta, rotary_pct) as transformers 5.24 `GPTNeoXConfig.convert_rope_params_to_dict` reads them:
    `rope_scaling` or `rope_parameters`, with the hub's `rotary_emb_base` / `rotary_pct` as defaults."""
    rope = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(
            f"GPT-NeoX rope_parameters rope_type {rope_type!r} is not supported by hooked (default only):"
            " its scaled frequencies would be computed as plain RoPE"
        )
    theta = float(rope.get("rope_theta", config.get("rotary_emb_base", 10000.0)))
    rotary_pct = float(rope.get("partial_rotary_factor", config.get("rotary_pct", 0.25)))
    if not 0.0 < rotary_pct <= 1.0:
        raise ValueError(f"rotary_pct / partial_rotary_factor {rotary_pct} must be in (0, 1]")
    return theta, rotary_pct


# Pythia's sizes -> the sizes its first release was named by, which TransformerLens 3.9 keeps as aliases
PYTHIA_FIRST_NAMES = {
    "70m": "19m",
    "160m": "125m",
    "410m": "350m",
    "1b": "800m",
    "1.4b": "1.3b",
    "2.8b": "2.7b",
    "6.9b": "6.7b",
    "12b": "13b",
}


def pythia_names() -> dict[str, tuple[str, ...]]:
    """TransformerLens 3.9's official Pythia names (supported_models.py) -> its aliases
    (hooked.transformer_lens.aliases): each size and variant under its short name and its first release's names;
    `pythia` and `pythia-v0` are 70m's."""
    names = {"EleutherAI/pythia-14m": ("pythia-14m",), "EleutherAI/pythia-31m": ("pythia-31m",)}
    for size, first in PYTHIA_FIRST_NAMES.items():
        seeds = ("-seed1", "-seed2", "-seed3") if size == "160m" else ()
        for variant in ("", "-deduped", "-deduped-v0", "-v0", *seeds):
            short = {"70m": "pythia", "70m-v0": "pythia-v0"}.get(size + variant)
            aliases = (f"pythia-{size}{variant}", *((short,) if short else ()))
            names[f"EleutherAI/pythia-{size}{variant}"] = (
                *aliases,
                f"EleutherAI/pythia-{first}{variant}",
                f"pythia-{first}{variant}",
            )
    return dict(sorted(names.items()))


# ============================================================================= modules and forward
def rotate_leading(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on the first cos.shape[-1] dimensions of x [batch pos head d_head], the rest passed through
    (transformers' `apply_rotary_pos_emb` for GPT-NeoX: rotate, then concatenate)."""
    rotary_dim = cos.shape[-1]
    # transformers concatenates [batch head pos d_head] tensors, so its result is laid out that way: the same layout
    # here (concatenated per head, then viewed back) keeps the eager path's q @ k^T on the BLAS path transformers
    # takes, which matters on some CPUs' kernels (MKL_CBWR=COMPATIBLE rounds other layouts apart). Same values.
    parts = [apply_rotary(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]]
    return torch.cat([part.transpose(1, 2) for part in parts], dim=-1).transpose(1, 2)


class GPTNeoXAttention(nn.Module):
    def __init__(self, cfg: GPTNeoXConfig):
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_head
        self.scaling = cfg.d_head**-0.5
        # Output rows ordered [n_heads, 3, d_head]: head h's q, k, v are rows h*3*d_head ... (h+1)*3*d_head.
        self.query_key_value = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.attention_bias)
        self.dense = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.attention_bias)
        self.hook_q = HookPoint("batch pos head_index d_head")  # before RoPE
        self.hook_k = HookPoint("batch pos head_index d_head")  # before RoPE
        self.hook_v = HookPoint("batch pos head_index d_head")
        self.hook_rot_q = HookPoint("batch pos head_index d_head")  # first rotary_dim dims turned, the rest as q
        self.hook_rot_k = HookPoint("batch pos head_index d_head")
        self.hook_attn_scores = HookPoint("batch head_index query_pos key_pos")  # scaled, masked, pre-softmax
        self.hook_pattern = HookPoint("batch head_index query_pos key_pos")
        self.hook_z = HookPoint("batch pos head_index d_head")  # dense's input, split by head
        self.hook_result = HookPoint("batch pos head_index d_model")  # each head's write, before the bias

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"] | tuple[Tensor, Tensor, Tensor],
        cos: Tensor,
        sin: Tensor,
        mask: AttentionMask,
        kv: LayerKV | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        if isinstance(x, tuple):  # per-head inputs [batch pos head_index d_model] (hooked.layers.attention_input)
            weight = self.query_key_value.weight.view(self.n_heads, 3, self.d_head, -1)
            q, k, v = (torch.einsum("bphm,hdm->bphd", inputs, weight[:, part]) for part, inputs in enumerate(x))
            if self.query_key_value.bias is not None:
                bias = self.query_key_value.bias.view(self.n_heads, 3, self.d_head)
                q, k, v = q + bias[:, 0], k + bias[:, 1], v + bias[:, 2]
        else:
            batch, pos, _ = x.shape
            q, k, v = self.query_key_value(x).view(batch, pos, self.n_heads, 3 * self.d_head).split(self.d_head, dim=-1)
        # split's outputs are views autograd forbids editing in place: a listening hook gets a copy (writable)
        q = self.hook_q(writable(q) if self.hook_q.listening else q)
        k = self.hook_k(writable(k) if self.hook_k.listening else k)
        v = self.hook_v(writable(v) if self.hook_v.listening else v)
        q = self.hook_rot_q(rotate_leading(q, cos, sin))
        k = self.hook_rot_k(rotate_leading(k, cos, sin))
        if kv is not None:  # a KV cache: keys and values of every column so far (this call's included)
            k, v = kv.append(k, v)
        z = attend(q, k, v, mask, self.scaling, self.hook_attn_scores, self.hook_pattern, softmax_in_float32=True)
        return heads_output(self, z, self.dense)

    def _qkv(self, part: int) -> Tensor:
        """Rows of query_key_value for q (0), k (1) or v (2), as TransformerLens: [head_index d_model d_head] (a
        view)."""
        return self.query_key_value.weight.view(self.n_heads, 3, self.d_head, -1)[:, part].transpose(1, 2)

    def _qkv_bias(self, part: int) -> Tensor:
        bias = self.query_key_value.bias
        if bias is None:
            return self.query_key_value.weight.new_zeros(self.n_heads, self.d_head)
        return bias.view(self.n_heads, 3, self.d_head)[:, part]

    W_Q = property(lambda self: self._qkv(0), doc="[head_index d_model d_head], a view of query_key_value")
    W_K = property(lambda self: self._qkv(1), doc="[head_index d_model d_head], a view of query_key_value")
    W_V = property(lambda self: self._qkv(2), doc="[head_index d_model d_head], a view of query_key_value")
    b_Q = property(lambda self: self._qkv_bias(0), doc="[head_index d_head] (zeros without attention_bias)")
    b_K = property(lambda self: self._qkv_bias(1), doc="[head_index d_head] (zeros without attention_bias)")
    b_V = property(lambda self: self._qkv_bias(2), doc="[head_index d_head] (zeros without attention_bias)")

    @property
    def W_O(self) -> Float[Tensor, "head_index d_head d_model"]:
        return self.dense.weight.T.reshape(self.n_heads, self.d_head, -1)

    @property
    def b_O(self) -> Float[Tensor, " d_model"]:
        bias = self.dense.bias
        return bias if bias is not None else self.dense.weight.new_zeros(self.dense.weight.shape[0])

    OV = property(ov_circuit, doc="Each head's OV circuit W_V @ W_O: FactoredMatrix [head_index d_model d_model]")
    QK = property(qk_circuit, doc="Each head's QK circuit W_Q @ W_K^T: FactoredMatrix [head_index d_model d_model]")

    tp_counts: ClassVar[dict[str, str]] = {"n_heads": "heads"}

    def tp_plan(self) -> dict[str, Split]:
        """Tensor parallelism: each rank holds some heads' q|k|v rows (3 * d_head per head, contiguous in this
        layout) and their columns of dense."""
        plan = {
            "query_key_value.weight": Split("heads", 0, 3 * self.d_head),
            "dense.weight": Split("heads", 1, self.d_head, reduce=True),
        }
        if self.query_key_value.bias is not None:
            plan["query_key_value.bias"] = Split("heads", 0, 3 * self.d_head)
        return plan

    # For weight processing (hooked.processing): nn.Linear weights are [out, in].
    def residual_readers(self) -> tuple[Projection, ...]:
        return (Projection(self.query_key_value.weight, 1, self.query_key_value.bias),)

    def query_key_path(self) -> QueryKeyPath:
        """No q/k norm; RoPE over the leading rotary_dim dimensions with forward's (cos, sin)."""
        return QueryKeyPath(None, None, "hook_rot_q", "hook_rot_k", rotary_arguments=(1, 2), rotate=turn_leading)

    def residual_writers(self) -> tuple[Projection, ...]:
        return (Projection(self.dense.weight, 0, self.dense.bias),)

    @property
    def value_bias(self) -> Tensor | None:  # [head_index d_head]
        """The value part of query_key_value's bias, as stored (a strided view; None without attention_bias)."""
        bias = self.query_key_value.bias
        return None if bias is None else bias.view(self.n_heads, 3, self.d_head)[:, 2]


class GPTNeoXMLP(nn.Module):
    """dense_4h_to_h(act(dense_h_to_4h(x))), both with biases."""

    def __init__(self, cfg: GPTNeoXConfig):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(cfg.d_model, cfg.d_mlp)
        self.dense_4h_to_h = nn.Linear(cfg.d_mlp, cfg.d_model)
        self.activation = ACTIVATIONS[cfg.activation]
        self.hook_in = HookPoint("batch pos d_model")  # what the MLP reads: after ln2 (its weight included)
        self.hook_in.cached_by_default = False  # as hook_mlp_in: a copy of a neighbour, cached on request
        self.hook_pre = HookPoint("batch pos d_mlp")
        self.hook_post = HookPoint("batch pos d_mlp")  # the neurons: dense_4h_to_h's input

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        x = self.hook_in(x)
        pre = self.hook_pre(self.dense_h_to_4h(x))
        post = self.hook_post(self.activation(pre))
        return self.dense_4h_to_h(post)

    W_in = property(lambda self: self.dense_h_to_4h.weight.T, doc="[d_model d_mlp], a transposed view")
    W_out = property(lambda self: self.dense_4h_to_h.weight.T, doc="[d_mlp d_model], a transposed view")
    b_in = property(lambda self: self.dense_h_to_4h.bias, doc="[d_mlp]")
    b_out = property(lambda self: self.dense_4h_to_h.bias, doc="[d_model]")

    def tp_plan(self) -> dict[str, Split]:
        """Tensor parallelism: each rank holds some neurons' dense_h_to_4h rows and dense_4h_to_h columns."""
        return {
            "dense_h_to_4h.weight": Split("d_mlp", 0),
            "dense_h_to_4h.bias": Split("d_mlp", 0),
            "dense_4h_to_h.weight": Split("d_mlp", 1, reduce=True),
        }

    def residual_readers(self) -> tuple[Projection, ...]:
        return (Projection(self.dense_h_to_4h.weight, 1, self.dense_h_to_4h.bias),)

    def residual_writers(self) -> tuple[Projection, ...]:
        return (Projection(self.dense_4h_to_h.weight, 0, self.dense_4h_to_h.bias),)


class GPTNeoXBlock(DecoderBlock):
    """Sequential block (`use_parallel_residual=False`): attention, then the MLP on resid_mid, as GPT-2."""

    mlp_stage: ClassVar[tuple[str, ...]] = ("hook_mlp_in", "ln2", "mlp", "hook_mlp_out", "hook_resid_post")

    def __init__(self, cfg: GPTNeoXConfig):
        super().__init__()
        # Declared in forward order: hook_dict lists hooks in the order they fire.
        self.hook_resid_pre = HookPoint("batch pos d_model")
        self.hook_q_input = HookPoint(
            "batch pos head_index d_model"
        )  # each head's copy of resid_pre (see attention_input)
        self.hook_k_input = HookPoint("batch pos head_index d_model")
        self.hook_v_input = HookPoint("batch pos head_index d_model")
        self.ln1 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.attn = GPTNeoXAttention(cfg)
        self.hook_attn_out = HookPoint("batch pos d_model")
        if not cfg.use_parallel_residual:
            self.hook_resid_mid = HookPoint("batch pos d_model")
        self.hook_mlp_in = HookPoint("batch pos d_model")  # what ln2 reads (resid_mid; a parallel block: resid_pre)
        self.ln2 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.mlp = GPTNeoXMLP(cfg)
        self.hook_mlp_out = HookPoint("batch pos d_model")
        self.hook_resid_post = HookPoint("batch pos d_model")

    def _attention(
        self, resid_pre: Tensor, cos: Tensor, sin: Tensor, mask: AttentionMask, kv: LayerKV | None
    ) -> Tensor:
        attn_in = attention_input(self, resid_pre, self.attn.n_heads, self.attn.n_heads)
        return self.hook_attn_out(self.attn(attn_in, cos, sin, mask, kv))

    def attn_half(
        self, resid_pre: Tensor, cos: Tensor, sin: Tensor, mask: AttentionMask, kv: LayerKV | None = None
    ) -> Tensor:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self._attention(resid_pre, cos, sin, mask, kv)
        return self.hook_resid_mid(attn_out + resid_pre)

    def mlp_half(self, resid_mid: Tensor) -> Tensor:
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(mlp_input(self, resid_mid))))
        return self.hook_resid_post(mlp_out + resid_mid)


class GPTNeoXParallelBlock(GPTNeoXBlock):
    """Parallel block (`use_parallel_residual=True`, Pythia): attention and MLP both read resid_pre, so the
    block cannot be cut in two: `attn_half` computes all of it and `mlp_half` passes resid_post through."""

    mlp_stage: ClassVar[tuple[str, ...]] = ()

    def attn_half(
        self, resid_pre: Tensor, cos: Tensor, sin: Tensor, mask: AttentionMask, kv: LayerKV | None = None
    ) -> Tensor:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self._attention(resid_pre, cos, sin, mask, kv)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(mlp_input(self, resid_pre))))
        # transformers' order, (mlp_out + attn_out) + resid_pre: float addition is not associative
        return self.hook_resid_post(mlp_out + attn_out + resid_pre)

    def mlp_half(self, resid_post: Tensor) -> Tensor:
        return resid_post


class GPTNeoX(HookedTransformer):
    """GPT-NeoX / Pythia with TransformerLens hook names. Load a checkpoint with `hooked.load(directory_or_hub_id)`."""

    def __init__(self, cfg: GPTNeoXConfig):
        super().__init__(cfg)
        self.embed_in = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.hook_embed = HookPoint("batch pos d_model")
        self.rotary = RotaryEmbedding(cfg.rotary_dim, cfg.rope_theta)  # cos/sin over the rotary dims only
        block = GPTNeoXParallelBlock if cfg.use_parallel_residual else GPTNeoXBlock
        self.blocks = nn.ModuleList(block(cfg) for _ in range(cfg.n_layers))
        self.ln_final = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.d_model, cfg.d_vocab, bias=False)
        self.setup_hooks()

    def resid_from_tokens(self, tokens: Tensor, position_ids: Tensor) -> Float[Tensor, "batch pos d_model"]:
        return self.hook_embed(self.embed_in(tokens))

    def block_inputs(self, position_ids: Tensor, mask: AttentionMask, dtype: torch.dtype) -> tuple:
        cos, sin = self.rotary(position_ids, dtype)  # [batch pos rotary_dim], once for all blocks
        return cos, sin, mask

    def embedding_writers(self) -> tuple[Projection, ...]:
        return (Projection(self.embed_in.weight, 1),)

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embed_in.weight

    # ------------------------------------------------------------------------- declarations
    # What the rest of the library reads about GPT-NeoX (docs/adding-a-model.md).
    config_class = GPTNeoXConfig
    architectures = ("GPTNeoXForCausalLM", "gpt_neox")
    family = "gpt_neox"
    title = "GPT-NeoX / Pythia"
    embedding_hook_names = ("hook_embed",)
    checkpoint_table = (
        (r"gpt_neox\.embed_in\.weight", r"embed_in.weight"),
        (r"gpt_neox\.layers\.(\d+)\.input_layernorm\.(weight|bias)", r"blocks.\1.ln1.\2"),
        (r"gpt_neox\.layers\.(\d+)\.post_attention_layernorm\.(weight|bias)", r"blocks.\1.ln2.\2"),
        (r"gpt_neox\.layers\.(\d+)\.attention\.(query_key_value|dense)\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
        (r"gpt_neox\.layers\.(\d+)\.mlp\.(dense_h_to_4h|dense_4h_to_h)\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
        (r"gpt_neox\.final_layer_norm\.(weight|bias)", r"ln_final.\1"),
    )

    @property
    def checkpoint_renames(self) -> tuple[tuple[str, str], ...]:
        """Checkpoint key -> parameter name; the unembedding (`embed_out` on disk, transformers 5.24's `lm_head`)
        when untied."""
        head = () if self.cfg.tie_word_embeddings else ((r"(?:embed_out|lm_head)\.weight", r"lm_head.weight"),)
        return self.checkpoint_table + head

    @property
    def checkpoint_ignored(self) -> tuple[str, ...]:
        # Older checkpoints carry the causal-mask and RoPE buffers; a tied one may carry a copy of the embedding.
        buffers = (r"gpt_neox\.layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)",)
        return buffers + ((r"(?:embed_out|lm_head)\.weight",) if self.cfg.tie_word_embeddings else ())

    checkpoint_stacked: tuple[tuple, ...] = ()  # nothing stacked: the fused q|k|v stays one parameter
    # TransformerLens 3.9's official names (supported_models.py) of these checkpoints -> its aliases
    # (hooked.transformer_lens.aliases)
    transformer_lens_names = {
        "EleutherAI/gpt-neox-20b": ("gpt-neox-20b", "gpt-neox", "neox"),
        **pythia_names(),
    }
    random_sizes = dict(n_layers=2, d_model=32, n_heads=4, d_mlp=64, d_vocab=64, rotary_dim=4)

    @classmethod
    def draw_sizes(cls, draw, st, n_layers: int, n_heads: int) -> dict:
        """Config fields for a hypothesis-drawn model: head width, rotary share, block kind and options."""
        d_head = draw(st.sampled_from([4, 8, 12]))
        return dict(
            d_model=n_heads * d_head,
            d_mlp=draw(st.sampled_from([32, 48, 64])),
            rotary_dim=draw(st.sampled_from(list(range(2, d_head + 1, 2)))),
            use_parallel_residual=draw(st.booleans()),
            tie_word_embeddings=draw(st.booleans()),
            attention_bias=draw(st.booleans()),
            activation=draw(st.sampled_from(["gelu", "gelu_new", "relu"])),
        )

    hook_docs = {
        "hook_embed": "token embeddings `embed_in[tokens]`, which are block 0's `hook_resid_pre` (RoPE acts on q and"
        " k)",
        "blocks.{i}.ln1.hook_scale": "the LayerNorm's scale `sqrt(var(x) + eps)`, before attention",
        "blocks.{i}.ln1.hook_normalized": "`(x - mean) / scale`, before the norm's weight and bias",
        "blocks.{i}.ln2.hook_scale": "the LayerNorm's scale before the MLP (a parallel block: of resid_pre)",
        "blocks.{i}.ln2.hook_normalized": "`(x - mean) / scale`, before the norm's weight and bias",
        "blocks.{i}.attn.hook_q": "queries: head h's first d_head outputs of its [q k v] slice of `query_key_value`,"
        " before RoPE",
        "blocks.{i}.attn.hook_k": "keys: head h's middle d_head outputs of `query_key_value`, before RoPE",
        "blocks.{i}.attn.hook_v": "values: head h's last d_head outputs of `query_key_value`",
        "blocks.{i}.attn.hook_rot_q": "q with RoPE on its first `rotary_dim` dimensions (pairs i, i + rotary_dim / 2);"
        " the other dimensions as in `hook_q`",
        "blocks.{i}.attn.hook_rot_k": "k with RoPE on its first `rotary_dim` dimensions, as for q",
        "blocks.{i}.attn.hook_attn_scores": "`rot_q @ rot_k^T * d_head**-0.5`, masked entries set to the dtype's"
        " minimum; listening switches the layer to the eager attention path",
        "blocks.{i}.attn.hook_pattern": "softmax of the scores, computed in float32 and cast back",
        "blocks.{i}.attn.hook_z": "per-head attention output; a view of `dense`'s input, so an in-place edit changes"
        " what the projection reads",
        "blocks.{i}.hook_mlp_in": "what ln2 reads: resid_mid, or resid_pre in a parallel block (TransformerLens'"
        " `use_hook_mlp_in`); computed only when a hook listens",
        "blocks.{i}.mlp.hook_in": "`ln2` of resid_mid (a parallel block: of resid_pre), the LayerNorm's weight and bias"
        " included: what `dense_h_to_4h` reads; circuit-tracer's name, the point a transcoder reads; a default cache"
        " leaves it out (cache it by name)",
        "blocks.{i}.mlp.hook_pre": "`dense_h_to_4h(x)`, before the activation",
        "blocks.{i}.mlp.hook_post": "the neurons: `act(pre)` (`hidden_act`, Pythia: exact-erf GELU), `dense_4h_to_h`'s"
        " input",
        "blocks.{i}.hook_mlp_out": "MLP output, `dense_4h_to_h(post)`",
        "blocks.{i}.hook_resid_post": "`resid_mid + mlp_out`; a parallel block: `(mlp_out + attn_out) + resid_pre`",
    }
