"""The MLP pieces every architecture shares: what the MLP half reads (`mlp_input`, for `hook_mlp_in`), the gated
MLP of the Llama / Qwen style families (`GatedMLP`), GPT-2's `gelu_new`, and the message a router gives when
every expert of a layer is ablated.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hooked.hooks import HookPoint
from hooked.layers.declarations import Projection, Split


def mlp_input(block: nn.Module, resid_mid: Tensor) -> Tensor:
    """`blocks.{i}.hook_mlp_in`: what the MLP half reads before its norm. A copy when hooked, so an in-place
    edit changes the MLP's input and not the residual stream (TransformerLens' `use_hook_mlp_in`)."""
    point = block.hook_mlp_in
    return point(resid_mid.clone()) if point.listening else resid_mid


def gelu_new(x: Tensor) -> Tensor:
    """GPT-2's tanh GELU in Hugging Face's exact operation order (F.gelu(approximate='tanh') differs).

    Without autograd the same operations run in place on one buffer: bit-identical (each step
    rounds the same; halving 1 + tanh is exact), and about 3x faster on activations larger than the cache,
    where the seven temporaries of the plain expression are memory-bound (a fifth of a sweep's time).
    The cube is `(x * x) * x` on the CPU in float32, float64 and bfloat16: what `torch.pow(x, 3.0)` computes
    there (PyTorch 2.13's aten/src/ATen/native/cpu/PowKernel.cpp, `pow_tensor_scalar_optimized_kernel`), in
    two vectorised passes that take about 60% of pow's time; elsewhere `torch.pow` itself.
    """
    if torch.is_grad_enabled() and x.requires_grad:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    cube = x.mul(x).mul_(x) if x.device.type == "cpu" and x.dtype in _CUBED_BY_PRODUCT else torch.pow(x, 3.0)
    # (1 + tanh) * 0.5, then * x: the one rounding of x (1 + tanh) / 2 that (0.5 * x) * (1 + tanh) makes, also
    # where x * (1 + tanh) overflows (x near the dtype's max, where halving last gave inf)
    return cube.mul_(0.044715).add_(x).mul_(math.sqrt(2.0 / math.pi)).tanh_().add_(1.0).mul_(0.5).mul_(x)


_CUBED_BY_PRODUCT = (torch.float32, torch.float64, torch.bfloat16)  # pow(x, 3.0) is (x * x) * x on the CPU


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), no biases (Llama / Qwen style), with TransformerLens' hooks.

    `hook_pre` is the gate's pre-activation, `hook_pre_linear` the up projection, and `hook_post`
    the neurons, act(gate) * up: the down projection's input.
    """

    def __init__(self, d_model: int, d_mlp: int, activation=F.silu):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_mlp, bias=False)
        self.up_proj = nn.Linear(d_model, d_mlp, bias=False)
        self.down_proj = nn.Linear(d_mlp, d_model, bias=False)
        self.activation = activation
        self.hook_in = HookPoint("batch pos d_model")  # what the MLP reads: after ln2 (its weight included)
        self.hook_in.cached_by_default = False  # as hook_mlp_in: a copy of a neighbour, cached on request
        self.hook_pre = HookPoint("batch pos d_mlp")  # gate pre-activation
        self.hook_pre_linear = HookPoint("batch pos d_mlp")  # up projection
        self.hook_post = HookPoint("batch pos d_mlp")  # the neurons: act(gate) * up

    def forward(self, x: Tensor) -> Tensor:
        x = self.hook_in(x)
        pre = self.hook_pre(self.gate_proj(x))
        pre_linear = self.hook_pre_linear(self.up_proj(x))
        post = self.hook_post(self.activation(pre) * pre_linear)
        return self.down_proj(post)

    def tp_plan(self) -> dict[str, Split]:
        """Tensor parallelism: each rank holds some neurons' gate/up rows and down_proj's columns."""
        plan = {"down_proj.weight": Split("d_mlp", 1, reduce=True)}
        for child in ("gate_proj", "up_proj"):
            plan[f"{child}.weight"] = Split("d_mlp", 0)
            if getattr(self, child).bias is not None:
                plan[f"{child}.bias"] = Split("d_mlp", 0)
        return plan

    def residual_readers(self) -> tuple[Projection, ...]:
        """What reads the norm before it, for weight processing (hooked.processing): nn.Linear
        [out, in]."""
        return (Projection(self.gate_proj.weight, 1), Projection(self.up_proj.weight, 1))

    def residual_writers(self) -> tuple[Projection, ...]:
        return (Projection(self.down_proj.weight, 0),)

    @property
    def W_gate(self) -> Tensor:
        """[d_model d_mlp], TransformerLens' layout (a transposed view)."""
        return self.gate_proj.weight.T

    @property
    def W_in(self) -> Tensor:
        """[d_model d_mlp]: the up projection."""
        return self.up_proj.weight.T

    @property
    def W_out(self) -> Tensor:
        """[d_mlp d_model]."""
        return self.down_proj.weight.T

    @property
    def b_in(self) -> Tensor:
        """[d_mlp] zeros: no biases (TransformerLens' gated MLP has zeros there)."""
        return self.up_proj.weight.new_zeros(self.up_proj.weight.shape[0])

    @property
    def b_out(self) -> Tensor:
        """[d_model] zeros: no biases."""
        return self.down_proj.weight.new_zeros(self.down_proj.weight.shape[0])


def all_experts_removed(point: str, n_experts: int) -> str:
    """Why routing cannot run with every expert's router logit at -inf (the softmax would be 0 / 0)."""
    layer = point.split(".")[1] if point.startswith("blocks.") else "{layer}"
    return (
        f"{point}: every one of the layer's {n_experts} experts is ablated at the router (-inf), which leaves no"
        " expert to route to (the softmax would be 0 / 0 and the MLP output NaN). To remove the whole MoE"
        f" layer, zero its output instead: the address 'L{layer}.mlp', or blocks.{layer}.hook_mlp_out"
    )
