"""Hook names as the dictionary formats write them, turned into `hooked`'s.

SAELens and circuit-tracer name TransformerLens points, and `hooked` keeps TransformerLens' names, so most
names pass unchanged: `blocks.3.hook_resid_post`, `blocks.3.attn.hook_z`, `blocks.3.mlp.hook_in` (the MLP's
input after ln2, which SAELens' `HookedSAETransformer` and circuit-tracer add to TransformerLens); circuit-tracer's
`mlp.hook_out` and TransformerLens' `unembed.hook_in` are renamed (`to_hooked`). eai-sparsify and SAELens'
`HookedProxyLM` name Hugging Face modules instead (`layers.3`, `model.layers.3.mlp`): `from_module_name` maps
the ones with a clear equivalent.

A name with no equivalent is refused only against a model (`hooked.sae.load(..., model=model)`), naming the
nearest of its hook points; without one it is kept, and the splice refuses it then.
"""

from __future__ import annotations

import difflib
import re

_MLP_HOOK_OUT = re.compile(r"^blocks\.(\d+)\.mlp\.hook_out$")  # circuit-tracer's MLP output (ReplacementMLP.hook_out)
_PRE_NORM_MLP_OUT = re.compile(r"^blocks\.(\d+)\.hook_mlp_out_pre_norm$")


def to_hooked(name: str, model=None) -> str:
    """`name` (TransformerLens' or circuit-tracer's spelling) as `hooked` spells it; with `model`, checked to be
    one of its hook points. TransformerLens' `unembed.hook_in` is the final norm's output; circuit-tracer's
    `mlp.hook_out` is the MLP module's output: `hook_mlp_out`, or `hook_mlp_out_pre_norm` on a model whose MLP
    output passes a norm before the residual add (Gemma 2 and 3, OLMo 2)."""
    match = _MLP_HOOK_OUT.match(name)
    if match:
        pre_norm = f"blocks.{match.group(1)}.hook_mlp_out_pre_norm"
        name = (
            pre_norm if model is not None and pre_norm in model.hook_dict else f"blocks.{match.group(1)}.hook_mlp_out"
        )
    elif name == "unembed.hook_in":
        name = "ln_final.hook_normalized"
    if model is not None and name not in model.hook_dict:
        nearest = difflib.get_close_matches(name, model.hook_names, n=3, cutoff=0.5)
        hint = f"; the nearest are {', '.join(repr(n) for n in nearest)}" if nearest else "; see model.hook_names"
        raise ValueError(f"{name!r} is not a hook point of this {type(model).__name__}{hint}")
    return name


def to_transformer_lens(name: str) -> str:
    """A `hooked` hook name as TransformerLens (and so SAELens) spells it: the same for every point SAELens uses;
    the MLP output before a post-MLP norm is circuit-tracer's `mlp.hook_out`."""
    match = _PRE_NORM_MLP_OUT.match(name)
    return f"blocks.{match.group(1)}.mlp.hook_out" if match else name


# Hugging Face module names (relative to the base model, as eai-sparsify saves them, or with its `model.` /
# `transformer.` / `gpt_neox.` prefix) -> (what an SAE on the module's output reads, what a transcoder of the
# module reads and writes). A decoder layer's output is the residual stream after it; its input the one before.
_LAYER = r"^(?:model\.|transformer\.|gpt_neox\.|language_model\.)?(?:layers|h)\.(\d+)"
_MODULES = [
    (
        re.compile(_LAYER + r"$"),
        "blocks.{L}.hook_resid_post",
        ("blocks.{L}.hook_resid_pre", "blocks.{L}.hook_resid_post"),
    ),
    (re.compile(_LAYER + r"\.mlp$"), "blocks.{L}.hook_mlp_out", ("blocks.{L}.mlp.hook_in", "blocks.{L}.hook_mlp_out")),
    (re.compile(_LAYER + r"\.(?:self_attn|attn|attention)$"), "blocks.{L}.hook_attn_out", None),
    (re.compile(r"^(?:model\.|transformer\.)?(?:embed_tokens|wte|embed_in)$"), "hook_embed", None),
]


def from_module_name(module: str, transcoder: bool) -> tuple[str, str | None] | None:
    """The (hook_name, hook_name_out) of a dictionary on Hugging Face module `module`: an SAE reads the module's
    output; a transcoder reads its input and replaces its output. None where there is no clear equivalent (a
    transcoder of an attention module reads the normed input, which no single hook point holds)."""
    for pattern, sae_point, transcoder_points in _MODULES:
        match = pattern.match(module)
        if match is None:
            continue
        layer = match.group(1) if match.groups() else ""
        if not transcoder:
            return sae_point.replace("{L}", layer), None
        if transcoder_points is None:
            return None
        return tuple(point.replace("{L}", layer) for point in transcoder_points)
    return None
