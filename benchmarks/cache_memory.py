"""Memory of `run_with_cache` with every hook point cached: one buffer per activation, no duplicates.

    .venv/bin/python benchmarks/cache_memory.py [--batch 4] [--pos 256]

GPT-2-small shape (benchmarks/common.py), float32, CPU, torch.inference_mode, random tokens
[batch pos] (default 4 x 256). Reports

* the number of cached tensors, `cache.nbytes()` (bytes of the distinct storages the cache holds)
  and the sum of each cached tensor's `numel * element_size` (what the activations themselves
  need); their ratio is 1.00 when no tensor is a view into a bigger buffer and no buffer is held
  twice;
* resident memory (RSS, and RssAnon = heap, which excludes the memory-mapped weights), sampled
  every 2 ms from /proc/self/status: peak growth during the call and growth still held after it
  (logits + cache alive), against a plain forward measured the same way in the same process.

A warm-up forward runs first so that the weight pages (memory-mapped from the safetensors file)
are already resident and do not count as growth.
"""

from __future__ import annotations

import argparse
import gc

import torch
from common import GiB, PeakSampler, environment, gpt2_small_checkpoint, proc_status, random_tokens, table, tensor_bytes

import hooked


def measure(fn):
    """(result, peak growth, held growth) of RSS and RssAnon over the call, in bytes."""
    gc.collect()
    before = proc_status()
    with PeakSampler(interval=0.002) as sampler:
        result = fn()
    after = proc_status()
    peak = {k: sampler.peak.get(k, 0) - before.get(k, 0) for k in ("VmRSS", "RssAnon")}
    held = {k: after.get(k, 0) - before.get(k, 0) for k in ("VmRSS", "RssAnon")}
    return result, peak, held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--pos", type=int, default=256)
    args = parser.parse_args()

    model = hooked.load(gpt2_small_checkpoint(), dtype=torch.float32, device="cpu")
    tokens = random_tokens(args.batch, args.pos)
    print(environment())

    with torch.inference_mode():
        model(tokens)  # warm-up: fault the memory-mapped weights in
        logits, forward_peak, forward_held = measure(lambda: model(tokens))
        logits_bytes = tensor_bytes([logits])
        del logits
        (logits, cache), cache_peak, cache_held = measure(lambda: model.run_with_cache(tokens))

    held_bytes = cache.nbytes()
    needed = tensor_bytes(cache.values())
    expected_shapes = model.hook_shapes(args.batch, args.pos)
    wrong_shapes = [name for name, tensor in cache.items() if tuple(tensor.shape) != expected_shapes[name]]
    shared = len(cache) - len({t.untyped_storage().data_ptr() for t in cache.values()})

    title = f"\nrun_with_cache, every hook point, float32, batch {args.batch} x {args.pos}"
    print(table(["", "value"], [
        ("tensors cached", f"{len(cache)} (of {len(model.hook_dict)} hook points)"),
        ("tensors sharing a storage with another", str(shared)),
        ("shapes differing from model.hook_shapes()", str(len(wrong_shapes))),
        ("bytes held, cache.nbytes()", f"{held_bytes / GiB:.3f} GiB"),
        ("sum of numel * element_size", f"{needed / GiB:.3f} GiB"),
        ("ratio held / needed (target 1.00)", f"{held_bytes / needed:.3f}"),
        ("logits", f"{logits_bytes / GiB:.3f} GiB"),
    ], title=title))

    def row(name, peak, held, payload):
        return (name, f"{peak['VmRSS'] / GiB:.3f}", f"{peak['RssAnon'] / GiB:.3f}", f"{held['RssAnon'] / GiB:.3f}",
                f"{payload / GiB:.3f}", f"{peak['RssAnon'] / payload:.2f}")

    print()
    print(table(
        ["", "peak RSS growth GiB", "peak RssAnon growth GiB", "RssAnon held after GiB", "output GiB", "peak anon / output"],
        [
            row("forward, no hooks (output: logits)", forward_peak, forward_held, logits_bytes),
            row("run_with_cache (output: logits + cache)", cache_peak, cache_held, logits_bytes + held_bytes),
        ],
        title="resident memory, sampled every 2 ms (growth over the RSS before the call)",
    ))
    if wrong_shapes:
        print("shape mismatches:", wrong_shapes[:10])


if __name__ == "__main__":
    main()
