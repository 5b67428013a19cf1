"""TransformerLens' model names (hooked.aliases): resolved to their hub ids before the hub cache is read.

The cache is laid out as huggingface_hub writes it (as tests/infrastructure/test_loading.py does), offline, holding the
tiny GPT-2 under TransformerLens' official name "gpt2" and a tiny Qwen3 under "Qwen/Qwen3-0.6B".
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch

import hooked
from hooked.transformer_lens.aliases import TRANSFORMER_LENS_NAMES, hub_id, nearest
from hooked.weights import resolve
from tests.transformer_lens.tl_reference import save_grouped_qwen3

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from transformer_lens.supported_models import MODEL_ALIASES, OFFICIAL_MODEL_NAMES


def put_in_cache(hub: Path, repo_id: str, directory: Path) -> None:
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(directory, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("qwen3")
    save_grouped_qwen3(directory, n_layers=1)
    return directory


@pytest.fixture
def hub_cache(gpt2_dir, qwen3_dir, tmp_path, monkeypatch):
    from huggingface_hub import constants

    put_in_cache(tmp_path / "hub", "gpt2", gpt2_dir)
    put_in_cache(tmp_path / "hub", "Qwen/Qwen3-0.6B", qwen3_dir)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)  # no local directory of these names
    return tmp_path / "hub"


def test_aliases_load_their_hub_id_from_the_cache(gpt2, hub_cache, tokens):
    for name in ("gpt2-small", "GPT2-Small", "gpt2"):
        model = hooked.load(name)
        assert isinstance(model, hooked.GPT2) and model.name_or_path == "gpt2"  # provenance: the hub id
        with torch.no_grad():
            assert torch.equal(model(tokens), gpt2(tokens))  # the same weights through the same forward
    assert resolve("gpt2-small", config_only=True) == resolve("gpt2")  # what `hooked hooks gpt2-small` reads
    for name in ("qwen3-0.6b", "qwen/qwen3-0.6b", "Qwen/Qwen3-0.6B"):
        model = hooked.load(name)
        assert isinstance(model, hooked.Qwen3) and model.name_or_path == "Qwen/Qwen3-0.6B"


def test_from_pretrained_takes_transformer_lens_names(hub_cache):
    model = hooked.HookedTransformer.from_pretrained("gpt2-small")
    assert isinstance(model, hooked.GPT2) and model.name_or_path == "gpt2" and model.processing["fold_ln"]
    assert isinstance(hooked.HookedTransformer.from_pretrained_no_processing("qwen3-0.6b"), hooked.Qwen3)


def test_a_local_directory_of_that_name_wins(hub_cache, qwen3_dir):
    shutil.copytree(qwen3_dir, "gpt2-small")
    model = hooked.load("gpt2-small")
    assert isinstance(model, hooked.Qwen3) and model.name_or_path == "gpt2-small"


def test_an_unknown_name_suggests_the_nearest_transformer_lens_names(hub_cache):
    with pytest.raises(
        hooked.CheckpointError, match=r"'gpt2-smal' is not a local directory.*did you mean 'gpt2-small'"
    ):
        hooked.load("gpt2-smal")
    with pytest.raises(hooked.CheckpointError, match=r"did you mean 'qwen3-0\.6b'"):
        hooked.load("qwen3-0.6")
    with pytest.raises(hooked.CheckpointError) as raised:
        hooked.load("someone/unrelated-model")
    assert "did you mean" not in str(raised.value)


def test_an_alias_not_in_the_cache_names_its_hub_id(hub_cache):
    with pytest.raises(
        hooked.CheckpointError,
        match=r"'distil-gpt2' \(TransformerLens' name for hub id 'distilgpt2'\)"
        r" is not a local directory and is not in the Hugging Face cache",
    ):
        hooked.load("distil-gpt2")


def test_names_are_transformer_lens_3_9s():
    """Every name is TransformerLens', with exactly its aliases; the names of the implemented families TransformerLens
    lists
    are all here except the Stanford CRFM GPT-2s (refused: reorder_and_upcast_attn, revisions as checkpoints)."""
    for official, aliases in TRANSFORMER_LENS_NAMES.items():
        assert official in OFFICIAL_MODEL_NAMES
        assert list(aliases) == MODEL_ALIASES.get(official, [])
        for name in (official, *aliases):
            assert hub_id(name) == hub_id(name.upper()) == official
    prefixes = (
        "meta-llama/",
        "codellama/",
        "mistralai/mistral-",
        "mistralai/mixtral-",
        "eleutherai/pythia",
        "eleutherai/gpt-neox",
    )
    families = [
        name
        for name in OFFICIAL_MODEL_NAMES
        if "gpt2" in name.lower() or "qwen3" in name.lower() or name.lower().startswith(prefixes)
    ]
    missing = [
        name for name in families if name not in TRANSFORMER_LENS_NAMES and not name.startswith("stanford-crfm/")
    ]
    assert missing == []
    assert hub_id("openai-community/gpt2") is None  # a hub id of its own, downloaded as given
    assert nearest("gpt-2-small")[0] == "gpt2-small" and nearest("falcon-7b") == []
