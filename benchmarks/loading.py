"""Loading a checkpoint: peak resident memory over the size of the weights, and load time.

    .venv/bin/python benchmarks/loading.py [--rounds 3] [--model all|gpt2|qwen3-sharded|families]

Three sections (`--model`, default all):

* gpt2: GPT-2-small-shaped float32 checkpoint, one file (benchmarks/common.py), loaded on the CPU
  as float32 and as bfloat16;
* qwen3-sharded: SHARDED bfloat16 checkpoints (`save_pretrained(dir, max_shard_size="200MB")`, so
  `model.safetensors.index.json` and several shard files) of the shapes of
  benchmarks/qwen3_forward.py (common.QWEN3_SHAPES): dense Qwen3 (8 layers, d_model 1024, 16/8
  heads of 128, d_mlp 3072, vocab 32000) loaded as bfloat16 and as float32, and Qwen3-MoE (4
  layers, 16 experts, top-4, expert width 768) loaded as bfloat16. transformers loads them with
  the class named in config.json (`Qwen3ForCausalLM` / `Qwen3MoeForCausalLM`);
* families: the float32 checkpoints of benchmarks/families_forward.py (common.FAMILY_SHAPES: Llama,
  Mistral, GPT-NeoX, Mixtral, OLMo 2, d_model 1024, 4 layers, vocab 32000, one file each) loaded as float32.

Every load runs in a fresh subprocess (`loading.py --worker LIB DTYPE --dir DIR`), so nothing the
parent allocated counts; hooked and transformers subprocesses alternate (A B A B ...), `--rounds`
of each.

* baseline: VmRSS after the imports (`import torch, hooked`; plus transformers for its worker);
* peak: the kernel's high-water mark of this process (VmHWM) after the load returns (not
  `ru_maxrss`, which on Linux starts from the parent's RSS at fork);
* peak ratio = (peak - baseline) / bytes of the loaded weights (distinct parameter storages, in the
  target dtype). Target for hooked: <= 1.3;
* RssAnon / RssFile peaks (sampled every 2 ms) split the growth into heap copies and pages of the
  memory-mapped safetensors file; "held" is the growth still resident after the load, "touched"
  the growth once every weight has been read once (as the first forward would);
* "hooked, dynamo pre-imported" (gpt2 section): hooked with `torch._dynamo` imported before the
  baseline, as `import transformers` does for its worker; separates the loader's own cost from
  that import;
* "hooked, processed": `HookedTransformer.from_pretrained(dir, dtype=...)`, TransformerLens' default
  weight processing done in place after the read; its weights include what processing adds (GPT-2's
  unembedding, untied from the embedding, and its bias);
* load time: wall time of `hooked.load(dir, dtype=...)` vs `<class>.from_pretrained(dir,
  dtype=...)`, medians, ratio vs transformers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# "hooked, dynamo pre-imported" imports torch._dynamo before its baseline, as `import transformers`
# does: building the model on the meta device initialises nn.Embedding with normal_, whose meta
# implementation imports torch._dynamo on first use (see docs/benchmarks.md).
GPT2_LIBS = ("transformers", "hooked", "hooked, dynamo pre-imported", "hooked, processed")
QWEN3_LIBS = ("transformers", "hooked", "hooked, processed")


@dataclass(frozen=True)
class Case:
    label: str  # e.g. "float32 file -> bfloat16"
    directory: Path
    dtype: str  # target dtype
    libs: tuple[str, ...]


def worker(lib: str, dtype_name: str, directory: str) -> None:
    import torch
    from common import PeakSampler, peak_rss, proc_status  # before hooked: puts the checkout on sys.path

    import hooked  # in the baseline of both workers

    if lib == "transformers":
        import transformers
        from common import quiet_transformers

        quiet_transformers()
        architecture = json.loads((Path(directory) / "config.json").read_text())["architectures"][0]
        model_class = getattr(transformers, architecture)  # GPT2LMHeadModel, Qwen3ForCausalLM, ...
    if lib == "hooked, dynamo pre-imported":
        import torch._dynamo  # noqa: F401
    dtype = getattr(torch, dtype_name)
    baseline = proc_status()
    with PeakSampler(interval=0.002) as sampler:
        start = time.perf_counter()
        if lib == "hooked, processed":  # TransformerLens' default processing, in place (hooked.processing)
            model = hooked.HookedTransformer.from_pretrained(directory, dtype=dtype, device="cpu")
        elif lib.startswith("hooked"):
            model = hooked.load(directory, dtype=dtype, device="cpu")
        else:
            model = model_class.from_pretrained(directory, dtype=dtype)
        seconds = time.perf_counter() - start
    held = proc_status()
    # VmHWM, not ru_maxrss: Linux carries the parent's RSS at fork into the child's ru_maxrss across
    # exec, so a parent that built a checkpoint (> 1 GiB resident) would set every worker's "peak".
    peak = held.get("VmHWM") or peak_rss()
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    weights = sum(storages.values())
    assert all(p.dtype == dtype for p in model.parameters())
    with torch.no_grad():
        for p in model.parameters():  # read every weight once (the first forward would)
            p.sum()
    touched = proc_status()

    def grown(status):
        return {k: status.get(k, 0) - baseline.get(k, 0) for k in ("VmRSS", "RssAnon", "RssFile")}

    print(
        json.dumps(
            {
                "lib": lib,
                "dtype": dtype_name,
                "seconds": seconds,
                "weights": weights,
                "peak": peak - baseline["VmRSS"],
                "sampled_peak": {
                    k: sampler.peak.get(k, 0) - baseline.get(k, 0) for k in ("VmRSS", "RssAnon", "RssFile")
                },
                "held": grown(held),
                "touched": grown(touched),
            }
        )
    )


def describe(name: str, directory: Path) -> str:
    files = sorted(directory.glob("*.safetensors"))
    total = sum(f.stat().st_size for f in files)
    index = " + model.safetensors.index.json" if (directory / "model.safetensors.index.json").exists() else ""
    sizes = ", ".join(f"{f.stat().st_size / 2**20:.0f}" for f in files)
    return f"{name}: {directory}: {total / 2**30:.3f} GiB in {len(files)} safetensors file(s){index} (MiB: {sizes})"


def sections(which: str) -> dict[str, list[Case]]:
    from common import FAMILY_SHAPES, family_checkpoint, gpt2_small_checkpoint, qwen3_sharded_checkpoint

    result = {}
    if which in ("all", "gpt2"):
        directory = gpt2_small_checkpoint()
        print(describe("gpt2-small, float32", directory))
        result["GPT-2 small, float32 checkpoint (one file)"] = [
            Case(f"float32 file -> {dtype}", directory, dtype, GPT2_LIBS) for dtype in ("float32", "bfloat16")
        ]
    if which in ("all", "qwen3-sharded"):
        dense, moe = qwen3_sharded_checkpoint("dense"), qwen3_sharded_checkpoint("moe")
        print(describe("qwen3 dense, bfloat16, sharded", dense))
        print(describe("qwen3 moe, bfloat16, sharded", moe))
        result["Qwen3 / Qwen3-MoE, sharded bfloat16 checkpoints (max_shard_size 200MB)"] = [
            Case("Qwen3 dense, sharded bf16 -> bfloat16", dense, "bfloat16", QWEN3_LIBS),
            Case("Qwen3 dense, sharded bf16 -> float32", dense, "float32", QWEN3_LIBS),
            Case("Qwen3-MoE, sharded bf16 -> bfloat16", moe, "bfloat16", QWEN3_LIBS),
        ]
    if which in ("all", "families"):
        cases = []
        for family in FAMILY_SHAPES:
            directory = family_checkpoint(family)
            print(describe(f"{family}, float32", directory))
            cases.append(Case(f"{family}, float32 file -> float32", directory, "float32", ("transformers", "hooked")))
        result["The other families, float32 checkpoints (one file)"] = cases
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", choices=("all", "gpt2", "qwen3-sharded", "families"), default="all")
    parser.add_argument("--worker", nargs=2, metavar=("LIB", "DTYPE"))
    parser.add_argument("--dir")
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, args.dir)
        return

    from common import GiB, environment, table

    print(environment())
    cases = sections(args.model)
    results: dict[tuple[Case, str], list[dict]] = {
        (case, lib): [] for section in cases.values() for case in section for lib in case.libs
    }
    for _ in range(args.rounds):
        for case, lib in results:
            command = [sys.executable, __file__, "--worker", lib, case.dtype, "--dir", str(case.directory)]
            completed = subprocess.run(command, capture_output=True, text=True, check=False)
            if completed.returncode != 0:
                raise SystemExit(f"worker {lib} {case.label} failed:\n{completed.stderr}")
            results[(case, lib)].append(json.loads(completed.stdout.strip().splitlines()[-1]))

    def median(case, lib, *keys):
        values = []
        for result in results[(case, lib)]:
            value = result
            for key in keys:
                value = value[key]
            values.append(value)
        return statistics.median(values)

    for title, section in cases.items():
        rows = []
        for case in section:
            for lib in case.libs:
                weights = median(case, lib, "weights")
                rows.append(
                    (
                        f"{lib}, {case.label}",
                        f"{weights / GiB:.3f}",
                        f"{median(case, lib, 'peak') / GiB:.3f}",
                        f"{median(case, lib, 'peak') / weights:.2f}",
                        f"{median(case, lib, 'sampled_peak', 'RssAnon') / GiB:.3f}",
                        f"{median(case, lib, 'sampled_peak', 'RssFile') / GiB:.3f}",
                        f"{median(case, lib, 'held', 'VmRSS') / GiB:.3f}",
                        f"{median(case, lib, 'touched', 'VmRSS') / GiB:.3f}",
                    )
                )
        print(
            table(
                [
                    "",
                    "weights GiB",
                    "peak growth GiB",
                    "peak / weights",
                    "peak RssAnon",
                    "peak RssFile",
                    "held",
                    "touched",
                ],
                rows,
                title=f"\n{title}\nresident memory of one load, fresh subprocess, median of {args.rounds} (GiB over the"
                " post-import RSS; target hooked peak / weights <= 1.3)",
            )
        )

        rows = []
        for case in section:
            reference = median(case, "transformers", "seconds")
            for lib in case.libs:
                seconds = [r["seconds"] for r in results[(case, lib)]]
                rows.append(
                    (
                        f"{lib}, {case.label}",
                        f"{statistics.median(seconds):.2f}",
                        f"{min(seconds):.2f}",
                        f"{statistics.median(seconds) / reference:.2f}",
                    )
                )
        print()
        print(
            table(
                ["", "median s", "min s", "ratio vs transformers"],
                rows,
                title=f"load time, median of {args.rounds} fresh subprocesses",
            )
        )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
