"""Shared helpers of the benchmark scripts: random checkpoints (GPT-2 small, Qwen3), timing and memory.

Not a benchmark itself; every script in this folder imports it (`python benchmarks/<name>.py`
puts this folder on sys.path).

* `gpt2_small_checkpoint()` builds a random checkpoint with GPT-2 small's shapes (12 layers,
  d_model 768, 12 heads, vocab 50257, 1024 positions) with transformers' `GPT2LMHeadModel`,
  randomises the LayerNorm weights and biases (GPT-2's init leaves them at 1 and 0, which would
  hide a norm that ignores them) and `save_pretrained`s it to `$HOOKED_BENCH_DIR/gpt2-small`
  (default /tmp/hooked-bench/gpt2-small). An existing checkpoint is reused.
* `transformers_checkpoint(dir, config_name, model_name, kwargs, dtype, max_shard_size)` does the
  same for any transformers causal LM (norms randomised, cast to `dtype`, optionally sharded);
  `qwen3_sharded_checkpoint("dense" | "moe")` is `QWEN3_SHAPES[kind]` (the shapes of
  benchmarks/qwen3_forward.py) in bfloat16, shards of at most 200 MB, with its index file.
* `compare(...)` times several callables interleaved (A B A B ...), after warmup, and reports the
  median of each and the ratio of medians against the first. Ratios of runs taken in the same
  process, interleaved, survive a noisy shared machine far better than absolute times.
* `rss()`, `peak_rss()`, `PeakSampler` measure resident memory.
* `transformer_lens_gpt2(dir)` builds TransformerLens 3.9's `HookedTransformer` (or a subclass such as
  SAELens' `HookedSAETransformer`) on the same weights as a GPT-2 checkpoint, unprocessed (no LayerNorm
  folding, no centring), as `hooked.load` loads them.

Threads: torch's default (`torch.get_num_threads()`), never changed here (a script's `--cpu-time` may).
"""

from __future__ import annotations

import gc
import os
import platform
import resource
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

# Run as `python benchmarks/<name>.py` from a clone without `pip install -e .`: make the checkout's
# `hooked` importable (an installed one is used as is).
REPO_ROOT = Path(__file__).resolve().parent.parent
try:
    import hooked  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, str(REPO_ROOT))

BENCH_DIR = Path(os.environ.get("HOOKED_BENCH_DIR", "/tmp/hooked-bench"))
GPT2_SMALL = dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
GiB = 1024**3
MiB = 1024**2


# ----------------------------------------------------------------------------- checkpoint
def gpt2_small_checkpoint(directory: Path | None = None, seed: int = 0) -> Path:
    """A random GPT-2-small-shaped checkpoint directory (config.json + model.safetensors), float32."""
    return transformers_checkpoint(
        directory or BENCH_DIR / "gpt2-small", "GPT2Config", "GPT2LMHeadModel", GPT2_SMALL, seed=seed
    )


def transformer_lens_gpt2(directory: Path, model_class=None):
    """TransformerLens' HookedTransformer with `directory`'s GPT-2 weights, unprocessed, float32, CPU, eval mode.

    `model_class`: a subclass to build instead (SAELens' `HookedSAETransformer`, benchmarks/saes.py).

    TransformerLens' own converter (transformer_lens 3.9, pretrained/weight_conversions/gpt2.py) maps
    transformers' `GPT2LMHeadModel`; `load_and_process_state_dict` with every processing flag off keeps the
    weights as `hooked.load` does, so both compute the same function (tests/transformer_lens/tl_reference.py does
    the same).
    """
    import warnings

    from transformers import GPT2LMHeadModel

    quiet_transformers()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import HookedTransformer, HookedTransformerConfig
        from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    hf = GPT2LMHeadModel.from_pretrained(directory).eval()
    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        n_heads=c.n_head,
        d_head=c.n_embd // c.n_head,
        d_mlp=c.n_inner or 4 * c.n_embd,
        d_vocab=c.vocab_size,
        n_ctx=c.n_positions,
        act_fn="gelu_new",
        normalization_type="LN",
        positional_embedding_type="standard",
        eps=c.layer_norm_epsilon,
        device="cpu",
        dtype=torch.float32,
        original_architecture="GPT2LMHeadModel",
    )
    model = (model_class or HookedTransformer)(cfg)
    with torch.no_grad():
        model.load_and_process_state_dict(
            convert_gpt2_weights(hf, cfg),
            fold_ln=False,
            center_writing_weights=False,
            center_unembed=False,
            fold_value_biases=False,
        )
    del hf
    return model.eval()


def random_tokens(batch: int, pos: int, vocab: int = GPT2_SMALL["vocab_size"], seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, pos), generator=generator)


# ----------------------------------------------------------------------------- timing
@dataclass
class Timing:
    name: str
    samples: list[float]  # seconds

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """Interquartile range over the median (0.05 = the middle half of runs lie within 5%)."""
        if len(self.samples) < 4:
            return float("nan")
        q = statistics.quantiles(self.samples, n=4)
        return (q[2] - q[0]) / self.median


def quiet_transformers() -> None:
    """No progress bars or info logs from transformers (they would break the tables)."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def compare(
    fns: dict[str, Callable[[], object]],
    repeats: int = 10,
    warmup: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> list[Timing]:
    """Time each callable `repeats` times, interleaved round-robin (A B A B ...), after `warmup` rounds.

    Interleaving spreads the machine's slow phases over every candidate instead of charging one of
    them; the ratio of medians is the figure to read. gc is collected before and disabled during.
    `clock=time.process_time` counts this process's CPU time instead of wall time: with one torch thread
    it ignores the time other jobs hold the cores (a busy shared machine), not the cache misses they cause.
    """
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for round_index in range(warmup + repeats):
            for name in names:
                start = clock()
                fns[name]()
                elapsed = clock() - start
                if round_index >= warmup:
                    samples[name].append(elapsed)
    finally:
        if gc_was_enabled:
            gc.enable()
    return [Timing(name, samples[name]) for name in names]


def timing_table(timings: list[Timing], unit: str = "ms", baseline: int = 0, title: str | None = None) -> str:
    """A table of medians and the ratio of each median to the baseline row's."""
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    base = timings[baseline].median
    base_min = min(timings[baseline].samples)
    rows = [
        (
            t.name,
            f"{t.median * scale:.2f}",
            f"{t.spread:.0%}",
            f"{t.median / base:.3f}",
            f"{min(t.samples) * scale:.2f}",
            f"{min(t.samples) / base_min:.3f}",
        )
        for t in timings
    ]
    headers = ["", f"median {unit}", "IQR/median", f"ratio vs {timings[baseline].name}", f"min {unit}", "ratio of mins"]
    return table(headers, rows, title)


def table(headers: list[str], rows: list[tuple], title: str | None = None) -> str:
    cells = [list(map(str, headers))] + [list(map(str, row)) for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    if title:
        lines.append(title)
    for index, row in enumerate(cells):
        line = "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        lines.append("| " + line + " |")
        if index == 0:
            lines.append("|-" + "--".join("-" * w for w in widths) + "-|")
    return "\n".join(lines)


def environment() -> str:
    import transformers

    return (
        f"{time.strftime('%Y-%m-%d')}  python {platform.python_version()}  torch {torch.__version__}"
        f"  transformers {transformers.__version__}  threads {torch.get_num_threads()}"
        f"  cpus {os.cpu_count()}  {platform.processor() or platform.machine()}"
    )


# ----------------------------------------------------------------------------- memory
def rss() -> int:
    """Current resident set size in bytes."""
    import psutil

    return psutil.Process().memory_info().rss


def peak_rss() -> int:
    """Peak resident set size of this process since it started, in bytes (Linux: ru_maxrss is KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def proc_status() -> dict[str, int]:
    """VmRSS / RssAnon / RssFile / RssShmem / VmHWM from /proc/self/status, in bytes (Linux only)."""
    values = {}
    try:
        with open("/proc/self/status") as file:
            for line in file:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                    values[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return values


def reset_peak_rss() -> bool:
    """VmHWM := the current RSS (/proc/self/clear_refs "5", Linux >= 4.0), so a later VmHWM is the peak of
    what comes next, not of the imports or an earlier load. False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")
        return True
    except OSError:
        return False


class PeakSampler:
    """Polls /proc/self/status in a thread and keeps the peak of VmRSS, RssAnon and RssFile.

    The peaks of RssAnon (heap copies) and RssFile (mapped file pages) are taken separately, so
    their sum may exceed the peak of VmRSS; polling every `interval` s can miss a spike shorter
    than that, which `peak_rss()` (the kernel's own high-water mark) does not.
    """

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for key, value in proc_status().items():
            if value > self.peak.get(key, 0):
                self.peak[key] = value

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.interval)

    def __enter__(self) -> PeakSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# ----------------------------------------------------------------------------- Qwen3 checkpoints
# The shapes of benchmarks/qwen3_forward.py: a slice of Qwen3-0.6B (dense) and of Qwen3-30B-A3B (MoE).
QWEN3_COMMON = dict(
    vocab_size=32000,
    hidden_size=1024,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6},
)
QWEN3_SHAPES = {
    "dense": ("Qwen3Config", "Qwen3ForCausalLM", dict(QWEN3_COMMON, num_hidden_layers=8, intermediate_size=3072)),
    "moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            QWEN3_COMMON,
            num_hidden_layers=4,
            intermediate_size=3072,
            num_experts=16,
            num_experts_per_tok=4,
            moe_intermediate_size=768,
            norm_topk_prob=True,
            initializer_range=0.05,
        ),
    ),
}


# The shapes of benchmarks/families_forward.py and the families section of benchmarks/loading.py: one
# small slice of each family, d_model 1024, 4 layers, vocab 32000 (family -> config, model class, kwargs).
FAMILY_COMMON = dict(
    vocab_size=32000, hidden_size=1024, num_attention_heads=16, num_hidden_layers=4, max_position_embeddings=4096
)
FAMILY_SHAPES = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            FAMILY_COMMON,
            num_key_value_heads=8,
            intermediate_size=2816,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 1024,
            },
        ),
    ),
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(FAMILY_COMMON, num_key_value_heads=8, intermediate_size=2816, sliding_window=4096),
    ),
    "gpt_neox": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(FAMILY_COMMON, intermediate_size=4096, rotary_pct=0.25, use_parallel_residual=True),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(FAMILY_COMMON, num_key_value_heads=8, intermediate_size=1024, num_local_experts=8, num_experts_per_tok=2),
    ),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(FAMILY_COMMON, num_key_value_heads=8, intermediate_size=2816)),
}


def family_checkpoint(family: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> Path:
    """`FAMILY_SHAPES[family]` saved once under $HOOKED_BENCH_DIR/{family}-{dtype}."""
    dtype_name = str(dtype).removeprefix("torch.")
    return transformers_checkpoint(BENCH_DIR / f"{family}-{dtype_name}", *FAMILY_SHAPES[family], dtype=dtype, seed=seed)


def transformers_checkpoint(
    directory: Path,
    config_name: str,
    model_name: str,
    config_kwargs: dict,
    dtype: torch.dtype = torch.float32,
    max_shard_size: str | None = None,
    seed: int = 0,
) -> Path:
    """A random transformers model (`model_name` built from `config_name(**config_kwargs)`), saved once.

    Norm weights and biases are randomised (`hooked.testing.randomize_norms`), the model is cast to
    `dtype` and written with `save_pretrained(..., max_shard_size=...)` (None: transformers' default,
    one file at these sizes). An existing checkpoint in `directory` is reused; it is written next to
    the target and renamed, so an interrupted run never leaves half a checkpoint.
    """
    directory = Path(directory)
    if (directory / "config.json").exists() and list(directory.glob("*.safetensors")):
        return directory
    import transformers

    from hooked.testing import randomize_norms

    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**config_kwargs)).eval()
    randomize_norms(model, seed)
    model = model.to(dtype)
    partial = directory.with_name(directory.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    save_kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(partial, **save_kwargs)
    del model
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        partial.rename(directory)
    except OSError:  # another process got there first
        shutil.rmtree(partial, ignore_errors=True)
    return directory


def qwen3_sharded_checkpoint(kind: str, directory: Path | None = None, seed: int = 0) -> Path:
    """`QWEN3_SHAPES[kind]` ("dense" or "moe") saved in bfloat16 in shards of at most 200 MB.

    The directory ($HOOKED_BENCH_DIR/qwen3-{kind}-bf16-sharded) holds `model.safetensors.index.json`
    and several `model-0000i-of-0000n.safetensors` files.
    """
    config_name, model_name, kwargs = QWEN3_SHAPES[kind]
    directory = Path(directory or BENCH_DIR / f"qwen3-{kind}-bf16-sharded")
    return transformers_checkpoint(
        directory, config_name, model_name, kwargs, dtype=torch.bfloat16, max_shard_size="200MB", seed=seed
    )
