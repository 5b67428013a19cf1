"""Gemma Scope's `params.npz` (Gemma 2) and Gemma Scope 2's `params.safetensors` (Gemma 3): JumpReLU dictionaries
stored as the JAX code trained them, in float32, with no config beside the weights.

    W_enc [d_in, d_sae] (Gemma Scope 2: w_enc), W_dec [d_sae, d_out], b_enc, b_dec, threshold [d_sae]
    affine_skip_connection [d_in, d_out]  (Gemma Scope 2's affine transcoders: x @ it is added to the output)
    features = relu(pre) * (pre > threshold), pre = x @ W_enc + b_enc  (b_dec is never subtracted from x)
    output = features @ W_dec + b_dec (+ x @ affine_skip_connection)

The files do not say where they read, so `hook_name` (and a transcoder's `hook_name_out`) is needed. It is
inferred only where the path or a config.json beside the file says it unambiguously, as SAELens 6.54's loaders
read them (`get_gemma_2_config_from_hf`, `get_gemma_3_config_from_hf`): a layer (`layer_12`) and one of Gemma
Scope's kinds (a repository named `...-res`, `-mlp`, `-att`, `-transcoders`; Gemma Scope 2's folders
`resid_post`, `mlp_out`, `attn_out`, `transcoder`). Residual SAEs read `blocks.L.hook_resid_post`, MLP SAEs
`hook_mlp_out`, attention SAEs `attn.hook_z` (flattened over heads), transcoders `mlp.hook_in` (the MLP's input
after its pre-norm, where they were trained) and write `hook_mlp_out`. Gemma Scope's embedding SAEs were trained
on the embeddings before Gemma's sqrt(d_model) scale, so on `hook_embed` that factor is folded in, as SAELens'
`gemma_2_sae_huggingface_loader` adjusts them.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from hooked.processing import unprocessed
from hooked.sae.architectures import JUMPRELU
from hooked.sae.dictionary import Dictionary, DictionaryConfig
from hooked.sae.formats.files import Npz, Safetensors
from hooked.sae.formats.layout import Stored, build, check
from hooked.sae.formats.names import to_hooked

NAME = "gemma-scope"
FILES = ("params.npz", "params.safetensors")
LOOKS_FOR = "params.npz / params.safetensors (Gemma Scope)"

# a path component naming Gemma Scope's kind -> (hook_name, hook_name_out) templates
_KINDS = {
    "res": ("blocks.{L}.hook_resid_post", None),
    "resid_post": ("blocks.{L}.hook_resid_post", None),
    "mlp": ("blocks.{L}.hook_mlp_out", None),
    "mlp_out": ("blocks.{L}.hook_mlp_out", None),
    "att": ("blocks.{L}.attn.hook_z", None),
    "attn_out": ("blocks.{L}.attn.hook_z", None),
    "transcoders": ("blocks.{L}.mlp.hook_in", "blocks.{L}.hook_mlp_out"),
    "transcoder": ("blocks.{L}.mlp.hook_in", "blocks.{L}.hook_mlp_out"),
}
_KIND = re.compile(r"(?:^|[-_])(" + "|".join(sorted(_KINDS, key=len, reverse=True)) + r")(?:_all)?$")
_LAYER = re.compile(r"(?:^|[-_/])layer_(\d+)(?:$|[-_])")
# Gemma Scope 2's config.json names Hugging Face points (`hf_hook_point_in`)
_HF_POINTS = [
    (re.compile(r"layers\.(\d+)\.output$"), "blocks.{L}.hook_resid_post"),
    (re.compile(r"layers\.(\d+)\.self_attn\.o_proj\.input$"), "blocks.{L}.attn.hook_z"),
    (re.compile(r"layers\.(\d+)\.post_feedforward_layernorm\.output$"), "blocks.{L}.hook_mlp_out"),
    (re.compile(r"layers\.(\d+)\.pre_feedforward_layernorm\.output$"), "blocks.{L}.mlp.hook_in"),
]
_EXAMPLE = "hook_name='blocks.12.hook_resid_post' (hook_mlp_out for an MLP SAE, attn.hook_z for an attention one)"


def detect(path: Path) -> bool:
    """Whether `path` is a Gemma Scope file (params.npz, params.safetensors, any .npz, or a .safetensors in Gemma
    Scope 2's layout under another name) or a directory holding params.npz / params.safetensors."""
    if path.is_file():
        return path.name in FILES or path.suffix == ".npz" or is_version_2(path)
    return any((path / name).is_file() for name in FILES)


def is_version_2(path: Path) -> bool:
    """Whether `path` is a .safetensors file in Gemma Scope 2's layout (its encoder is `w_enc`, lower case)."""
    if path.suffix != ".safetensors":
        return False
    with Safetensors(path) as source:
        return "w_enc" in source.keys()


def read(
    path: Path,
    *,
    hook_name: str | None,
    hook_name_out: str | None,
    device: str,
    dtype: str | None,
    model=None,
) -> Dictionary:
    """The Gemma Scope dictionary in `path` (a params.npz or params.safetensors file, or the directory that holds
    one: params.npz first)."""
    if path.is_dir():
        path = next(path / name for name in FILES if (path / name).is_file())
    source = Npz(path) if path.suffix == ".npz" else Safetensors(path)
    with source:
        keys = set(source.keys())
        layout = {}
        for name in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"):
            key = name if name in keys else name.lower()
            layout[name] = Stored(key)
        if layout["W_enc"].key not in keys:
            raise ValueError(f"{path} has no W_enc (or w_enc): it holds {sorted(keys)}, not a Gemma Scope dictionary")
        d_in, d_sae = source.shape(layout["W_enc"].key)
        if len(source.shape(layout["W_dec"].key) if layout["W_dec"].key in keys else ()) == 3:
            raise ValueError(
                f"{path}: its decoder is [d_sae, n_layers, d_out], a Gemma Scope 2 cross-layer transcoder; load its"
                " folder with hooked.sae.clt"
            )
        skip = "affine_skip_connection" in keys
        if skip:
            layout["W_skip"] = Stored("affine_skip_connection", transposed=True)
        d_out = source.shape(layout["W_dec"].key)[-1] if layout["W_dec"].key in keys else d_in
        inferred = _infer(path) if hook_name is None else (None, None)  # a given hook_name: the user names both
        hook_in, hook_out = hook_name or inferred[0], hook_name_out or inferred[1]
        if hook_in is None:
            raise ValueError(
                f"{path} does not record the hook point it reads, and its path does not say it unambiguously;"
                f" pass it: hooked.sae.load(path, {_EXAMPLE})"
            )
        if skip and hook_out is None:
            raise ValueError(
                f"{path} is an affine transcoder (it has affine_skip_connection): pass the point it writes too,"
                " hook_name_out='blocks.L.hook_mlp_out'"
            )
        hook_in, hook_out = to_hooked(hook_in, model), hook_out and to_hooked(hook_out, model)
        cfg = DictionaryConfig(
            d_in=d_in,
            d_sae=d_sae,
            hook_name=hook_in,
            architecture=JUMPRELU.name,
            hook_name_out=hook_out,
            d_out=d_out if hook_out else None,
            apply_b_dec_to_input=False,
            reshape_activations="hook_z" if hook_in.endswith("attn.hook_z") else "none",
            dtype=dtype or "float32",
            device=device,
            processing=unprocessed(),  # trained on Gemma's own activations
            metadata={"source": "gemma_scope", **_config_beside(path)},
        )
        check(cfg, source, layout, skip, config_file=f"the shape of {layout['W_enc'].key}", model=model)
        dictionary = build(cfg, source, layout, skip)
    if hook_in == "hook_embed" and path.suffix == ".npz":
        dictionary.fold_scaling_factor(1 / math.sqrt(d_in))  # trained on embeddings / sqrt(d_model)
    return dictionary


def _infer(path: Path) -> tuple[str | None, str | None]:
    """(hook_name, hook_name_out) from a config.json beside the file, else from the path; (None, None) unless
    exactly one layer and one kind are named."""
    config = _config_beside(path)
    names = []
    for field in ("hf_hook_point_in", "hf_hook_point_out"):
        point = config.get(field)
        name = None
        for pattern, template in _HF_POINTS:
            match = pattern.search(point or "")
            if match:
                name = template.replace("{L}", match.group(1))
        names.append(name)
    if names[0] is not None:
        return names[0], names[1]
    # the folders, not the file resolved: in the Hugging Face cache the file is a link into blobs/, and the path
    # to it (snapshots/<commit>/layer_20/width_16k/...) is what names the layer
    parts = path.parent.resolve().parts
    kinds = {match.group(1) for part in parts if (match := _KIND.search(part.lower()))}
    templates = {_KINDS[kind] for kind in kinds}
    if templates == {_KINDS["res"]} and any("embedding" in part for part in parts):
        return "hook_embed", None
    layers = {match.group(1) for part in parts for match in _LAYER.finditer("/" + part)}
    if len(layers) != 1 or len(templates) != 1:
        return None, None
    (layer,), ((hook_in, hook_out),) = layers, templates
    return hook_in.replace("{L}", layer), hook_out and hook_out.replace("{L}", layer)


def _config_beside(path: Path) -> dict:
    config = path.parent / "config.json"
    if not config.exists():
        return {}
    try:
        raw = json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return raw if isinstance(raw, dict) else {}
