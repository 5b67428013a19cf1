"""The attention core every architecture shares: each head's own copy of its input (`attention_input`, for
`hook_q_input` / `hook_k_input` / `hook_v_input`), the mask and positions of a padded batch (`AttentionMask`,
`position_ids_for`), the choice of path (eager, SDPA or the Triton kernel: `attention_backend`, `choose_backend`)
and `attend`, which computes the costly points (scores, pattern) only when something listens, in a visible
branch (docs/attention.md).
"""

from __future__ import annotations

import abc
import contextlib
import functools
import importlib.util
import os
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hooked.hooks import HookPoint
from hooked.layers.linear import add_bias


def attention_input(
    block: nn.Module, resid_pre: Tensor, n_heads: int, n_kv_heads: int
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """What a block's attention reads: `ln1(resid_pre)`, or, when a hook listens at the split inputs, each
    head's own normalised copy of the residual stream.

    The split form is TransformerLens' `use_split_qkv_input`: `blocks.{i}.hook_q_input` [batch pos
    head_index d_model] and `hook_k_input` / `hook_v_input` [batch pos kv_head_index d_model] hold one
    copy of `resid_pre` per head, each normalised by `ln1` on its own, so a hook can change what one
    head's query (or one key/value head's keys and values) reads without touching the others. Circuit
    edges (`hooked.circuits`) patch exactly there. It runs only while a hook listens at one of the three
    points: a copy is made at a hooked point, the other two broadcast one normalised input. The per-head
    projection sums in another order than the fused one, so results differ by float rounding (about
    1e-7 relative in float32).

    `ln1`'s own hooks still fire once, on the unsplit stream, with their declared shapes; what they change
    in the normalised input is added to every head's normalised copy that a hook edited. A head whose
    copy no hook edited reads exactly the shared normalised input, as without split inputs (so a sweep may
    hook `ln1` in one variant and a split input in another), and hooks at both compose additively.
    """
    if not (block.hook_q_input.listening or block.hook_k_input.listening or block.hook_v_input.listening):
        return block.ln1(resid_pre)  # the hot path: no tuple, no generator
    points = (block.hook_q_input, block.hook_k_input, block.hook_v_input)
    if any(point.shard is not None for point in points):
        raise RuntimeError("the split q/k/v inputs are not supported under tensor parallelism (hooked.load(..., tp=N))")
    heads = (n_heads, n_kv_heads, n_kv_heads)
    copies = [
        point(resid_pre[:, :, None].expand(-1, -1, count, -1).clone()) if point.listening else None
        for point, count in zip(points, heads, strict=True)
    ]
    edit = None
    if block.ln1.hook_scale.listening or block.ln1.hook_normalized.listening:  # ln1's hooks fire here, once
        # What they changed: against the same arithmetic, so rows they left alone get exactly 0.
        normalized, reference = block.ln1.fire(resid_pre)
        edit = None if normalized is reference else normalized - reference
    else:
        normalized = block.ln1(resid_pre)
    inputs = []
    for copy, count in zip(copies, heads, strict=True):
        shared = normalized[:, :, None].expand(-1, -1, count, -1)
        if copy is None:
            inputs.append(shared)
            continue
        per_head = block.ln1.unhooked(copy)
        if edit is not None:
            per_head = per_head + edit[:, :, None]
        # A copy no hook changed reads exactly the shared input (recomputing it would round differently,
        # and a per-head norm downstream, Qwen3's q_norm, can blow a near-zero rounding error up). Its
        # gradient still flows through the copy, as for an edited one: what the split points are for.
        edited = (copy != resid_pre[:, :, None]).any(-1, keepdim=True)
        if per_head.requires_grad:
            shared = shared.detach() + (per_head - per_head.detach())  # the shared value, the copy's gradient
        inputs.append(torch.where(edited, per_head, shared))
    return tuple(inputs)


@dataclass(frozen=True)
class AttentionMask:
    """How keys are masked for one forward: causal always, plus optional left padding and sliding window.

    `key_valid` [batch key_pos] is None when no row is padded, which lets SDPA use `is_causal`.
    `window` (Mistral's `sliding_window`): query column i sees key column j only if i - j < window, as
    transformers 5.24 `masking_utils.sliding_window_overlay`; columns, not positions, so left padding
    (which shifts both alike) changes nothing. Set by the model (`windowed`), never by the caller.
    Built once per forward by the model; the derived masks are computed once and shared by all blocks.
    """

    key_valid: Tensor | None
    query_len: int
    key_len: int
    window: int | None = None

    def windowed(self, window: int | None) -> AttentionMask:
        """This mask with a sliding window; itself when the window cannot hide any key (window >= key_len),
        so short inputs keep the plain causal paths (`is_causal`, the Triton kernel)."""
        if window is None or window >= self.key_len:
            return self
        return AttentionMask(self.key_valid, self.query_len, self.key_len, window)

    @functools.cached_property
    def boolean(self) -> Tensor | None:
        """[batch 1 query_pos key_pos], True where a query may attend (None: plain causal).

        A padded query row sees no valid key; it is allowed its own position so that it stays
        finite (its output is meaningless and is never read by a valid row).
        """
        if self.key_valid is None:
            return None  # plain causal, or causal with a window: `causal(device)`
        offset = self.key_len - self.query_len
        query = torch.arange(self.query_len, device=self.key_valid.device)[:, None]
        key = torch.arange(self.key_len, device=self.key_valid.device)[None, :]
        mask = self.causal(self.key_valid.device)[0] & self.key_valid[:, None, :]
        mask = mask | (key == query + offset)[None]
        return mask[:, None]

    def causal(self, device: torch.device) -> Tensor:
        """[1 1 query_pos key_pos] bottom-right aligned: key j is visible to query i iff j <= i + key_len - query_len
        (and, with a window, i + key_len - query_len - j < window)."""
        offset = self.key_len - self.query_len
        query = torch.arange(self.query_len, device=device)[:, None]
        key = torch.arange(self.key_len, device=device)[None, :]
        visible = key <= query + offset
        if self.window is not None:
            visible = visible & (key > query + offset - self.window)
        return visible[None, None]

    @functools.cached_property
    def left_padding_starts(self) -> Tensor | None:
        """First valid key of each row [batch] when the mask is plain left padding, else None."""
        if self.key_valid is None:
            return None
        starts = (~self.key_valid).sum(-1)
        positions = torch.arange(self.key_len, device=starts.device)
        return starts.to(torch.int32) if torch.equal(positions[None] >= starts[:, None], self.key_valid) else None


def position_ids_for(tokens: Tensor, key_valid: Tensor | None) -> Tensor:
    """[batch pos] each column's position in its own prompt: left padding is skipped (cumsum(mask) - 1,
    padding clamped to 0), so a padded row gets the positions of the prompt alone."""
    if key_valid is None:
        return torch.arange(tokens.shape[1], device=tokens.device)[None].expand_as(tokens)
    return (key_valid.long().cumsum(-1) - 1).clamp(min=0)


AttentionBackend = Literal["triton", "sdpa", "eager"]


_forced_backend: ContextVar[str | None] = ContextVar("hooked_attention_backend", default=None)
# An inference engine's attention core (hooked.engines.vllm): it replaces `attend` for every layer while set, and
# owns the keys and values (a paged KV cache), so q, k, v and z still pass through the model's own hook points.
_engine_attention: ContextVar[EngineAttention | None] = ContextVar("hooked_engine_attention", default=None)


class EngineAttention(abc.ABC):
    """What an engine's attention core implements: `z` [batch pos head_index d_head] for one layer's q, k, v (the
    layer named by `hook_attn_scores.layer()`), with the engine's own cache and per-request boundaries.
    `softmax_in_float32`, `softcap` and `window` are the layer's, as `attend` takes them: what a core needs to form
    one request's scores and pattern on hooked's eager path when a hook listens there."""

    @abc.abstractmethod
    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        scaling: float,
        hook_attn_scores: HookPoint,
        hook_pattern: HookPoint,
        *,
        softmax_in_float32: bool,
        softcap: float | None = None,
        window: int | None = None,
    ) -> Tensor: ...

    def check_layer(self, layer: int, softcap: float | None, window: int | None) -> None:
        """Raise unless this core applies the layer's attention logit `softcap` and sliding `window` (None: none,
        or, for the window, none the step's flat batch can show). An engine is told both when it builds its
        attention; this core applies neither, so it refuses a layer with either rather than compute another
        number."""
        if softcap is not None or window is not None:
            raise NotImplementedError(
                f"{type(self).__name__} applies no attention logit softcap or sliding window (layer {layer})"
            )


@contextlib.contextmanager
def engine_attention(core: EngineAttention | None) -> Iterator[None]:
    """Run every `attend` of the body through `core` (an inference engine's paged attention); None: hooked's own
    paths (what a core runs inside itself to form one request's pattern eagerly)."""
    token = _engine_attention.set(core)
    try:
        yield
    finally:
        _engine_attention.reset(token)


@contextlib.contextmanager
def attention_backend(name: AttentionBackend) -> Iterator[None]:
    """Force one attention path for the body of a `with` block.

    "eager" forms scores and pattern (Hugging Face's order); "sdpa" runs torch SDPA; "triton" runs
    `hooked.kernels.flash_attention` (CUDA, or CPU under TRITON_INTERPRET=1). Without it the choice
    is: eager when the scores or the pattern are hooked, else Triton on a CUDA GPU of compute capability
    8.0 or later (the device of the inputs, not the current one) for calls of more than one query
    column (sliding windows and logit softcaps included), else SDPA (which serves every decode step of a
    generation), or eager under a logit softcap, which SDPA cannot apply. A forced path that cannot serve
    a forward raises instead of quietly running another.
    """
    if name not in ("triton", "sdpa", "eager"):
        raise ValueError(f"attention backend must be 'triton', 'sdpa' or 'eager', not {name!r}")
    if name == "triton" and not triton_available():
        raise RuntimeError(
            "attention_backend('triton') needs the triton package and a CUDA GPU, or TRITON_INTERPRET=1"
            " set before hooked is imported (the CPU interpreter, for tests)"
        )
    token = _forced_backend.set(name)
    try:
        yield
    finally:
        _forced_backend.reset(token)


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_available(device: torch.device | None = None) -> bool:
    """Whether the Triton kernel can run on `device` (on some device, when None)."""
    if not _triton_installed():
        return False
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    if device is None:
        return interpreting or torch.cuda.is_available()
    return device.type == "cuda" or (interpreting and device.type == "cpu")


# The kernel's bfloat16 tl.dot and float32 "tf32x3" precision need tensor cores of compute capability
# 8.0 (Ampere) or later; older GPUs fail to compile them.
MIN_TRITON_CAPABILITY = (8, 0)


def triton_compiles_on(device: torch.device) -> bool:
    """Whether the kernel compiles for `device`: a CUDA GPU of capability >= 8.0 (CPU: the interpreter)."""
    if device.type != "cuda":
        return triton_available(device)
    return triton_available(device) and torch.cuda.get_device_capability(device) >= MIN_TRITON_CAPABILITY


def choose_backend(
    q: Tensor, mask: AttentionMask, hook_attn_scores: HookPoint, hook_pattern: HookPoint, softcap: float | None = None
) -> str:
    """The attention path for one forward (see `attention_backend`); `softcap` as in `attend`."""
    pattern_hooked = hook_attn_scores.listening or hook_pattern.listening
    forced = _forced_backend.get()
    if forced is None:
        if pattern_hooked:
            return "eager"
        # Decode steps (one query column against a KV cache) stay on SDPA: the kernel's one-query path
        # does not split the key range across programs (docs/generation.md; benchmarks/generate.py
        # measures both where a GPU is present).
        # The kernel skips key tiles outside a sliding window (Mistral) and applies a softcap (Gemma 2).
        if (
            q.is_cuda
            and mask.query_len > 1
            and triton_compiles_on(q.device)
            and (mask.key_valid is None or mask.left_padding_starts is not None)
        ):
            return "triton"
        return "sdpa" if softcap is None else "eager"  # SDPA has no softcap
    if pattern_hooked and forced != "eager":
        listening = hook_pattern.name if hook_pattern.listening else hook_attn_scores.name
        raise RuntimeError(
            f"attention_backend({forced!r}) cannot serve {listening}: only the eager path forms the"
            " scores and the pattern; remove that hook or use attention_backend('eager')"
        )
    if forced == "sdpa" and softcap is not None:
        raise RuntimeError(
            f"attention_backend('sdpa') cannot apply this model's attention logit softcap ({softcap}):"
            " use attention_backend('eager') or 'triton'"
        )
    if forced == "triton":
        if not triton_available(q.device):
            raise RuntimeError(
                f"attention_backend('triton') cannot run on {q.device}: it needs CUDA, or TRITON_INTERPRET=1 for CPU"
            )
        if not triton_compiles_on(q.device):
            raise RuntimeError(
                f"attention_backend('triton') needs a GPU of compute capability >= 8.0; {q.device} has"
                f" {torch.cuda.get_device_capability(q.device)}: use attention_backend('sdpa')"
            )
        if mask.key_valid is not None and mask.left_padding_starts is None:
            raise RuntimeError(
                "attention_backend('triton') serves causal attention with left padding only; this mask has holes"
            )
    return forced


def softcap_(x: Tensor, cap: float | None) -> Tensor:
    """`cap * tanh(x / cap)` in transformers' order (divide, tanh, multiply); x itself when cap is None. `x` is
    a fresh tensor nothing else holds (attention scores, the unembedding's output), capped in place where
    autograd does not record it: the same values, without two more tensors of its size."""
    if cap is None:
        return x
    if not (torch.is_grad_enabled() and x.requires_grad):
        return x.div_(cap).tanh_().mul_(cap)
    return torch.tanh(x / cap) * cap


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: AttentionMask,
    scaling: float,
    hook_attn_scores: HookPoint,
    hook_pattern: HookPoint,
    softmax_in_float32: bool,
    softcap: float | None = None,
) -> Tensor:
    """Causal attention for q [batch pos head_index d_head], k/v [batch pos kv_head_index d_head].

    Returns z [batch pos head_index d_head], contiguous, so `z.view(batch, pos, -1)` is the output
    projection's input with no copy. The path (see `attention_backend`) is: eager when the scores or
    the pattern are hooked, in Hugging Face's order (scores -> hook_attn_scores -> softmax ->
    hook_pattern -> pattern @ v); the Triton kernel on CUDA, whose output buffer is z; else SDPA.
    `softmax_in_float32` follows the architecture (GPT-2: input dtype; Qwen3: float32, cast back).
    `softcap` (Gemma 2's `attn_logit_softcapping`) caps the scaled scores at softcap * tanh(scores / softcap)
    before the mask, as transformers 5.24 `gemma2.eager_attention_forward`; `hook_attn_scores` sees the
    capped scores. SDPA cannot cap: a softcap runs on the kernel or the eager path.
    """
    engine = _engine_attention.get()
    if engine is not None:  # an inference engine's paged attention (hooked.engines.vllm)
        engine.check_layer(hook_attn_scores.layer(), softcap, mask.window)
        return engine(
            q,
            k,
            v,
            scaling,
            hook_attn_scores,
            hook_pattern,
            softmax_in_float32=softmax_in_float32,
            softcap=softcap,
            window=mask.window,
        )
    backend = choose_backend(q, mask, hook_attn_scores, hook_pattern, softcap)
    batch, pos, n_heads, d_head = q.shape
    n_kv_heads = k.shape[2]
    if backend == "triton":
        from hooked.kernels import flash_attention

        out = flash_attention(
            q, k, v, key_start=mask.left_padding_starts, sm_scale=scaling, softcap=softcap, window=mask.window
        )
        return out.view(batch, pos, n_heads, d_head)  # the kernel wrote [batch pos head*d_head]
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch head pos d_head]
    boolean_mask = mask.boolean
    if boolean_mask is None and (1 < mask.query_len < mask.key_len or mask.window is not None):
        boolean_mask = mask.causal(q.device)  # SDPA's is_causal aligns top-left and knows no window
    if backend == "eager":
        if n_kv_heads != n_heads:  # query head h reads kv head h // group
            k, v = repeat_kv(k, n_heads // n_kv_heads), repeat_kv(v, n_heads // n_kv_heads)
        scores = torch.matmul(q, k.transpose(-1, -2))
        # The same operations in place where autograd does not record them (the values are bit-identical):
        # [batch head pos pos] is the largest tensor of the layer, and each copy costs an allocation and a pass.
        in_place = not (torch.is_grad_enabled() and scores.requires_grad)
        scores = scores.mul_(scaling) if in_place else scores * scaling
        scores = softcap_(scores, softcap)
        if boolean_mask is None:
            boolean_mask = mask.causal(q.device)
        fill = torch.finfo(scores.dtype).min
        scores = hook_attn_scores(
            scores.masked_fill_(~boolean_mask, fill) if in_place else scores.masked_fill(~boolean_mask, fill)
        )
        if softmax_in_float32:
            pattern = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        else:
            pattern = F.softmax(scores, dim=-1)
        pattern = hook_pattern(pattern)
        z = torch.matmul(pattern, v)
    else:
        z = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=boolean_mask,
            is_causal=boolean_mask is None and mask.query_len > 1,
            scale=scaling,
            enable_gqa=n_kv_heads != n_heads,
        )
    return z.transpose(1, 2).contiguous()  # a no-op when SDPA already wrote [batch pos head d_head]


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """[batch kv_head pos d_head] -> [batch kv_head * n_rep pos d_head], kv head j serving query heads j * n_rep ..
    (j + 1) * n_rep - 1, as transformers 5.24's `repeat_kv`: expand, then reshape, which keeps a view where it can
    (one kv head: a stride-0 axis). The same memory layout as there matters: a BLAS product over another layout
    (repeat_interleave's copy) may round differently on some CPUs' kernels (MKL_CBWR=COMPATIBLE)."""
    batch, n_kv_heads, pos, d_head = x.shape
    return x[:, :, None].expand(batch, n_kv_heads, n_rep, pos, d_head).reshape(batch, n_kv_heads * n_rep, pos, d_head)


def heads_output(attention: nn.Module, z: Tensor, out: nn.Module) -> Tensor:
    """An attention module's output from its heads' z [batch pos head_index d_head], through `attention.hook_z`:
    `out` (the output projection) of the heads concatenated, a view of z, so an edit of z at the hook edits out's
    input; or, while `attention.hook_result` listens, each head's write `z[h] @ W_O[h]` through that hook, summed, plus
    out's bias (equal to out(z) up to rounding; W_O is computed only then)."""
    z = attention.hook_z(writable(z) if attention.hook_z.listening else z)
    if attention.hook_result.listening:
        result = attention.hook_result(torch.einsum("bphd,hdm->bphm", z, attention.W_O))
        return add_bias(out, result.sum(2))
    return out(z.reshape(*z.shape[:2], -1))


def writable(z: Tensor) -> Tensor:
    """z, or a copy of it when autograd saved it, so a hook may edit z in place and still backpropagate.

    SDPA and the Triton kernel save their output for the backward pass, and that output is z (no copy
    is made on those paths). An in-place edit would then fail at `.backward()` ("modified by an
    inplace operation"). The copy is made only when a hook listens at z and gradients are recorded;
    under `torch.no_grad()` z stays the attention output itself. GPT-2's q, k and v get the same
    treatment: they are `unbind` views of the fused projection, which autograd forbids editing in place.
    """
    return z.clone() if z.requires_grad else z
