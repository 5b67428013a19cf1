"""The sparse dictionaries bundled with the IOI models (hooked/bundled/<model>/saes/, trained by
scripts/train_saes.py; docs/saes.md, "Bundled dictionaries"): they load by name, splice into their model as their
weights say, load in SAELens 6.54 with the same outputs, and reproduce the evaluation table docs/saes.md prints,
which meets the bounds it states; a reduced rerun of the script reaches those bounds (slow). Also the set layout
(per-layer SAELens directories layer_0/, layer_1/, ...) that hooked.sae.load and save read and write."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import hooked
import hooked.sae
from hooked import metrics, tasks

from .dictionaries import explicit_acts, random_dictionary, replacing

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "saes.md"
SAE = "hooked/ioi-gpt2/saes/blocks.2.hook_resid_post"
SETS = {
    "hooked/ioi-gpt2": "hooked/ioi-gpt2/saes/transcoders",
    "hooked/ioi-qwen3moe": "hooked/ioi-qwen3moe/saes/transcoders",
}
# scripts/train_saes.py's held-out prompts, written out: tasks.ioi(EVAL_PAIRS, seed) of the mixed templates and a
# quarter as many of the store template, each clean prompt with its answer and each corrupt one with its own
EVAL_SEED, EVAL_PAIRS = 2029, 250
COLUMNS = (
    "d_sae", "l0", "fvu", "ce_clean", "ce_spliced", "ce_zero_ablated", "loss_recovered", "dead_features",
    "dense_features", "logit_diff_clean", "logit_diff_spliced",
)  # fmt: skip
BOUND_ROWS = {  # docs/saes.md's bounds table: row label -> key
    "L0 at most": "l0_max",
    "FVU at most": "fvu_max",
    "CE spliced - CE clean at most (nats)": "ce_increase_max",
    "loss recovered at least (where zeroing the point costs at least 1 nat)": "loss_recovered_min",
    "logit diff spliced / logit diff clean at least": "logit_diff_ratio_min",
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Many small forwards: on a busy shared machine torch's thread pool waits on its barrier longer than such a
    forward computes (tests/sae/test_training.py does the same), so these run on one thread (restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- what docs/saes.md says
def section() -> str:
    text = DOCS.read_text()
    start = text.index("## Bundled dictionaries")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def docs_table() -> dict[str, dict[str, str]]:
    """The evaluation table: row name -> column -> the printed value (a string, to know its precision)."""
    rows = {}
    for line in section().splitlines():
        parts = cells(line) if line.startswith("| `hooked/") else []
        if len(parts) == len(COLUMNS) + 1:
            rows[parts[0].strip("`")] = dict(zip(COLUMNS, parts[1:], strict=True))
    return rows


def docs_bounds() -> dict[str, dict[str, float]]:
    bounds = {"dictionary": {}, "set": {}}
    for line in section().splitlines():
        parts = cells(line)
        if parts[0] in BOUND_ROWS:
            for kind, value in zip(("dictionary", "set"), parts[1:], strict=True):
                if value != "-":
                    bounds[kind][BOUND_ROWS[parts[0]]] = float(value)
    return bounds


def close(printed: str, value: float | None) -> bool:
    """`value` is `printed` to its last printed digit (one unit of slack for another machine's rounding)."""
    if printed == "-":
        return value is None
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(float(printed) - value) <= 10**-decimals


def meets(row: dict[str, float], bounds: dict) -> list[str]:
    """The bounds a row (floats; fvu None for a whole set) misses, checked here from the docs' own table."""
    limits = bounds["set" if row["fvu"] is None else "dictionary"]
    missed = []
    if row["fvu"] is not None and row["l0"] > limits["l0_max"]:
        missed.append("l0")
    if row["fvu"] is not None and row["fvu"] > limits["fvu_max"]:
        missed.append("fvu")
    if row["ce_spliced"] - row["ce_clean"] > limits["ce_increase_max"]:
        missed.append("ce")
    if row["ce_zero_ablated"] - row["ce_clean"] >= 1 and row["loss_recovered"] < limits["loss_recovered_min"]:
        missed.append("loss recovered")
    if row["logit_diff_spliced"] < limits["logit_diff_ratio_min"] * row["logit_diff_clean"]:
        missed.append("logit diff")
    return missed


def script():
    spec = importlib.util.spec_from_file_location("train_saes", ROOT / "scripts" / "train_saes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def heldout() -> tuple[list[str], tasks.Task]:
    texts, parts = [], []
    for template, count in (("mixed", EVAL_PAIRS), ("store", EVAL_PAIRS // 4)):
        task = tasks.ioi(count, seed=EVAL_SEED, template=template)
        texts += [p + a for p, a in zip(task.clean, task.correct, strict=True)]
        texts += [p + a for p, a in zip(task.corrupt, task.incorrect, strict=True)]
        parts.append(task)
    joined = tasks.Task(
        "ioi", *(getattr(parts[0], f) + getattr(parts[1], f) for f in ("clean", "corrupt", "correct", "incorrect")),
        EVAL_SEED, {},
    )  # fmt: skip
    return texts, joined


# ----------------------------------------------------------------------------- loading
def test_the_bundled_dictionaries_load_by_name():
    assert set(hooked.sae.bundled_saes()) == {SAE, *SETS.values()}
    sae = hooked.sae.load(SAE)
    assert (sae.hook_name, sae.cfg.hook_name_out, sae.cfg.architecture, sae.cfg.d_sae, sae.cfg.k) == (
        "blocks.2.hook_resid_post", None, "topk", 512, 8,
    )  # fmt: skip
    for model_name, name in SETS.items():
        layers = hooked.sae.load(name)
        assert [(d.hook_name, d.hook_name_out) for d in layers] == [
            (f"blocks.{i}.mlp.hook_in", f"blocks.{i}.hook_mlp_out") for i in range(4)
        ]
        assert all(d.cfg.architecture == "jumprelu" and d.cfg.d_sae == 256 for d in layers)
        assert all(d.cfg.metadata["model_name"] == model_name for d in layers)
        one = hooked.sae.load(f"{name}/layer_2")  # a layer by name, the same weights as in the set
        path = hooked.sae.bundled_saes()[name] / "layer_2"
        for got in (one, hooked.sae.load(path)):  # exact: the same file's tensors, read twice
            assert torch.equal(got.W_enc, layers[2].W_enc) and torch.equal(got.threshold, layers[2].threshold)
    total = sum(f.stat().st_size for f in (ROOT / "hooked" / "bundled").glob("*/saes/**/*") if f.is_file())
    assert total < 3.5e6  # docs/saes.md: 2.7 MB in all
    with pytest.raises(FileNotFoundError, match="bundled ones are: hooked/ioi-gpt2/saes/blocks.2.hook_resid_post"):
        hooked.sae.load("hooked/ioi-gpt2/saes/blocks.3.hook_resid_post")


@pytest.mark.parametrize("model_name", list(SETS))
def test_the_shipped_transcoders_splice_into_their_model_as_their_weights_say(model_name):
    """Every MLP (Qwen3-MoE: every mixture-of-experts block) replaced at once equals the same replacement written in
    plain torch on the weights (tests/sae/dictionaries.py); with the error term the logits are the model's own."""
    model = hooked.load(model_name)
    layers = hooked.sae.load(SETS[model_name], model=model)
    tokens, mask = model.tokens_and_mask(tasks.ioi(6, seed=3).clean, None, None)
    with torch.no_grad():
        clean = model(tokens, attention_mask=mask)
        spliced, cache = model.run_with_cache_with_saes(tokens, saes=layers, attention_mask=mask)
        by_hand = model.run_with_hooks(
            tokens, attention_mask=mask, fwd_hooks=[pair for d in layers for pair in replacing(d)]
        )
        kept = model.run_with_saes(tokens, saes=layers, use_error_term=True, attention_mask=mask)
    torch.testing.assert_close(spliced[mask], by_hand[mask], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kept[mask], clean[mask], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(spliced[mask], clean[mask], atol=1e-2)
    acts = cache["blocks.0.hook_mlp_out.hook_sae_acts_post"][mask]
    assert 1 <= (acts > 0).sum(-1).float().mean() <= 16


def test_saelens_loads_the_shipped_dictionaries_with_the_same_outputs():
    from sae_lens import SAE as SAELensSAE

    from hooked.sae.formats import resolve

    shipped = {
        "hooked/ioi-gpt2": [SAE, f"{SETS['hooked/ioi-gpt2']}/layer_0"],
        "hooked/ioi-qwen3moe": [f"{SETS['hooked/ioi-qwen3moe']}/layer_3"],
    }
    for model_name, names in shipped.items():
        model = hooked.load(model_name)
        tokens, mask = model.tokens_and_mask(heldout()[0][:64], None, None)
        for name in names:
            ours = hooked.sae.load(name)
            _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=[ours.hook_name])
            peer = SAELensSAE.load_from_disk(resolve(name))
            assert type(peer).__name__ == ("TopKSAE" if name == SAE else "JumpReLUTranscoder")
            assert peer.cfg.metadata.hook_name == ours.hook_name  # these points have TransformerLens' names
            x = cache[ours.hook_name][mask]
            with torch.no_grad():
                torch.testing.assert_close(peer.encode(x), ours.encode(x), rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(peer(x), ours(x), rtol=1e-5, atol=1e-5)
                assert (peer.encode(x) > 0).sum(-1).float().mean() > 1


# ----------------------------------------------------------------------------- the docs' table
@pytest.fixture(scope="module")
def table() -> dict[str, dict[str, str]]:
    return docs_table()


def test_the_docs_state_the_scripts_bounds_and_its_table_is_the_recorded_one(table):
    module = script()
    assert docs_bounds() == module.BOUNDS
    assert (module.EVAL_SEED, module.settings(small=False)["eval_prompts"]) == (EVAL_SEED, EVAL_PAIRS)
    recorded = {}
    for model_name in SETS:
        record = json.loads((hooked.weights.bundled_models()[model_name] / "saes" / "evaluation.json").read_text())
        assert record["eval_seed"] == EVAL_SEED and record["settings"]["eval_prompts"] == EVAL_PAIRS
        assert record["command"] == "python scripts/train_saes.py" and record["bounds"] == module.BOUNDS
        recorded |= {f"{model_name}/saes/{row['dictionary']}": row for row in record["rows"]}
    assert set(table) == set(recorded) and len(table) == 11
    for name, row in table.items():
        for column in COLUMNS:
            assert close(row[column], recorded[name][column]), (name, column, row[column], recorded[name][column])


@pytest.mark.parametrize("model_name", list(SETS))
def test_evaluating_the_shipped_files_reproduces_the_docs_table(model_name, table):
    """hooked.sae.evaluate's columns, the IOI logit differences by hooked.metrics, and each set spliced whole with
    its cross-entropy taken from the logits here; every figure as the docs print it."""
    model = hooked.load(model_name)
    texts, task = heldout()
    names = ([SAE] if model_name == "hooked/ioi-gpt2" else []) + [SETS[model_name]]
    metric = metrics.logit_diff(model, task.correct, task.incorrect)
    prompts, prompt_mask = model.tokens_and_mask(task.clean, None, None)
    tokens, mask = model.tokens_and_mask(texts, None, None)
    with torch.no_grad():
        clean_diff = metric(model(prompts, attention_mask=prompt_mask)).mean().item()
        for name in names:
            loaded = hooked.sae.load(name)
            ds = loaded if isinstance(loaded, list) else [loaded]
            rows = hooked.sae.evaluate(model, ds, texts)
            for index, (d, row) in enumerate(zip(ds, rows, strict=True)):
                spliced = metric(model.run_with_saes(prompts, saes=[d], attention_mask=prompt_mask)).mean().item()
                got = {
                    **row, "logit_diff_clean": clean_diff, "logit_diff_spliced": spliced,
                }  # fmt: skip
                label = name if len(ds) == 1 else f"{name}/layer_{index}"
                for column in COLUMNS:
                    assert close(table[label][column], got[column]), (label, column, table[label][column], got[column])
                assert not meets({k: float(v) for k, v in got.items() if k in COLUMNS}, docs_bounds())
            if len(ds) > 1:
                whole = _whole_set(model, ds, tokens, mask, metric, prompts, prompt_mask)
                whole |= {"ce_clean": rows[0]["ce_clean"], "logit_diff_clean": clean_diff, "fvu": None}
                whole["loss_recovered"] = (whole["ce_zero_ablated"] - whole["ce_spliced"]) / (
                    whole["ce_zero_ablated"] - whole["ce_clean"]
                )
                label = f"{name} (all {len(ds)} layers at once)"
                for column in ("ce_spliced", "ce_zero_ablated", "loss_recovered", "logit_diff_spliced"):
                    assert close(table[label][column], whole[column]), (label, column, table[label][column])
                assert close(table[label]["l0"], sum(row["l0"] for row in rows))
                assert not meets(whole | {"l0": 0.0}, docs_bounds())


def _whole_set(model, ds, tokens, mask, metric, prompts, prompt_mask) -> dict[str, float]:
    """Cross-entropy over the real next-token pairs with every layer of `ds` spliced, and with every MLP output
    zeroed, from the logits; the logit difference with them spliced."""
    zero = [(d.hook_name_out, lambda x, hook: torch.zeros_like(x)) for d in ds]
    losses = {"ce_spliced": [], "ce_zero_ablated": []}
    for start in range(0, len(tokens), 64):
        rows, real = tokens[start : start + 64], mask[start : start + 64]
        pairs = real[:, :-1] & real[:, 1:]
        for key, logits in (
            ("ce_spliced", model.run_with_saes(rows, saes=ds, attention_mask=real)),
            ("ce_zero_ablated", model.run_with_hooks(rows, fwd_hooks=zero, attention_mask=real)),
        ):
            per_token = F.cross_entropy(logits[:, :-1].transpose(1, 2).double(), rows[:, 1:], reduction="none")
            losses[key].append(per_token[pairs])
    out = {key: torch.cat(values).mean().item() for key, values in losses.items()}
    out["logit_diff_spliced"] = metric(model.run_with_saes(prompts, saes=ds, attention_mask=prompt_mask)).mean().item()
    return out


@pytest.mark.slow
def test_the_script_reaches_the_docs_bounds_at_reduced_size(tmp_path):
    run = subprocess.run(
        [sys.executable, "scripts/train_saes.py", "--small", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    bounds = docs_bounds()
    for model_name in SETS:
        saes = tmp_path / model_name.removeprefix("hooked/") / "saes"
        record = json.loads((saes / "evaluation.json").read_text())
        assert record["settings"]["n_tokens"] < 600_000  # the reduced run
        assert len(record["rows"]) == (6 if model_name == "hooked/ioi-gpt2" else 5)
        for row in record["rows"]:
            assert not meets(row, bounds), (model_name, row["dictionary"], row)
        layers = hooked.sae.load(saes / "transcoders")
        assert [d.hook_name_out for d in layers] == [f"blocks.{i}.hook_mlp_out" for i in range(4)]


# ----------------------------------------------------------------------------- the set layout
def _set(n: int = 3) -> list:
    return [
        random_dictionary(16, f"blocks.{i}.mlp.hook_in", hook_name_out=f"blocks.{i}.hook_mlp_out",
                          architecture="jumprelu", seed=i)
        for i in range(n)
    ]  # fmt: skip


def test_a_set_saves_as_per_layer_saelens_directories_and_loads_back_in_layer_order(tmp_path):
    from sae_lens import SAE as SAELensSAE

    layers = _set()
    assert hooked.sae.save(layers, tmp_path / "set") == tmp_path / "set"
    assert sorted(p.name for p in (tmp_path / "set").iterdir()) == ["layer_0", "layer_1", "layer_2"]
    (tmp_path / "set" / "notes").mkdir()  # anything else in the directory is not a layer
    back = hooked.sae.load(tmp_path / "set")
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(1))
    for i, (d, got) in enumerate(zip(layers, back, strict=True)):
        assert got.hook_name == f"blocks.{i}.mlp.hook_in"
        peer = SAELensSAE.load_from_disk(tmp_path / "set" / f"layer_{i}")
        with torch.no_grad():
            torch.testing.assert_close(got.encode(x), explicit_acts(d, x))
            torch.testing.assert_close(peer.encode(x), explicit_acts(d, x), rtol=1e-5, atol=1e-6)


@pytest.mark.unchecked  # a list holding a non-dictionary, deliberately: save's own check must name it
def test_a_bad_set_is_refused(tmp_path):
    layers = _set()
    with pytest.raises(ValueError, match="at index 0 but reads or writes another layer"):
        hooked.sae.save(layers[1:], tmp_path / "shifted")
    assert not (tmp_path / "shifted").exists()  # refused before anything is written
    hooked.sae.save(layers, tmp_path / "set")
    with pytest.raises(ValueError, match="per-layer dictionaries, each naming its own points"):
        hooked.sae.load(tmp_path / "set", hook_name="blocks.0.hook_resid_post")
    for path in (tmp_path / "set" / "layer_1").iterdir():
        path.unlink()
    (tmp_path / "set" / "layer_1").rmdir()
    with pytest.raises(ValueError, match="but not layer_1"):
        hooked.sae.load(tmp_path / "set")
    with pytest.raises(TypeError, match="list of hooked.sae dictionaries"):
        hooked.sae.save([layers[0], "not a dictionary"], tmp_path / "mixed")


def test_the_bundled_set_in_circuit_tracers_form_loads_back_the_same(tmp_path):
    layers = hooked.sae.load(SETS["hooked/ioi-gpt2"])
    hooked.sae.save(layers, tmp_path / "ct", format="circuit-tracer")
    assert (tmp_path / "ct" / "config.yaml").exists()
    back = hooked.sae.load(tmp_path / "ct")
    x = torch.randn(7, 128, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for d, got in zip(layers, back, strict=True):
            assert (got.hook_name, got.hook_name_out) == (d.hook_name, d.hook_name_out)
            torch.testing.assert_close(got(x), d(x))


def test_texts_here_are_the_scripts():
    """The held-out prompts written out above are the ones the script evaluates on."""
    texts, task = script().ioi_texts(EVAL_SEED, EVAL_PAIRS)
    assert texts == heldout()[0] and task.clean == heldout()[1].clean
    assert re.fullmatch(r".* to \w+", texts[0]) and len(texts) == 2 * (EVAL_PAIRS + EVAL_PAIRS // 4)
