"""Loading a checkpoint: peak resident memory over the size of the weights, and load time.

    .venv/bin/python benchmarks/loading.py [--rounds 3]

GPT-2-small-shaped float32 checkpoint (benchmarks/common.py), loaded on the CPU as float32 and as
bfloat16. Every load runs in a fresh subprocess (`loading.py --worker LIB DTYPE`), so nothing the
parent allocated counts; hooked and transformers subprocesses alternate (A B A B ...), `--rounds`
of each.

* baseline: VmRSS after the imports (`import torch, hooked`; plus transformers for its worker);
* peak: the kernel's high-water mark (`ru_maxrss`, VmHWM) after the load returns;
* peak ratio = (peak - baseline) / bytes of the loaded weights (distinct parameter storages, in the
  target dtype). Target for hooked: <= 1.3;
* RssAnon / RssFile peaks (sampled every 2 ms) split the growth into heap copies and pages of the
  memory-mapped safetensors file; "held" is the growth still resident after the load, "touched"
  the growth once every weight has been read once (as the first forward would);
* "hooked, dynamo pre-imported": hooked with `torch._dynamo` imported before the baseline, as
  `import transformers` does for its worker; separates the loader's own cost from that import;
* load time: wall time of `hooked.load(dir, dtype=...)` vs
  `GPT2LMHeadModel.from_pretrained(dir, dtype=...)`, medians, ratio vs transformers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

DTYPES = ("float32", "bfloat16")
# "hooked, dynamo pre-imported" imports torch._dynamo before its baseline, as `import transformers`
# does: building the model on the meta device initialises nn.Embedding with normal_, whose meta
# implementation imports torch._dynamo on first use (see docs/benchmarks.md).
LIBS = ("transformers", "hooked", "hooked, dynamo pre-imported")


def worker(lib: str, dtype_name: str, directory: str) -> None:
    import torch
    from common import PeakSampler, peak_rss, proc_status  # before hooked: puts the checkout on sys.path

    import hooked  # in the baseline of both workers

    if lib == "transformers":
        from common import quiet_transformers
        from transformers import GPT2LMHeadModel

        quiet_transformers()
    if lib == "hooked, dynamo pre-imported":
        import torch._dynamo  # noqa: F401
    dtype = getattr(torch, dtype_name)
    baseline = proc_status()
    with PeakSampler(interval=0.002) as sampler:
        start = time.perf_counter()
        if lib.startswith("hooked"):
            model = hooked.load(directory, dtype=dtype, device="cpu")
        else:
            model = GPT2LMHeadModel.from_pretrained(directory, dtype=dtype)
        seconds = time.perf_counter() - start
    peak = peak_rss()
    held = proc_status()
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    weights = sum(storages.values())
    assert all(p.dtype == dtype for p in model.parameters())
    with torch.no_grad():
        for p in model.parameters():  # read every weight once (the first forward would)
            p.sum()
    touched = proc_status()

    def grown(status):
        return {k: status.get(k, 0) - baseline.get(k, 0) for k in ("VmRSS", "RssAnon", "RssFile")}

    print(json.dumps({
        "lib": lib, "dtype": dtype_name, "seconds": seconds, "weights": weights,
        "peak": peak - baseline["VmRSS"],
        "sampled_peak": {k: sampler.peak.get(k, 0) - baseline.get(k, 0) for k in ("VmRSS", "RssAnon", "RssFile")},
        "held": grown(held), "touched": grown(touched),
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", nargs=2, metavar=("LIB", "DTYPE"))
    parser.add_argument("--dir")
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, args.dir)
        return

    from common import GiB, environment, gpt2_small_checkpoint, table

    directory = gpt2_small_checkpoint()
    file_bytes = sum(f.stat().st_size for f in Path(directory).glob("*.safetensors"))
    print(environment())
    print(f"checkpoint {directory}: {file_bytes / GiB:.3f} GiB of float32 safetensors")

    results: dict[tuple[str, str], list[dict]] = {(lib, dt): [] for lib in LIBS for dt in DTYPES}
    for _ in range(args.rounds):
        for dtype_name in DTYPES:
            for lib in LIBS:
                command = [sys.executable, __file__, "--worker", lib, dtype_name, "--dir", str(directory)]
                completed = subprocess.run(command, capture_output=True, text=True, check=False)
                if completed.returncode != 0:
                    raise SystemExit(f"worker {lib} {dtype_name} failed:\n{completed.stderr}")
                results[(lib, dtype_name)].append(json.loads(completed.stdout.strip().splitlines()[-1]))

    def median(lib, dtype_name, *keys):
        values = []
        for result in results[(lib, dtype_name)]:
            value = result
            for key in keys:
                value = value[key]
            values.append(value)
        return statistics.median(values)

    rows = []
    for dtype_name in DTYPES:
        for lib in LIBS:
            weights = median(lib, dtype_name, "weights")
            rows.append((
                f"{lib}, float32 file -> {dtype_name}",
                f"{weights / GiB:.3f}",
                f"{median(lib, dtype_name, 'peak') / GiB:.3f}",
                f"{median(lib, dtype_name, 'peak') / weights:.2f}",
                f"{median(lib, dtype_name, 'sampled_peak', 'RssAnon') / GiB:.3f}",
                f"{median(lib, dtype_name, 'sampled_peak', 'RssFile') / GiB:.3f}",
                f"{median(lib, dtype_name, 'held', 'VmRSS') / GiB:.3f}",
                f"{median(lib, dtype_name, 'touched', 'VmRSS') / GiB:.3f}",
            ))
    print(table(
        ["", "weights GiB", "peak growth GiB", "peak / weights", "peak RssAnon", "peak RssFile", "held", "touched"],
        rows,
        title=f"\nresident memory of one load, fresh subprocess, median of {args.rounds} (GiB over the post-import RSS;"
              " target hooked peak / weights <= 1.3)",
    ))

    rows = []
    for dtype_name in DTYPES:
        reference = median("transformers", dtype_name, "seconds")
        for lib in LIBS:
            seconds = [r["seconds"] for r in results[(lib, dtype_name)]]
            rows.append((f"{lib}, float32 file -> {dtype_name}", f"{statistics.median(seconds):.2f}", f"{min(seconds):.2f}",
                         f"{statistics.median(seconds) / reference:.2f}"))
    print()
    print(table(["", "median s", "min s", "ratio vs transformers"], rows, title=f"load time, median of {args.rounds} fresh subprocesses"))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
