"""The IOI models bundled with hooked (hooked/bundled/, trained by scripts/train_ioi.py; docs/ioi-models.md).

Every figure here is computed by the test, from `hooked.tasks` prompts and `hooked.metrics`, on the
loaded model; nothing is read from what the training script recorded except the data split, which is
checked against the split written out below.
"""

import json
from pathlib import Path

import pytest
import torch

import hooked
from hooked import metrics, tasks
from hooked.weights import BUNDLED_MODELS, bundled_models, resolve

# The held-out split of scripts/train_ioi.py, written out: these names were never the IO or S of a
# training sentence (tasks.NAMES[4::5]), and these BABA/ABBA template ids never occurred in training.
HELDOUT_NAMES = (
    "Alice",
    "Andy",
    "Blake",
    "Charlie",
    "Collins",
    "David",
    "Eric",
    "Georgia",
    "Jack",
    "Jane",
    "Jessica",
    "Joshua",
    "Kyle",
    "Louis",
    "Maria",
    "Max",
    "Paul",
    "River",
    "Russell",
    "Simon",
    "Thomas",
)
HELDOUT_TEMPLATES = (5, 8, 12, 13)
SEED = 2024  # not the script's evaluation seed: other prompts than the ones it reported on
MAX_BYTES = 10 * 10**6


@pytest.fixture(scope="module", params=BUNDLED_MODELS)
def model(request):
    return hooked.load(request.param)


def _logit_diffs(model, task) -> torch.Tensor:
    metric = metrics.logit_diff(model, task.correct, task.incorrect)
    with torch.no_grad():
        return metric(model(model.to_tokens(task.clean)))


def test_bundled_names_load_from_the_package_without_the_hub(monkeypatch):
    import huggingface_hub

    def no_hub(*args, **kwargs):
        raise AssertionError("a bundled model must not reach the hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_hub)
    package = Path(hooked.__file__).resolve().parent / "bundled"
    assert set(bundled_models()) == set(BUNDLED_MODELS) == {"hooked/ioi-gpt2", "hooked/ioi-qwen3moe"}
    for name, expected_class in (("hooked/ioi-gpt2", hooked.GPT2), ("hooked/ioi-qwen3moe", hooked.Qwen3Moe)):
        assert resolve(name) == package / name.removeprefix("hooked/")
        loaded = hooked.load(name)
        assert type(loaded) is expected_class and loaded.name_or_path == name


def test_an_unknown_bundled_name_lists_the_bundled_ones():
    with pytest.raises(
        hooked.CheckpointError, match=r"'hooked/ioi-gpt3' is not a bundled model.*hooked/ioi-gpt2, hooked/ioi-qwen3moe"
    ):
        hooked.load("hooked/ioi-gpt3")


def test_files_are_small_and_complete():
    for name, directory in bundled_models().items():
        files = {path.name: path.stat().st_size for path in directory.iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files), name
        assert all(size <= MAX_BYTES for size in files.values()), (name, files)


def test_the_recorded_split_is_the_one_tested(model):
    record = json.loads((resolve(model.name_or_path) / "config.json").read_text())["hooked_ioi"]
    assert tuple(record["heldout_names"]) == HELDOUT_NAMES == tasks.NAMES[4::5]
    assert tuple(record["heldout_templates"]) == HELDOUT_TEMPLATES


def test_every_name_is_one_token_and_bos_follows_the_architecture(model):
    ids = [model.to_single_token(" " + name) for name in tasks.NAMES]
    assert len(set(ids)) == len(tasks.NAMES)
    assert model.tokenizer.convert_tokens_to_ids("<|unk|>") not in ids
    assert all(model.to_string([token]) == name for token, name in zip(ids, tasks.NAMES, strict=True))
    prompt = "When Mary and John went to the store, John gave a drink to"
    assert model.to_string(model.to_tokens(prompt, prepend_bos=False)[0]) == prompt
    starts_with_bos = model.to_tokens(prompt)[0, 0].item() == model.tokenizer.bos_token_id
    assert starts_with_bos == isinstance(model, hooked.GPT2)  # Qwen3 prepends no BOS, as it was trained


def test_held_out_names_in_held_out_templates(model):
    task = tasks.ioi(400, seed=SEED, names=HELDOUT_NAMES)
    diff = _logit_diffs(model, task)
    held_out = torch.tensor([template in HELDOUT_TEMPLATES for template in task.per_prompt["template_id"]])
    assert held_out.sum() >= 80
    diff = diff[held_out]
    assert diff.mean() >= 3.0, f"mean logit difference {diff.mean():.2f} on {len(diff)} held-out prompts"
    assert (diff > 0).float().mean() >= 0.95, f"IO above S on {(diff > 0).float().mean():.1%} of {len(diff)} prompts"


def test_held_out_names_in_the_never_trained_store_template(model):
    diff = _logit_diffs(model, tasks.ioi(200, seed=SEED, template="store", names=HELDOUT_NAMES))
    assert diff.mean() >= 3.0 and (diff > 0).float().mean() >= 0.95, (diff.mean(), (diff > 0).float().mean())


def test_generation_answers_and_stops():
    model = hooked.load("hooked/ioi-gpt2")
    prompt = "When Mary and John went to the store, John gave a drink to"
    assert model.generate(prompt, max_new_tokens=5) == prompt + " Mary"


def test_the_moe_model_routes_by_token():
    model = hooked.load("hooked/ioi-qwen3moe")
    task = tasks.ioi(64, seed=SEED, names=HELDOUT_NAMES)
    tokens = model.to_tokens(task.clean)
    real = tokens != model.tokenizer.pad_token_id
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_expert_indices"))
    assert len(cache) == model.cfg.n_layers
    final_sets = {}
    for name, indices in cache.items():  # [batch pos top_k]
        used = torch.bincount(indices[real].reshape(-1), minlength=model.cfg.n_experts)
        assert (used > 0).sum() >= 6, f"{name}: only experts {used.nonzero()[:, 0].tolist()} are ever chosen"
        assert used.max() <= 0.5 * used.sum(), f"{name}: one expert takes {used.max() / used.sum():.0%} of the slots"
        final_sets[name] = len({tuple(sorted(row)) for row in indices[:, -1].tolist()})
    # Every prompt ends with " to": layer 0 routes it alike, later layers by what the prompt holds.
    assert max(final_sets.values()) >= 4, (
        f"distinct expert pairs of the last token across prompts, by layer: {final_sets}"
    )
