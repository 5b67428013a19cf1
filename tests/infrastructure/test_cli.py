"""The `hooked` console script: `hooked hooks MODEL`, `hooked run MODEL PROMPT`, `hooked sweep MODEL ...`, `hooked
demo`."""

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
from hooked.interventions.results import SweepResult


def test_hooks_lists_every_name_with_its_shape(gpt2, gpt2_dir, capsys):
    assert main(["hooks", str(gpt2_dir), "--pos", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == gpt2.hook_names
    listed = dict(line.split(maxsplit=1) for line in lines)
    assert listed["blocks.1.attn.hook_pattern"] == "[1, 4, 5, 5]"
    assert listed["blocks.0.mlp.hook_post"] == "[1, 5, 256]"


@pytest.mark.parametrize(
    "config",
    [
        dict(
            model_type="llama",
            architectures=["LlamaForCausalLM"],
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=48,
            vocab_size=64,
        ),
        dict(
            model_type="mistral",
            architectures=["MistralForCausalLM"],
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=48,
            vocab_size=64,
            sliding_window=4,
        ),
        dict(
            model_type="gpt_neox",
            architectures=["GPTNeoXForCausalLM"],
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            intermediate_size=48,
            vocab_size=64,
            rotary_pct=0.25,
            use_parallel_residual=True,
        ),
        dict(
            model_type="mixtral",
            architectures=["MixtralForCausalLM"],
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=16,
            vocab_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
        dict(
            model_type="olmo2",
            architectures=["Olmo2ForCausalLM"],
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=48,
            vocab_size=64,
        ),
    ],
)
def test_hooks_lists_every_family_from_its_config_json(tmp_path, config, capsys):
    """`hooked hooks DIR` on a config.json alone (no weights): every hook point of the family, with its shape."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["hooks", str(tmp_path), "--pos", "5"]) == 0
    listed = dict(line.split(maxsplit=1) for line in capsys.readouterr().out.splitlines())
    model_class = next(c for c in hooked.models.MODEL_CLASSES if c.family == config["model_type"])
    model = model_class(model_class.config_class.from_hf(config))
    assert list(listed) == model.hook_names
    assert listed["blocks.1.attn.hook_pattern"] == "[1, 4, 5, 5]"
    assert listed["blocks.0.attn.hook_rot_k"] == f"[1, 5, {model.cfg.n_kv_heads}, 8]"


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
    return [
        "sweep",
        str(gpt2_dir),
        "--task",
        "ioi",
        "--components",
        components,
        "--method",
        method,
        "--out",
        str(out),
        "--n",
        str(N_PROMPTS),
        "--seed",
        "1",
        "--names",
        *ONE_TOKEN_NAMES,
        *extra,
    ]


def exit_code(argv) -> int:
    """main's return value, or the code of the SystemExit argparse raises for a usage error."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


@pytest.mark.parametrize(
    "components, method, stem",
    [
        ("heads", "zero", "heads-zero"),
        ("heads", "resample", "heads-resample"),
        ("heads", "mean", "heads-mean"),
        ("mlps", "zero", "mlps-zero"),
        ("mlps", "resample", "mlps-resample"),
        ("neurons:1", "zero", "neurons-L1-zero"),
        ("neurons:-1", "resample", "neurons-L1-resample"),
    ],
)
def test_sweep_writes_the_table_json_and_heatmap_of_a_direct_sweep(
    gpt2, gpt2_dir, tmp_path, capsys, components, method, stem
):
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


@pytest.mark.parametrize(
    "change, message",
    [
        (["--components", "neurons"], "neurons needs a layer number"),
        (["--components", "tails"], "unknown component kind 'tails'"),
        (["--components", "neurons:7"], "layer 7 is out of range; this model has 2 layers"),
        (["--components", "neurons:-3"], "layer -3 is out of range"),
        (["--components", "experts:0"], "layer 0 has no experts"),
        (["--method", "median"], "invalid choice: 'median'"),
        (["--task", "sst2"], "invalid choice: 'sst2'"),
        (["--n", "0"], "--n must be at least 1"),
        (["--max-rows", "1"], "max_rows=1 is smaller than one variant's 4 rows"),
        (["--engine", "vllm"], "--engine vllm needs vLLM in this Python"),  # this environment has no vLLM
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size belongs to --engine vllm"),
    ],
)
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
    assert [path.name for path in tmp_path.iterdir()] == ["out"] and [path.name for path in out.iterdir()] == [
        "keep.txt"
    ]


# ----------------------------------------------------------------------------- hooked circuit
# On the bundled IOI model (its tokenizer has the paper's names as single tokens), with few prompts.
IOI_MODEL = "hooked/ioi-gpt2"
CIRCUIT_FILES = [
    "circuit-edges.csv",
    "circuit-faithfulness.csv",
    "circuit-faithfulness.json",
    "circuit-faithfulness.png",
    "circuit.json",
    "circuit.png",
]


def circuit_argv(out, *extra):
    return ["circuit", IOI_MODEL, "--task", "ioi", "--out", str(out), "--n", "6", "--seed", "2", *extra]


def test_circuit_writes_the_edges_faithfulness_and_picture(tmp_path, capsys):
    from hooked import circuits
    from hooked.circuits import Circuit

    out = tmp_path / "runs" / "circuit"
    argv = circuit_argv(out, "--method", "eap-ig", "--edges", "30", "--steps", "3")
    assert main(argv) == 0
    assert sorted(path.name for path in out.iterdir()) == CIRCUIT_FILES
    assert sorted(path.name for path in out.parent.iterdir()) == ["circuit"]  # no staging folder left behind

    # The same discovery from the library: the same edges, scores and faithfulness.
    model = hooked.load(IOI_MODEL)
    task = tasks.ioi(6, seed=2)
    metric = metrics.logit_diff(model, task.correct, task.incorrect)
    expected = circuits.discover(model, task.clean, task.corrupt, metric, method="eap-ig", n_edges=30, steps=3)
    saved = Circuit.from_json(out / "circuit.json", model=model)
    assert saved.edges == expected.edges and saved.method == "eap-ig"
    assert saved.scores == pytest.approx(expected.scores, abs=1e-5)
    provenance = saved.provenance
    assert provenance["model"] == IOI_MODEL and provenance["command"] == ["hooked", *argv]
    assert provenance["task"]["clean"] == task.clean and provenance["metric"].startswith("logit_diff")
    assert provenance["circuits"]["method"] == "eap-ig" and provenance["circuits"]["steps"] == 3
    assert provenance["held_out"] == {
        "name": "ioi",
        "n": 6,
        "seed": 12345,
        "split": "heldout names in heldout templates",
    }
    held = tasks.ioi_heldout(6)
    held_metric = metrics.logit_diff(model, held.correct, held.incorrect)
    assert provenance["faithfulness"]["discovery_prompts"] == pytest.approx(expected.faithfulness(), abs=1e-4)
    assert provenance["faithfulness"]["held_out_prompts"] == pytest.approx(
        expected.faithfulness(held.clean, held.corrupt, held_metric), abs=1e-4
    )

    with (out / "circuit-edges.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [row["edge"] for row in rows] == [str(edge) for edge in expected.edges]
    assert [row["source"] + "->" + row["receiver"] for row in rows] == [row["edge"] for row in rows]
    assert [float(row["score"]) for row in rows] == pytest.approx(
        [expected.scores[str(e)] for e in expected.edges], abs=1e-5
    )
    ranks = [int(row["rank"]) for row in rows]
    assert ranks == sorted(ranks) and ranks[0] == 1 and ranks[-1] <= 30  # pruning drops edges from the top 30

    report = json.loads((out / "circuit-faithfulness.json").read_text())
    sizes = [row["size"] for row in report["curve"]]
    assert sizes == [5, 10, 20, 30, 50, 100, 200, 479]  # the defaults, --edges, and the whole graph
    assert report["curve"][-1]["faithfulness"] == pytest.approx(1.0) and report["curve"][-1]["edges"] == 479
    at_30 = report["curve"][sizes.index(30)]
    assert at_30["edges"] == len(expected.edges) and at_30["faithfulness"] == pytest.approx(report["faithfulness"])
    with (out / "circuit-faithfulness.csv").open() as file:
        curve = list(csv.DictReader(file))
    assert [int(row["size"]) for row in curve] == sizes
    assert [float(row["held_out_faithfulness"]) for row in curve] == pytest.approx(
        [row["held_out_faithfulness"] for row in report["curve"]]
    )
    for png in ("circuit.png", "circuit-faithfulness.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / png).stat().st_size > 10_000

    printed = capsys.readouterr().out
    assert f"{len(expected.edges)} of 479 edges" in printed and "held-out prompts, seed 12345" in printed
    for head, inputs in expected.heads.items():
        assert f"  {head:<8} {','.join(inputs)}" in printed
    for name in CIRCUIT_FILES:
        assert str(out / name) in printed


def test_circuit_with_acdc(tmp_path, capsys):
    out = tmp_path / "acdc"
    assert (
        main(
            [
                "circuit",
                IOI_MODEL,
                "--method",
                "acdc",
                "--threshold",
                "1.0",
                "--n",
                "2",
                "--out",
                str(out),
                "--sizes",
                "4",
                "8",
            ]
        )
        == 0
    )
    assert sorted(path.name for path in out.iterdir()) == CIRCUIT_FILES
    data = json.loads((out / "circuit.json").read_text())
    assert data["method"] == "acdc" and data["provenance"]["circuits"]["threshold"] == 1.0
    assert [row["size"] for row in json.loads((out / "circuit-faithfulness.json").read_text())["curve"]] == [4, 8, 479]
    assert "acdc circuit on 2 ioi prompts" in capsys.readouterr().out


@pytest.mark.parametrize(
    "change, message",
    [
        (["--method", "acdc"], "--method acdc needs --threshold"),
        (["--method", "acdc", "--threshold", "0.1", "--edges", "5"], "--edges belongs to --method eap / eap-ig"),
        (["--method", "eap"], "--method eap needs --edges N"),
        (["--method", "eap-ig", "--edges", "5", "--threshold", "0.1"], "--threshold belongs to --method acdc"),
        (["--method", "eap", "--edges", "5", "--steps", "3"], "--steps belongs to --method eap-ig"),
        (["--edges", "0"], "--edges must be at least 1"),
        (["--edges", "5", "--steps", "0"], "--steps must be at least 1"),
        (["--method", "acdc", "--threshold", "-1"], "--threshold must be a finite number > 0"),
        (["--method", "acdc", "--threshold", "0"], "--threshold must be a finite number > 0"),
        (["--method", "acdc", "--threshold", "nan"], "--threshold must be a finite number > 0"),
        (["--edges", "5", "--n", "0"], "--n must be at least 1"),
        (["--edges", "5", "--sizes", "0", "10"], "--sizes must be positive"),
        (["--method", "path"], "invalid choice: 'path'"),
        (["--task", "facts"], "invalid choice: 'facts'"),
        (["--edges", "5000"], "--edges 5000: this model's graph has only 479 edges"),
    ],
)
def test_circuit_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path, capsys, change, message):
    out = tmp_path / "out"
    assert exit_code(circuit_argv(out, *change)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_circuit_leaves_an_existing_folder_as_it_was_on_error(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert exit_code(circuit_argv(out, "--edges", "5000")) == 2
    assert [path.name for path in tmp_path.iterdir()] == ["out"] and [path.name for path in out.iterdir()] == [
        "keep.txt"
    ]
    (tmp_path / "file").write_text("")
    assert exit_code(circuit_argv(tmp_path / "file", "--edges", "5")) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    missing = tmp_path / "no-such-model"
    assert exit_code(["circuit", str(missing), "--edges", "5", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and len(err.strip().splitlines()) == 1
    assert [path.name for path in out.iterdir()] == ["keep.txt"]


# ----------------------------------------------------------------------------- hooked demo
def test_demo_calls_the_demo_entry_point(monkeypatch):
    import hooked.demo

    calls = []
    monkeypatch.setattr(hooked.demo, "main", lambda argv=None: calls.append(argv))
    assert main(["demo", "--model", "gpt2", "--out", "runs/x"]) == 0
    assert main(["demo"]) == 0
    assert calls == [["--model", "gpt2", "--out", "runs/x"], []]


# ----------------------------------------------------------------------------- the shared options
MODEL_HELP = "hub id, checkpoint directory or bundled name (hooked/ioi-gpt2)"
DTYPE_HELP = "the weights' dtype (default float32)"
DEVICE_HELP = "where the model runs: cpu, cuda, cuda:1, ... (default cpu)"
# Each command that reads a model, with the options it shares (help text after the option) and what its --out holds.
SHARED_OPTIONS = {
    "hooks": ({"model": MODEL_HELP}, None),
    "run": (
        {"model": MODEL_HELP, "--dtype {float32,bfloat16,float16}": DTYPE_HELP, "--device DEVICE": DEVICE_HELP},
        None,
    ),
    "sweep": (
        {"model": MODEL_HELP, "--dtype {float32,bfloat16,float16}": DTYPE_HELP, "--device DEVICE": DEVICE_HELP},
        "the CSV, JSON and PNG",
    ),
    "circuit": (
        {"model": MODEL_HELP, "--dtype {float32,bfloat16,float16}": DTYPE_HELP, "--device DEVICE": DEVICE_HELP},
        "the JSON, CSVs and PNGs",
    ),
    "graph": (
        {"model": MODEL_HELP, "--dtype {float32,bfloat16,float16}": DTYPE_HELP, "--device DEVICE": DEVICE_HELP},
        "graph.pt, graph.json and graph.png",
    ),
}


@pytest.mark.parametrize("command", sorted(SHARED_OPTIONS))
def test_every_command_lists_the_shared_options_with_one_help_text(command, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "400")  # argparse wraps at the terminal's width: one line per option
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    options, holds = SHARED_OPTIONS[command]
    for option, help_text in options.items():
        # argparse puts the help after the option, or on the next line where the option is long
        (at,) = [i for i, line in enumerate(lines) if line == option or line.startswith(option + " ")]
        assert help_text in (lines[at], lines[at + 1]) or lines[at].endswith(" " + help_text), lines[at : at + 2]
    listed = [line for line in lines if line.startswith("--out")]
    if holds is None:
        assert listed == []
    else:
        assert len(listed) == 1 and listed[0].startswith("--out DIR ") and listed[0].endswith(f"folder for {holds}")


def test_the_shared_options_parse_as_before():
    from hooked.cli import make_parser

    args = make_parser().parse_args(["sweep", "gpt2", "--components", "heads", "--out", "x"])
    assert (args.model, args.dtype, args.device, args.out) == ("gpt2", "float32", "cpu", "x")
    args = make_parser().parse_args(["run", "--device", "cuda:1", "m", "hi", "--dtype", "bfloat16"])
    assert (args.model, args.prompt, args.dtype, args.device) == ("m", "hi", "bfloat16", "cuda:1")


# ----------------------------------------------------------------------------- closed pipes
@pytest.mark.parametrize(
    "reader, n_layer, unbuffered", [("head -1", 300, False), ("true", 2, False), ("true", 2, True)]
)
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
    result = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command}"], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.stderr == ""
    assert result.stdout == ("" if reader == "true" else result.stdout.splitlines()[0] + "\n")
    assert result.returncode in (0, 1)  # 1: the pipe closed early (Python docs, "Note on SIGPIPE")


def test_help_into_a_closed_pipe_exits_quietly():
    """argparse prints --help and exits; the flush of what it printed must not complain either."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    command = f"{shlex.quote(sys.executable)} -m hooked.cli sweep --help | true"
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300, env=env)
    assert result.stderr == ""
