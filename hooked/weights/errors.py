"""`CheckpointError`: the one exception every step of reading a checkpoint raises for a bad checkpoint.

A name that resolves to no checkpoint, a config.json naming an unsupported architecture, an unreadable
safetensors file and a checkpoint whose tensors do not fit its model all raise it, so a caller catches
one type (`hooked.CheckpointError`) whatever went wrong.
"""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint that does not match the architecture its config names."""
