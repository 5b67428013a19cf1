"""Causal GQA attention kernels: Triton FlashAttention (``flash_attention``) and its torch reference.

out[b, i, h*d:(h+1)*d] = sum_{key_start[b] <= j <= i + k_pos - q_pos} softmax_j(sm_scale * q_i . k_j) v_j

with optionally the scores capped at ``softcap * tanh(s / softcap)`` (Gemma 2) and the keys limited to
``j > i + k_pos - q_pos - window`` (a sliding window, Mistral).

``triton_attention`` (and so triton) is imported lazily, on first access to ``flash_attention``.
"""

from hooked.kernels.attention.reference import attention_reference

__all__ = ["attention_reference", "flash_attention"]


def __getattr__(name):
    if name == "flash_attention":
        from hooked.kernels.attention.triton_attention import flash_attention

        return flash_attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
