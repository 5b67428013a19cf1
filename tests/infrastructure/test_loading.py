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
        assert torch.equal(model(tokens), gpt2(tokens))  # exact: the same weights through the same forward
    assert model.tokenizer is not None


def test_unknown_hub_id_offline_says_what_to_do(hub_cache):
    with pytest.raises(hooked.CheckpointError, match="not in the Hugging Face cache.*HF_HUB_OFFLINE"):
        hooked.load("someone/other-model")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_weights_are_read_into_the_requested_dtype(gpt2_dir, dtype):
    model = hooked.load(gpt2_dir, dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert not any(p.is_meta for p in model.parameters())
    assert model.training is False


def test_dtype_may_be_given_by_name(gpt2_dir):
    assert hooked.load(gpt2_dir, dtype="bfloat16").dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        hooked.load(gpt2_dir, dtype="float8")


def test_float64_loads_as_model_to_float64_computes(gpt2_dir, tokens):
    """float64 (a reference for float32 and the kernels) loads, and computes what converting after loading does:
    the file's float32 values widen exactly either way and both run the same float64 kernels, hence equality."""
    model = hooked.load(gpt2_dir, dtype=torch.float64)
    converted = hooked.load(gpt2_dir).to(torch.float64)
    assert hooked.load(gpt2_dir, dtype="float64").dtype == torch.float64
    with torch.no_grad():
        logits = model(tokens)
        assert logits.dtype == torch.float64
        assert torch.equal(logits, converted(tokens))


def test_model_class_must_match_the_checkpoint(gpt2_dir):
    assert isinstance(hooked.GPT2.from_pretrained(gpt2_dir), hooked.GPT2)
    with pytest.raises(hooked.CheckpointError, match="GPT2 checkpoint, not Qwen3"):
        hooked.Qwen3.from_pretrained(gpt2_dir)


def _malformed_copies(original: bytes):
    """(description, file bytes): one-byte header mutations, truncations and edited headers."""
    import json
    import random

    length = int.from_bytes(original[:8], "little")
    header = json.loads(original[8 : 8 + length])
    data = original[8 + length :]
    rng = random.Random(0)
    for _ in range(150):
        position = rng.randrange(8 + length)
        mutated = bytearray(original)
        mutated[position] = rng.randrange(256)
        yield f"byte {position} -> {mutated[position]}", bytes(mutated)
    for cut in (4, 8, 20, 8 + length // 2, 8 + length, 8 + length + 1, len(original) // 2, len(original) - 1):
        yield f"truncated to {cut} bytes", original[:cut]
    tensors = [key for key in header if key != "__metadata__"]
    first = min(tensors, key=lambda key: header[key]["data_offsets"][0])

    def edited(describe, change):
        copy = json.loads(json.dumps(header))
        change(copy)
        text = json.dumps(copy).encode()
        return describe, len(text).to_bytes(8, "little") + text + data

    def shift(copy, key, by):
        copy[key]["data_offsets"] = [n + by for n in copy[key]["data_offsets"]]

    yield edited("offsets shifted to start at -8", lambda c: shift(c, first, -8))
    yield edited("offsets shifted into the next tensor", lambda c: shift(c, first, 4))
    yield edited("negative shape", lambda c: c[first].update(shape=[-1, *c[first]["shape"][1:]]))
    yield edited("float offsets", lambda c: c[first].update(data_offsets=[float(n) for n in c[first]["data_offsets"]]))
    yield edited("unknown dtype", lambda c: c[first].update(dtype="F12"))
    yield edited("a tensor dropped (a hole)", lambda c: c.pop(first))
    yield edited("not an object", lambda c: c.clear())
    yield "a list for a header", (2).to_bytes(8, "little") + b"[]" + data
    yield "a 2**40-byte header", (2**40).to_bytes(8, "little") + original[8:]


def test_every_malformed_safetensors_file_is_refused_or_read_right(gpt2, gpt2_dir, tmp_path, tokens):
    """Header mutations are refused with CheckpointError (never another exception), or, when the
    mutation is harmless (a space in the JSON, a metadata value), load exactly the original weights."""
    original = (gpt2_dir / "model.safetensors").read_bytes()
    directory = tmp_path / "malformed"
    shutil.copytree(gpt2_dir, directory)
    with torch.no_grad():
        expected = gpt2(tokens)
    outcomes = {"refused": 0, "read right": 0}
    for description, content in _malformed_copies(original):
        (directory / "model.safetensors").write_bytes(content)
        try:
            model = hooked.load(directory)
        except hooked.CheckpointError:
            outcomes["refused"] += 1
            continue
        with torch.no_grad():
            # exact: the original weights run the same forward; any other weight shows
            assert torch.equal(model(tokens), expected), f"{description}: loaded silently with other weights"
        outcomes["read right"] += 1
    assert outcomes["refused"] > 140, outcomes
