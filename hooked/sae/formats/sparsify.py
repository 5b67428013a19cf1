"""eai-sparsify's directory format (eai-sparsify 1.3.3, `sparse_coder.py`: `SparseCoder.save_to_disk` /
`load_from_disk`): `cfg.json` (a `SparseCoderConfig` plus `d_in`) and `sae.safetensors`.

    encoder.weight [M, d_in] (F.linear's layout), encoder.bias [M], W_dec [M, d_in], b_dec [d_in], W_skip [d_in, d_in]
    features = top-k of relu(x' @ encoder.weight.T + encoder.bias), x' = x - b_dec (a transcoder: x' = x)
    output = features @ W_dec + b_dec (+ x @ W_skip.T)

A TopK dictionary in hooked's terms (relu after the top-k selection gives the same features as sparsify's
relu before it); `activation: groupmax` has no hooked equivalent and is refused. The directory is named after
the Hugging Face module it was trained on (`layers.2`, `layers.2.mlp`; eai-sparsify's trainer hooks the module's
output, and a transcoder reads its input): `layers.2` -> `blocks.2.hook_resid_post` (a transcoder:
`hook_resid_pre` -> `hook_resid_post`), `layers.2.mlp` -> `blocks.2.hook_mlp_out` (a transcoder: `mlp.hook_in` ->
`hook_mlp_out`). `hook_name=` / `hook_name_out=` override it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from hooked.processing import unprocessed
from hooked.sae.architectures import TOPK
from hooked.sae.dictionary import Dictionary, DictionaryConfig
from hooked.sae.formats.files import Safetensors
from hooked.sae.formats.layout import Stored, build, check, dtype_name
from hooked.sae.formats.names import from_module_name, to_hooked

NAME = "sparsify"
CONFIG = "cfg.json"
WEIGHTS = "sae.safetensors"
FILES = (CONFIG, WEIGHTS)
LOOKS_FOR = "cfg.json + sae.safetensors (eai-sparsify)"


def detect(path: Path) -> bool:
    """Whether directory `path` holds a sparse coder eai-sparsify saved. SAELens names its config cfg.json too: the
    directory is eai-sparsify's when sae.safetensors is there without SAELens' sae_weights.safetensors, or when the
    config is a `SparseCoderConfig` (no d_sae, which SAELens' configs always have; expansion_factor or
    num_latents instead)."""
    if not (path / CONFIG).is_file():
        return False
    if (path / WEIGHTS).exists() and not (path / "sae_weights.safetensors").exists():
        return True
    try:
        raw = json.loads((path / CONFIG).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(raw, dict) and "d_sae" not in raw and ("expansion_factor" in raw or "num_latents" in raw)


def read(
    directory: Path,
    *,
    hook_name: str | None,
    hook_name_out: str | None,
    device: str,
    dtype: str | None,
    model=None,
) -> Dictionary:
    """The sparse coder eai-sparsify saved in `directory`."""
    config_file = directory / CONFIG
    if not (directory / WEIGHTS).exists():
        raise FileNotFoundError(
            f"{directory} has an eai-sparsify {CONFIG} but no {WEIGHTS} (SparseCoder.save_to_disk writes both);"
            " copy the weights next to the config"
        )
    try:
        raw = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{config_file} is not valid JSON ({error})") from None
    if raw.get("activation", "topk") != "topk":
        raise ValueError(
            f"{config_file}: activation {raw['activation']!r}; hooked.sae reads eai-sparsify's topk coders (groupmax"
            " keeps the largest of each group of features, which no hooked architecture does)"
        )
    for field in ("d_in", "k"):
        if not isinstance(raw.get(field), int) or raw[field] <= 0:
            raise ValueError(f"{config_file}: {field} is {raw.get(field)!r}; it must be a positive int")
    d_sae = raw.get("num_latents") or raw["d_in"] * raw.get("expansion_factor", 32)
    transcoder = bool(raw.get("transcode", False))
    skip = bool(raw.get("skip_connection", False))
    hook_in, hook_out = _hook_names(directory, transcoder, hook_name, hook_name_out)
    hook_in, hook_out = to_hooked(hook_in, model), hook_out and to_hooked(hook_out, model)
    with Safetensors(directory / WEIGHTS) as source:
        stored_dtype = dtype_name(source.dtype("encoder.weight") if "encoder.weight" in source.keys() else "float32")
        cfg = DictionaryConfig(
            d_in=raw["d_in"],
            d_sae=d_sae,
            hook_name=hook_in,
            architecture=TOPK.name,
            hook_name_out=hook_out,
            d_out=raw["d_in"] if transcoder else None,
            apply_b_dec_to_input=not transcoder,
            k=raw["k"],
            dtype=dtype or stored_dtype,  # SparseCoder.load_from_disk keeps the file's dtype
            device=device,
            processing=unprocessed(),  # trained on a Hugging Face model's activations
            metadata={key: value for key, value in raw.items() if key != "d_in"} | {"source": "sparsify"},
        )
        layout = {
            "W_enc": Stored("encoder.weight", transposed=True),
            "b_enc": Stored("encoder.bias"),
            "W_dec": Stored("W_dec"),
            "b_dec": Stored("b_dec"),
        }
        if skip:
            layout["W_skip"] = Stored("W_skip")
        check(cfg, source, layout, skip, str(config_file), model=model)
        return build(cfg, source, layout, skip)


def _hook_names(directory: Path, transcoder: bool, hook_name: str | None, hook_name_out: str | None):
    """The points the coder reads and writes: the arguments, else what its directory's module name says."""
    if not transcoder and hook_name_out is not None:
        raise ValueError(
            f"hook_name_out={hook_name_out!r}, but {directory} holds an SAE (transcode is false), which rewrites the"
            " point it reads; leave hook_name_out out"
        )
    module = directory.name
    if re.fullmatch(r"seed\d+", module):  # several seeds of one hookpoint: hookpoint/seedN
        module = directory.parent.name
    inferred = from_module_name(module, transcoder) or (None, None)
    hook_in = hook_name or inferred[0]
    hook_out = (hook_name_out or (inferred[1] if hook_name is None else None)) if transcoder else None
    if hook_in is None or (transcoder and hook_out is None):
        what = (
            "hook_name='blocks.2.mlp.hook_in', hook_name_out='blocks.2.hook_mlp_out'"
            if transcoder
            else ("hook_name='blocks.2.hook_resid_post'")
        )
        raise ValueError(
            f"{directory}: the directory's name {module!r} is not a module hooked.sae can map to its hook points"
            f" (layers.N, layers.N.mlp, ...); pass them: hooked.sae.load(path, {what})"
        )
    return hook_in, hook_out
