"""`VllmModel`: the calls hooked's users write (`run_with_hooks`, `run_with_cache`, `model.hooks`, `generate`,
`hooked.sweep`, `hooked.generate_variants`), answered by a vLLM engine running hooked's own modules.

`hooked.load(path, engine="vllm", tensor_parallel_size=N, **engine_args)` returns one. The weights live in vLLM's
worker processes; this process holds the model's description only (its config, tokenizer and hook points, on
PyTorch's meta device), which is what checks the calls before any request is queued.

How a call runs: every prompt of the batch becomes one request, without its padding, under one *variant* (the call's
hooks, shipped to the workers once); the scheduler batches the requests with whatever else is running, and each
request's hooks see that request's rows only, `[1, pos, ...]` in hooked's layout, with `hook.position_ids` counting
its own tokens. Logits come back from the workers (the final norm's output at the prompt positions asked for,
unembedded there); caches come back per request and are padded back into the caller's `[batch pos ...]` layout
(zeros at padding positions). What differs from hooked's own engine, and why, is in docs/vllm.md.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from hooked.hooks import NameFilter
from hooked.names import apply_pos_slice, pos_axis

GRADIENTS = (
    "vLLM runs its models under torch.inference_mode(): no gradient flows on the engine. Load the model with"
    " hooked.load(path) (hooked's own engine) for attribution, EAP / EAP-IG, graphs and training"
)

# The described model's calls that would run a forward here (on the meta device): refused, naming the way.
RUNS_HERE = frozenset(
    {
        "run_with_saes",
        "run_with_cache_with_saes",
        "run_with_hooks_with_saes",
        "saes",
        "add_sae",
        "forward_tokens",
        "logits_from_resid",
        "embed",
        "resid_from_tokens",
        "accumulated_bias",
        "to",
        "cuda",
        "half",
        "float",
        "process_weights_",
        "state_dict",
        "parameters",
        "named_parameters",
    }
)


def _described_model(directory: Path, dtype: torch.dtype):
    """The hooked model a checkpoint describes, on the meta device (no weights), with its tokenizer; its `device`
    and `dtype` are the caller's (CPU, the engine's dtype), so token ids and checks are made here."""
    from hooked.tokenizer import HookedTokenizer
    from hooked.weights.architecture import architecture_for, build_on_meta, read_config

    config = read_config(directory)
    family = architecture_for(config)
    described = type(
        f"Described{family.__name__}",
        (family,),
        {"device": property(lambda self: torch.device("cpu")), "dtype": property(lambda self: dtype)},
    )
    model = build_on_meta(described, config)
    model.tokenizer = HookedTokenizer.from_directory(directory, config)
    model.name_or_path = str(directory)
    return model.eval()


class VllmModel:
    """A hooked model whose forward runs on a vLLM engine (see the module docstring and docs/vllm.md)."""

    engine_name = "vllm"

    def __init__(
        self,
        name_or_path: str | Path,
        *,
        dtype: torch.dtype | str = torch.float32,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        **engine_args,
    ):
        from hooked.engines.vllm.engine import VllmEngine
        from hooked.weights.sources import resolve

        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"hooked on vLLM runs float32, bfloat16 or float16, not {dtype}")
        directory = Path(resolve(name_or_path))
        self._described = _described_model(directory, dtype)
        if max_model_len is None:
            max_model_len = min(self._described.max_positions or 4096, 4096)
        self._engine = VllmEngine(
            directory,
            max_model_len=max_model_len,
            dtype=str(dtype).removeprefix("torch."),
            tensor_parallel_size=tensor_parallel_size,
            **engine_args,
        )
        self._described.name_or_path = str(name_or_path)
        self.max_model_len = max_model_len
        self._context: list[list[tuple[NameFilter, Callable]]] = []  # hooks of enclosing `with model.hooks(...)`
        self._added: list[tuple[NameFilter, Callable]] = []  # add_hook's, until reset_hooks()
        self._closer = weakref.finalize(self, VllmEngine.close, self._engine)

    # ----------------------------------------------------------------- what this process knows
    def __getattr__(self, name: str):
        """The model's description answers what it can: config, tokenizer, hook points, structure (its modules are on
        PyTorch's meta device, without weights); a weight, or a call that would run the model here, is refused."""
        if name.startswith("__") or name in ("_described", "_engine"):
            raise AttributeError(name)
        value = getattr(self._described, name)
        if isinstance(value, Tensor) or name in RUNS_HERE:
            raise AttributeError(
                f"{name!r} is not available on a model served by vLLM: its weights live in vLLM's worker processes."
                " Load the model with hooked.load(path) (hooked's own engine) for weights, dictionaries spliced in"
                " and anything else the calls listed in docs/vllm.md do not cover"
            )
        return value

    def __reduce__(self):  # a hook shipped to the workers may hold a cache that points here: it goes as a stub
        return (_Elsewhere, (self.name_or_path,))

    def __repr__(self) -> str:
        return f"VllmModel({self.name_or_path!r}, {type(self._described).__mro__[1].__name__} on vLLM)"

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")  # where this process's tensors (ids, logits, caches) are

    @property
    def dtype(self) -> torch.dtype:
        return self._described.dtype

    def close(self) -> None:
        """Shut the engine's processes down (also done when the model is garbage-collected or Python exits)."""
        self._closer()

    def _open(self) -> None:
        if not self._closer.alive:
            raise RuntimeError("this model's vLLM engine was closed (model.close()); load the model again")

    def __enter__(self) -> VllmModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------- hooks
    @contextlib.contextmanager
    def hooks(self, fwd_hooks=(), bwd_hooks=(), reset_hooks_end: bool = True) -> Iterator[VllmModel]:
        """Hooks for every call in the block (each call ships them with its requests)."""
        if bwd_hooks:
            raise RuntimeError(f"backward hooks: {GRADIENTS}")
        pairs = self._checked(list(fwd_hooks))
        if not reset_hooks_end:
            self._added += pairs
            yield self
            return
        self._context.append(pairs)
        try:
            yield self
        finally:
            self._context.remove(pairs)

    def add_hook(self, name: NameFilter, hook: Callable, dir: str = "fwd", is_permanent: bool = False) -> None:
        if dir != "fwd":
            raise RuntimeError(f"a {dir} hook: {GRADIENTS}")
        self._added += self._checked([(name, hook)])

    def reset_hooks(self, *args, **kwargs) -> None:
        self._added = []

    def hooks_attached(self) -> bool:
        return bool(self._added or any(self._context))

    def _active_hooks(self) -> list[tuple[NameFilter, Callable]]:
        return [*self._added, *(pair for pairs in self._context for pair in pairs)]

    def _checked(self, fwd_hooks: Sequence) -> list[tuple[NameFilter, Callable]]:
        """The hooks, each name resolved and each callback checked here, before anything is queued: an unknown name
        (KeyError naming the nearest), something not callable, what an ablation's own check refuses (a head out of
        range)."""
        pairs = []
        for pair in fwd_hooks:
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise TypeError(f"fwd_hooks holds (hook name, fn) pairs, not {pair!r}")
            name, fn = pair
            if not callable(fn):
                raise TypeError(f"the hook at {name!r} is a {type(fn).__name__}, not a callable fn(activation, hook)")
            validate = getattr(fn, "validate_hook_point", None)
            for resolved in self._described.resolve_hook_names(name):
                if validate is not None:
                    validate(self._described.hook_dict[resolved], self._described)
            pairs.append((name, fn))
        return pairs

    # ----------------------------------------------------------------- forward
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(
        self,
        input,
        *,
        attention_mask: Tensor | None = None,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        return_type: str | None = "logits",
        loss_per_token: bool = False,
        **unsupported,
    ):
        """Logits [batch pos d_vocab] (zeros at padding positions: each prompt runs alone), as hooked's forward."""
        return self._forward(
            input, [], attention_mask, prepend_bos, padding_side, return_type, loss_per_token, unsupported
        )[0]

    def run_with_hooks(
        self, *args, fwd_hooks=(), bwd_hooks=(), reset_hooks_end: bool = True, clear_contexts: bool = False, **kwargs
    ):
        """`model.run_with_hooks(tokens, fwd_hooks=[(name, fn)])`: the hooks run in vLLM's workers on each prompt's
        own rows. Only what a hook does to the activations comes back (a hook that appends to a list of this
        process appends in a worker's copy): keep activations with `run_with_cache`."""
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end):
            return self.forward(*args, **kwargs)

    def run_with_cache(
        self,
        *args,
        names_filter: NameFilter | None = None,
        device: torch.device | str | None = None,
        remove_batch_dim: bool = False,
        incl_bwd: bool = False,
        pos_slice=None,
        **kwargs,
    ):
        """`logits, cache = model.run_with_cache(tokens)`: every request brings its activations back; the cache is
        in the caller's [batch pos ...] layout, zeros at padding positions (attention patterns: zero weight on
        padding keys, scores at the dtype's minimum)."""
        from hooked.cache import ActivationCache
        from hooked.layers import position_ids_for

        if incl_bwd:
            raise RuntimeError(f"incl_bwd=True: {GRADIENTS}")
        described = self._described
        names = described.default_cache_names() if names_filter is None else described.resolve_hook_names(names_filter)
        input = args[0] if args else kwargs.pop("input")
        forward_args = {k: kwargs.pop(k) for k in ("attention_mask", "prepend_bos", "padding_side") if k in kwargs}
        output, tokens, key_valid, caches = self._forward(
            input,
            names,
            forward_args.get("attention_mask"),
            forward_args.get("prepend_bos"),
            forward_args.get("padding_side"),
            kwargs.pop("return_type", "logits"),
            kwargs.pop("loss_per_token", False),
            kwargs,
        )
        store = {}
        for name in names:
            point = described.hook_dict[name]
            tensor = _padded([cache[name] for cache in caches], key_valid, point, tokens.shape)
            if pos_slice is not None:
                tensor = apply_pos_slice(tensor, pos_slice, pos_axis(point))
            if remove_batch_dim:
                if tensor.shape[0] != 1:
                    raise ValueError(
                        f"remove_batch_dim=True needs a batch of 1, but {name} has batch {tensor.shape[0]}"
                    )
                tensor = tensor[0]
            store[name] = tensor if device is None else tensor.to(device)
        position_ids = position_ids_for(tokens, key_valid)
        attention_mask = key_valid
        if pos_slice is not None:
            position_ids = apply_pos_slice(position_ids, pos_slice, 1)
            attention_mask = None if attention_mask is None else apply_pos_slice(attention_mask, pos_slice, 1)
        if remove_batch_dim:
            position_ids = position_ids[0]
            attention_mask = None if attention_mask is None else attention_mask[0]
        cache = ActivationCache(
            store, self, has_batch_dim=not remove_batch_dim, position_ids=position_ids, attention_mask=attention_mask
        )
        return output, cache

    def _forward(
        self, input, cache_names, attention_mask, prepend_bos, padding_side, return_type, per_token, unsupported
    ):
        """One request per prompt under the active hooks: (output by return_type, ids, mask, per-request caches)."""
        from hooked.models.base import HookedTransformer

        if unsupported:
            raise TypeError(
                f"{', '.join(sorted(unsupported))}: not supported by a model served by vLLM (the engine runs whole"
                " prompts: no past_kv_cache, start_at_layer or stop_at_layer); use hooked's own engine"
            )
        if return_type not in ("logits", "loss", "both", None):
            raise ValueError(f"return_type must be 'logits', 'loss', 'both' or None, not {return_type!r}")
        tokens, key_valid = self._described.tokens_and_mask(input, attention_mask, prepend_bos, padding_side)
        prompts = _prompts(tokens, key_valid)
        wants_logits = return_type is not None
        results = self._run(prompts, self._active_hooks(), cache_names, "all" if wants_logits else None)
        caches = [result.cache for result in results]
        if not wants_logits:
            return None, tokens, key_valid, caches
        logits = torch.zeros(*tokens.shape, results[0].prompt_logits.shape[-1])
        for row, result in enumerate(results):
            columns = slice(None) if key_valid is None else key_valid[row]
            logits[row, columns] = result.prompt_logits
        logits = logits.to(self.dtype)
        if return_type == "logits":
            return logits, tokens, key_valid, caches
        loss = HookedTransformer.loss(logits, tokens, key_valid, per_token=per_token)
        return (loss if return_type == "loss" else (logits, loss)), tokens, key_valid, caches

    @contextlib.contextmanager
    def _variants(self, hooks: Mapping[str, Sequence]) -> Iterator[dict[str, str | None]]:
        """Each name's hooks installed on the engine as one variant for the block (None for a name without hooks: the
        model as it is), every variant dropped after it, also when it raises."""
        self._open()
        ids = {}
        try:
            for name, pairs in hooks.items():
                ids[name] = self._engine.add_variant(pairs) if pairs else None
            yield ids
        finally:
            for variant in ids.values():
                if variant is not None:
                    self._engine.drop_variant(variant)

    def _run(self, prompts, fwd_hooks, cache_names=(), prompt_logits=None, max_new_tokens=1, **options):
        """The prompts as requests under one variant made of `fwd_hooks` (and the cache of `cache_names`)."""
        self._open()
        variant = self._engine.add_variant(fwd_hooks, cache=list(cache_names)) if fwd_hooks or cache_names else None
        try:
            return self._engine.generate(
                prompts,
                [variant] * len(prompts),
                max_new_tokens,
                logits=False,
                prompt_logits=prompt_logits,
                prompt_indices=list(range(len(prompts))),
                **options,
            )
        finally:
            if variant is not None:
                self._engine.drop_variant(variant)

    # ----------------------------------------------------------------- generation
    def generate(
        self,
        input="",
        max_new_tokens: int = 10,
        *,
        fwd_hooks=(),
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        freq_penalty: float = 0.0,
        stop_at_eos: bool = True,
        eos_token_id=None,
        return_type: str = "input",
        attention_mask: Tensor | None = None,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        verbose: bool = False,
        **unsupported,
    ):
        """`model.generate(prompt, max_new_tokens, fwd_hooks=[...])`: hooks on the prompt and every decode step, each
        prompt one request. Greedy by default; sampling is vLLM's (`seed` seeds each request), so sampled text differs
        from hooked's own engine's. Output as hooked's `generate`: prompts on the left, finished rows filled with
        the end-of-sequence token."""
        results = self._generate(
            input, {"": list(fwd_hooks)}, max_new_tokens, do_sample, temperature, top_k, top_p, seed, freq_penalty,
            stop_at_eos, eos_token_id, return_type, attention_mask, prepend_bos, padding_side, unsupported,
        )  # fmt: skip
        return results[""]

    def generate_variants(self, input, variants: Mapping, max_new_tokens: int = 10, **kwargs) -> dict:
        """`hooked.generate_variants` on the engine: one request per (variant, prompt), all queued together."""
        if not isinstance(variants, Mapping) or not variants:
            raise ValueError("variants must be a non-empty dict: {name: [(hook_name, callback), ...]}")
        for refused in ("return_cache", "fwd_hooks", "use_past_kv_cache"):
            if refused in kwargs:
                raise ValueError(f"generate_variants does not take {refused}=; generate the variant alone")
        self._no_outside_hooks("generate_variants")
        options = dict(
            do_sample=False, temperature=1.0, top_k=None, top_p=None, seed=None, freq_penalty=0.0, stop_at_eos=True,
            eos_token_id=None, return_type="input", attention_mask=None, prepend_bos=None, padding_side=None,
        )  # fmt: skip
        unknown = {k: v for k, v in kwargs.items() if k not in options and k != "verbose"}
        options.update({k: v for k, v in kwargs.items() if k in options})
        return self._generate(input, dict(variants), max_new_tokens, *options.values(), unknown)

    def _generate(
        self, input, variants, max_new_tokens, do_sample, temperature, top_k, top_p, seed, freq_penalty, stop_at_eos,
        eos_token_id, return_type, attention_mask, prepend_bos, padding_side, unsupported,
    ) -> dict:  # fmt: skip
        from hooked.generation import _eos_ids, _format, _is_text, _prompts_on_the_left, move_padding

        if unsupported:
            raise TypeError(
                f"{', '.join(sorted(unsupported))}: not supported on vLLM (return_cache: run run_with_cache on the"
                " generated ids; use_past_kv_cache: the engine always caches)"
            )
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1 on the engine, got {max_new_tokens!r}")
        if return_type not in ("input", "tokens", "str"):
            raise ValueError(f"return_type must be 'input', 'tokens' or 'str', not {return_type!r}")
        sampling = {"temperature": 0.0}
        if do_sample:
            sampling = {"temperature": temperature, "top_k": top_k or 0, "top_p": 1.0 if top_p is None else top_p}
            if seed is not None:
                sampling["seed"] = seed
        else:
            asked = [n for n, given in (("temperature", temperature != 1.0), ("top_k", top_k is not None),
                                        ("top_p", top_p is not None), ("seed", seed is not None)) if given]  # fmt: skip
            if asked:
                raise ValueError(f"{', '.join(asked)} only apply when sampling; pass do_sample=True")
        if freq_penalty:
            sampling["frequency_penalty"] = freq_penalty
        eos_ids = _eos_ids(self._described, eos_token_id, stop_at_eos) if stop_at_eos else []
        text_input = _is_text(input)
        tokens, key_valid, right_padded = _prompts_on_the_left(
            self._described, input, attention_mask, prepend_bos, padding_side
        )
        prompts = _prompts(tokens, key_valid)
        longest = max(map(len, prompts)) + max_new_tokens
        if longest > self.max_model_len:
            raise ValueError(
                f"the longest prompt plus max_new_tokens is {longest} tokens, more than the engine's max_model_len"
                f" {self.max_model_len}; load with a larger max_model_len= or ask for fewer tokens"
            )
        active = self._active_hooks()
        planned = {name: self._checked(active + _pairs(pairs)) for name, pairs in variants.items()}
        with self._variants(planned) as ids:
            requests = [(name, prompt) for name in planned for prompt in prompts]
            results = self._engine.generate(
                [prompt for _, prompt in requests],
                [ids[name] for name, _ in requests],
                max_new_tokens,
                logits=False,
                sampling=sampling,
                stop_token_ids=eos_ids,
                prompt_indices=list(range(len(prompts))) * len(planned),
            )
        outputs = {}
        batch = tokens.shape[0]
        for block, name in enumerate(planned):
            new = [results[block * batch + row].tokens for row in range(batch)]
            width = max(map(len, new))
            filler = eos_ids[0] if eos_ids else 0
            out = torch.cat([tokens, torch.full((batch, width), filler, dtype=tokens.dtype)], dim=1)
            for row, generated in enumerate(new):
                out[row, tokens.shape[1] : tokens.shape[1] + len(generated)] = torch.tensor(generated)
            if right_padded and return_type != "str":
                valid = torch.cat([key_valid, key_valid.new_ones(batch, width)], dim=1)
                outputs[name] = move_padding(out, valid, "right")[0]
            else:
                outputs[name] = _format(
                    self._described, out, tokens, key_valid, eos_ids, input, text_input, prepend_bos, return_type
                )
        return outputs

    # ----------------------------------------------------------------- sweeps
    def sweep(self, input, variants, metric, *, attention_mask=None, progress=None, task=None, **unsupported):
        """`hooked.sweep` on the engine: the base run and one request per (variant, prompt), all queued together; each
        variant's values are the metric on its prompts' logits against the base run's, as on hooked's own engine."""
        from hooked.interventions.metrics import check_prompts
        from hooked.interventions.results import SweepResult
        from hooked.interventions.sweeps import MetricReads, metric_name, plan_variants, sweep_provenance

        if unsupported.pop("data_parallel", None):
            raise ValueError("data_parallel: the engine spreads requests over its own workers; drop data_parallel=")
        unsupported = {k: v for k, v in unsupported.items() if v is not None}
        if unsupported:
            raise TypeError(
                f"{', '.join(sorted(unsupported))}: not taken by hooked.sweep on vLLM (the engine schedules the"
                " requests itself: bound its batches with max_num_seqs= / max_num_batched_tokens= at load)"
            )
        if not isinstance(variants, Mapping) or not variants:
            raise ValueError("variants must be a non-empty dict: {name: [(hook_name, callback), ...]}")
        described = self._described
        self._no_outside_hooks("hooked.sweep")
        tokens, key_valid = described.tokens_and_mask(input, attention_mask, prepend_bos=None)
        check_prompts(metric, described, tokens, key_valid, "hooked.sweep")
        planned = plan_variants(described, variants, tokens.shape)
        reads = MetricReads.of(metric, described)
        prompts = _prompts(tokens, key_valid)
        which = "last" if reads.position == -1 else "all"
        columns = None if reads.columns is None else reads.columns.tolist()

        with self._variants({variant.name: variant.hooks for variant in planned}) as ids:
            runs = [None, *(ids[v.name] for v in planned)]  # the base run first
            results = self._engine.generate(
                [prompt for _ in runs for prompt in prompts],
                [variant for variant in runs for _ in prompts],
                1,
                logits=False,
                prompt_logits=which,
                columns=columns,
                prompt_indices=list(range(len(prompts))) * len(runs),
            )
        batch = len(prompts)

        def logits_of(block: int) -> Tensor:
            rows = [results[block * batch + row].prompt_logits for row in range(batch)]
            if which == "last":
                return torch.stack(rows).to(self.dtype)  # [batch 1 columns]: each prompt's last real token
            full = torch.zeros(*tokens.shape, rows[0].shape[-1], dtype=self.dtype)
            for row, values in enumerate(rows):
                full[row, slice(None) if key_valid is None else key_valid[row]] = values.to(self.dtype)
            return full

        base = logits_of(0)
        base_value = reads.evaluate(base, base, key_valid, "on the base run (no variant)")
        values = torch.stack(
            [
                reads.evaluate(logits_of(block + 1), base, key_valid, f"with variant {variant.name!r}")
                for block, variant in enumerate(planned)
            ]
        )
        return SweepResult(
            variants=[v.name for v in planned],
            values=values,
            base=base_value.cpu(),
            metric=metric_name(metric),
            provenance=sweep_provenance(described, planned, metric, task, tokens),
        )

    def _no_outside_hooks(self, caller: str) -> None:
        if self.hooks_attached():
            raise RuntimeError(
                f"{caller} runs the model without outside hooks, but hooks are registered; remove them"
                " (model.reset_hooks(), or leave the `with model.hooks(...)` block) or add them to every variant"
            )


class _Elsewhere:
    """What a `VllmModel` becomes when a hook that refers to it is shipped to vLLM's workers."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attribute: str):
        raise AttributeError(
            f"a hook running in vLLM's workers asked the model ({self.name}) for {attribute!r}; hooks there see only"
            " what they are given (activations, `hook`); compute references (means, caches) before the call"
        )


def _pairs(pairs) -> list:
    if isinstance(pairs, tuple) and len(pairs) == 2 and callable(pairs[1]):
        return [pairs]
    return list(pairs)


def _prompts(tokens: Tensor, key_valid: Tensor | None) -> list[list[int]]:
    """Each row's real token ids: the request the engine runs for it."""
    if key_valid is None:
        return tokens.tolist()
    return [row[valid].tolist() for row, valid in zip(tokens, key_valid, strict=True)]


def _padded(pieces: list[Tensor], key_valid: Tensor | None, point, shape: torch.Size) -> Tensor:
    """Per-request activations [1, len_i, ...] back in the caller's [batch pos ...] layout: each row's real columns,
    zeros elsewhere (an attention pattern's padding keys get weight 0, its scores the dtype's minimum)."""
    batch, width = shape
    first = pieces[0]
    axes = point.axes
    sizes = [batch if axis == "batch" else width if axis in ("pos", "query_pos", "key_pos") else first.shape[i]
             for i, axis in enumerate(axes)]  # fmt: skip
    fill = torch.finfo(first.dtype).min if point.name.endswith("hook_attn_scores") else 0.0
    out = torch.full(sizes, fill, dtype=first.dtype)
    for row, piece in enumerate(pieces):
        index: list = [slice(None)] * len(axes)
        index[0] = row
        valid = torch.ones(width, dtype=torch.bool) if key_valid is None else key_valid[row]
        for i, axis in enumerate(axes):
            if axis in ("pos", "query_pos", "key_pos"):
                index[i] = valid.nonzero()[:, 0]
        if sum(axis in ("pos", "query_pos", "key_pos") for axis in axes) == 2:  # both position axes: an outer index
            q, k = (i for i, axis in enumerate(axes) if axis in ("pos", "query_pos", "key_pos"))
            real = valid.nonzero()[:, 0]
            view = out[row]
            inner = view.index_select(q - 1, real)
            inner.index_copy_(k - 1, real, piece[0])
            view.index_copy_(q - 1, real, inner)
        else:
            out[tuple(index)] = piece[0]
    return out
