"""Bad input: each case raises a clear error and leaves nothing behind (no hook, no model)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import hooked
from hooked.cli import main as cli_main


def test_token_id_out_of_vocabulary(gpt2):
    with pytest.raises(ValueError, match=r"token id 320 is out of range.*320"):
        gpt2(torch.tensor([[1, 2, 320]]))
    with pytest.raises(ValueError, match="token id -1"):
        gpt2(torch.tensor([[-1, 2]]))


def test_sequence_longer_than_the_position_embeddings(gpt2):
    with pytest.raises(ValueError, match="65 positions.*only 64"):
        gpt2(torch.zeros(1, 65, dtype=torch.long))


def test_empty_input(gpt2):
    with pytest.raises(ValueError, match="empty input"):
        gpt2(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="nothing to run"):
        gpt2("", prepend_bos=False)
    with pytest.raises(TypeError, match="empty list"):
        gpt2([])


@pytest.mark.unchecked
def test_float_tokens_and_bad_masks(gpt2):
    with pytest.raises(TypeError, match="integer"):
        gpt2(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        gpt2(torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 4))
    with pytest.raises(ValueError, match="no real token"):
        gpt2(torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.tensor([[1, 1, 1], [0, 0, 0]]))


def test_hooks_are_removed_after_a_bad_input(gpt2):
    with pytest.raises(ValueError):
        gpt2.run_with_hooks(torch.tensor([[999]]), fwd_hooks=[("hook_embed", lambda x, h: None)])
    with pytest.raises(ValueError):
        gpt2.run_with_cache(torch.tensor([[999]]))
    # the autouse fixture in conftest.py asserts that no hook is left registered


@pytest.fixture
def broken_dir(gpt2_dir, tmp_path):
    directory = tmp_path / "broken"
    shutil.copytree(gpt2_dir, directory)
    return directory


def rewrite(directory, edit):
    state = load_file(directory / "model.safetensors")
    edit(state)
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})


def test_unknown_architecture_names_the_supported_ones(broken_dir):
    config = json.loads((broken_dir / "config.json").read_text())
    config.update(architectures=["FalconForCausalLM"], model_type="falcon")
    (broken_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(hooked.CheckpointError, match=r"FalconForCausalLM.*not supported.*GPT2LMHeadModel"):
        hooked.load(broken_dir)


def test_missing_tensor(broken_dir):
    rewrite(broken_dir, lambda state: state.pop("transformer.h.1.mlp.c_fc.weight"))
    with pytest.raises(hooked.CheckpointError, match=r"missing tensors: \['blocks.1.mlp.c_fc.weight'\]"):
        hooked.load(broken_dir)


def test_unexpected_tensor(broken_dir):
    rewrite(broken_dir, lambda state: state.__setitem__("transformer.h.0.attn.q_attn.weight", torch.zeros(2)))
    with pytest.raises(hooked.CheckpointError, match=r"unexpected tensors: \['transformer.h.0.attn.q_attn.weight'\]"):
        hooked.load(broken_dir)


def test_mis_shaped_tensor(broken_dir):
    rewrite(broken_dir, lambda state: state.__setitem__("transformer.wpe.weight", torch.zeros(32, 64)))
    with pytest.raises(
        hooked.CheckpointError, match=r"transformer.wpe.weight: \(32, 64\) in the file, \(64, 64\) expected"
    ):
        hooked.load(broken_dir)


def test_truncated_safetensors_file(broken_dir):
    path = broken_dir / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(hooked.CheckpointError, match="truncated"):
        hooked.load(broken_dir)


def test_missing_shard(gpt2_dir, tmp_path):
    directory = tmp_path / "no-shard"
    shutil.copytree(gpt2_dir, directory)
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"transformer.wte.weight": "model-00001-of-00002.safetensors"}})
    )
    with pytest.raises(hooked.CheckpointError, match="missing"):
        hooked.load(directory)


def test_not_a_directory_nor_cached_hub_id(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(hooked.CheckpointError, match="not in the Hugging Face cache"):
        hooked.load("someone/not-a-model")


def test_cli_reports_errors_without_a_traceback(tmp_path, capsys):
    assert cli_main(["hooks", str(tmp_path)]) == 2
    assert "config.json" in capsys.readouterr().err


@pytest.mark.unchecked
def test_unknown_return_type_is_refused_before_running(gpt2):
    with pytest.raises(ValueError, match="return_type"):
        gpt2(torch.tensor([[1, 2]]), return_type="logit")
