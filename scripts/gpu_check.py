"""`make gpu-check`: one command that proves and measures everything GPU-specific in `hooked` (issue 21).

A GPU is lent now and then for ~15 minutes in all, so this must run unattended, in order, within
8 minutes of device time, and leave every figure on disk even when a step fails or runs out of time.
Each step runs in a child process of its own (a Triton fault or a CUDA error poisons only that step's
context) under a hard time limit; inside a step each configuration checks a soft deadline first and
is recorded as skipped when it has passed. CUDA out-of-memory is caught per configuration, recorded,
the cache emptied, and the step goes on.

    0. CUDA build of torch: on a machine with `nvidia-smi` whose torch is the CPU build, install
       torch==<constraints.txt pin> from the PyTorch CUDA index, then re-exec this script.
    1. tests/kernels/test_attention_kernel.py compiled for real (TRITON_INTERPRET=0), and logit parity of
       hooked vs transformers on the device, float32 and bfloat16, GPT-2 / Qwen3 / Qwen3-MoE.
    2. Kernel vs torch SDPA (flash backend) vs eager, bf16, causal, d_head 64/128, seq 512..8192:
       forward and forward+backward ms, TFLOP/s and the fraction of the H200's bf16 dense peak.
    3. End to end on random weights at real shapes: forward with / without a hook on every z,
       generate tokens/s vs transformers, and Qwen3-8B's 1,152-head ablation sweep vs a loop.
    4. torch.compile of the forward with hooks attached: compiles, equals eager, speed.
    5. EAP (hooked.circuits.attribute) over every edge of a Qwen3-8B-shaped model.
    6. hooked on vLLM (issue 38): the recipe (every MLP zeroed, every head of one layer zeroed, 8 new tokens,
       one request per variant and prompt) on a Qwen3-8B-shaped random checkpoint: tokens/s of hooked on vLLM
       against vLLM's own Qwen3 without hooks (target: within 1.15x), hooked's own engine (generate_variants) and
       nnsight's `VLLM` where importable. Runs under GPU_CHECK_VLLM_PYTHON (an environment with vllm and hooked,
       docs/vllm.md) or this Python; without vllm it reports "skipped: vllm not installed" and the rest runs.
    7. Dictionaries and attribution graphs (issue 40), random weights: GPT-2-small with a d_sae 24,576 SAE spliced
       at one layer and at every layer (time and peak memory against the plain forward); transcoder attribution
       graphs at GPT-2-small and Gemma-2-2B shapes (128 tokens); a Gemma-2-2B-shaped graph of 4,096 tokens.

Output (--out, default runs/gpu-check/): gpu-check.json (environment + every result), gpu-check.log
(everything printed), results.jsonl (one line per result, written as it happens).

`--dry-run` runs every step on the CPU with tiny shapes (Triton through its interpreter, torch.compile
with the aot_eager backend); what needs CUDA (the flash SDPA backend, TFLOP/s fractions, CUDA timers)
reports "skipped: no CUDA". Its times mean nothing; it exists so the script cannot rot
(tests/infrastructure/test_gpu_check.py).

Usage: python scripts/gpu_check.py [--dry-run [--with-vllm]] [--out DIR] [--steps 1 2 3 4 5 6 7]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
H200_BF16_DENSE_TFLOPS = 989.0  # NVIDIA H200 SXM datasheet, bf16 dense (1,979 is with 2:4 sparsity)
# Hard limits per step in seconds (steps 1-5: 450 s in all, under the 8 minutes; the soft deadline
# inside a step is 85% of it). Step 6 (vLLM) adds up to 300 s where vllm is installed (two engine starts on an
# 8B checkpoint, written first); without vllm it ends at once. Run it alone with `--steps 6` when time is short.
# Step 7 (dictionaries and graphs) adds up to 300 s; `--steps 7` runs it alone.
# The CUDA-build install (step 0) has its own limit and runs only when needed.
STEP_LIMITS = {1: 90, 2: 100, 3: 140, 4: 70, 5: 50, 6: 300, 7: 300}
DRY_RUN_LIMITS = {1: 60, 2: 30, 3: 60, 4: 60, 5: 30, 6: 240, 7: 60}
INSTALL_LIMIT = 300
STEP_NAMES = {
    1: "correctness",
    2: "kernel-bench",
    3: "end-to-end",
    4: "compile",
    5: "eap",
    6: "vllm",
    7: "dictionaries",
}
# The CUDA build to install (step 0): the local version tag and its index. torch==2.13.0 alone would be
# "already satisfied" by 2.13.0+cpu (PEP 440 ignores the local label), hence the explicit +cu128.
CUDA_TAG = os.environ.get("GPU_CHECK_CUDA_TAG", "cu128")
CUDA_INDEX = os.environ.get("GPU_CHECK_TORCH_INDEX", f"https://download.pytorch.org/whl/{CUDA_TAG}")


# ============================================================================= results
class Recorder:
    """Prints one line per result and appends it to results.jsonl (so a killed step keeps what it did)."""

    def __init__(self, out: Path, step: int, deadline: float):
        self.path = out / "results.jsonl"
        self.step, self.deadline, self.errors = step, deadline, 0

    def __call__(self, what: str, status: str, **figures) -> None:
        if status == "error":
            self.errors += 1
        row = dict(step=self.step, what=what, status=status, **figures)
        shown = "  ".join(f"{k}={_fmt(v)}" for k, v in figures.items())
        print(f"[{self.step} {STEP_NAMES[self.step]}] {what}: {status}  {shown}".rstrip(), flush=True)
        with open(self.path, "a") as file:
            file.write(json.dumps(row, default=str) + "\n")

    def out_of_time(self, what: str) -> bool:
        if time.time() < self.deadline:
            return False
        self(what, "skipped", reason="step time limit")
        return True

    def guarded(self, what: str, fn) -> dict | None:
        """Run one configuration: OOM is recorded and the cache emptied; any other error is recorded."""
        import torch

        if self.out_of_time(what):
            return None
        try:
            return fn()
        except torch.cuda.OutOfMemoryError as error:
            self(what, "oom", reason=str(error).splitlines()[0][:160])
        except Exception as error:  # noqa: BLE001 - recorded, counted, the step goes on
            self(what, "error", reason=f"{type(error).__name__}: {error}".splitlines()[0][:300])
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return None


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# ============================================================================= helpers shared by steps
def device_of(args) -> str:
    import torch

    return "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"


def timer(device: str):
    """ms per call: triton.testing.do_bench on CUDA (synchronises, flushes L2); median of 2 calls on the CPU."""
    if device == "cuda":
        import triton.testing

        return lambda fn: triton.testing.do_bench(fn, warmup=10, rep=50)

    def cpu(fn):
        fn()
        samples = []
        for _ in range(2):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples)

    return cpu


def random_model(architecture: str, device: str, dtype, seed: int = 0, **sizes):
    """A hooked model built from its config straight on `device` with N(0, 0.02) weights (no files, no CPU copy).

    hooked.testing.random_model draws every weight on the CPU in float32 from one generator: right for
    tests, minutes for 8B parameters. Norm weights are 1 + noise so a dropped norm would still show.
    """
    import torch

    from hooked.models import GPT2, Gemma2, Gemma2Config, GPT2Config, Qwen3, Qwen3Config, Qwen3Moe, Qwen3MoeConfig

    classes = {
        "gpt2": (GPT2, GPT2Config),
        "qwen3": (Qwen3, Qwen3Config),
        "qwen3_moe": (Qwen3Moe, Qwen3MoeConfig),
        "gemma2": (Gemma2, Gemma2Config),
    }
    model_class, config_class = classes[architecture]
    if "mlp_only_layers" in sizes:
        sizes["mlp_only_layers"] = tuple(sizes["mlp_only_layers"])
    with torch.device(device):
        model = model_class(config_class(**sizes))
    model.to(dtype)
    generator = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0.0, 0.02, generator=generator)
            elif parameter.ndim == 1:
                parameter.normal_(1.0, 0.1, generator=generator)
            else:
                parameter.normal_(0.0, 0.02, generator=generator)
    return model.eval()


# Real shapes (hooked config fields). Qwen3-MoE: Qwen3-30B-A3B's layer at 4 layers instead of 48.
QWEN3_ROPE = dict(rope_theta=1e6)
REAL_MODELS = {
    "gpt2-small": ("gpt2", dict(n_layers=12, d_model=768, n_heads=12, d_mlp=3072, d_vocab=50257, n_ctx=1024)),
    "qwen3-0.6b": (
        "qwen3",
        dict(
            n_layers=28,
            d_model=1024,
            n_heads=16,
            n_kv_heads=8,
            d_head=128,
            d_mlp=3072,
            d_vocab=151936,
            tie_word_embeddings=True,
            **QWEN3_ROPE,
        ),
    ),
    "qwen3-8b": (
        "qwen3",
        dict(
            n_layers=36, d_model=4096, n_heads=32, n_kv_heads=8, d_head=128, d_mlp=12288, d_vocab=151936, **QWEN3_ROPE
        ),
    ),
    "qwen3-moe-128e-4l": (
        "qwen3_moe",
        dict(
            n_layers=4,
            d_model=2048,
            n_heads=32,
            n_kv_heads=4,
            d_head=128,
            d_mlp=6144,
            d_vocab=151936,
            n_experts=128,
            top_k=8,
            d_expert_mlp=768,
            **QWEN3_ROPE,
        ),
    ),
}
TINY_MODELS = {
    "gpt2-tiny": ("gpt2", dict(n_layers=2, d_model=32, n_heads=4, d_mlp=64, d_vocab=64, n_ctx=64)),
    "qwen3-tiny": ("qwen3", dict(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=48, d_vocab=64)),
    "qwen3-8b-tiny": ("qwen3", dict(n_layers=3, d_model=32, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=48, d_vocab=64)),
    "qwen3-moe-tiny": (
        "qwen3_moe",
        dict(
            n_layers=2,
            d_model=32,
            n_heads=4,
            n_kv_heads=2,
            d_head=8,
            d_mlp=48,
            d_vocab=64,
            n_experts=8,
            top_k=2,
            d_expert_mlp=16,
        ),
    ),
}


def models_for(args) -> dict:
    return TINY_MODELS if args.dry_run else REAL_MODELS


def eight_b(args) -> str:
    return "qwen3-8b-tiny" if args.dry_run else "qwen3-8b"


def z_hook_names(model) -> list[str]:
    return [name for name in model.hook_dict if name.endswith("attn.hook_z")]


# ============================================================================= step 1: correctness
def step_correctness(args, record: Recorder) -> None:
    import torch

    device = device_of(args)
    # The kernel tests, compiled for real: conftest.py and the test file only *setdefault* TRITON_INTERPRET,
    # so the explicit 0 here wins. The dry run runs two fast tests under the interpreter.
    env = dict(os.environ, TRITON_INTERPRET="1" if args.dry_run else "0")
    selection = ["-k", "padded_rows_are_exactly_zero or input_validation"] if args.dry_run else []
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/kernels/test_attention_kernel.py",
        *selection,
    ]
    budget = max(10, int(record.deadline - time.time() - 20))  # leave ~20 s for the parity checks
    try:
        result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=budget)
        tail = (result.stdout + result.stderr).strip().splitlines()
        summary = tail[-1] if tail else ""
        (Path(args.out) / "kernel-tests.log").write_text(result.stdout + result.stderr)
        if result.returncode == 0:
            record("kernel tests (pytest)", "ok", interpret=env["TRITON_INTERPRET"], summary=summary)
        else:
            record(
                "kernel tests (pytest)",
                "error",
                interpret=env["TRITON_INTERPRET"],
                summary=summary,
                log="kernel-tests.log",
            )
    except subprocess.TimeoutExpired:
        record("kernel tests (pytest)", "skipped", reason=f"time limit {budget} s")

    # Parity: hooked.load of a random transformers checkpoint vs transformers itself, both on the device.
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import common  # noqa: E402 - benchmarks/common.py: transformers_checkpoint
    import transformers

    import hooked

    common.quiet_transformers()
    checkpoints = {
        "gpt2": (
            "GPT2Config",
            "GPT2LMHeadModel",
            dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=128),
        ),
        "qwen3": (
            "Qwen3Config",
            "Qwen3ForCausalLM",
            dict(
                num_hidden_layers=2,
                hidden_size=64,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=64,
                intermediate_size=128,
                vocab_size=512,
                max_position_embeddings=128,
            ),
        ),
        "qwen3_moe": (
            "Qwen3MoeConfig",
            "Qwen3MoeForCausalLM",
            dict(
                num_hidden_layers=2,
                hidden_size=64,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=64,
                intermediate_size=128,
                moe_intermediate_size=32,
                num_experts=8,
                num_experts_per_tok=2,
                norm_topk_prob=True,
                vocab_size=512,
                max_position_embeddings=128,
            ),
        ),
    }
    # max |hooked - transformers| / max(max |logit|, 1): float32 allows TF32-level dot products in the
    # kernel; bfloat16 allows a few bf16 ulps of the logits.
    tolerance = {torch.float32: 2e-3, torch.bfloat16: 5e-2}
    with tempfile.TemporaryDirectory() as tmp:
        for arch, (config_name, model_name, kwargs) in checkpoints.items():
            directory = common.transformers_checkpoint(Path(tmp) / arch, config_name, model_name, kwargs)
            for dtype in (torch.float32, torch.bfloat16):
                what = f"parity {arch} {str(dtype).removeprefix('torch.')} on {device}"

                def check(directory=directory, dtype=dtype, what=what):
                    ours = hooked.load(directory, dtype=dtype, device=device)
                    theirs = getattr(transformers, model_name).from_pretrained(directory, dtype=dtype).to(device).eval()
                    tokens = torch.randint(
                        0, 512, (2, 48 if args.dry_run else 128), generator=torch.Generator().manual_seed(0)
                    )
                    tokens = tokens.to(device)
                    with torch.inference_mode():
                        a = ours(tokens).float()
                        b = theirs(tokens).logits.float()
                    diff = (a - b).abs().max().item()
                    relative = diff / max(b.abs().max().item(), 1.0)
                    ok = relative <= tolerance[dtype]
                    record(
                        what, "ok" if ok else "error", max_abs_diff=diff, relative=relative, tolerance=tolerance[dtype]
                    )

                record.guarded(what, check)


# ============================================================================= step 2: kernel benchmark
def eager_attention(q, k, v):
    """softmax(q k^T / sqrt(d) + causal mask) v on [batch head pos d_head]: the O(T^2)-memory baseline."""
    import torch

    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


def step_kernel_bench(args, record: Recorder) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from attention import causal_fwd_flops  # benchmarks/attention.py: the FLOP count written out there

    from hooked.kernels import flash_attention

    device = device_of(args)
    cuda = device == "cuda"
    time_ms = timer(device)
    dtype = torch.bfloat16 if cuda else torch.float32  # the interpreter's bf16 is slow and truncates
    heads, batch_tokens = (16, 32768) if cuda else (2, 64)
    head_dims = (64, 128) if cuda else (16,)
    seqs = (512, 1024, 2048, 4096, 8192) if cuda else (16, 32)
    record("peak used", "info", h200_bf16_dense_tflops=H200_BF16_DENSE_TFLOPS, heads=heads, batch_tokens=batch_tokens)
    for s in seqs:  # sequence outermost: when the deadline cuts the step, both head dims have figures
        for d in head_dims:
            b = max(1, batch_tokens // s)
            flops = {"fwd": causal_fwd_flops(b, heads, s, d)}
            flops["fwd+bwd"] = 3.5 * flops["fwd"]  # backward = 2.5 x forward (benchmarks/attention.py)

            def inputs():
                gen = torch.Generator(device).manual_seed(0)
                q, k, v = (
                    torch.randn(b, s, heads, d, device=device, dtype=dtype, generator=gen).requires_grad_()
                    for _ in range(3)
                )
                return q, k, v

            def ours(q, k, v):
                return flash_attention(q, k, v)  # [b, s, heads * d]

            def flash(q, k, v):
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)

            def eager(q, k, v):
                return eager_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))

            impls = {"triton": ours, "sdpa-flash": flash, "eager": eager}
            for impl, fn in impls.items():
                what = f"{impl} d={d} seq={s} batch={b}"
                if impl == "sdpa-flash" and not cuda:
                    record(what, "skipped", reason="no CUDA (flash SDPA backend)")
                    continue

                def measure(fn=fn, impl=impl, what=what):
                    q, k, v = inputs()
                    with torch.no_grad():
                        out = fn(q, k, v)
                        reference = eager(q.float(), k.float(), v.float()) if impl != "eager" else out
                        out = out.reshape(b, s, heads, d).transpose(1, 2) if impl == "triton" else out
                        diff = (out.float() - reference.float()).abs().max().item()
                        del out, reference
                        fwd_ms = time_ms(lambda: fn(q, k, v))
                    dout = torch.randn_like(fn(q, k, v))

                    def fwd_bwd():
                        fn(q, k, v).backward(dout)
                        q.grad = k.grad = v.grad = None

                    fb_ms = time_ms(fwd_bwd)
                    figures = dict(fwd_ms=fwd_ms, fwd_bwd_ms=fb_ms, max_abs_diff_vs_fp32_eager=diff)
                    if cuda:
                        for key, ms in (("fwd", fwd_ms), ("fwd+bwd", fb_ms)):
                            tflops = flops[key] / (ms * 1e-3) / 1e12
                            figures[f"{key}_tflops"] = tflops
                            figures[f"{key}_frac_peak"] = tflops / H200_BF16_DENSE_TFLOPS
                    else:
                        figures["tflops"] = "skipped: no CUDA"
                    record(what, "ok", **figures)

                record.guarded(what, measure)


# ============================================================================= step 3: end to end
def step_end_to_end(args, record: Recorder) -> None:
    import torch

    import hooked
    from hooked import ablate, metrics

    device = device_of(args)
    time_ms = timer(device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    batch, pos = (4, 1024) if device == "cuda" else (2, 16)
    new_tokens = 64 if device == "cuda" else 4

    for name, (arch, sizes) in models_for(args).items():
        holder = {}

        def build(arch=arch, sizes=sizes, name=name, holder=holder):
            start = time.perf_counter()
            holder["model"] = random_model(arch, device, dtype, **sizes)
            n = sum(p.numel() for p in holder["model"].parameters())
            record(f"{name} build", "ok", params_m=n / 1e6, seconds=time.perf_counter() - start)

        record.guarded(f"{name} build", build)
        if "model" not in holder:
            continue
        model = holder["model"]
        tokens = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(0)).to(
            device
        )

        def forward(model=model, tokens=tokens, name=name):
            hooks = [(hook, lambda z, hook: z) for hook in z_hook_names(model)]
            with torch.inference_mode():
                plain = time_ms(lambda: model(tokens))
                hooked_ms = time_ms(lambda: model.run_with_hooks(tokens, fwd_hooks=hooks))
            record(
                f"{name} forward {batch}x{pos}",
                "ok",
                ms=plain,
                ms_hook_every_z=hooked_ms,
                overhead=hooked_ms / plain - 1,
                n_z_hooks=len(hooks),
            )

        record.guarded(f"{name} forward {batch}x{pos}", forward)

        def generate(model=model, name=name, arch=arch, sizes=sizes):
            prompt = tokens[:, :32]
            start = time.perf_counter()
            model.generate(prompt, max_new_tokens=new_tokens, stop_at_eos=False)
            _sync(device)
            ours = batch * new_tokens / (time.perf_counter() - start)
            theirs = _transformers_generate(arch, sizes, device, dtype, prompt, new_tokens)
            record(
                f"{name} generate {batch}x{new_tokens} greedy",
                "ok",
                tokens_per_s=ours,
                transformers_tokens_per_s=theirs,
                ratio=ours / theirs if theirs else None,
            )

        if name in ("gpt2-small", "qwen3-0.6b", "gpt2-tiny", "qwen3-tiny"):
            record.guarded(f"{name} generate", generate)

        if name == eight_b(args):

            def head_sweep(model=model, name=name):
                prompt = torch.randint(0, model.cfg.d_vocab, (1, 15), generator=torch.Generator().manual_seed(1)).to(
                    device
                )
                metric = metrics.logit_diff(model, [1], [2])
                variants = {a: ablate.hooks(model, a, "zero") for a in ablate.components(model, "heads")}
                with torch.inference_mode():
                    hooked.sweep(model, prompt, dict(list(variants.items())[:2]), metric, progress=False)  # warm-up
                    _sync(device)
                    start = time.perf_counter()
                    result = hooked.sweep(model, prompt, variants, metric, progress=False)
                    _sync(device)
                    sweep_s = time.perf_counter() - start
                    # The loop is timed on its first variants and extrapolated: 1,152 8B forwards would eat the step.
                    n_loop = min(len(variants), 64 if device == "cuda" else 4)
                    start = time.perf_counter()
                    for fwd_hooks in list(variants.values())[:n_loop]:
                        metric(model.run_with_hooks(prompt, fwd_hooks=fwd_hooks))
                    _sync(device)
                    loop_s = (time.perf_counter() - start) * len(variants) / n_loop
                record(
                    f"{name} head sweep",
                    "ok",
                    n_variants=len(variants),
                    rows=len(result.table()),
                    sweep_s=sweep_s,
                    loop_s_extrapolated=loop_s,
                    loop_variants_timed=n_loop,
                    speedup=loop_s / sweep_s,
                    target_s=2.0,
                    met=sweep_s < 2.0,
                )

            record.guarded(f"{name} head sweep", head_sweep)
        del model, holder
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _transformers_generate(arch: str, sizes: dict, device: str, dtype, prompt, new_tokens: int) -> float:
    """tokens/s of transformers' greedy generate on a random model of the same shape (its own weights)."""
    import torch
    import transformers

    if arch == "gpt2":
        config = transformers.GPT2Config(
            n_layer=sizes["n_layers"],
            n_embd=sizes["d_model"],
            n_head=sizes["n_heads"],
            n_inner=sizes["d_mlp"],
            vocab_size=sizes["d_vocab"],
            n_positions=sizes["n_ctx"],
        )
        model_class = transformers.GPT2LMHeadModel
    else:
        config = transformers.Qwen3Config(
            num_hidden_layers=sizes["n_layers"],
            hidden_size=sizes["d_model"],
            num_attention_heads=sizes["n_heads"],
            num_key_value_heads=sizes["n_kv_heads"],
            head_dim=sizes["d_head"],
            intermediate_size=sizes["d_mlp"],
            vocab_size=sizes["d_vocab"],
            tie_word_embeddings=sizes.get("tie_word_embeddings", False),
        )
        model_class = transformers.Qwen3ForCausalLM
    with torch.device(device):
        model = model_class(config).to(dtype).eval()
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        model.generate(prompt[:, :4], max_new_tokens=2, do_sample=False, pad_token_id=0)  # warm-up
        _sync(device)
        start = time.perf_counter()
        model.generate(prompt, **kwargs)
        _sync(device)
    seconds = time.perf_counter() - start
    del model
    return prompt.shape[0] * new_tokens / seconds


# ============================================================================= step 4: torch.compile
def step_compile(args, record: Recorder) -> None:
    import torch

    device = device_of(args)
    time_ms = timer(device)
    # aot_eager on the CPU: dynamo and AOT autograd traced as on the GPU, without a C++ build per graph.
    backend = "inductor" if device == "cuda" else "aot_eager"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    name = "gpt2-small" if device == "cuda" else "gpt2-tiny"  # 12 layers: inductor compiles it within the limit
    batch, pos = (4, 512) if device == "cuda" else (2, 16)
    holder = {}

    def run():
        arch, sizes = models_for(args)[name]
        model = holder["model"] = random_model(arch, device, dtype, **sizes)
        tokens = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(0)).to(
            device
        )

        def zero_head_0(z, hook):  # an in-place edit, the common case a compiled forward must honour
            z[:, :, 0] = 0.0
            return z

        for hook in z_hook_names(model):
            model.add_hook(hook, zero_head_0)
        try:
            compiled = torch.compile(model, backend=backend)
            with torch.no_grad():
                eager = model(tokens)
                start = time.perf_counter()
                out = compiled(tokens)
                _sync(device)
                compile_s = time.perf_counter() - start
                diff = (out.float() - eager.float()).abs().max().item()
                relative = diff / max(eager.float().abs().max().item(), 1.0)
                eager_ms = time_ms(lambda: model(tokens))
                compiled_ms = time_ms(lambda: compiled(tokens))
        finally:
            model.reset_hooks(including_permanent=True)
        ok = relative <= (3e-2 if dtype == torch.bfloat16 else 1e-4)
        record(
            f"{name} compile ({backend}) with hooks on every z",
            "ok" if ok else "error",
            compile_s=compile_s,
            max_abs_diff=diff,
            relative=relative,
            eager_ms=eager_ms,
            compiled_ms=compiled_ms,
            speedup=eager_ms / compiled_ms,
        )

    record.guarded(f"{name} compile", run)


# ============================================================================= step 5: EAP
def step_eap(args, record: Recorder) -> None:
    import torch

    try:
        from hooked import circuits, metrics
    except ImportError as error:
        record("eap", "skipped", reason=f"no circuits module ({error})")
        return
    device = device_of(args)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    name = eight_b(args)

    def run():
        arch, sizes = models_for(args)[name]
        model = random_model(arch, device, dtype, **sizes)
        generator = torch.Generator().manual_seed(2)
        clean = torch.randint(0, model.cfg.d_vocab, (2, 15), generator=generator).to(device)
        corrupt = torch.randint(0, model.cfg.d_vocab, (2, 15), generator=generator).to(device)
        metric = metrics.logit_diff(model, [1, 1], [2, 2])
        circuits.attribute(model, clean[:, :4], corrupt[:, :4], metric, method="eap")  # warm-up / autotune
        _sync(device)
        start = time.perf_counter()
        scores = circuits.attribute(model, clean, corrupt, metric, method="eap")
        _sync(device)
        seconds = time.perf_counter() - start
        n_edges = len(scores) if hasattr(scores, "__len__") else None
        figures = dict(seconds=seconds, n_edges=n_edges)
        if device == "cuda":
            figures["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        record(f"{name} EAP every edge, 2x15 tokens", "ok", **figures)

    record.guarded(f"{name} EAP", run)


# ============================================================================= step 7: dictionaries and graphs
# (a) a spliced SAE at real width; (b) transcoder attribution graphs at GPT-2-small and Gemma-2-2B shapes; (c) a graph
# of 4,096 tokens at Gemma-2-2B's shape (docs/graphs.md, "Memory", estimates it on paper). Random weights, models
# built from their configs, no hub. Transcoders are TopK (`k` active features per position and layer: a fixed L0, as
# Gemma Scope's are near 70), reading blocks.l.mlp.hook_in and writing blocks.l.hook_mlp_out.
GEMMA2_2B = dict(
    n_layers=26,
    d_model=2304,
    n_heads=8,
    n_kv_heads=4,
    d_head=256,
    d_mlp=9216,
    d_vocab=256000,
    query_pre_attn_scalar=256,
)
DICTIONARY_SHAPES = {  # name: (architecture, model sizes, d_sae, L0)
    "gpt2-small": ("gpt2", REAL_MODELS["gpt2-small"][1], 24576, 64),
    "gemma-2-2b": ("gemma2", GEMMA2_2B, 16384, 64),
}
DICTIONARY_SHAPES_TINY = {
    "gpt2-tiny": ("gpt2", TINY_MODELS["gpt2-tiny"][1], 96, 4),
    "gemma2-tiny": (
        "gemma2",
        dict(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=48, d_vocab=64, query_pre_attn_scalar=8),
        64,
        4,
    ),
}
# (c): 4,096 tokens at Gemma-2-2B's shape, every one of its 26 layers; few feature rows (each backward pass runs
# batch_size copies of the whole prompt), each row's 1,000 largest edges kept (a sparse adjacency)
LONG = dict(pos=4096, max_feature_nodes=256, batch_size=8, edges_per_row=1000)
LONG_TINY = dict(pos=48, max_feature_nodes=16, batch_size=4, edges_per_row=20)


def random_dictionary(d_in: int, d_sae: int, hook_name: str, device: str, dtype, seed: int, **config):
    """A hooked.sae Dictionary with N(0, 1/d_in) encoder and N(0, 1/d_sae) decoder weights, built on `device`."""
    import torch

    from hooked.sae import Dictionary, DictionaryConfig

    dtype_name = str(dtype).removeprefix("torch.")
    cfg = DictionaryConfig(d_in=d_in, d_sae=d_sae, hook_name=hook_name, dtype=dtype_name, device=device, **config)
    dictionary = Dictionary(cfg)
    generator = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        dictionary.W_enc.normal_(0.0, d_in**-0.5, generator=generator)
        dictionary.W_dec.normal_(0.0, d_sae**-0.5, generator=generator)
        dictionary.b_enc.fill_(0.01)
        if getattr(dictionary, "threshold", None) is not None:
            dictionary.threshold.zero_()  # every positive pre-activation fires: a dense encode costs the same anyway
    return dictionary.requires_grad_(False)


def transcoder_set(model, d_sae: int, k: int, device: str, dtype) -> list:
    d = model.cfg.d_model
    return [
        random_dictionary(
            d,
            d_sae,
            f"blocks.{layer}.mlp.hook_in",
            device,
            dtype,
            seed=layer,
            hook_name_out=f"blocks.{layer}.hook_mlp_out",
            architecture="topk",
            k=k,
        )
        for layer in range(model.cfg.n_layers)
    ]


def measured(device: str, fn):
    """(fn's result, seconds, peak GiB allocated above what was allocated before; None on the CPU)."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    result = fn()
    _sync(device)
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated() - before) / 2**30 if device == "cuda" else None
    return result, seconds, peak


def step_dictionaries(args, record: Recorder) -> None:
    import torch

    from hooked import graphs

    device = device_of(args)
    time_ms = timer(device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shapes = DICTIONARY_SHAPES_TINY if args.dry_run else DICTIONARY_SHAPES
    generator = torch.Generator().manual_seed(0)

    # (a) SAEs of d_sae features on every layer's residual stream (jumprelu, as Gemma Scope's), spliced
    name, (arch, sizes, d_sae, _) = next(iter(shapes.items()))
    batch, pos = (8, 1024) if device == "cuda" else (2, 16)

    def spliced():
        model = random_model(arch, device, dtype, **sizes)
        tokens = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=generator).to(device)
        saes = [
            random_dictionary(
                model.cfg.d_model,
                d_sae,
                f"blocks.{layer}.hook_resid_post",
                device,
                dtype,
                seed=layer,
                architecture="jumprelu",
            )
            for layer in range(model.cfg.n_layers)
        ]
        middle = [saes[model.cfg.n_layers // 2]]
        runs = {
            "plain": lambda: model(tokens),
            "one SAE": lambda: model.run_with_saes(tokens, saes=middle),
            f"{len(saes)} SAEs": lambda: model.run_with_saes(tokens, saes=saes),
            f"{len(saes)} SAEs, error term": lambda: model.run_with_saes(tokens, saes=saes, use_error_term=True),
        }
        figures = {}
        with torch.inference_mode():
            for what, run in runs.items():
                _, _, peak = measured(device, run)
                figures[what] = (time_ms(run), peak)
            # with the error term the spliced model computes what the model computes alone (bf16: its rounding)
            plain, with_error = runs["plain"](), runs[f"{len(saes)} SAEs, error term"]()
            diff = (with_error.float() - plain.float()).abs().max().item() / plain.float().abs().max().item()
        tolerance = 3e-2 if dtype == torch.bfloat16 else 1e-4
        record(
            f"{name} {len(saes)} SAEs with the error term equal the plain forward",
            "ok" if diff <= tolerance else "error",
            relative=diff,
            tolerance=tolerance,
        )
        plain_ms, plain_peak = figures["plain"]
        for what, (ms, peak) in figures.items():
            extra = {} if peak is None else dict(peak_gib=peak, extra_gib=peak - plain_peak)
            record(f"{name} forward {batch}x{pos}, {what}, d_sae {d_sae}", "ok", ms=ms, vs_plain=ms / plain_ms, **extra)
        if device != "cuda":
            record("spliced SAE peak memory", "skipped", reason="no CUDA")

    record.guarded(f"{name} spliced SAEs", spliced)

    # (b) a transcoder attribution graph at each shape; (c) one of 4,096 tokens at the last shape (LONG)
    prompt_pos = 128 if device == "cuda" else 12
    long = LONG_TINY if args.dry_run else LONG
    for name, (arch, sizes, d_sae, k) in shapes.items():
        cases = [(prompt_pos, dict(max_feature_nodes=2048 if device == "cuda" else 32))]
        if name == list(shapes)[-1]:
            cases.append((long["pos"], {key: v for key, v in long.items() if key != "pos"}))
        holder = {}

        def build(arch=arch, sizes=sizes, d_sae=d_sae, k=k, holder=holder):
            holder["model"] = random_model(arch, device, dtype, **sizes)
            holder["transcoders"] = transcoder_set(holder["model"], d_sae, k, device, dtype)

        record.guarded(f"{name} with transcoders, build", build)
        for pos, settings in cases if holder else []:

            def graph(name=name, d_sae=d_sae, k=k, pos=pos, settings=settings, holder=holder):
                model, transcoders = holder["model"], holder["transcoders"]
                tokens = torch.randint(1, model.cfg.d_vocab, (pos,), generator=generator)
                g, seconds, peak = measured(device, lambda: graphs.attribute(model, tokens, transcoders, **settings))
                figures = dict(
                    seconds=seconds,
                    n_layers=model.cfg.n_layers,
                    d_sae=d_sae,
                    l0=k,
                    n_active=int(g.active_features.shape[0]),
                    n_nodes=g.n_nodes,
                    **settings,
                )
                if peak is not None:
                    figures["peak_gib"] = peak
                record(f"{name} transcoder graph, {pos} tokens", "ok", **figures)

            record.guarded(f"{name} transcoder graph, {pos} tokens", graph)
        holder.clear()


# ============================================================================= step 6: hooked on vLLM
# The recipe (issue 38) on a Qwen3-8B-shaped random checkpoint: every MLP zeroed, every head of one layer zeroed,
# greedy new tokens, one request per (variant, prompt). vLLM lives in an environment of its own (docs/vllm.md):
# GPU_CHECK_VLLM_PYTHON names its interpreter for this step; without vllm the step says so and ends.
VLLM_8B = dict(
    num_hidden_layers=36,
    hidden_size=4096,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=12288,
    vocab_size=151936,
    max_position_embeddings=4096,
    rope_theta=1e6,
)
# vLLM's CPU attention takes head sizes of 32 and up; the dry run (`--with-vllm`) only checks that the step runs.
VLLM_8B_TINY = {
    **VLLM_8B,
    "num_hidden_layers": 3,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 192,
    "vocab_size": 512,
}
VLLM_HEAD_LAYER = 0  # whose heads the recipe zeroes one at a time


def step_vllm(args, record: Recorder) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        record(
            "vllm",
            "skipped",
            reason=f"vllm not installed for {sys.executable} (set GPU_CHECK_VLLM_PYTHON to the Python of an"
            " environment with vllm and hooked installed, docs/vllm.md)",
        )
        return
    if args.dry_run and not args.with_vllm:
        record("vllm", "skipped", reason="dry run: vLLM engines take about a minute each on a CPU (--with-vllm)")
        return
    import torch

    from hooked.engines.vllm.engine import VllmEngine

    device = device_of(args)
    shape = VLLM_8B_TINY if args.dry_run else VLLM_8B
    # VllmEngine starts vLLM in float32 unless it takes a dtype (then every side runs bfloat16 on CUDA)
    takes_dtype = "dtype" in inspect.signature(VllmEngine.__init__).parameters
    dtype = "bfloat16" if device == "cuda" and takes_dtype else "float32"
    n_prompts, new_tokens = (8, 8) if device == "cuda" else (2, 4)
    generator = torch.Generator().manual_seed(3)
    lengths = torch.randint(16, 129 if device == "cuda" else 33, (n_prompts,), generator=generator).tolist()
    prompts = [torch.randint(0, shape["vocab_size"], (n,), generator=generator).tolist() for n in lengths]
    engine_args = dict(max_model_len=256, enable_prefix_caching=False)
    if device == "cuda":
        engine_args["gpu_memory_utilization"] = 0.6  # one engine at a time; the last one's memory may linger
    else:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: vLLM's CPU backend takes its KV cache from here

    holder = {}

    def checkpoint():
        holder["path"] = _vllm_checkpoint(args, shape, device)
        record("vllm checkpoint", "ok", path=str(holder["path"]), dtype=dtype, engine_takes_dtype=takes_dtype)

    record.guarded("vllm checkpoint", checkpoint)
    if "path" not in holder:
        return
    path = holder["path"]
    from hooked.ablate import zero

    hooks = (
        [[]]
        + [[(f"blocks.{layer}.hook_mlp_out", zero())] for layer in range(shape["num_hidden_layers"])]
        + [[(f"blocks.{VLLM_HEAD_LAYER}.attn.hook_z", zero(heads=h))] for h in range(shape["num_attention_heads"])]
    )
    every = [prompt for _ in hooks for prompt in prompts]  # one request per (variant, prompt)
    generated = len(every) * new_tokens
    rates: dict[str, float] = {}

    def rate(name: str, fn) -> None:
        """fn(request indices) runs those requests; tokens/s of all of them, after a warm-up on two variants' (an
        MLP's and a head's: the hooks' first calls too)."""
        fn([i for i in range(len(every)) if i // n_prompts in (1, len(hooks) - 1)])
        _sync(device)
        start = time.perf_counter()
        fn(range(len(every)))
        _sync(device)
        rates[name] = generated / (time.perf_counter() - start)

    def hooked_own():  # first: hooked's own engine holds the whole model and its KV cache in this process
        import hooked

        loaded = {"model": hooked.load(str(path), dtype=getattr(torch, dtype), device=device)}
        longest = max(lengths)
        tokens = torch.zeros(n_prompts, longest, dtype=torch.long)
        mask = torch.zeros_like(tokens)
        for row, prompt in enumerate(prompts):  # padded on the left
            tokens[row, longest - len(prompt) :], mask[row, longest - len(prompt) :] = torch.tensor(prompt), 1
        tokens, mask = tokens.to(device), mask.to(device)
        variants = list(enumerate(hooks))
        chunk = 16  # variants per generate_variants call (x 8 prompts = 128 rows: an 8B KV cache that fits)

        def sweep(indices):
            chosen = [variants[v] for v in sorted({i // n_prompts for i in indices})]
            with torch.inference_mode():
                for first in range(0, len(chosen), chunk):
                    part = {str(i): pairs for i, pairs in chosen[first : first + chunk]}
                    hooked.generate_variants(
                        loaded["model"], tokens, part, new_tokens, attention_mask=mask, stop_at_eos=False
                    )

        try:
            rate("hooked", sweep)
        finally:
            loaded.clear()
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
        record(
            "hooked's own engine, the recipe (generate_variants)",
            "ok",
            requests=len(every),
            variants_per_call=chunk,
            tokens_per_s=rates["hooked"],
        )

    def native():
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        llm = LLM(model=str(path), dtype=dtype, enforce_eager=True, skip_tokenizer_init=True, **engine_args)
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True, detokenize=False)
        try:
            rate(
                "native",
                lambda indices: llm.generate([TokensPrompt(prompt_token_ids=every[i]) for i in indices], params),
            )
        finally:
            llm.llm_engine.engine_core.shutdown()
        record("vllm native, no hooks", "ok", requests=len(every), tokens_per_s=rates["native"])

    def hooked_vllm():
        extra = dict(engine_args, dtype=dtype) if takes_dtype else engine_args
        engine = VllmEngine(path, **extra)
        try:
            ids = [engine.add_variant(pairs) if pairs else None for pairs in hooks]
            chosen = [variant for variant in ids for _ in prompts]
            rate(
                "hooked-vllm",
                lambda indices: engine.generate(
                    [every[i] for i in indices], [chosen[i] for i in indices], new_tokens, logits=False
                ),
            )
        finally:
            engine.close()
        record("vllm hooked, the recipe", "ok", requests=len(every), tokens_per_s=rates["hooked-vllm"])

    def nnsight_vllm():
        try:
            from nnsight.modeling.vllm import VLLM
        except ImportError as error:
            record("vllm nnsight", "skipped", reason=f"nnsight's VLLM not importable ({error})")
            return
        model = VLLM(str(path), dispatch=True, dtype=dtype, enforce_eager=True, **engine_args)

        def one_by_one(indices):  # one trace per variant, each variant's prompts as invokes, its edit on every step
            for pairs in [hooks[v] for v in sorted({i // n_prompts for i in indices})]:
                with model.trace(temperature=0.0, max_tokens=new_tokens) as tracer:
                    for prompt in prompts:
                        with tracer.invoke(prompt), tracer.all():
                            _nnsight_edit(model, pairs)

        rate("nnsight", one_by_one)
        record("vllm nnsight VLLM, the recipe", "ok", requests=len(every), tokens_per_s=rates["nnsight"])

    for what, fn in (
        ("hooked's own engine", hooked_own),
        ("vllm native", native),
        ("vllm hooked", hooked_vllm),
        ("vllm nnsight", nnsight_vllm),
    ):
        record.guarded(what, fn)
    if "hooked-vllm" in rates:  # the ratios, from the sides that ran
        mine = rates["hooked-vllm"]
        figures = {
            f"hooked_vllm_vs_{side}": mine / rates[side] for side in ("native", "hooked", "nnsight") if side in rates
        }
        if "native" in rates:
            figures.update(native_over_hooked_vllm=rates["native"] / mine, target=1.15)
            figures["met"] = figures["native_over_hooked_vllm"] <= 1.15
        record("vllm summary (tokens/s ratios)", "ok", **figures)


def _nnsight_edit(model, pairs) -> None:
    """The recipe's edit in nnsight's terms (vLLM's own Qwen3 module names): an MLP's output or one head of o_proj's
    input set to zero. Not yet run against nnsight (not installed where this was written)."""
    for name, ablation in pairs:
        layer = int(name.split(".")[1])
        module = model.model.layers[layer]
        if name.endswith("hook_mlp_out"):
            module.mlp.output[:] = 0
        else:
            (head,) = ablation.heads if isinstance(ablation.heads, (list, tuple)) else (ablation.heads,)
            d_head = model.config.head_dim
            module.self_attn.o_proj.input[:, head * d_head : (head + 1) * d_head] = 0


def _vllm_checkpoint(args, shape: dict, device: str) -> Path:
    """A random Qwen3 checkpoint of `shape` in bfloat16 (N(0, 0.02) weights, norms 1 + noise), written once under
    --out with transformers' save_pretrained (vLLM's native model reads it by the checkpoint's own names)."""
    import torch
    import transformers

    directory = args.out / ("qwen3-vllm-tiny" if args.dry_run else "qwen3-8b-vllm")
    if (directory / "config.json").exists():
        return directory
    config = transformers.Qwen3Config(**shape, tie_word_embeddings=False)
    with torch.device(device):
        model = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16).eval()
    generator = torch.Generator(device).manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            norm = parameter.ndim == 1
            parameter.normal_(1.0 if norm else 0.0, 0.1 if norm else 0.02, generator=generator)
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    partial.rename(directory)
    return directory


STEPS = {
    1: step_correctness,
    2: step_kernel_bench,
    3: step_end_to_end,
    4: step_compile,
    5: step_eap,
    6: step_vllm,
    7: step_dictionaries,
}


# ============================================================================= environment and CUDA build
def nvidia_smi() -> dict:
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        line = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            .stdout.strip()
            .splitlines()[0]
        )
        name, driver, memory = (part.strip() for part in line.split(","))
        return dict(gpu=name, driver=driver, gpu_memory=memory)
    except (OSError, subprocess.SubprocessError, IndexError, ValueError) as error:
        return dict(nvidia_smi_error=str(error))


def environment() -> dict:
    import torch
    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    env = dict(
        python=platform.python_version(),
        platform=platform.platform(),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        cuda_available=torch.cuda.is_available(),
        triton=triton_version,
        transformers=transformers.__version__,
        cpu_count=os.cpu_count(),
        **nvidia_smi(),
    )
    if torch.cuda.is_available():
        env["torch_device"] = torch.cuda.get_device_name()
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    return env


def pinned_torch() -> str:
    text = (REPO_ROOT / "constraints.txt").read_text()
    match = re.search(r"^torch==([\w.]+)", text, re.MULTILINE)
    return match.group(1) if match else "2.13.0"


def ensure_cuda_build(log) -> None:
    """Step 0: swap torch's CPU build for the CUDA build of the same pinned version, then re-exec.

    Runs only with nvidia-smi present and `torch.version.cuda is None`, and once (GPU_CHECK_REEXEC).
    A failed install is logged and the run goes on with the CPU build (every CUDA step then says so).
    """
    if os.environ.get("GPU_CHECK_REEXEC") or shutil.which("nvidia-smi") is None:
        return
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.version.cuda)"], capture_output=True, text=True
    )
    if probe.stdout.strip() != "None":
        return
    version = pinned_torch()
    # With its dependencies (the nvidia-* libraries come from the same index); constraints.txt keeps
    # triton and the rest at their pins.
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "-c",
        str(REPO_ROOT / "constraints.txt"),
        f"torch=={version}+{CUDA_TAG}",
        "--index-url",
        CUDA_INDEX,
    ]
    if os.environ.get("GPU_CHECK_WHEELS"):  # a folder of wheels carried to a machine without network
        command += ["--find-links", os.environ["GPU_CHECK_WHEELS"]]
    log(f"[0 cuda-build] torch is the CPU build and nvidia-smi is present: {' '.join(command)}")
    start = time.time()
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_LIMIT)
        tail = (result.stdout + result.stderr).strip().splitlines()[-3:]
        if result.returncode != 0:
            log(
                f"[0 cuda-build] install: error rc={result.returncode} after {time.time() - start:.0f} s: "
                f"{' | '.join(tail)}"
            )
            return
    except subprocess.TimeoutExpired:
        log(f"[0 cuda-build] install: stopped after the {INSTALL_LIMIT} s limit; going on with the CPU build")
        return
    log(f"[0 cuda-build] install: ok in {time.time() - start:.0f} s; re-executing")
    os.environ["GPU_CHECK_REEXEC"] = "1"
    os.execv(sys.executable, [sys.executable, *sys.argv])


# ============================================================================= driver
def run_step(step: int, args, log) -> dict:
    """One step in a child process under its hard limit; its output is echoed and logged line by line."""
    limit = (DRY_RUN_LIMITS if args.dry_run else STEP_LIMITS)[step]
    deadline = time.time() + 0.85 * limit
    # vLLM pins its own transformers, so it lives in an environment of its own (docs/vllm.md): step 6 runs there
    python = os.environ.get("GPU_CHECK_VLLM_PYTHON", sys.executable) if step == 6 else sys.executable
    command = [python, __file__, "--child", str(step), "--deadline", str(deadline), "--out", str(args.out)]
    if args.dry_run:
        command.append("--dry-run")
    if args.with_vllm:
        command.append("--with-vllm")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    if args.dry_run:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    start = time.time()
    child = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []

    def echo_and_log():
        for line in child.stdout:
            lines.append(line.rstrip("\n"))
            log(lines[-1], echo=re.match(r"\[\d", line) is not None)  # result lines; the rest only to the log

    reader = threading.Thread(target=echo_and_log)
    reader.start()
    try:
        rc = child.wait(timeout=limit)
        reader.join(timeout=10)
        last = next((line for line in reversed(lines) if line.strip()), "")  # a crash's exception line
        status = "ok" if rc == 0 else f"error (exit code {rc}: {last[:200]}; see gpu-check.log)"
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, 9)  # the child and anything it started (pytest, compile workers)
        child.wait()
        rc, status = None, f"stopped: time limit {limit} s"
    reader.join(timeout=10)
    seconds = time.time() - start
    log(f"[{step} {STEP_NAMES[step]}] step: {status}  seconds={seconds:.1f} limit={limit}")
    return dict(step=step, name=STEP_NAMES[step], status=status, exit_code=rc, seconds=seconds, limit_s=limit)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, Triton interpreter")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "gpu-check")
    parser.add_argument("--steps", type=int, nargs="*", default=list(STEPS))
    parser.add_argument("--with-vllm", action="store_true", help="--dry-run: run step 6's vLLM engines too (minutes)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out = args.out.resolve()
    sys.path.insert(0, str(REPO_ROOT))

    if args.child is not None:  # inside one step's process
        record = Recorder(args.out, args.child, args.deadline)
        STEPS[args.child](args, record)
        return 1 if record.errors else 0

    args.out.mkdir(parents=True, exist_ok=True)
    log_file = open(args.out / "gpu-check.log", "a")

    def log(line: str, echo: bool = True) -> None:
        if echo:
            print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    if not os.environ.get("GPU_CHECK_REEXEC"):
        (args.out / "results.jsonl").unlink(missing_ok=True)
    if not args.dry_run:
        ensure_cuda_build(log)
    start = time.time()
    env = environment()
    log(f"[env] {json.dumps(env)}")
    if not args.dry_run and not env["cuda_available"]:
        # Real shapes on the CPU would only burn every step's limit (an 8B model in float32 is 32 GB).
        log("[env] no CUDA device: nothing run; `--dry-run` (GPU_CHECK_ARGS=--dry-run) checks the script on the CPU")
        steps = [
            dict(step=step, name=STEP_NAMES[step], status="skipped: no CUDA", exit_code=None) for step in args.steps
        ]
    else:
        steps = [run_step(step, args, log) for step in args.steps]
    results_path = args.out / "results.jsonl"
    results = [json.loads(line) for line in results_path.read_text().splitlines()] if results_path.exists() else []
    report = dict(
        date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        dry_run=args.dry_run,
        h200_bf16_dense_tflops=H200_BF16_DENSE_TFLOPS,
        environment=env,
        steps=steps,
        results=results,
        seconds=time.time() - start,
    )
    (args.out / "gpu-check.json").write_text(json.dumps(report, indent=1, default=str))
    failed = [s["step"] for s in steps if s["exit_code"] not in (0, None)]
    log(
        f"[done] {len(steps)} steps in {time.time() - start:.0f} s; failed: {failed or 'none'}; wrote "
        f"{args.out}/gpu-check.json"
    )
    if not args.dry_run and not env["cuda_available"]:
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
