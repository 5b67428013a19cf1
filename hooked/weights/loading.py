"""`load_model`: a checkpoint's name to a loaded, checked, optionally processed model (what `hooked.load` calls).

The steps, each in its own module: resolve the name to a directory (`sources`), read config.json and
build the model it names on the meta device (`architecture`), read every tensor from the safetensors
files straight into the target dtype and device, renamed and checked (`state_dict`), and only then
assign them. Any failure raises before a model exists, so a caller gets a fully loaded model or an
exception, never a half-loaded one. Processing flags (TransformerLens' `fold_ln`, centring, ...;
hooked.processing) are applied in place after the read; with `tp` the process
reads only its shard (hooked.distributed, docs/scaling.md).
"""

from __future__ import annotations

from pathlib import Path

import torch

from hooked.distributed import Parallel, parallelize
from hooked.processing import FLAGS, check_flags, process_weights, unprocessed
from hooked.tokenizer import HookedTokenizer
from hooked.weights.architecture import architecture_for, build_on_meta, read_config
from hooked.weights.errors import CheckpointError
from hooked.weights.sources import from_the_hub, hub_name_for, resolve
from hooked.weights.state_dict import read_state_dict


def load_model(
    name_or_path: str | Path,
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str = "cpu",
    model_class=None,
    tp: int | None = None,
    timeout: float | None = None,
    processing: dict | None = None,
    use_hook_tokens: bool = False,
):
    """Build the model a checkpoint describes and fill it from its safetensors files.

    `processing` (flag -> bool, `hooked.processing.FLAGS`) processes the weights in place once read, as
    TransformerLens' `from_pretrained` does; refused, before anything is read, under tensor parallelism.
    With `tp` (under torchrun), this process builds and reads only its shard (hooked.distributed);
    the ranks of a group agree at the end, so either every rank has its shard or every rank raises.
    """
    check_device(device)
    processing = {**unprocessed(), **(processing or {})}
    unknown = set(processing) - set(FLAGS)
    if unknown:
        raise TypeError(f"unknown processing flag(s) {sorted(unknown)}; the flags are {', '.join(FLAGS)}")
    if tp is not None and tp > 1 and any(processing.values()):
        raise ValueError(
            "weight processing is not supported under tensor parallelism (tp > 1): centring the unembedding needs"
            " the whole vocabulary on one rank; load with tp=1 or without processing"
        )
    if tp is None:
        return _load(name_or_path, dtype, device, model_class, processing=processing, use_hook_tokens=use_hook_tokens)
    parallel = Parallel.create(tp, timeout)
    model, error = None, None
    try:
        model = _load(name_or_path, dtype, parallel.device(device), model_class, parallel, processing)
    except Exception as caught:
        error = caught
    parallel.agree(error, what="hooked.load")
    return model


def _load(name_or_path, dtype, device, model_class, parallel=None, processing=None, use_hook_tokens=False):
    dtype = _as_dtype(dtype)
    directory = resolve(name_or_path)
    config = read_config(directory)
    detected = architecture_for(config)
    if model_class is not None and model_class is not detected:
        raise CheckpointError(
            f"{directory} holds a {detected.__name__} checkpoint, not {model_class.__name__}; use hooked.load"
        )
    model_class = detected
    model = build_on_meta(model_class, config, use_hook_tokens)
    processing = processing or unprocessed()
    check_flags(model, processing)  # a refused combination (a rotary model's refactoring) fails before any read
    plan = None
    if parallel is not None:
        model.parallel = parallel
        plan = parallelize(model, parallel) if parallel.tp_size > 1 else None
    state = read_state_dict(directory, model, dtype, torch.device(device), plan)
    model.load_state_dict(state, strict=True, assign=True)
    if plan is not None:  # a shard: no parameter gradients, so a forward builds no autograd graph (hooked.distributed)
        model.requires_grad_(False)
    del state  # the parameters are these tensors: processing changes them in place, tensor by tensor
    if any(processing.values()):
        process_weights(model, **processing)
    model.tokenizer = HookedTokenizer.from_directory(directory, config)
    # Recorded in sweep results' provenance; a TransformerLens name as the hub id it stood for.
    model.name_or_path = hub_name_for(name_or_path) if from_the_hub(name_or_path) else str(name_or_path)
    return model.eval()


def check_device(device: torch.device | str) -> None:
    """Refuse a device this torch cannot use before anything is read, naming the `device=` argument and the fix."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device={device!r} is not a torch device ({error}); use 'cpu', 'cuda' or 'cuda:N'") from None
    if parsed.type != "cuda":
        return
    if not torch.cuda.is_available():
        why = (
            f"this torch ({torch.__version__}) was built without CUDA"
            if torch.version.cuda is None
            else "no CUDA GPU is visible (check CUDA_VISIBLE_DEVICES and the driver)"
        )
        raise RuntimeError(
            f"device={device!r}, but {why}; load with device='cpu', or install a CUDA build of torch on a"
            " machine with a GPU"
        )
    count = torch.cuda.device_count()
    if parsed.index is not None and parsed.index >= count:
        raise RuntimeError(f"device={device!r}, but this machine has {count} CUDA GPU(s) (cuda:0..cuda:{count - 1})")


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    # float64 too: a reference to check float32 or a kernel against (`model.to(torch.float64)` computes the same)
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
    if isinstance(dtype, str):
        if dtype.removeprefix("torch.") not in names:
            raise ValueError(f"dtype {dtype!r} is not supported; use one of {', '.join(names)}")
        return names[dtype.removeprefix("torch.")]
    if dtype not in names.values():
        raise ValueError(f"dtype {dtype} is not supported; use one of {', '.join(names)}")
    return dtype
