"""TransformerLens' weight processing, done in place on hooked's own parameters.

TransformerLens' `HookedTransformer.from_pretrained` rewrites the weights so that the residual stream is
easier to read without changing what the model computes (TransformerLens 3.9, `weight_processing.py`,
`ProcessWeights.process_weights`), in this order:

- `fold_ln`: each norm's weight (and LayerNorm's bias) moves into the weights that read the norm's output
  (q/k/v, the MLP's input, the router and experts, the unembedding; LayerNorm's bias into their biases,
  the final one into a new unembedding bias b_U), and the norm keeps only its normalisation: weight 1,
  bias 0 (TransformerLens' `LNPre` / `RMSPre`, `cfg.normalization_type`). For LayerNorm the reading
  weights are then centred over d_model (the normalised input has mean 0, so that component never
  mattered). RMSNorm (Qwen3) folds the weight only: no bias, no centring, as TransformerLens does.
- `center_writing_weights` (LayerNorm models only, as TransformerLens): every weight that writes to the
  residual stream (W_E, W_pos, W_O, W_out) and its bias loses its mean over d_model. Every LayerNorm
  removes that mean anyway, so no norm's output changes; the residual stream itself is centred.
- `center_unembed`: W_U (and b_U) lose their mean over the vocabulary: every logit of a position shifts
  by the same amount, so log-probs, loss and argmax are unchanged, logits are not.
- `fold_value_biases`: b_O += sum over heads of b_V[h] @ W_O[h], b_V = 0 (attention patterns sum to 1, so
  a value bias is a constant write); then b_O is centred again where writing weights are centred.
- `refactor_factored_attn_matrices`: each head's W_Q, W_K (with their biases as an extra input row) and
  W_V, W_O are re-factored through the SVD of W_Q W_K^T and W_V W_O (TransformerLens' experimental
  option, off by default); refused for rotary models, whose QK circuit depends on positions.

Each step runs tensor by tensor on the parameters themselves (`torch.no_grad`, in-place ops), so the
peak memory stays that of the weights: the only new tensors are means and bias updates, float32 copies of
16 MiB blocks of a weight when the weights are in a lower precision (TransformerLens processes in
float32), and the weights processing adds: an unembedding of its own when W_E and W_U are tied (they no
longer agree once processed) and, with LayerNorm, the unembedding bias.

Where each architecture keeps these weights is declared next to it, as data: every attention and MLP
module lists its `residual_readers()` and `residual_writers()` (`Projection`s: a weight, its d_model
axis, its bias), an attention module its stored `value_bias`, and the model its `embedding_writers()`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from hooked.layers import Projection  # noqa: F401  (declared by the layers, read here)

FLAGS = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases", "refactor_factored_attn_matrices")

# The hook points whose activations each flag changes (fnmatch patterns over hooked's names); every other point
# keeps its values to float rounding. fold_ln moves each norm's gain into the weights that read it, so of the
# activations only a norm's output *with* its gain changes, which is what the MLP reads (`mlp.hook_in`); the residual
# stream, `ln*.hook_normalized` (before the gain), q/k/v and every output stay. The other flags are declared as
# changing every point (centring the writing weights changes the residual stream and every write to it, folding
# value biases hook_v and hook_z). Read where a dictionary records the processing it was trained on
# (hooked/sae/splice.py): a difference matters only at the points it reads and writes. Checked by running models
# with and without each flag (tests/transformer_lens/test_processing.py).
CHANGED_POINTS = {
    "fold_ln": ("blocks.*.mlp.hook_in",),
    "center_writing_weights": ("*",),
    "center_unembed": ("*",),
    "fold_value_biases": ("*",),
    "refactor_factored_attn_matrices": ("*",),
}


def changes_activations(flag: str, point: str) -> bool:
    """Whether processing flag `flag` changes the activation at hook point `point` (CHANGED_POINTS)."""
    return any(fnmatch.fnmatchcase(point, pattern) for pattern in CHANGED_POINTS[flag])


def unprocessed() -> dict[str, bool]:
    """The record of a model loaded as the checkpoint stores it: every flag False (`model.processing`)."""
    return dict.fromkeys(FLAGS, False)


def flags_of(arguments: dict) -> dict[str, bool]:
    """The processing flags among a call's arguments (`flags_of(locals())`), in FLAGS' order: `process_weights`,
    `hooked.load` and `HookedTransformer.from_pretrained` take each flag by name and read them here alike."""
    return {flag: arguments[flag] for flag in FLAGS}


def process_weights(
    model: nn.Module,
    fold_ln: bool = True,
    center_writing_weights: bool = True,
    center_unembed: bool = True,
    fold_value_biases: bool = True,
    refactor_factored_attn_matrices: bool = False,
) -> nn.Module:
    """Process `model`'s weights in place as TransformerLens' `from_pretrained` does; returns the model.

    The defaults are TransformerLens'. Steps that do not apply are skipped, as there: centring the
    writing weights on an RMSNorm model, folding value biases on a model without them. What was done is
    recorded in `model.processing` (and `cfg.normalization_type` becomes "LNPre" / "RMSPre" with
    `fold_ln`). Activations keep their meaning; see docs/transformer-lens.md for which hook values change.

        model = hooked.load("gpt2")
        hooked.processing.process_weights(model)   # = HookedTransformer.from_pretrained("gpt2")
    """
    flags = flags_of(locals())
    check_flags(model, flags)
    if not any(flags.values()):
        return model
    layer_norm = model.cfg.normalization_type == "LN"  # else RMSNorm (Qwen3): no bias, no centring
    center_writing_weights = center_writing_weights and layer_norm
    with torch.no_grad():
        if fold_ln or center_unembed or center_writing_weights:  # W_U and W_E stop being one tensor
            model.untie_unembedding(bias=fold_ln and layer_norm)
        if fold_ln:
            for norm, readers in _norm_readers(model):
                _fold_norm(norm, readers, layer_norm)
            model.cfg._set_normalization_type(f"{model.cfg.normalization_type}Pre")
        if center_writing_weights:
            for writer in _residual_writers(model):
                _center_writer(writer)
        if center_unembed:
            _center_unembed(model)
        if fold_value_biases:
            for block in model.blocks:
                _fold_value_bias(block.attn, model.cfg, recenter=center_writing_weights)
        if refactor_factored_attn_matrices:
            parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
            for block in model.blocks:
                _refactor_attention(block.attn, parameters)
    model.processing = dict(flags, center_writing_weights=center_writing_weights)
    return model


def check_flags(model: nn.Module, flags: dict[str, bool]) -> None:
    """Refuse processing that cannot be done, before anything is changed (also before a load reads weights)."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, not {value!r}")
    if not any(flags.values()):
        return
    if getattr(model, "tensor_parallel", False):
        raise ValueError(
            "weight processing is not supported under tensor parallelism (hooked.load(..., tp=N)): centring the"
            " unembedding needs the whole vocabulary on one rank; load with tp=1 or without processing"
        )
    done = [name for name, value in getattr(model, "processing", {}).items() if value]
    if done:
        raise ValueError(
            f"this model's weights are already processed ({', '.join(done)}); load the checkpoint again to process"
            " it differently"
        )
    cap = model.cfg.output_logits_soft_cap
    if flags["center_unembed"] and cap > 0:
        raise ValueError(
            f"center_unembed=True: this model caps its logits ({cap} * tanh(logits / {cap})), and a cap does not"
            " commute with the shift centring the unembedding makes, so every probability would change"
            " (TransformerLens 3.9 turns it off with a warning). Pass center_unembed=False:"
            " HookedTransformer.from_pretrained(path, center_unembed=False)"
        )
    if flags["refactor_factored_attn_matrices"] and model.cfg.positional_embedding_type == "rotary":
        raise ValueError(
            "refactor_factored_attn_matrices=True: a rotary model's QK circuit depends on the query's and the key's"
            " positions, so W_Q W_K^T cannot be refactored (TransformerLens refuses it too); pass False"
        )


# ----------------------------------------------------------------------------- the layout
def _norm_readers(model: nn.Module) -> Iterator[tuple[nn.Module, tuple[Projection, ...]]]:
    """Every norm with the weights that read its output, the final norm with the unembedding."""
    for block in model.blocks:
        yield block.ln1, block.attn.residual_readers()
        if block.mlp is not None:  # an attention-only block (cfg.attn_only) has no ln2 and no MLP
            yield block.ln2, block.mlp.residual_readers()
    yield model.ln_final, (Projection(model.unembed_weight, 1, model.unembed_bias),)


def _residual_writers(model: nn.Module) -> Iterator[Projection]:
    yield from model.embedding_writers()
    for block in model.blocks:
        yield from block.attn.residual_writers()
        if block.mlp is not None:
            yield from block.mlp.residual_writers()


# ----------------------------------------------------------------------------- the steps
# A lower-precision weight is processed in float32 (as TransformerLens does), this many elements at a time:
# a whole float32 copy of a bfloat16 embedding would hold as many bytes as the embedding twice over.
BLOCK_ELEMENTS = 1 << 22


def _blocks(tensor: Tensor, write: bool = True) -> Iterator[tuple[slice, Tensor]]:
    """`tensor` in float32, rows block by block: (which rows, the block). A float32 tensor is one block,
    itself, edited in place; a lower-precision one gives float32 copies, each written back (`write`) once
    the caller's loop body has edited it."""
    if tensor.dtype in (torch.float32, torch.float64):
        yield slice(None), tensor
        return
    step = max(1, BLOCK_ELEMENTS // max(1, tensor[0].numel()))
    for start in range(0, tensor.shape[0], step):
        part = tensor[start : start + step]
        block = part.float()
        yield slice(start, start + step), block
        if write:
            part.copy_(block)


def _wide(tensor: Tensor) -> Tensor:
    """`tensor` in the precision it is processed in: float32, or float64 for a float64 model."""
    return tensor if tensor.dtype in (torch.float32, torch.float64) else tensor.float()


def _broadcast(vector: Tensor, ndim: int, axis: int) -> Tensor:
    shape = [1] * ndim
    shape[axis] = -1
    return vector.view(shape)


def _scale(weight: Tensor, axis: int, scale: Tensor) -> None:
    """weight *= scale along `axis`."""
    for rows, block in _blocks(weight):
        block.mul_(_broadcast(scale[rows] if axis == 0 else scale, block.ndim, axis))


def _center(tensor: Tensor, axis: int) -> None:
    """tensor -= its mean along `axis` (over every block first, when the axis is the blocks' own)."""
    if axis != 0:
        for _, block in _blocks(tensor):
            block.sub_(block.mean(axis, keepdim=True))
        return
    mean = sum(block.sum(0) for _, block in _blocks(tensor, write=False)) / tensor.shape[0]
    for _, block in _blocks(tensor):
        block.sub_(mean)


def _contract(weight: Tensor, axis: int, vector: Tensor) -> Tensor:
    """`weight` summed against `vector` along `axis` (its last axis, or the first of a matrix), in float32,
    by matmuls: no temporary the size of the weight."""
    if axis in (-1, weight.ndim - 1):
        return torch.cat([block @ vector for _, block in _blocks(weight, write=False)])
    if axis == 0 and weight.ndim == 2:
        return sum(vector[rows] @ block for rows, block in _blocks(weight, write=False))
    raise ValueError(f"cannot contract axis {axis} of a weight of shape {tuple(weight.shape)}")


def _add(tensor: Tensor, update: Tensor) -> None:
    for rows, block in _blocks(tensor):
        block.add_(update[rows])


def _fold_norm(norm: nn.Module, readers: tuple[Projection, ...], layer_norm: bool) -> None:
    """Fold `norm`'s gain (and bias) into its readers, centre them (LayerNorm), and leave the norm bare. The
    gain is what multiplies the normalised input: the weight, or `1 + weight` where the norm says so (Gemma)."""
    scale = _wide(norm.gain)
    shift = _wide(norm.bias) if layer_norm else None
    for reader in readers:
        if shift is not None:  # (n w + b) @ W + c = n @ (w W) + (b @ W + c), with W before the scaling
            if reader.bias is None:
                raise ValueError(
                    f"cannot fold a LayerNorm bias into a weight of shape {tuple(reader.weight.shape)} without a bias"
                )
            _add(reader.bias, _contract(reader.weight, reader.axis, shift))
        _scale(reader.weight, reader.axis, scale)
        if layer_norm:  # the normalised input has mean 0: its component along the all-ones direction is unused
            _center(reader.weight, reader.axis)
    norm.set_unit_gain()
    if layer_norm:
        norm.bias.zero_()


def _center_writer(writer: Projection) -> None:
    _center(writer.weight, writer.axis)
    if writer.bias is not None:
        _center(writer.bias, 0)


def _center_unembed(model: nn.Module) -> None:
    """W_U [d_vocab d_model] here: the mean over the vocabulary is over axis 0."""
    _center(model.unembed_weight, 0)
    if model.unembed_bias is not None:
        _center(model.unembed_bias, 0)


def _fold_value_bias(attn: nn.Module, cfg, recenter: bool) -> None:
    """b_O += sum_h b_V[h] @ W_O[h]; b_V = 0. A model without value biases has nothing to fold."""
    value_bias = attn.value_bias  # as stored: [n_kv_heads * d_head]
    if value_bias is None:
        return
    (writer,) = attn.residual_writers()
    if writer.bias is None:
        raise ValueError("cannot fold value biases into an attention output without a bias")
    group = cfg.n_heads // cfg.n_kv_heads
    per_query_head = _wide(value_bias).view(cfg.n_kv_heads, cfg.d_head).repeat_interleave(group, 0).reshape(-1)
    contracted = 1 - (writer.axis % 2)  # the output projection's other (head_index d_head) axis
    _add(writer.bias, _contract(writer.weight, contracted, per_query_head))
    if recenter:  # TransformerLens centres b_O again after folding
        _center(writer.bias, 0)
    value_bias.zero_()


def _refactor_attention(attn: nn.Module, parameters: set[int]) -> None:
    """TransformerLens' `refactor_factored_attn_matrices` for one layer, through the TransformerLens-named
    views of the attention's weights (each must be a view of a parameter: checked)."""
    from hooked.factored import FactoredMatrix

    W_Q, b_Q, W_K, b_K = (getattr(attn, name).float() for name in ("W_Q", "b_Q", "W_K", "b_K"))
    # The biases as an extra input row: a d_model + 1 input whose last coordinate is 1.
    query = torch.cat([W_Q, b_Q[:, None, :]], dim=1)
    key = torch.cat([W_K, b_K[:, None, :]], dim=1)
    query, key_t = FactoredMatrix(query, key.transpose(-1, -2)).make_even().pair
    key = key_t.transpose(-1, -2)
    W_V, b_V, W_O = (getattr(attn, name).float() for name in ("W_V", "b_V", "W_O"))
    b_O = attn.b_O.float() + (b_V[:, :, None] * W_O).sum((0, 1))
    U, S, V = FactoredMatrix(W_V, W_O).svd()
    for name, value in (
        ("W_Q", query[:, :-1]),
        ("b_Q", query[:, -1]),
        ("W_K", key[:, :-1]),
        ("b_K", key[:, -1]),
        ("W_V", U * S[:, None, :]),
        ("b_V", torch.zeros_like(b_V)),
        ("W_O", V.transpose(-1, -2)),
        ("b_O", b_O),
    ):
        view = getattr(attn, name)
        if view.untyped_storage().data_ptr() not in parameters:
            raise RuntimeError(
                f"{type(attn).__name__}.{name} is not a view of a parameter, so it cannot be refactored in place"
            )
        view.copy_(value)
