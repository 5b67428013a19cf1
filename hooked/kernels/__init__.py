"""Custom compute kernels for hooked.

``flash_attention(q, k, v, *, key_start=None, sm_scale=None, softcap=None, window=None)
-> out [b, q_pos, n_heads * d_head]``: causal (bottom-right aligned) GQA attention,
softmax(cap(sm_scale * q k^T) + mask) v with an optional logit softcap and sliding window, as a Triton
kernel with a Triton backward. Triton is imported lazily (on first access), so importing this package
never touches a GPU; set TRITON_INTERPRET=1 before importing hooked to run the kernel on CPU.
"""

__all__ = ["flash_attention"]


def __getattr__(name):
    if name == "flash_attention":
        from hooked.kernels.attention.triton_attention import flash_attention

        return flash_attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
