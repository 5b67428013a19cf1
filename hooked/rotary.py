"""Rotary position embeddings: the inverse frequencies (plain, YaRN, linear and Llama 3.1 scaling), cos and sin
for a forward's position ids, and the half-split rotation, each in the operation order of transformers 5.24
(`modeling_rope_utils`, the models' `apply_rotary_pos_emb`), so float32 results are bit-identical.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn


def plain_frequencies(d_head: int, theta: float) -> Tensor:
    """1 / theta^(arange(0, d_head, 2) / d_head), float32 on the CPU (the model is built under
    torch.device("meta"), and these are real numbers)."""
    return 1.0 / (theta ** (torch.arange(0, d_head, 2, dtype=torch.float, device="cpu") / d_head))


@dataclass(frozen=True)
class YarnScaling:
    """YaRN rotary scaling (arXiv 2309.00071) as transformers' `_compute_yarn_parameters` reads it."""

    factor: float  # context extension factor
    original_max_positions: int  # context length the model was pretrained with
    beta_fast: float = 32.0  # ramp boundary (rotations) below which frequencies are extrapolated
    beta_slow: float = 1.0  # ramp boundary above which frequencies are interpolated
    attention_factor: float | None = None  # cos/sin multiplier; None: derived from factor (and mscale)
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True  # round the ramp boundaries to whole dimensions

    def frequencies(self, d_head: int, theta: float) -> tuple[Tensor, float]:
        """Interpolated (divided by `factor`) and extrapolated frequencies blended over a linear ramp, in the order
        of transformers 5.24 `modeling_rope_utils._compute_yarn_parameters`, and the cos/sin factor."""

        def get_mscale(scale: float, mscale: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

        attention_factor = self.attention_factor
        if attention_factor is None:
            if self.mscale and self.mscale_all_dim:
                attention_factor = float(
                    get_mscale(self.factor, self.mscale) / get_mscale(self.factor, self.mscale_all_dim)
                )
            else:
                attention_factor = get_mscale(self.factor)

        def correction_dim(rotations: float) -> float:
            return (d_head * math.log(self.original_max_positions / (rotations * 2 * math.pi))) / (2 * math.log(theta))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d_head - 1)
        if low == high:
            high += 0.001  # as transformers: avoid a zero-width ramp
        ramp = torch.clamp((torch.arange(d_head // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
        extrapolation_weight = 1 - ramp
        pos_freqs = theta ** (torch.arange(0, d_head, 2, device="cpu").to(dtype=torch.float) / d_head)
        inv_freq_extrapolation = 1.0 / pos_freqs
        inv_freq_interpolation = 1.0 / (self.factor * pos_freqs)
        inv_freq = inv_freq_interpolation * (1 - extrapolation_weight) + inv_freq_extrapolation * extrapolation_weight
        return inv_freq, attention_factor


@dataclass(frozen=True)
class LinearScaling:
    """Linear ("position interpolation") rotary scaling: every inverse frequency divided by `factor`
    (transformers 5.24 `modeling_rope_utils._compute_linear_scaling_rope_parameters`)."""

    factor: float

    def frequencies(self, d_head: int, theta: float) -> tuple[Tensor, float]:
        return plain_frequencies(d_head, theta) / self.factor, 1.0


@dataclass(frozen=True)
class Llama3Scaling:
    """Llama 3.1's rotary scaling (transformers 5.24 `modeling_rope_utils._compute_llama3_parameters`):
    wavelengths longer than original_max_positions / low_freq_factor are divided by `factor`, shorter
    than original_max_positions / high_freq_factor kept, and those between blended smoothly."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_positions: int  # context length the model was pretrained with

    def frequencies(self, d_head: int, theta: float) -> tuple[Tensor, float]:
        """transformers 5.24 `_compute_llama3_parameters`, operation for operation."""
        inv_freq = plain_frequencies(d_head, theta)
        low_freq_wavelen = self.original_max_positions / self.low_freq_factor
        high_freq_wavelen = self.original_max_positions / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / self.factor, inv_freq)
        smooth_factor = (self.original_max_positions / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / self.factor + smooth_factor * inv_freq_llama
        is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama), 1.0


RopeScaling = YarnScaling | LinearScaling | Llama3Scaling  # each computes its own frequencies


def rotary_frequencies(d_head: int, theta: float, scaling: RopeScaling | None = None) -> tuple[Tensor, float]:
    """Inverse frequencies [d_head / 2] (float32, on the CPU) and the factor cos/sin are multiplied by: plain
    RoPE, or what the scaling computes (`scaling.frequencies`), each in its transformers 5.24 function's
    order so the bits agree."""
    return (plain_frequencies(d_head, theta), 1.0) if scaling is None else scaling.frequencies(d_head, theta)


class RotaryEmbedding(nn.Module):
    """cos and sin [batch pos d_head] for the position ids of one forward (no parameters, no state).

    The frequencies are a plain attribute, not a buffer: the loader builds models on the meta device
    and assigns only checkpoint tensors, so a buffer would stay on meta. They are moved to the
    position ids' device on first use there (d_head / 2 floats).
    """

    def __init__(self, d_head: int, theta: float, scaling: RopeScaling | None = None):
        super().__init__()
        self.d_head, self.theta, self.scaling = d_head, theta, scaling
        self.inv_freq, self.attention_factor = rotary_frequencies(d_head, theta, scaling)

    def forward(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        if self.inv_freq.device != position_ids.device:  # once per device, not a copy per forward
            self.inv_freq = self.inv_freq.to(position_ids.device)
        inv_freq = self.inv_freq
        freqs = position_ids[..., None].float() * inv_freq  # [batch pos d_head/2], float32
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_factor
        sin = emb.sin() * self.attention_factor
        return cos.to(dtype), sin.to(dtype)

    def extra_repr(self) -> str:
        return f"d_head={self.d_head}, theta={self.theta}, scaling={self.scaling}"


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last axis (the half-split RoPE convention)."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x [batch pos head d_head] by cos/sin [batch pos d_head]: x * cos + rotate_half(x) * sin."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return (x * cos) + (rotate_half(x) * sin)


def turn_leading(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The half-split rotary turn of the first cos.shape[-1] dimensions of x [..., d_head], the rest passed through,
    with cos/sin [..., rotary_dim] broadcasting against x's leading axes (one turn per row; `apply_rotary` is the
    model's own, over [batch pos head d_head]). The same arithmetic as `x * cos + rotate_half(x) * sin`, written
    into one new tensor: QK attribution turns tens of thousands of rows at a time (hooked/graphs/qk.py)."""
    rotary_dim = cos.shape[-1]
    half = rotary_dim // 2
    turned = x[..., :rotary_dim]
    out = turned * cos
    out[..., :half].addcmul_(turned[..., half:], sin[..., :half], value=-1)  # rotate_half: (-x2, x1)
    out[..., half:].addcmul_(turned[..., :half], sin[..., half:])
    return (
        out if rotary_dim == x.shape[-1] else torch.cat([out, x[..., rotary_dim:].expand(*out.shape[:-1], -1)], dim=-1)
    )
