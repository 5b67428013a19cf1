"""GPU benchmark: hooked.kernels.flash_attention vs torch SDPA (flash backend), causal, bf16.

FLOP counts (causal attention does half of the dense work):
    forward           = 2 matmuls (QK^T, PV) * 2 FLOP/MAC * b * h * s * s * d / 2  = 2 * b * h * s^2 * d
    backward          = 2.5 * forward   (5 matmuls: recompute QK^T, dV, dP, dQ, dK)
    forward+backward  = 3.5 * forward
TFLOP/s = FLOPs / time. Decode (q_pos = 1, k_pos = s) is memory bound, so only its time and the
time ratio to SDPA are reported. SDPA needs q_pos == k_pos for its causal mask, so for decode SDPA
runs non-causal (a single query at the end sees every key anyway).

Usage: python benchmarks/attention.py [--heads 16] [--batch-tokens 16384]
Without a CUDA device it prints a message and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys


def causal_fwd_flops(batch: int, heads: int, seq: int, d_head: int) -> float:
    return 2 * 2 * batch * heads * seq * seq * d_head / 2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--batch-tokens", type=int, default=16384, help="batch = batch_tokens // seq")
    parser.add_argument("--seqs", type=int, nargs="*", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--head-dims", type=int, nargs="*", default=[64, 128])
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        print("no CUDA device: GPU benchmark not run")
        return 0

    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from hooked.kernels import flash_attention

    dtype, dev, H = torch.bfloat16, "cuda", args.heads
    print(f"device: {torch.cuda.get_device_name()}  dtype: bf16  heads: {H}  causal")
    header = (f"{'d':>4} {'seq':>6} {'batch':>5} | {'fwd TF/s':>9} {'sdpa':>7} {'ratio':>6} | "
              f"{'f+b TF/s':>9} {'sdpa':>7} {'ratio':>6} | {'decode us':>9} {'sdpa':>7} {'t ratio':>7} | {'max|diff|':>9}")
    print(header)
    print("-" * len(header))
    for d in args.head_dims:
        for s in args.seqs:
            b = max(1, args.batch_tokens // s)
            q, k, v = (torch.randn(b, s, H, d, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
            # SDPA wants [b, h, s, d]
            qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
            dout = torch.randn(b, s, H * d, device=dev, dtype=dtype)
            dout_t = dout.view(b, s, H, d).transpose(1, 2).contiguous()

            def ours_fwd():
                return flash_attention(q, k, v)

            def ours_fb():
                flash_attention(q, k, v).backward(dout)

            def ref_fwd():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return sdpa(qt, kt, vt, is_causal=True)

            def ref_fb():
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
            print(f"{d:>4} {s:>6} {b:>5} | {tf(fwd, t_f):>9.1f} {tf(fwd, t_f_ref):>7.1f} {t_f_ref / t_f:>6.2f} | "
                  f"{tf(fb, t_fb):>9.1f} {tf(fb, t_fb_ref):>7.1f} {t_fb_ref / t_fb:>6.2f} | "
                  f"{t_d * 1e3:>9.1f} {t_d_ref * 1e3:>7.1f} {t_d / t_d_ref:>7.2f} | {diff:>9.2e}")
            del q, k, v, qt, kt, vt, dout, dout_t
            torch.cuda.empty_cache()
    print("ratio = SDPA time / our time (>1: we are faster); t ratio = our decode time / SDPA decode time;"
          " max|diff| = forward difference to SDPA")
    return 0


if __name__ == "__main__":
    sys.exit(main())
