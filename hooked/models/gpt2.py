"""GPT-2 (`GPT2LMHeadModel`) with a hook point on every activation TransformerLens names.

Numerics follow Hugging Face transformers 5.24 `models/gpt2/modeling_gpt2.py` exactly: learned position embeddings
added to token embeddings, pre-norm blocks, fused q|k|v projection, attention scaled by
d_head**-0.5 with the softmax in the input dtype, GPT-2's tanh GELU (`gelu_new`), final LayerNorm,
and the unembedding tied to the token embedding. Float32 logits are bit-identical to
`GPT2LMHeadModel` (tests/families/test_gpt2_parity.py).

Weights keep the checkpoint's names and layout: `c_attn`, `c_proj`, `c_fc` are GPT-2's Conv1D
matrices, [in, out], applied with `torch.addmm` as Hugging Face does. An `nn.Linear` layout (transposed
at load) gives the same float32 bits only for some batch shapes: for a single short prompt the BLAS
kernel for a transposed operand sums in another order (7.6e-6 on a 64-wide layer, measured), so the
stored layout is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from hooked.factored import ov_circuit, qk_circuit
from hooked.hooks import HookPoint
from hooked.kv_cache import LayerKV
from hooked.layers import (
    AttentionMask,
    Conv1D,
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
from hooked.rows import current_rows


# ============================================================================= config
@dataclass
class GPT2Config(ModelConfig):
    n_layers: int  # transformer blocks
    d_model: int  # residual stream width
    n_heads: int  # attention heads
    d_mlp: int  # MLP hidden width (n_inner, default 4 * d_model)
    d_vocab: int  # vocabulary size
    n_ctx: int  # learned positions (n_positions)
    layer_norm_eps: float = 1e-5
    activation: Literal["gelu_new", "gelu", "relu"] | None = "gelu_new"  # None in an attn_only model (no MLP)
    scale_attn_by_inverse_layer_idx: bool = False  # divide scores by (layer + 1) as well
    attn_only: bool = False  # TransformerLens' toy models: blocks without MLP (HookedTransformerConfig only)
    default_prepend_bos: bool = True  # as TransformerLens; settable, read by to_tokens and the forward

    # TransformerLens' names for what the architecture fixes
    normalization_type = "LN"
    positional_embedding_type = "standard"
    original_architecture = "GPT2LMHeadModel"
    gated_mlp = False
    final_rms = False
    rotary_dim = None

    act_fn = alias("activation")
    eps = alias("layer_norm_eps")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    n_kv_heads = alias("n_heads")

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")

    transformer_lens_shape = (
        "normalization_type='LN', positional_embedding_type='standard', act_fn gelu_new, gelu or relu"
    )

    @classmethod
    def from_transformer_lens(cls, tl: dict) -> tuple[GPT2Config | None, list[str] | None]:
        if (tl["normalization_type"], tl["positional_embedding_type"]) != ("LN", "standard"):
            return None, None
        n_heads, d_head, d_model, act_fn = tl["n_heads"], tl["d_head"], tl["d_model"], tl["act_fn"]
        problems = [
            f"act_fn={act_fn!r} (GPT-2 has {', '.join(ACTIVATIONS)})"
            if act_fn not in ACTIVATIONS and not tl["attn_only"]
            else None,  # no MLP: act_fn unused
            f"d_model={d_model} != n_heads * d_head = {n_heads * d_head}" if n_heads * d_head != d_model else None,
            "gated_mlp=True" if tl["gated_mlp"] else None,
            "use_qk_norm=True" if tl["use_qk_norm"] else None,
            "parallel_attn_mlp=True" if tl["parallel_attn_mlp"] else None,
            f"n_key_value_heads={tl['n_key_value_heads']}" if tl["n_key_value_heads"] not in (None, n_heads) else None,
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
            n_ctx=tl["n_ctx"],
            layer_norm_eps=tl["eps"],
            activation=act_fn,
            attn_only=tl["attn_only"],
            scale_attn_by_inverse_layer_idx=tl["scale_attn_by_inverse_layer_idx"],
        ), []

    @classmethod
    def from_hf(cls, config: dict) -> GPT2Config:
        unsupported = {
            "add_cross_attention": True,
            "reorder_and_upcast_attn": True,
            "scale_attn_weights": False,
            "tie_word_embeddings": False,
        }
        for key, bad in unsupported.items():
            if config.get(key) == bad:
                raise ValueError(f"GPT-2 with {key}={bad} is not supported by hooked")
        activation = config.get("activation_function", "gelu_new")
        if activation not in ACTIVATIONS:
            raise ValueError(f"GPT-2 activation {activation!r} is not supported ({', '.join(ACTIVATIONS)})")
        return cls(
            n_layers=config["n_layer"],
            d_model=config["n_embd"],
            n_heads=config["n_head"],
            d_mlp=config.get("n_inner") or 4 * config["n_embd"],
            d_vocab=config["vocab_size"],
            n_ctx=config["n_positions"],
            layer_norm_eps=config.get("layer_norm_epsilon", 1e-5),
            activation=activation,
            scale_attn_by_inverse_layer_idx=config.get("scale_attn_by_inverse_layer_idx", False),
        )


# transformers' ACT2FN entries a GPT2Config's `activation_function` may name that hooked runs: the same functions
# (GELUActivation is F.gelu, NewGELUActivation is gelu_new's formula, "relu" is nn.ReLU), so the logits stay exact.
ACTIVATIONS = {"gelu_new": gelu_new, "gelu": F.gelu, "relu": F.relu}


# ============================================================================= modules and forward
class GPT2Attention(nn.Module):
    def __init__(self, cfg: GPT2Config, layer: int):
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_head
        self.scaling = cfg.d_head**-0.5 / (layer + 1 if cfg.scale_attn_by_inverse_layer_idx else 1)
        self.c_attn = Conv1D(cfg.d_model, 3 * cfg.d_model)
        self.c_proj = Conv1D(cfg.d_model, cfg.d_model)
        self.hook_q = HookPoint("batch pos head_index d_head")
        self.hook_k = HookPoint("batch pos head_index d_head")
        self.hook_v = HookPoint("batch pos head_index d_head")
        self.hook_attn_scores = HookPoint("batch head_index query_pos key_pos")  # scaled, masked, pre-softmax
        self.hook_pattern = HookPoint("batch head_index query_pos key_pos")
        self.hook_z = HookPoint("batch pos head_index d_head")  # c_proj's input, split by head
        self.hook_result = HookPoint("batch pos head_index d_model")  # each head's write, before the bias

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"] | tuple[Tensor, Tensor, Tensor],
        mask: AttentionMask,
        kv: LayerKV | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        if isinstance(x, tuple):  # per-head inputs [batch pos head_index d_model] (hooked.layers.attention_input)
            q, k, v = (
                torch.einsum("bphm,hmd->bphd", inputs, weight) + bias
                for inputs, weight, bias in zip(
                    x, (self.W_Q, self.W_K, self.W_V), (self.b_Q, self.b_K, self.b_V), strict=True
                )
            )
        else:
            batch, pos, _ = x.shape
            q, k, v = self.c_attn(x).view(batch, pos, 3, self.n_heads, self.d_head).unbind(2)
        # unbind's outputs are views autograd forbids editing in place: a listening hook gets a copy (writable)
        q = self.hook_q(writable(q) if self.hook_q.listening else q)
        k = self.hook_k(writable(k) if self.hook_k.listening else k)
        v = self.hook_v(writable(v) if self.hook_v.listening else v)
        if kv is not None:  # a KV cache: keys and values of every column so far (this call's included)
            k, v = kv.append(k, v)
        z = attend(q, k, v, mask, self.scaling, self.hook_attn_scores, self.hook_pattern, softmax_in_float32=False)
        return heads_output(self, z, self.c_proj)

    @property
    def W_O(self) -> Float[Tensor, "head_index d_head d_model"]:
        return self.c_proj.weight.view(self.n_heads, self.d_head, -1)

    def _split_qkv(self, index: int) -> Tensor:
        d_model = self.n_heads * self.d_head
        weight = self.c_attn.weight[:, index * d_model : (index + 1) * d_model]
        return weight.reshape(d_model, self.n_heads, self.d_head).transpose(0, 1)

    @property
    def W_Q(self) -> Float[Tensor, "head_index d_model d_head"]:
        return self._split_qkv(0)

    @property
    def W_K(self) -> Float[Tensor, "head_index d_model d_head"]:
        return self._split_qkv(1)

    @property
    def W_V(self) -> Float[Tensor, "head_index d_model d_head"]:
        return self._split_qkv(2)

    @property
    def b_Q(self) -> Float[Tensor, "head_index d_head"]:
        return self.c_attn.bias.view(3, self.n_heads, self.d_head)[0]

    @property
    def b_K(self) -> Float[Tensor, "head_index d_head"]:
        return self.c_attn.bias.view(3, self.n_heads, self.d_head)[1]

    @property
    def b_V(self) -> Float[Tensor, "head_index d_head"]:
        return self.c_attn.bias.view(3, self.n_heads, self.d_head)[2]

    @property
    def b_O(self) -> Float[Tensor, " d_model"]:
        return self.c_proj.bias

    OV = property(ov_circuit, doc="Each head's OV circuit W_V @ W_O: FactoredMatrix [head_index d_model d_model]")
    QK = property(qk_circuit, doc="Each head's QK circuit W_Q @ W_K^T: FactoredMatrix [head_index d_model d_model]")

    tp_counts = {"n_heads": "heads"}

    def tp_plan(self) -> dict[str, Split]:
        """Tensor parallelism: each rank holds some heads' q|k|v columns and their c_proj rows."""
        return {
            "c_attn.weight": Split("heads", 1, self.d_head, parts=3),
            "c_attn.bias": Split("heads", 0, self.d_head, parts=3),
            "c_proj.weight": Split("heads", 0, self.d_head, reduce=True),
        }

    # For weight processing (hooked.processing): c_attn reads ln1's output along its rows
    # (Conv1D [in, out]).
    def residual_readers(self) -> tuple[Projection, ...]:
        return (Projection(self.c_attn.weight, 0, self.c_attn.bias),)

    def query_key_path(self) -> QueryKeyPath:
        """No q/k norm and no rotary embeddings (positions are learned): the scores read hook_q and hook_k."""
        return QueryKeyPath(None, None, "hook_q", "hook_k")

    def residual_writers(self) -> tuple[Projection, ...]:
        return (Projection(self.c_proj.weight, 1, self.c_proj.bias),)

    @property
    def value_bias(self) -> Tensor:  # [head_index * d_head]
        """The value part of c_attn's bias, as stored (a view)."""
        return self.c_attn.bias[2 * self.n_heads * self.d_head :]


class GPT2MLP(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.c_fc = Conv1D(cfg.d_model, cfg.d_mlp)
        self.c_proj = Conv1D(cfg.d_mlp, cfg.d_model)
        self.activation = ACTIVATIONS[cfg.activation]
        self.hook_in = HookPoint("batch pos d_model")  # what the MLP reads: after ln2 (its weight included)
        self.hook_in.cached_by_default = False  # as hook_mlp_in: a copy of a neighbour, cached on request
        self.hook_pre = HookPoint("batch pos d_mlp")
        self.hook_post = HookPoint("batch pos d_mlp")  # the neurons

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        x = self.hook_in(x)
        pre = self.hook_pre(self.c_fc(x))
        post = self.hook_post(self.activation(pre))
        return self.c_proj(post)

    @property
    def W_in(self) -> Float[Tensor, "d_model d_mlp"]:
        return self.c_fc.weight  # Conv1D stores [in, out], TransformerLens' layout

    @property
    def W_out(self) -> Float[Tensor, "d_mlp d_model"]:
        return self.c_proj.weight

    @property
    def b_in(self) -> Float[Tensor, " d_mlp"]:
        return self.c_fc.bias

    @property
    def b_out(self) -> Float[Tensor, " d_model"]:
        return self.c_proj.bias

    def tp_plan(self) -> dict[str, Split]:
        """Tensor parallelism: each rank holds some neurons' c_fc columns and c_proj rows."""
        return {
            "c_fc.weight": Split("d_mlp", 1),
            "c_fc.bias": Split("d_mlp", 0),
            "c_proj.weight": Split("d_mlp", 0, reduce=True),
        }

    def residual_readers(self) -> tuple[Projection, ...]:
        return (Projection(self.c_fc.weight, 0, self.c_fc.bias),)

    def residual_writers(self) -> tuple[Projection, ...]:
        return (Projection(self.c_proj.weight, 1, self.c_proj.bias),)


class GPT2Block(DecoderBlock):
    mlp_stage = ("hook_mlp_in", "ln2", "mlp", "hook_mlp_out", "hook_resid_post")  # what mlp_half computes

    def __init__(self, cfg: GPT2Config, layer: int):
        super().__init__()
        # Declared in forward order: hook_dict lists hooks in the order they fire.
        self.hook_resid_pre = HookPoint("batch pos d_model")
        self.hook_q_input = HookPoint(
            "batch pos head_index d_model"
        )  # each head's copy of resid_pre (see attention_input)
        self.hook_k_input = HookPoint("batch pos head_index d_model")
        self.hook_v_input = HookPoint("batch pos head_index d_model")
        self.ln1 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.attn = GPT2Attention(cfg, layer)
        self.hook_attn_out = HookPoint("batch pos d_model")
        if cfg.attn_only:
            # TransformerLens 3.9's attn_only block (components/transformer_block.py): no ln2, no MLP, no
            # resid_mid. Generic code reads `block.mlp is None`; TransformerLens' never-firing hook_mlp_in and
            # hook_mlp_out are left out, so a hook put there raises instead of silently never running.
            self.ln2 = self.mlp = None
        else:
            self.hook_resid_mid = HookPoint("batch pos d_model")
            self.hook_mlp_in = HookPoint("batch pos d_model")  # what the MLP half reads, before ln2
            self.ln2 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
            self.mlp = GPT2MLP(cfg)
            self.hook_mlp_out = HookPoint("batch pos d_model")
        self.hook_resid_post = HookPoint("batch pos d_model")

    def attn_half(self, resid_pre: Tensor, mask: AttentionMask, kv: LayerKV | None = None) -> Tensor:
        resid_pre = self.hook_resid_pre(resid_pre)
        n_heads = self.attn.n_heads
        attn_out = self.hook_attn_out(self.attn(attention_input(self, resid_pre, n_heads, n_heads), mask, kv))
        if self.mlp is None:  # attention-only: the sum is resid_post, hooked in mlp_half (the block's second stage)
            return attn_out + resid_pre
        return self.hook_resid_mid(attn_out + resid_pre)

    def mlp_half(self, resid_mid: Tensor) -> Tensor:
        if self.mlp is None:
            return self.hook_resid_post(resid_mid)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(mlp_input(self, resid_mid))))
        return self.hook_resid_post(resid_mid + mlp_out)


def _padded_columns(tokens: Tensor) -> Tensor | None:
    """[batch pos] True at the padded columns of `tokens` in the running forward (None: none padded, or
    called outside a forward). A generation step's columns are the last of the forward's mask."""
    try:
        mask = current_rows().attention_mask
    except RuntimeError:
        return None
    if mask is None or mask.shape[0] != tokens.shape[0] or bool(mask[:, -tokens.shape[1] :].all()):
        return None
    return ~mask[:, -tokens.shape[1] :].to(tokens.device)


class GPT2(HookedTransformer):
    """GPT-2 with TransformerLens hook names. Load with `hooked.load("gpt2")`."""

    def __init__(self, cfg: GPT2Config):
        super().__init__(cfg)
        self.wte = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.hook_embed = HookPoint("batch pos d_model")
        self.wpe = nn.Embedding(cfg.n_ctx, cfg.d_model)
        self.hook_pos_embed = HookPoint("batch pos d_model")
        self.blocks = nn.ModuleList(GPT2Block(cfg, layer) for layer in range(cfg.n_layers))
        self.ln_final = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.setup_hooks()

    def resid_from_tokens(self, tokens: Tensor, position_ids: Tensor) -> Float[Tensor, "batch pos d_model"]:
        embed = self.hook_embed(self.wte(tokens))
        pos_embed = self.wpe(position_ids)
        padding = _padded_columns(tokens)
        if padding is not None:  # TransformerLens 3.9's PosEmbed: 0 at padded positions (real ones unchanged)
            pos_embed = pos_embed.masked_fill(padding[..., None], 0.0)
        return embed + self.hook_pos_embed(pos_embed)

    def block_inputs(self, position_ids: Tensor, mask: AttentionMask, dtype: torch.dtype) -> tuple:
        return (mask,)

    def embedding_writers(self) -> tuple[Projection, ...]:
        return (Projection(self.wte.weight, 1), Projection(self.wpe.weight, 1))

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.wte.weight

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        return self.wpe.weight

    @property
    def W_E_pos(self) -> Float[Tensor, "d_vocab_plus_n_ctx d_model"]:
        """W_E and W_pos stacked, as TransformerLens: every input direction, for full QK and OV circuits."""
        return torch.cat([self.W_E, self.W_pos])

    @property
    def max_positions(self) -> int:
        return self.cfg.n_ctx

    # ------------------------------------------------------------------------- declarations
    # What the rest of the library reads about GPT-2 (docs/adding-a-model.md).
    config_class = GPT2Config
    architectures = ("GPT2LMHeadModel", "gpt2")
    family = "gpt2"
    title = "GPT-2"
    embedding_hook_names = ("hook_embed", "hook_pos_embed")
    # Checkpoint key -> parameter name. Both layouts: transformers' (`transformer.` prefix) and
    # the hub's original file (no prefix, plus causal-mask buffers `attn.bias` / `attn.masked_bias`).
    checkpoint_renames = (
        (r"(?:transformer\.)?(wte|wpe)\.weight", r"\1.weight"),
        (r"(?:transformer\.)?h\.(\d+)\.ln_1\.(weight|bias)", r"blocks.\1.ln1.\2"),
        (r"(?:transformer\.)?h\.(\d+)\.ln_2\.(weight|bias)", r"blocks.\1.ln2.\2"),
        (r"(?:transformer\.)?h\.(\d+)\.(attn|mlp)\.(c_attn|c_proj|c_fc)\.(weight|bias)", r"blocks.\1.\2.\3.\4"),
        (r"(?:transformer\.)?ln_f\.(weight|bias)", r"ln_final.\1"),
    )
    checkpoint_ignored = (r"(?:transformer\.)?h\.\d+\.attn\.(bias|masked_bias)", r"lm_head\.weight")
    # TransformerLens 3.9's official names (supported_models.py) of GPT-2 checkpoints -> its aliases
    # (hooked.transformer_lens.aliases)
    transformer_lens_names = {
        "gpt2": ("gpt2-small",),
        "gpt2-medium": (),
        "gpt2-large": (),
        "gpt2-xl": (),
        "distilgpt2": ("distillgpt2", "distill-gpt2", "distil-gpt2", "gpt2-xs"),
    }
    random_sizes = dict(n_layers=2, d_model=32, n_heads=4, d_mlp=64, d_vocab=64, n_ctx=32)

    @classmethod
    def draw_sizes(cls, draw, st, n_layers: int, n_heads: int) -> dict:
        return dict(
            d_model=draw(st.sampled_from([d for d in range(16, 49, 4) if d % n_heads == 0])),
            d_mlp=draw(st.sampled_from([32, 48, 64])),
            n_ctx=32,
        )

    hook_docs = {  # what each hook holds here, for docs/hooks-reference.md (shared meanings live there)
        "hook_embed": "token embeddings `wte[tokens]`",
        "blocks.{i}.ln1.hook_scale": "the LayerNorm's scale `sqrt(var(x) + eps)`, before attention",
        "blocks.{i}.ln1.hook_normalized": "`(x - mean) / scale`, before the norm's weight and bias",
        "blocks.{i}.attn.hook_q": "queries, split by head: a view of the fused `c_attn` output",
        "blocks.{i}.attn.hook_k": "keys, split by head: a view of the fused `c_attn` output",
        "blocks.{i}.attn.hook_v": "values, split by head: a view of the fused `c_attn` output",
        "blocks.{i}.attn.hook_attn_scores": "`q @ k^T * d_head**-0.5`, masked entries set to the dtype's minimum (not"
        " -inf); listening switches the layer to the eager attention path",
        "blocks.{i}.attn.hook_z": "per-head attention output; a view of `c_proj`'s input, so an in-place edit changes"
        " what the projection reads",
        "blocks.{i}.mlp.hook_in": "`ln2(resid_mid)`, the LayerNorm's weight and bias included: what `c_fc` reads;"
        " circuit-tracer's name, the point a transcoder reads; a default cache leaves it out (cache it by name)",
        "blocks.{i}.mlp.hook_pre": "`c_fc` output, the pre-activation",
        "blocks.{i}.mlp.hook_post": "the neurons, `act(pre)`: `gelu_new` unless the config names `gelu` or `relu`",
        "hook_pos_embed": "position embeddings `wpe[position_ids]` (position ids skip left padding)",
    }
