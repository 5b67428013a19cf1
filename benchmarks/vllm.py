"""hooked on vLLM (issue 38): the recipe's ablation sweep over generation, throughput and memory, against vLLM's
own model without hooks and against hooked's own engine.

    PYTHONPATH=. .vllm-venv/bin/python benchmarks/vllm.py [--quick] [--repeats 3] [--concurrency 64,128,256,512]
                                                          [--profile]

Runs in vLLM's environment (`.vllm-venv`, docs/vllm.md: hooked installed there editable, so its own engine runs
there too). Three sides, each in a process of its own, one after another (one engine at a time on a small machine):

* `native`: vLLM's in-tree `Qwen3ForCausalLM` on the checkpoint, no hooks (the baseline);
* `hooked-vllm`: `hooked.engines.vllm.VllmEngine` (hooked's Qwen3 modules on vLLM's paged attention and scheduler);
* `hooked`: hooked's own engine (`hooked.load` + `model.generate` / `hooked.generate_variants` on a padded batch).

Both vLLM sides get the same engine arguments (float32, eager, `max_model_len`, `max_num_seqs`, raw-logits mode,
prefix caching off: the sweep repeats each prompt once per variant, and salted variants never share a prefill, so
the native side would otherwise skip prefills the hooked side must compute). Threads: every process is started
with OMP_NUM_THREADS=1 and VLLM_CPU_OMP_THREADS_BIND=nobind (vLLM leaves torch at OMP_NUM_THREADS), so each
side computes on one thread; hooked's side calls `torch.set_num_threads(1)`.

(a) The sweep: clean + every MLP zeroed (`blocks.L.hook_mlp_out`, `hooked.ablate.zero()`) + every head of one
    layer zeroed (`blocks.L.attn.hook_z`, `zero(heads=h)`), over prompts of mixed lengths, greedy new tokens: one
    request per (variant, prompt) on hooked-vllm, the same number of plain requests on native. hooked-vllm also
    runs the same requests with no hooks (what hooked's modules cost without hooks), hooked its
    `generate_variants` of the same sweep (one batch of variants x prompts rows).
(b) Throughput: N concurrent requests (prompt lengths drawn from the same range, clean), generated tokens/s.
(c) Memory: the peak RSS of the process holding the model (vLLM's worker, its largest child process; hooked's
    own process) over each N (the kernel's high-water mark, VmHWM, reset before (b)'s calls at that N), the RSS
    after loading, and the KV cache the requests need, from the shapes: their tokens alone, vLLM's paged blocks of
    `block_size` tokens, hooked's cache of batch x (the longest prompt + new tokens).
(d) step.py's Python cost per hooked request at one decode step of `--dispatch-requests` requests, by hook kind
    (in the driver's process, no engine): what a step pays per hooked request on top of the model's forward.

Times: wall seconds (median of `--repeats` after one warm-up) and CPU seconds of the side's processes (the driver,
vLLM's engine core and worker: user + system). One thread's CPU time is what a busy shared machine disturbs least
for hooked's own engine; vLLM's processes also spend CPU time waiting on each other, which grows with the load, so
read its CPU column as a second noisy estimate. Ratios are against the native run of the same invocation.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# `python benchmarks/vllm.py` puts this folder first on sys.path, where this file would shadow the vllm package
# (here and in the engine processes vLLM spawns, which inherit sys.path and import this file again): the folder
# goes last, where `common` is still found.
HERE = Path(__file__).resolve().parent
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != HERE] + [str(HERE)]
from common import BENCH_DIR, MiB, table, transformers_checkpoint  # noqa: E402

# A Qwen3 big enough that a token's compute is not all per-step overhead, small enough for a 2-core CPU:
# 6 layers, d_model 512, 8 query / 4 kv heads of 64 (vLLM's CPU attention takes head sizes of 32 and up),
# d_mlp 1536, vocab 8192, tied embeddings: 23 M parameters, 92 MB in float32.
QWEN3 = dict(
    hidden_size=512,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    intermediate_size=1536,
    vocab_size=8192,
    tie_word_embeddings=True,
    max_position_embeddings=256,
)
QWEN3_QUICK = {**QWEN3, "hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256, "vocab_size": 1024}
MAX_MODEL_LEN = 128
SWEEP_LAYER = 0  # whose heads the sweep zeroes one at a time
SIDES = ("native", "hooked-vllm", "hooked")


def prompts(n: int, shortest: int, longest: int, vocab: int, seed: int) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(shortest, longest + 1, (n,), generator=generator)
    return [torch.randint(0, vocab, (int(n),), generator=generator).tolist() for n in lengths]


class Clock:
    """Wall and CPU seconds of this process and its children (vLLM's engine core), around a call."""

    def __init__(self):
        import psutil

        self.me = psutil.Process()

    def cpu(self) -> float:
        total = 0.0
        for process in [self.me, *self.me.children(recursive=True)]:
            try:
                times = process.cpu_times()
                total += times.user + times.system
            except Exception:  # noqa: BLE001 - a process that ended between listing and reading
                pass
        return total

    def time(self, fn, repeats: int) -> dict:
        fn()  # warm-up
        wall, cpu = [], []
        for _ in range(repeats):
            start_cpu, start = self.cpu(), time.perf_counter()
            fn()
            wall.append(time.perf_counter() - start)
            cpu.append(self.cpu() - start_cpu)
        return dict(wall=statistics.median(wall), wall_min=min(wall), cpu=statistics.median(cpu))


class ModelProcess:
    """The process holding the model: vLLM's engine core (a child of this one) or this process itself."""

    def __init__(self):
        import psutil

        me = psutil.Process()
        children = me.children(recursive=True)
        # the child with the most memory holds the model: vLLM's worker (beside the engine core, resource tracker)
        self.process = max(children, key=lambda p: p.memory_info().rss) if children else me

    def _status(self, key: str) -> int:
        with open(f"/proc/{self.process.pid}/status") as file:
            for line in file:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise KeyError(key)

    def rss(self) -> int:
        return self._status("VmRSS")

    def peak_of(self, fn) -> int:
        """VmHWM over `fn()`: the high-water mark reset to the current RSS first (/proc/PID/clear_refs "5")."""
        with open(f"/proc/{self.process.pid}/clear_refs", "w") as file:
            file.write("5")
        fn()
        return self._status("VmHWM")


# ----------------------------------------------------------------------------- the sides
def sweep_hooks(n_layers: int, n_heads: int) -> list[list[tuple]]:
    """The recipe's variants: clean, each MLP zeroed, each head of SWEEP_LAYER zeroed."""
    from hooked.ablate import zero

    return (
        [[]]
        + [[(f"blocks.{layer}.hook_mlp_out", zero())] for layer in range(n_layers)]
        + [[(f"blocks.{SWEEP_LAYER}.attn.hook_z", zero(heads=head))] for head in range(n_heads)]
    )


def engine_args(args) -> dict:
    return dict(enable_prefix_caching=False, max_num_seqs=max(args.concurrency + [args.sweep_requests]))


def run_side(side: str, args) -> dict:
    import torch

    torch.set_num_threads(1)
    config = json.loads((args.checkpoint / "config.json").read_text())
    n_layers, n_heads, vocab = config["num_hidden_layers"], config["num_attention_heads"], config["vocab_size"]
    sweep_prompts = prompts(args.prompts, args.shortest, args.longest, vocab, seed=0)
    hooks = sweep_hooks(n_layers, n_heads)
    clock = Clock()
    result: dict = dict(side=side, threads=torch.get_num_threads(), variants=len(hooks))
    started = time.perf_counter()

    if side == "hooked":
        import hooked

        model = hooked.load(str(args.checkpoint), dtype=torch.float32)
        result["start_s"] = time.perf_counter() - started
        holder = ModelProcess()
        result["rss_loaded"] = holder.rss()

        def padded(batch: list[list[int]]):
            longest = max(map(len, batch))
            tokens = torch.zeros(len(batch), longest, dtype=torch.long)
            mask = torch.zeros(len(batch), longest, dtype=torch.long)
            for row, prompt in enumerate(batch):  # on the left: each prompt continues from its own last token
                tokens[row, longest - len(prompt) :] = torch.tensor(prompt)
                mask[row, longest - len(prompt) :] = 1
            return tokens, mask

        def generate(batch, new):
            tokens, mask = padded(batch)
            with torch.inference_mode():
                return model.generate(tokens, new, attention_mask=mask, stop_at_eos=False, do_sample=False)

        tokens, mask = padded(sweep_prompts)
        variants = {str(index): pairs for index, pairs in enumerate(hooks)}

        def sweep():
            with torch.inference_mode():
                return hooked.generate_variants(
                    model, tokens, variants, args.new, attention_mask=mask, stop_at_eos=False, do_sample=False
                )

        clean = generate(sweep_prompts, args.new)
        result["clean_tokens"] = [row[-args.new :].tolist() for row in clean]
        result["sweep"] = {"generate_variants": clock.time(sweep, args.repeats)}
    else:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if side == "native":
            from vllm import LLM

            llm = LLM(
                model=str(args.checkpoint),
                dtype="float32",
                enforce_eager=True,
                skip_tokenizer_init=True,
                max_model_len=MAX_MODEL_LEN,
                logprobs_mode="raw_logits",  # as VllmEngine: the same engine arguments on both vLLM sides
                max_logprobs=vocab,
                **engine_args(args),
            )

            def generate(batch, new, variants=None):
                params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True, detokenize=False)
                outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], params, use_tqdm=False)
                return [list(output.outputs[0].token_ids) for output in outputs]

            close = llm.llm_engine.engine_core.shutdown
        else:
            from hooked.engines.vllm.engine import VllmEngine

            engine = VllmEngine(args.checkpoint, max_model_len=MAX_MODEL_LEN, **engine_args(args))

            def generate(batch, new, variants=None):
                chosen = variants or [None] * len(batch)
                return [g.tokens for g in engine.generate(batch, chosen, new, logits=False)]

            close = engine.close
        result["start_s"] = time.perf_counter() - started
        holder = ModelProcess()
        result["rss_loaded"] = holder.rss()
        result["clean_tokens"] = generate(sweep_prompts, args.new)
        every = [p for _ in hooks for p in sweep_prompts]  # one request per (variant, prompt)
        result["sweep"] = {"no hooks": clock.time(lambda: generate(every, args.new), args.repeats)}
        if side == "hooked-vllm":
            ids = [engine.add_variant(pairs) if pairs else None for pairs in hooks]
            chosen = [variant for variant in ids for _ in sweep_prompts]
            result["sweep"]["sweep"] = clock.time(lambda: generate(every, args.new, chosen), args.repeats)
            ablated = generate(every, args.new, chosen)
            # the hooks did something: each ablated variant's tokens differ from the clean run on some prompt
            per_variant = [ablated[i * len(sweep_prompts) : (i + 1) * len(sweep_prompts)] for i in range(len(ids))]
            result["variants_changing_tokens"] = sum(tokens != per_variant[0] for tokens in per_variant[1:])

    throughput = {}
    for n in args.concurrency:
        batch = prompts(n, args.shortest, args.longest, vocab, seed=n)
        timed = {}
        peak = holder.peak_of(
            lambda batch=batch: timed.update(
                clock.time(lambda: generate(batch, args.throughput_new), args.throughput_repeats)
            )
        )
        throughput[n] = dict(timed, peak_rss=peak, prompt_tokens=sum(map(len, batch)), longest=max(map(len, batch)))
    result["throughput"] = throughput
    if side != "hooked":
        close()
    return result


def profile(args) -> str:
    """cProfile of hooked-vllm's sweep and of the same requests without hooks, the engine in this process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0, set by the driver): where a step's time goes, per function of step.py."""
    import cProfile
    import io
    import pstats

    import torch

    from hooked.engines.vllm.engine import VllmEngine

    torch.set_num_threads(1)
    config = json.loads((args.checkpoint / "config.json").read_text())
    sweep_prompts = prompts(args.prompts, args.shortest, args.longest, config["vocab_size"], seed=0)
    hooks = sweep_hooks(config["num_hidden_layers"], config["num_attention_heads"])
    engine = VllmEngine(args.checkpoint, max_model_len=MAX_MODEL_LEN, **engine_args(args))
    ids = [engine.add_variant(pairs) if pairs else None for pairs in hooks]
    every = [p for _ in hooks for p in sweep_prompts]
    out = io.StringIO()
    # the hot path's functions (cumulative seconds: a function's own time and its callees')
    watched = {
        "model_forward": "worker.py: the model runner's forward (everything below)",
        "run_flat": "step.py: hooked's blocks over the flat batch",
        "step_hooks": "step.py: one dispatcher per hook point, built each step",
        "_request_rows": "step.py: each hooked request's Rows, each step",
        "__call__": "step.py _Dispatch.__call__: cutting rows, calling the user's hooks",
    }
    for label, variants in (("no hooks", [None] * len(every)), ("sweep", [v for v in ids for _ in sweep_prompts])):
        engine.generate(every, variants, args.new, logits=False)  # warm-up
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        engine.generate(every, variants, args.new, logits=False)
        profiler.disable()
        wall = time.perf_counter() - start
        stats = pstats.Stats(profiler)
        rows = []
        for (file, _, function), (_, calls, _, cumulative, _) in stats.stats.items():
            if function in watched and ("hooked/engines/vllm" in file) and (function != "__call__" or "step" in file):
                rows.append((watched[function], calls, f"{cumulative:.3f}"))
        ablation = [
            (f"{Path(file).name}:{function}", calls, f"{cumulative:.3f}")
            for (file, _, function), (_, calls, _, cumulative, _) in stats.stats.items()
            if "hooked/interventions" in file and function in ("__call__", "selection", "replacement")
        ]
        out.write(table(["", "calls", "cumulative s"], rows + ablation, title=f"\n{label}: {wall:.3f} s profiled"))
        out.write("\n")
        stats.stream = out
        stats.sort_stats("tottime").print_stats(15)
    engine.close()
    return out.getvalue()


def dispatch_cost(args) -> str:
    """(d) step.py's per-request Python cost at one decode step of N hooked requests (one token each), in this
    process, no engine: `step_hooks` (a dispatcher per point, each request's Rows) and the dispatcher's call
    (cutting each request's row, its hook, writing back), per hook kind; best of 5, microseconds per request."""
    import torch

    from hooked.ablate import zero
    from hooked.engines.vllm.step import Step, step_hooks
    from hooked.testing import random_model

    torch.set_num_threads(1)
    model = random_model("qwen3", seed=0)

    def in_place_head(z, hook):
        z[:, :, 1] = 0.0

    def in_place_all(activation, hook):
        activation.zero_()

    def no_op(activation, hook):
        return None

    kinds = {
        "zero(heads=1) at attn.hook_z": ("blocks.0.attn.hook_z", zero(heads=1)),
        "z[:, :, 1] = 0 in place at attn.hook_z": ("blocks.0.attn.hook_z", in_place_head),
        "zero() at hook_mlp_out": ("blocks.0.hook_mlp_out", zero()),
        "x.zero_() in place at hook_mlp_out": ("blocks.0.hook_mlp_out", in_place_all),
        "a no-op at hook_mlp_out": ("blocks.0.hook_mlp_out", no_op),
    }
    n = args.dispatch_requests
    step = Step(tuple(f"r{i}" for i in range(n)), tuple(range(n + 1)), ("v",) * n, (10,) * n)
    positions = torch.full((n,), 10)
    rows = []
    for label, (name, fn) in kinds.items():
        point = model.hook_dict[name]
        sizes = {"batch": 1, "pos": n, **model.axis_sizes()}
        activation = torch.randn(*(sizes[axis] for axis in point.axes))
        build, call = [], []
        for _ in range(5):
            start = time.perf_counter()
            ((_, dispatch),) = step_hooks(step, positions, {"v": [(name, fn)]}, {})
            built = time.perf_counter()
            dispatch(activation.clone(), point)
            build.append(built - start)
            call.append(time.perf_counter() - built)
        rows.append((label, f"{min(build) / n * 1e6:.1f}", f"{min(call) / n * 1e6:.1f}"))
    return table(
        ["", "step_hooks us/request", "dispatch us/request"],
        rows,
        title=f"\n(d) step.py at one decode step of {n} hooked requests (hooked's tiny random Qwen3, one thread)",
    )


# ----------------------------------------------------------------------------- the driver
def kv_bytes_per_token(config: dict) -> int:
    return config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * config["head_dim"] * 4  # float32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: a 2-layer d_model 128 model, small N")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--throughput-repeats", type=int, default=2, help="--repeats of (b), each N")
    parser.add_argument("--concurrency", default="64,128,256,512")
    parser.add_argument("--prompts", type=int, default=8, help="prompts in the sweep")
    parser.add_argument("--shortest", type=int, default=8)
    parser.add_argument("--longest", type=int, default=64)
    parser.add_argument("--new", type=int, default=8, help="new tokens per request in the sweep")
    parser.add_argument("--throughput-new", type=int, default=16, help="new tokens per request in (b)")
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--kv-cache-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE for both vLLM sides")
    parser.add_argument("--profile", action="store_true", help="cProfile hooked-vllm's sweep (in one process)")
    parser.add_argument("--side-timeout", type=int, default=1200, help="seconds before a side's process is stopped")
    parser.add_argument("--dispatch-requests", type=int, default=512, help="hooked requests in (d)'s decode step")
    parser.add_argument("--side", help=argparse.SUPPRESS)  # inside one side's process
    parser.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick and args.concurrency == parser.get_default("concurrency"):
        args.concurrency, args.repeats, args.throughput_repeats, args.prompts = "8,16", 1, 1, 3
    args.concurrency = [int(n) for n in args.concurrency.split(",")]
    args.sweep_requests = 0  # set below, from the model's shape

    if args.side:
        config = json.loads((args.checkpoint / "config.json").read_text())
        args.sweep_requests = (1 + config["num_hidden_layers"] + config["num_attention_heads"]) * args.prompts
        if args.side == "profile":
            print("PROFILE\n" + profile(args), flush=True)  # after vLLM's own log lines (also on stdout)
        else:
            print("RESULT " + json.dumps(run_side(args.side, args)), flush=True)
        return

    shape = QWEN3_QUICK if args.quick else QWEN3
    name = "qwen3-vllm-quick" if args.quick else "qwen3-vllm"
    checkpoint = transformers_checkpoint(BENCH_DIR / name, "Qwen3Config", "Qwen3ForCausalLM", shape)
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        VLLM_CPU_KVCACHE_SPACE=str(args.kv_cache_gib),
        TOKENIZERS_PARALLELISM="false",
    )
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  {os.cpu_count()} CPUs, load average"
        f" {os.getloadavg()[0]:.1f} at the start;  Qwen3 {shape['num_hidden_layers']} layers, d_model"
        f" {shape['hidden_size']}, {shape['num_attention_heads']}/{shape['num_key_value_heads']} heads of"
        f" {shape['head_dim']}, d_mlp {shape['intermediate_size']}, vocab {shape['vocab_size']}, float32",
        flush=True,
    )
    if args.profile:
        command = [sys.executable, __file__, "--side", "profile", "--checkpoint", str(checkpoint)]
        command += ["--prompts", str(args.prompts), "--shortest", str(args.shortest), "--longest", str(args.longest)]
        command += ["--new", str(args.new), "--concurrency", ",".join(map(str, args.concurrency))]
        done = subprocess.run(
            command, env=dict(env, VLLM_ENABLE_V1_MULTIPROCESSING="0"), capture_output=True, text=True
        )
        found = done.returncode == 0 and "PROFILE\n" in done.stdout
        print(done.stdout.rpartition("PROFILE\n")[2] if found else f"profile: failed\n{done.stderr[-3000:]}")
        return
    results = {}
    for side in args.sides.split(","):
        command = [sys.executable, __file__, "--side", side, "--checkpoint", str(checkpoint)]
        command += ["--repeats", str(args.repeats), "--concurrency", ",".join(map(str, args.concurrency))]
        command += ["--prompts", str(args.prompts), "--shortest", str(args.shortest), "--longest", str(args.longest)]
        command += ["--new", str(args.new), "--throughput-new", str(args.throughput_new)]
        command += ["--throughput-repeats", str(args.throughput_repeats)]
        started = time.perf_counter()
        # its own session: a side stopped at --side-timeout (its engine process died and left its driver waiting:
        # seen once here) is stopped with the engine processes it started
        child = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            stdout, stderr = child.communicate(timeout=args.side_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, 9)
            child.communicate()
            print(f"{side}: stopped after {args.side_timeout} s", flush=True)
            continue
        done = subprocess.CompletedProcess(command, child.returncode, stdout, stderr)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            print(f"{side}: failed (exit code {done.returncode})\n{done.stderr[-3000:]}", flush=True)
            continue
        results[side] = json.loads(lines[-1].removeprefix("RESULT "))
        print(
            f"{side}: done in {time.perf_counter() - started:.0f} s (engine start {results[side]['start_s']:.0f} s,"
            f" torch threads {results[side]['threads']}), load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    report(results, shape, args)
    print(dispatch_cost(args))


def report(results: dict, shape: dict, args) -> None:
    native = results.get("native")
    n_variants = next(iter(results.values()))["variants"] if results else 0
    requests = n_variants * args.prompts
    rows = []
    for side, result in results.items():
        for label, timing in result["sweep"].items():
            base = native["sweep"]["no hooks"] if native else None
            ratios = [f"{timing[key] / base[key]:.2f}x" if base else "-" for key in ("wall", "wall_min", "cpu")]
            rows.append(
                (
                    f"{side}: {label}",
                    f"{timing['wall']:.3f}",
                    f"{timing['wall_min']:.3f}",
                    f"{timing['cpu']:.3f}",
                    *ratios,
                )
            )
    print(
        table(
            ["", "median s", "min s", "CPU s", "vs native (median)", "vs native (min)", "vs native (CPU)"],
            rows,
            title=f"\n(a) the sweep: {n_variants} variants (clean, {shape['num_hidden_layers']} MLPs, "
            f"{shape['num_attention_heads']} heads of layer {SWEEP_LAYER}) x {args.prompts} prompts of "
            f"{args.shortest}-{args.longest} tokens = {requests} requests, {args.new} new tokens, greedy; "
            f"median of {args.repeats}. Target: hooked-vllm sweep <= 1.5x native",
        )
    )
    if native:
        for side in ("hooked-vllm", "hooked"):
            if side in results:
                same = sum(a == b for a, b in zip(results[side]["clean_tokens"], native["clean_tokens"], strict=True))
                print(f"{side}: clean tokens equal to native on {same} of {len(native['clean_tokens'])} prompts")
    if "hooked-vllm" in results:
        changed = results["hooked-vllm"].get("variants_changing_tokens")
        print(f"hooked-vllm: {changed} of {n_variants - 1} ablated variants change some prompt's tokens")

    config = {
        "num_hidden_layers": shape["num_hidden_layers"],
        "num_key_value_heads": shape["num_key_value_heads"],
        "head_dim": shape["head_dim"],
    }
    per_token = kv_bytes_per_token(config)
    block = 128  # vLLM 0.32's CPU default block size (vllm/platforms/cpu.py)
    rows = []
    for n in args.concurrency:
        row = [n]
        for side in SIDES:
            entry = results.get(side, {}).get("throughput", {}).get(str(n))
            row.append(f"{n * args.throughput_new / entry['wall']:.0f}" if entry else "-")
        for side in SIDES:
            entry = results.get(side, {}).get("throughput", {}).get(str(n))
            row.append(f"{n * args.throughput_new / entry['cpu']:.0f}" if entry else "-")
        rows.append(tuple(row))
    print(
        table(
            ["N", *[f"{s} tok/s" for s in SIDES], *[f"{s} tok/CPU-s" for s in SIDES]],
            rows,
            title=f"\n(b) throughput: N clean requests, prompts of {args.shortest}-{args.longest} tokens, "
            f"{args.throughput_new} new tokens each, greedy; generated tokens / median wall s and / CPU s"
            f" (median of {args.throughput_repeats} after a warm-up)",
        )
    )
    rows = []
    for n in args.concurrency:
        row = [n]
        sample = next((r["throughput"][str(n)] for r in results.values()), None)
        for side in SIDES:
            result = results.get(side)
            entry = result and result["throughput"].get(str(n))
            row.append(f"{result['rss_loaded'] / MiB:.0f} / {entry['peak_rss'] / MiB:.0f}" if entry else "-")
        if sample:
            prompt_tokens, longest = sample["prompt_tokens"], sample["longest"]
            paged = sum(
                math.ceil((length + args.throughput_new) / block) * block
                for length in _lengths(n, prompt_tokens, args, shape)
            )
            row.append(f"{(prompt_tokens + n * args.throughput_new) * per_token / MiB:.0f}")
            row.append(f"{paged * per_token / MiB:.0f}")
            row.append(f"{n * (longest + args.throughput_new) * per_token / MiB:.0f}")
        rows.append(tuple(row))
    print(
        table(
            [
                "N",
                *[f"{s} RSS loaded / peak MiB" for s in SIDES],
                "KV tokens held MiB",
                "vLLM KV blocks MiB",
                "hooked KV cache MiB",
            ],
            rows,
            title=f"\n(c) memory: RSS of the process holding the model after loading, and its peak (VmHWM) over "
            f"(b)'s calls at that N; vLLM preallocates VLLM_CPU_KVCACHE_SPACE={args.kv_cache_gib} GiB of KV cache "
            "at start. "
            f"KV cache the requests need ({per_token / 1024:.0f} KiB per token in float32): their tokens alone, vLLM's "
            f"blocks of {block} tokens per request, hooked's batch x (longest prompt + new tokens)",
        )
    )
    print("RSS counts shared library pages too (torch, vLLM's ops); vLLM's: its worker process's (the largest child).")


def _lengths(n: int, prompt_tokens: int, args, shape: dict) -> list[int]:
    """The prompt lengths of (b)'s N requests, as `prompts` drew them (same seed)."""
    import torch

    generator = torch.Generator().manual_seed(n)
    lengths = torch.randint(args.shortest, args.longest + 1, (n,), generator=generator).tolist()
    assert sum(lengths) == prompt_tokens, "the prompt lengths drawn here differ from the run's"
    return lengths


if __name__ == "__main__":
    main()
