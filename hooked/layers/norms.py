"""Norms with TransformerLens' hook points: `LayerNorm` and `RMSNorm` over one base, `HookedNorm`, which fires
`hook_scale` and `hook_normalized` and keeps the checkpoint's own formula for the output unless a hook edits one
of them (docs/hooks.md).

Each reproduces the Hugging Face (transformers 5.24) operation order, so float32 results are bit-identical.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hooked.hooks import HookPoint


class HookedNorm(nn.Module):
    """A norm with TransformerLens' hooks `hook_scale` and `hook_normalized` (subclasses: the arithmetic).

    Without listeners it runs `unhooked` (the checkpoint's own kernel, bit-identical to Hugging Face). With
    listeners the hooks see, and may replace, the step-by-step intermediates; when they change nothing (no
    replacement, no in-place edit: the tensors' version counters say so) the output is still `unhooked`'s,
    so caching or watching a norm never moves any later number by a rounding (a pattern cached with or
    without the norm's hooks is the same tensor). Gradients flow through the hooked intermediates either way.
    Under `torch.inference_mode()`, where tensors keep no version counter, an in-place edit cannot be ruled
    out and the step-by-step output is used.
    """

    def forward(self, x: Tensor) -> Tensor:
        if not (self.hook_scale.listening or self.hook_normalized.listening):
            return self.unhooked(x)
        return self.fire(x)[0]

    def fire(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The output through the hooks, and what it is had they changed nothing, by the same arithmetic (so
        `output - reference` is exactly 0 wherever the hooks left the values alone)."""
        scale = self.scale(x)
        tracked = not scale.is_inference()
        scale_version = scale._version if tracked else None
        hooked_scale = self.hook_scale(scale)
        normalized = self.normalize(x, hooked_scale)
        normalized_version = normalized._version if tracked else None
        hooked_normalized = self.hook_normalized(normalized)
        untouched = (
            tracked
            and hooked_scale is scale
            and hooked_normalized is normalized
            and scale._version == scale_version
            and normalized._version == normalized_version
        )
        if not untouched:
            return self.affine(hooked_normalized), self.stepwise(x)
        exact = self.unhooked(x)
        if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters())):
            stepwise = self.affine(hooked_normalized)  # the value of `exact`, the gradient of the hooked path
            exact = exact.detach() + (stepwise - stepwise.detach())
        return exact, exact

    def stepwise(self, x: Tensor) -> Tensor:
        """The hooked arithmetic without the hooks."""
        return self.affine(self.normalize(x, self.scale(x)))

    @property
    def gain(self) -> Tensor:
        """The elementwise factor applied to the normalised input ([d]): what a direction read out through
        this norm is multiplied by (the weight here; a norm computing `(1 + weight) * x` says so)."""
        return self.weight

    def set_unit_gain(self) -> None:
        """Make `gain` all ones: weight processing folded it into the weights that read this norm's output
        (a norm whose gain is not its weight overrides this with its own)."""
        self.weight.fill_(1.0)


class LayerNorm(HookedNorm):
    """LayerNorm with TransformerLens' hooks: `hook_scale` [batch pos 1], `hook_normalized`.

    `hook_normalized` holds (x - mean) / scale, before the weight and bias are applied (HookedNorm says
    when the output is `F.layer_norm`'s and when the step-by-step one).
    """

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.hook_scale = HookPoint("batch pos 1")
        self.hook_normalized = HookPoint("batch pos d_model")

    def scale(self, x: Tensor) -> Tensor:
        centered = x - x.mean(-1, keepdim=True)
        return (centered.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    def normalize(self, x: Tensor, scale: Tensor) -> Tensor:
        return (x - x.mean(-1, keepdim=True)) / scale

    def affine(self, normalized: Tensor) -> Tensor:
        return normalized * self.weight + self.bias

    def unhooked(self, x: Tensor) -> Tensor:
        """The norm without firing its hooks (per-head split inputs: `attention_input`)."""
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)

    def normalize_with_scale(self, x: Tensor, scale: Tensor) -> Tensor:
        """What this norm does to `x` given the scale it used in the real forward (no weight)."""
        return (x - x.mean(-1, keepdim=True)) / scale

    # TransformerLens' names for the parameters (`model.ln_final.w`, `blocks[i].ln1.b`): the same tensors.
    w = property(lambda self: self.weight, doc="The weight, as TransformerLens names it: [d_model]")
    b = property(lambda self: self.bias, doc="The bias, as TransformerLens names it: [d_model]")


class RMSNorm(HookedNorm):
    """RMSNorm as Qwen3: normalise in float32, cast back, then multiply by the weight.

    `hook_scale` holds sqrt(mean(x^2) + eps) in float32 ([batch pos 1]); `hook_normalized` the
    normalised input in the model dtype, before the weight.
    """

    def __init__(self, d: int, eps: float, axes: str = "batch pos"):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.hook_scale = HookPoint(f"{axes} 1")
        self.hook_normalized = HookPoint(f"{axes} {'d_model' if axes == 'batch pos' else 'd_head'}")

    def scale(self, x: Tensor) -> Tensor:
        return (x.float().pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    def normalize(self, x: Tensor, scale: Tensor) -> Tensor:
        return (x.float() / scale).to(x.dtype)

    def affine(self, normalized: Tensor) -> Tensor:
        return self.weight * normalized

    def unhooked(self, x: Tensor) -> Tensor:
        """The norm without firing its hooks (per-head split inputs: `attention_input`)."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def normalize_with_scale(self, x: Tensor, scale: Tensor) -> Tensor:
        return x / scale

    w = property(lambda self: self.weight, doc="The weight, as TransformerLens names it (RMSNorm has no bias)")
