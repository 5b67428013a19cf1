"""The `hooked` console script: `hooked hooks MODEL`, `hooked run MODEL PROMPT`, `hooked sweep MODEL ...`, `hooked demo`."""

import csv
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hooked
from hooked import ablate, metrics, tasks
from hooked.cli import main
from hooked.results import SweepResult


def test_hooks_lists_every_name_with_its_shape(gpt2, gpt2_dir, capsys):
    assert main(["hooks", str(gpt2_dir), "--pos", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == gpt2.hook_names
    listed = dict(line.split(maxsplit=1) for line in lines)
    assert listed["blocks.1.attn.hook_pattern"] == "[1, 4, 5, 5]"
    assert listed["blocks.0.mlp.hook_post"] == "[1, 5, 256]"


def test_run_prints_the_model_top_tokens(gpt2, gpt2_dir, capsys):
    prompt = "When Mary and John went to the store"
    assert main(["run", str(gpt2_dir), prompt, "--top", "3"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    with torch.no_grad():
        probs = gpt2(prompt)[0, -1].softmax(-1)
    expected = probs.topk(3)
    assert [int(row[1]) for row in rows] == expected.indices.tolist()
    assert [float(row[0]) for row in rows] == [round(p, 4) for p in expected.values.tolist()]


def test_console_script_is_installed():
    script = shutil.which("hooked", path=str(Path(sys.executable).parent))
    assert script is not None, "the `hooked` console script is not installed in this environment"
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "hooks" in result.stdout


def test_hooks_fetches_config_json_alone_for_a_hub_id(gpt2_dir, monkeypatch, capsys):
    """`hooked hooks` reads config.json only, so for a hub id it must not download the weights."""
    import huggingface_hub

    asked = []

    def snapshot_download(repo_id, allow_patterns=None, **kwargs):
        asked.append(allow_patterns)
        return str(gpt2_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert main(["hooks", "someone/some-gpt2"]) == 0
    assert asked == [["config.json"]]
    assert "blocks.0.attn.hook_z" in capsys.readouterr().out


# ----------------------------------------------------------------------------- hooked sweep
# The fixture's tokenizer is trained on a few sentences: of the IOI paper's names only these are one
# token each, so the CLI tests pass them with --names (the default names give a clear error, below).
ONE_TOKEN_NAMES = ["Mary", "John", "Alice", "Anna"]
N_PROMPTS = 4


def sweep_argv(gpt2_dir, out, components, method, *extra):
    return ["sweep", str(gpt2_dir), "--task", "ioi", "--components", components, "--method", method,
            "--out", str(out), "--n", str(N_PROMPTS), "--seed", "1", "--names", *ONE_TOKEN_NAMES, *extra]


def exit_code(argv) -> int:
    """main's return value, or the code of the SystemExit argparse raises for a usage error."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


@pytest.mark.parametrize("components, method, stem", [
    ("heads", "zero", "heads-zero"),
    ("heads", "resample", "heads-resample"),
    ("heads", "mean", "heads-mean"),
    ("mlps", "zero", "mlps-zero"),
    ("mlps", "resample", "mlps-resample"),
    ("neurons:1", "zero", "neurons-L1-zero"),
    ("neurons:-1", "resample", "neurons-L1-resample"),
])
def test_sweep_writes_the_table_json_and_heatmap_of_a_direct_sweep(gpt2, gpt2_dir, tmp_path, capsys, components, method, stem):
    out = tmp_path / "runs" / "sweep"
    assert main(sweep_argv(gpt2_dir, out, components, method)) == 0
    assert sorted(path.name for path in out.iterdir()) == [f"{stem}.csv", f"{stem}.json", f"{stem}.png"]
    assert sorted(path.name for path in out.parent.iterdir()) == ["sweep"]  # no staging folder left behind

    # The same sweep, built here from the library: the task, the metric, and the mean's reference (the
    # clean prompts) and the resample's source (the corrupt prompts) as full caches of every hook.
    task = tasks.ioi(N_PROMPTS, seed=1, names=ONE_TOKEN_NAMES)
    metric = metrics.logit_diff(gpt2, task.correct, task.incorrect)
    if method == "zero":
        options = {}
    else:
        _, cache = gpt2.run_with_cache(task.clean if method == "mean" else task.corrupt)
        options = {"reference": cache} if method == "mean" else {"source": cache}
    kind = components.replace("-1", str(gpt2.cfg.n_layers - 1))
    variants = {address: ablate.hooks(gpt2, address, method, **options) for address in ablate.components(gpt2, kind)}
    expected = hooked.sweep(gpt2, task.clean, variants, metric)

    saved = SweepResult.from_json(out / f"{stem}.json")
    assert saved.variants == expected.variants
    assert saved.metric == "logit_diff"
    # The same computation on the same weights: equal far below the smallest effect (about 4e-5 here).
    torch.testing.assert_close(saved.base, expected.base, rtol=0, atol=1e-6)
    torch.testing.assert_close(saved.values, expected.values, rtol=0, atol=1e-6)
    assert float((saved.values - saved.base).abs().max()) > 2e-5  # the ablations move the metric: not a vacuous match
    assert saved.provenance["task"]["clean"] == task.clean
    assert saved.provenance["command"][:2] == ["hooked", "sweep"]

    with (out / f"{stem}.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [row["variant"] for row in rows] == ["base", *expected.variants]
    assert [float(row["logit_diff"]) for row in rows[1:]] == pytest.approx(list(expected.scores.values()), abs=1e-5)
    assert (out / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    printed = capsys.readouterr().out
    for name, _ in expected.top(5):
        assert f"  {name} " in printed
    for ext in ("csv", "json", "png"):
        assert str(out / f"{stem}.{ext}") in printed


def test_sweep_without_one_token_answers_names_them(gpt2_dir, tmp_path, capsys):
    """The paper's names are single GPT-2 tokens, not single tokens of the fixture's tokenizer."""
    out = tmp_path / "out"
    argv = ["sweep", str(gpt2_dir), "--components", "heads", "--out", str(out), "--n", "4"]
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "not one token" in err and "--names" in err
    assert not out.exists()


@pytest.mark.parametrize("change, message", [
    (["--components", "neurons"], "neurons needs a layer number"),
    (["--components", "tails"], "unknown component kind 'tails'"),
    (["--components", "neurons:7"], "layer 7 is out of range; this model has 2 layers"),
    (["--components", "neurons:-3"], "layer -3 is out of range"),
    (["--components", "experts:0"], "layer 0 has no experts"),
    (["--method", "median"], "invalid choice: 'median'"),
    (["--task", "sst2"], "invalid choice: 'sst2'"),
    (["--n", "0"], "--n must be at least 1"),
    (["--max-rows", "1"], "max_rows=1 is smaller than one variant's 4 rows"),
])
def test_sweep_refuses_bad_input_in_one_line_and_writes_nothing(gpt2_dir, tmp_path, capsys, change, message):
    out = tmp_path / "out"
    argv = sweep_argv(gpt2_dir, out, "heads", "zero", *change)  # a repeated option: the last one counts
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert not out.exists()


def test_sweep_needs_a_tokenizer(gpt2_dir, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(gpt2_dir / name, bare / name)
    out = tmp_path / "out"
    assert exit_code(sweep_argv(bare, out, "heads", "zero")) == 2
    err = capsys.readouterr().err
    assert "has no tokenizer" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_sweep_leaves_an_existing_folder_as_it_was_on_error(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert exit_code(sweep_argv(gpt2_dir, out, "neurons:9", "zero")) == 2
    assert [path.name for path in tmp_path.iterdir()] == ["out"] and [path.name for path in out.iterdir()] == ["keep.txt"]


# ----------------------------------------------------------------------------- hooked demo
def test_demo_calls_the_demo_entry_point(monkeypatch):
    import hooked.demo

    calls = []
    monkeypatch.setattr(hooked.demo, "main", lambda argv=None: calls.append(argv))
    assert main(["demo", "--model", "gpt2", "--out", "runs/x"]) == 0
    assert main(["demo"]) == 0
    assert calls == [["--model", "gpt2", "--out", "runs/x"], []]


# ----------------------------------------------------------------------------- closed pipes
@pytest.mark.parametrize("reader, n_layer, unbuffered", [("head -1", 300, False), ("true", 2, False), ("true", 2, True)])
def test_hooks_into_a_pipe_closed_early_exits_quietly(gpt2_dir, tmp_path, reader, n_layer, unbuffered):
    """`hooked hooks MODEL | head`: no BrokenPipeError traceback or message. With 300 layers the listing
    (about 250 kB) outgrows a pipe's buffer, so `head -1` closes the pipe while hooked is still printing.
    `true` closes it before hooked writes anything: with stdout buffered (Python's default for a pipe)
    2 layers' listing fits the buffer and the write that fails is the flush at the end; unbuffered
    (PYTHONUNBUFFERED=1), the first print fails."""
    config = json.loads((gpt2_dir / "config.json").read_text())
    config["n_layer"] = n_layer
    (tmp_path / "config.json").write_text(json.dumps(config))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    command = f"{shlex.quote(sys.executable)} -m hooked.cli hooks {shlex.quote(str(tmp_path))} | {reader}"
    result = subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], capture_output=True, text=True, timeout=300, env=env)
    assert result.stderr == ""
    assert result.stdout == ("" if reader == "true" else result.stdout.splitlines()[0] + "\n")
    assert result.returncode in (0, 1)  # 1: the pipe closed early (Python docs, "Note on SIGPIPE")


def test_help_into_a_closed_pipe_exits_quietly():
    """argparse prints --help and exits; the flush of what it printed must not complain either."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    command = f"{shlex.quote(sys.executable)} -m hooked.cli sweep --help | true"
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300, env=env)
    assert result.stderr == ""
