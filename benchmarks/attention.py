"""GPU benchmark: hooked's Triton attention vs torch SDPA, bf16: the kernel, then whole-model forwards.

Kernel: hooked.kernels.flash_attention vs torch SDPA (flash backend), causal. Model forwards:
`hooked.attention_backend("triton")` vs `hooked.attention_backend("sdpa")`.

Kernel section. FLOP counts (causal attention does half of the dense work):
    forward           = 2 matmuls (QK^T, PV) * 2 FLOP/MAC * b * h * s * s * d / 2  = 2 * b * h * s^2 * d
    backward          = 2.5 * forward   (5 matmuls: recompute QK^T, dV, dP, dQ, dK)
    forward+backward  = 3.5 * forward
TFLOP/s = FLOPs / time. Decode (q_pos = 1, k_pos = s) is memory bound, so only its time and the
time ratio to SDPA are reported. SDPA needs q_pos == k_pos for its causal mask, so for decode SDPA
runs non-causal (a single query at the end sees every key anyway). Targets: forward >= 0.9x SDPA's
TFLOP/s; decode time <= 1.2x SDPA's.

End-to-end section. Random checkpoints built with transformers' config classes and saved in
bfloat16 under $HOOKED_BENCH_DIR (default /tmp/hooked-bench; written once, reused):
    gpt2-small  GPT2LMHeadModel, 12 layers, d_model 768, 12 heads, vocab 50257, n_positions 4096
                (GPT-2 small has 1024 positions; 4096 so the 1 x 4096 forward fits; only wpe grows)
    qwen3-0.6b  Qwen3ForCausalLM with Qwen3-0.6B's shape: 28 layers, d_model 1024, 16 query / 8 kv
                heads of head_dim 128, d_mlp 3072, vocab 151936, tied embeddings
loaded with `hooked.load(dir, dtype=torch.bfloat16, device="cuda")`; forward (no hooks) of random
tokens, batch 8 x 1024 and 1 x 4096, under torch.inference_mode, timed with
triton.testing.do_bench (mean ms; 3 rounds, the two backends interleaved, median of the rounds)
inside `hooked.attention_backend("triton")` vs `hooked.attention_backend("sdpa")`. Reported: the
time of each, the ratio SDPA time / Triton time (>1: Triton faster) and the max abs difference
of the logits between the two backends (bfloat16 logits, compared in float32).

The script ends with one summary table in markdown, to paste into docs/benchmarks.md.

Usage: python benchmarks/attention.py [--heads 16] [--batch-tokens 16384] [--sections kernels e2e]
       python benchmarks/attention.py --dry-run   # CPU: the end-to-end code on tiny models, SDPA only
Without a CUDA device (and without --dry-run) it prints a message and exits 0. --dry-run builds
tiny checkpoints in a temporary directory and runs the end-to-end code on the CPU with the sdpa
backend (plus the Triton interpreter when TRITON_INTERPRET=1 is set); its times mean nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

BENCH_FOLDER = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_FOLDER)

# (config class, model class, config kwargs) of transformers, per end-to-end model.
E2E_MODELS = {
    "gpt2-small": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=4096),
    ),
    "qwen3-0.6b": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(
            num_hidden_layers=28,
            hidden_size=1024,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=3072,
            vocab_size=151936,
            tie_word_embeddings=True,
            max_position_embeddings=40960,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        ),
    ),
}
E2E_SHAPES = [(8, 1024), (1, 4096)]
# --dry-run: the same architectures, tiny.
DRY_RUN_MODELS = {
    "gpt2-tiny": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=128, bos_token_id=0, eos_token_id=0),
    ),
    "qwen3-tiny": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=128,
            vocab_size=512,
            tie_word_embeddings=True,
            max_position_embeddings=128,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        ),
    ),
}
DRY_RUN_SHAPES = [(2, 32), (1, 64)]
FWD_TARGET, DECODE_TARGET = 0.9, 1.2  # forward >= 0.9x SDPA TFLOP/s; decode time <= 1.2x SDPA's


def causal_fwd_flops(batch: int, heads: int, seq: int, d_head: int) -> float:
    return 2 * 2 * batch * heads * seq * seq * d_head / 2


def _import_common():
    """benchmarks/common.py (this folder on sys.path; it puts the checkout's hooked there too)."""
    if BENCH_FOLDER not in sys.path:
        sys.path.insert(0, BENCH_FOLDER)
    import common

    return common


# ----------------------------------------------------------------------------- kernel
def kernel_section(args) -> list[dict]:
    """flash_attention vs SDPA per (d_head, seq): prints a row each, returns them for the summary."""
    import torch
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    if REPO_ROOT not in sys.path:
        sys.path.insert(0, REPO_ROOT)
    from hooked.kernels import flash_attention

    dtype, dev, H = torch.bfloat16, "cuda", args.heads
    print(f"device: {torch.cuda.get_device_name()}  dtype: bf16  heads: {H}  causal")
    header = (
        f"{'d':>4} {'seq':>6} {'batch':>5} | {'fwd TF/s':>9} {'sdpa':>7} {'ratio':>6} | "
        f"{'f+b TF/s':>9} {'sdpa':>7} {'ratio':>6} | {'decode us':>9} {'sdpa':>7} {'t ratio':>7} | {'max|diff|':>9}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for d in args.head_dims:
        for s in args.seqs:
            b = max(1, args.batch_tokens // s)
            q, k, v = (torch.randn(b, s, H, d, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
            # SDPA wants [b, h, s, d]
            qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
            dout = torch.randn(b, s, H * d, device=dev, dtype=dtype)
            dout_t = dout.view(b, s, H, d).transpose(1, 2).contiguous()

            # The tensors are bound as defaults: the loop deletes its names before the next shape.
            def ours_fwd(q=q, k=k, v=v):
                return flash_attention(q, k, v)

            def ours_fb(q=q, k=k, v=v, dout=dout):
                flash_attention(q, k, v).backward(dout)

            def ref_fwd(qt=qt, kt=kt, vt=vt):
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return sdpa(qt, kt, vt, is_causal=True)

            def ref_fb(qt=qt, kt=kt, vt=vt, dout_t=dout_t):
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    sdpa(qt, kt, vt, is_causal=True).backward(dout_t)

            with torch.no_grad():  # compile / autotune outside the timing; sanity-check the values
                diff = (ours_fwd().view(b, s, H, d).transpose(1, 2) - ref_fwd()).abs().max().item()
            ours_fb(), ref_fb()
            with torch.no_grad():
                t_f = triton.testing.do_bench(ours_fwd)
                t_f_ref = triton.testing.do_bench(ref_fwd)
            t_fb = triton.testing.do_bench(ours_fb, grad_to_none=[q, k, v])
            t_fb_ref = triton.testing.do_bench(ref_fb, grad_to_none=[qt, kt, vt])

            # decode: one query against s cached keys
            qd = q.detach()[:, -1:]
            qdt = qd.transpose(1, 2).contiguous()
            kd, vd, kdt, vdt = k.detach(), v.detach(), kt.detach(), vt.detach()

            def ours_dec():
                return flash_attention(qd, kd, vd)

            def ref_dec():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return sdpa(qdt, kdt, vdt, is_causal=False)

            with torch.no_grad():
                ours_dec(), ref_dec()
                t_d = triton.testing.do_bench(ours_dec)
                t_d_ref = triton.testing.do_bench(ref_dec)

            fwd = causal_fwd_flops(b, H, s, d)
            fb = 3.5 * fwd  # forward + backward (backward = 2.5 x forward)
            tf = lambda flops, ms: flops / (ms * 1e-3) / 1e12  # noqa: E731
            print(
                f"{d:>4} {s:>6} {b:>5} | {tf(fwd, t_f):>9.1f} {tf(fwd, t_f_ref):>7.1f} {t_f_ref / t_f:>6.2f} | "
                f"{tf(fb, t_fb):>9.1f} {tf(fb, t_fb_ref):>7.1f} {t_fb_ref / t_fb:>6.2f} | "
                f"{t_d * 1e3:>9.1f} {t_d_ref * 1e3:>7.1f} {t_d / t_d_ref:>7.2f} | {diff:>9.2e}"
            )
            rows.append(
                dict(
                    d=d,
                    seq=s,
                    batch=b,
                    fwd_tflops=tf(fwd, t_f),
                    fwd_tflops_ref=tf(fwd, t_f_ref),
                    fb_tflops=tf(fb, t_fb),
                    fb_tflops_ref=tf(fb, t_fb_ref),
                    decode_us=t_d * 1e3,
                    decode_us_ref=t_d_ref * 1e3,
                    diff=diff,
                )
            )
            del q, k, v, qt, kt, vt, dout, dout_t
            torch.cuda.empty_cache()
    print(
        "ratio = SDPA time / our time (>1: we are faster); t ratio = our decode time / SDPA decode time;"
        " max|diff| = forward difference to SDPA"
    )
    return rows


# ----------------------------------------------------------------------------- end to end
def cuda_timer(fn) -> float:
    """Mean ms of `fn` by triton.testing.do_bench (it synchronises and flushes the L2 cache)."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200)


def cpu_timer(fn, repeats: int = 3) -> float:
    """Median ms of `fn` over a few calls (dry run only: the CPU figures mean nothing)."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def max_abs_diff(a, b) -> float:
    """max |a - b| in float32, one batch row at a time (a float32 copy of 8 x 1024 x 151936 logits is 5 GB)."""
    return max((a[i].float() - b[i].float()).abs().max().item() for i in range(a.shape[0]))


def end_to_end(
    models: dict, shapes, device: str, backends: tuple[str, ...], timer, checkpoint_dir, rounds: int = 3
) -> list[dict]:
    """Forward of each model at each [batch pos] under each attention backend: times, ratio, logit diff.

    A failure in one (model, shape) is recorded in its row (and printed) and the others still run.
    """
    import torch

    common = _import_common()
    import hooked

    common.quiet_transformers()
    rows = []
    for name, (config_name, model_name, kwargs) in models.items():
        directory = common.transformers_checkpoint(
            checkpoint_dir / f"e2e-{name}-bf16", config_name, model_name, kwargs, dtype=torch.bfloat16
        )
        model = hooked.load(directory, dtype=torch.bfloat16, device=device)
        n_params = sum(p.numel() for p in {p.data_ptr(): p for p in model.parameters()}.values())
        print(f"\n{name}: {type(model).__name__}, {n_params / 1e6:.3g}M parameters, bfloat16 on {device} ({directory})")
        for batch, pos in shapes:
            row = dict(
                model=name, d_head=model.cfg.d_head, batch=batch, pos=pos, ms={}, diff=None, max_logit=None, error=None
            )
            rows.append(row)
            try:
                generator = torch.Generator().manual_seed(0)
                tokens = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=generator).to(device)

                def forward(backend, model=model, tokens=tokens):  # bound: the loop deletes `model` afterwards
                    with hooked.attention_backend(backend):
                        return model(tokens)

                with torch.inference_mode():
                    logits = {backend: forward(backend) for backend in backends}  # also compiles / autotunes
                    if len(backends) > 1:
                        row["diff"] = max_abs_diff(logits[backends[0]], logits[backends[1]])
                    row["max_logit"] = max(logits[backends[-1]][i].float().abs().max().item() for i in range(batch))
                    del logits
                    samples = {backend: [] for backend in backends}
                    for _ in range(rounds):  # interleaved: A B A B ...
                        for backend in backends:
                            samples[backend].append(timer(lambda backend=backend: forward(backend)))
                    row["ms"] = {backend: statistics.median(values) for backend, values in samples.items()}
            except Exception as error:  # noqa: BLE001 - report it in the table, run the other cases
                row["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:200]
            if device == "cuda":
                torch.cuda.empty_cache()
            times = "  ".join(f"{backend} {ms:.2f} ms" for backend, ms in row["ms"].items())
            ratio = (
                f"  SDPA / Triton time {row['ms']['sdpa'] / row['ms']['triton']:.3f}"
                if {"sdpa", "triton"} <= row["ms"].keys()
                else ""
            )
            diff = f"  max|logits triton - logits sdpa| {row['diff']:.3g}" if row["diff"] is not None else ""
            scale = f"  (max |logit| {row['max_logit']:.3g})" if row["max_logit"] is not None else ""
            print(f"  forward {batch} x {pos}: {row['error'] or times + ratio + diff + scale}")
        del model
    return rows


# ----------------------------------------------------------------------------- summary
def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---:" if i else "---" for i in range(len(headers))) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def summary(kernel_rows: list[dict], e2e_rows: list[dict], dtype: str = "bf16") -> str:
    """One markdown table: kernel forward / forward+backward / decode rows, then end-to-end forwards.

    "SDPA time / Triton time" > 1 means Triton is faster; the decode target (time <= 1.2x SDPA's)
    is a ratio >= 1 / 1.2 = 0.83 in this column.
    """
    headers = [
        "benchmark",
        "d_head",
        "batch x seq",
        "Triton",
        "SDPA",
        "SDPA time / Triton time",
        "target",
        "met",
        "max abs diff",
    ]
    rows = []
    for r in kernel_rows:
        shape = f"{r['batch']} x {r['seq']}"
        fwd_ratio = r["fwd_tflops"] / r["fwd_tflops_ref"]
        decode_ratio = r["decode_us_ref"] / r["decode_us"]
        rows.append(
            [
                f"kernel forward, {dtype}",
                str(r["d"]),
                shape,
                f"{r['fwd_tflops']:.1f} TFLOP/s",
                f"{r['fwd_tflops_ref']:.1f} TFLOP/s",
                f"{fwd_ratio:.2f}",
                f">= {FWD_TARGET}",
                "yes" if fwd_ratio >= FWD_TARGET else "**no**",
                f"{r['diff']:.2e}",
            ]
        )
        rows.append(
            [
                f"kernel forward+backward, {dtype}",
                str(r["d"]),
                shape,
                f"{r['fb_tflops']:.1f} TFLOP/s",
                f"{r['fb_tflops_ref']:.1f} TFLOP/s",
                f"{r['fb_tflops'] / r['fb_tflops_ref']:.2f}",
                "-",
                "-",
                "-",
            ]
        )
        rows.append(
            [
                f"kernel decode (1 query), {dtype}",
                str(r["d"]),
                f"{r['batch']} x 1 over {r['seq']} keys",
                f"{r['decode_us']:.1f} us",
                f"{r['decode_us_ref']:.1f} us",
                f"{decode_ratio:.2f}",
                f">= {1 / DECODE_TARGET:.2f} (time <= {DECODE_TARGET}x)",
                "yes" if r["decode_us"] <= DECODE_TARGET * r["decode_us_ref"] else "**no**",
                "-",
            ]
        )
    for r in e2e_rows:
        ms = r["ms"]
        triton = f"{ms['triton']:.2f} ms" if "triton" in ms else ("error" if r["error"] else "not run")
        sdpa = f"{ms['sdpa']:.2f} ms" if "sdpa" in ms else ("error" if r["error"] else "not run")
        ratio = f"{ms['sdpa'] / ms['triton']:.3f}" if {"sdpa", "triton"} <= ms.keys() else "-"
        diff = f"{r['diff']:.3g} logits (max abs logit {r['max_logit']:.3g})" if r["diff"] is not None else "-"
        rows.append(
            [
                f"model forward {r['model']}, {dtype}",
                str(r["d_head"]),
                f"{r['batch']} x {r['pos']}",
                triton,
                sdpa,
                ratio,
                "-",
                "-",
                r["error"] or diff,
            ]
        )
    return markdown_table(headers, rows)


# ----------------------------------------------------------------------------- main
def dry_run() -> int:
    """The end-to-end code path on the CPU with tiny models: SDPA, plus Triton under TRITON_INTERPRET=1."""
    import tempfile
    from pathlib import Path

    import torch

    _import_common()
    from hooked.layers import triton_available

    backends = ("triton", "sdpa") if triton_available(torch.device("cpu")) else ("sdpa",)
    print(f"dry run on the CPU, tiny models, backends {backends}: checks the code path; the times mean nothing")
    with tempfile.TemporaryDirectory(prefix="hooked-attention-dry-run-") as tmp:
        rows = end_to_end(DRY_RUN_MODELS, DRY_RUN_SHAPES, "cpu", backends, cpu_timer, Path(tmp))
    print("\nsummary (markdown)\n")
    print(summary([], rows))
    return 1 if any(r["error"] for r in rows) else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--batch-tokens", type=int, default=16384, help="batch = batch_tokens // seq")
    parser.add_argument("--seqs", type=int, nargs="*", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--head-dims", type=int, nargs="*", default=[64, 128])
    parser.add_argument("--sections", nargs="+", choices=("kernels", "e2e"), default=["kernels", "e2e"])
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="run the end-to-end code on the CPU with tiny models and the sdpa backend (no GPU needed)",
    )
    args = parser.parse_args(argv)

    if args.dry_run:
        return dry_run()

    import torch

    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        print("no CUDA device: GPU benchmark not run")
        return 0

    kernel_rows = kernel_section(args) if "kernels" in args.sections else []
    e2e_rows = []
    if "e2e" in args.sections:
        print(
            f"\nend to end: hooked forward, bf16, attention_backend('triton') vs ('sdpa'), "
            f"{torch.cuda.get_device_name()}"
        )
        e2e_rows = end_to_end(
            E2E_MODELS, E2E_SHAPES, "cuda", ("triton", "sdpa"), cuda_timer, _import_common().BENCH_DIR
        )
    print(f"\nsummary (markdown; {torch.cuda.get_device_name()}, torch {torch.__version__})\n")
    print(summary(kernel_rows, e2e_rows))
    return 1 if any(r["error"] for r in e2e_rows) else 0


if __name__ == "__main__":
    sys.exit(main())
