"""Loading from the Hugging Face cache by hub id, dtype/device handling, and load-time memory."""

import shutil

import pytest
import torch

import hooked


@pytest.fixture
def hub_cache(gpt2_dir, tmp_path, monkeypatch):
    """A hub cache laid out as huggingface_hub writes it, holding `someone/tiny-gpt2`."""
    from huggingface_hub import constants

    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--tiny-gpt2"
    snapshot = repo / "snapshots" / revision
    shutil.copytree(gpt2_dir, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return tmp_path / "hub"


def test_hub_id_loads_from_the_cache_offline(gpt2, hub_cache, tokens):
    model = hooked.load("someone/tiny-gpt2")
    with torch.no_grad():
        assert torch.equal(model(tokens), gpt2(tokens))
    assert model.tokenizer is not None


def test_unknown_hub_id_offline_says_what_to_do(hub_cache):
    with pytest.raises(hooked.CheckpointError, match="not in the Hugging Face cache.*HF_HUB_OFFLINE"):
        hooked.load("someone/other-model")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_weights_are_read_into_the_requested_dtype(gpt2_dir, dtype):
    model = hooked.load(gpt2_dir, dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert not any(p.is_meta for p in model.parameters())
    assert model.training is False


def test_dtype_may_be_given_by_name(gpt2_dir):
    assert hooked.load(gpt2_dir, dtype="bfloat16").dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        hooked.load(gpt2_dir, dtype="float8")


def test_model_class_must_match_the_checkpoint(gpt2_dir):
    assert isinstance(hooked.GPT2.from_pretrained(gpt2_dir), hooked.GPT2)
    with pytest.raises(hooked.CheckpointError, match="GPT2 checkpoint, not Qwen3"):
        hooked.Qwen3.from_pretrained(gpt2_dir)
