"""Memory of `run_with_cache` with every default hook point cached, hooked vs TransformerLens 3.9.

    .venv/bin/python benchmarks/cache_memory.py [--batch 4] [--pos 256] [--no-transformer-lens]

GPT-2-small shape (benchmarks/common.py), float32, CPU, torch.inference_mode, random tokens
[batch pos] (default 4 x 256). Each library runs in a subprocess of its own (`--worker hooked` /
`--worker transformer_lens`), so one's heap does not hide the other's growth. TransformerLens is built on
the same weights, unprocessed (`common.transformer_lens_gpt2`). Reports

* per library: the number of cached tensors, the bytes of the distinct storages the cache holds
  (a buffer shared by two names, or a view's whole buffer, counts once) and the sum of each cached
  tensor's `numel * element_size` (what the activations themselves need);
* the same bytes over the names both caches hold (TransformerLens caches the logits as
  `unembed.hook_out`, hooked has no unembedding hook; hooked caches `attn.hook_result`, which
  TransformerLens computes only after `set_use_attn_result(True)`). Target: hooked <= TransformerLens;
* resident memory (RSS, and RssAnon = heap, which excludes the memory-mapped weights), sampled
  every 2 ms from /proc/self/status: peak growth during the call and growth still held after it
  (logits + cache alive), against a plain forward measured the same way in the same process; "output"
  is the distinct storages of the logits and the cache.

A warm-up forward runs first so that the weight pages are already resident and do not count as growth.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import subprocess
import sys

import torch
from common import GiB, PeakSampler, environment, gpt2_small_checkpoint, proc_status, random_tokens, table, tensor_bytes

import hooked

LIBRARIES = ("hooked", "transformer_lens")


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


def distinct_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (a shared buffer counts once)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def worker(library: str, batch: int, pos: int) -> dict:
    """One library's run_with_cache in this process: its cache's storages by name and the RSS figures."""
    if library == "hooked":
        model = hooked.load(gpt2_small_checkpoint(), dtype=torch.float32, device="cpu")
    else:
        from common import transformer_lens_gpt2

        model = transformer_lens_gpt2(gpt2_small_checkpoint())
    tokens = random_tokens(batch, pos)
    with torch.inference_mode():
        model(tokens)  # warm-up: fault the weights in
        logits, forward_peak, forward_held = measure(lambda: model(tokens))
        logits_bytes = tensor_bytes([logits])
        del logits
        (logits, cache), cache_peak, cache_held = measure(lambda: model.run_with_cache(tokens))
    tensors = {name: cache[name] for name in cache.keys()}
    if library == "hooked":
        expected = model.hook_shapes(batch, pos)
        wrong_shapes = [name for name, t in tensors.items() if tuple(t.shape) != expected[name]]
    else:
        wrong_shapes = []
    return {
        "wrong_shapes": wrong_shapes,
        "payload": distinct_bytes([logits, *tensors.values()]),
        "names": list(tensors),
        "storage": {
            name: [t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()] for name, t in tensors.items()
        },
        "needed": {name: t.numel() * t.element_size() for name, t in tensors.items()},
        "logits": logits_bytes,
        "forward": [forward_peak, forward_held],
        "cache": [cache_peak, cache_held],
    }


def run_worker(library: str, args) -> dict:
    command = [sys.executable, __file__, "--worker", library, "--batch", str(args.batch), "--pos", str(args.pos)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {library} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def held_bytes(result: dict, names) -> int:
    return sum(dict(result["storage"][name] for name in names).values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--pos", type=int, default=256)
    parser.add_argument("--no-transformer-lens", action="store_true", help="measure hooked alone")
    parser.add_argument("--worker", choices=LIBRARIES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.batch, args.pos)))
        return

    print(environment())
    libraries = LIBRARIES[:1] if args.no_transformer_lens else LIBRARIES
    results = {library: run_worker(library, args) for library in libraries}
    ours = results["hooked"]
    wrong_shapes = ours[
        "wrong_shapes"
    ]  # the values are compared with TransformerLens' in tests/transformer_lens/test_cache_transformer_lens.py

    rows = []
    for library, result in results.items():
        held = held_bytes(result, result["names"])
        needed = sum(result["needed"].values())
        shared = len(result["names"]) - len({ptr for ptr, _ in result["storage"].values()})
        rows.append((library, str(len(result["names"])), str(shared), f"{held / GiB:.3f}", f"{needed / GiB:.3f}"))
    print(
        table(
            [
                "default run_with_cache()",
                "tensors",
                "names sharing a buffer",
                "GiB held (distinct storages)",
                "GiB sum of numel * element_size",
            ],
            rows,
            title=f"\nrun_with_cache, default points, float32, batch {args.batch} x {args.pos}",
        )
    )
    if wrong_shapes:
        print("hooked's cached shapes differing from model.hook_shapes():", wrong_shapes[:10])

    if "transformer_lens" in results:
        theirs = results["transformer_lens"]
        common = [name for name in ours["names"] if name in set(theirs["names"])]
        ours_held, theirs_held = held_bytes(ours, common), held_bytes(theirs, common)
        print()
        print(
            table(
                ["", "names", "hooked GiB", "TransformerLens GiB", "ratio hooked / TransformerLens"],
                [
                    (
                        "names both cache",
                        str(len(common)),
                        f"{ours_held / GiB:.3f}",
                        f"{theirs_held / GiB:.3f}",
                        f"{ours_held / theirs_held:.3f}",
                    ),
                    (
                        "each library's default set",
                        f"{len(ours['names'])} / {len(theirs['names'])}",
                        f"{held_bytes(ours, ours['names']) / GiB:.3f}",
                        f"{held_bytes(theirs, theirs['names']) / GiB:.3f}",
                        f"{held_bytes(ours, ours['names']) / held_bytes(theirs, theirs['names']):.3f}",
                    ),
                ],
                title="cache bytes held (distinct storages), target: names both cache <= 1.00",
            )
        )
        only_ours = sorted(
            {re.sub(r"^blocks\.\d+\.", "blocks.{i}.", n) for n in ours["names"] if n not in set(theirs["names"])}
        )
        only_theirs = sorted(
            {re.sub(r"^blocks\.\d+\.", "blocks.{i}.", n) for n in theirs["names"] if n not in set(ours["names"])}
        )
        print(f"only hooked caches: {only_ours}; only TransformerLens caches: {only_theirs}")

    def row(name, peak, held, payload):
        return (
            name,
            f"{peak['VmRSS'] / GiB:.3f}",
            f"{peak['RssAnon'] / GiB:.3f}",
            f"{held['RssAnon'] / GiB:.3f}",
            f"{payload / GiB:.3f}",
            f"{peak['RssAnon'] / payload:.2f}",
        )

    rows = []
    for library, result in results.items():
        payload = result["payload"]  # TransformerLens' unembed.hook_out is the logits: counted once
        rows.append(row(f"{library}: forward (output: logits)", *result["forward"], result["logits"]))
        rows.append(row(f"{library}: run_with_cache (output: logits + cache)", *result["cache"], payload))
    print()
    print(
        table(
            [
                "",
                "peak RSS growth GiB",
                "peak RssAnon growth GiB",
                "RssAnon held after GiB",
                "output GiB",
                "peak anon / output",
            ],
            rows,
            title="resident memory, each library in its own process, sampled every 2 ms (growth over the RSS before "
            "the call)",
        )
    )


if __name__ == "__main__":
    main()
