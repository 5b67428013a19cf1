"""hooked.engines.vllm.families without vLLM: what each family's vLLM attention is told (the window per layer),
what compute_logits applies, and the checkpoints refused before an engine starts. The vLLM side
(tests/engines/vllm_engine.py, `make test-vllm`) runs each family on the engine against hooked alone.
"""

import json

import pytest
import torch

from hooked.engines.vllm.families import check_supported, final_softcap, layer_window, logits_from_normed
from hooked.testing import ARCHITECTURES, random_model

POSITIONS = 12  # longer than every random model's window (3 or 4)


def window_in_pattern(pattern: torch.Tensor) -> int | None:
    """The window a layer's pattern [batch head query key] shows: None when every causal key has weight, else the
    w with weight on key j from query i exactly when 0 <= i - j < w (checked on every row)."""
    query, key = torch.arange(POSITIONS)[:, None], torch.arange(POSITIONS)[None, :]
    seen = (pattern > 0).all(0).all(0)  # [query key]: weight on it in every batch row and head
    if torch.equal(seen, key <= query):  # boolean masks: which keys have weight, not values compared
        return None
    width = int(seen[-1].sum())
    assert torch.equal(seen, (key <= query) & (query - key < width)), "not a causal sliding window"
    return width


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_each_layers_window_is_the_one_its_pattern_shows(architecture):
    """layer_window against hooked's own eager pattern: Mistral's and Mixtral's window on every layer, Gemma's on
    its sliding layers only (layer 0 slides, layer 1 is full), none elsewhere."""
    model = random_model(architecture, seed=2)
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.randint(0, model.cfg.d_vocab, (2, POSITIONS)), names_filter=names)
    shown = [window_in_pattern(cache[name]) for name in names]
    assert [layer_window(model.cfg, layer) for layer in range(model.cfg.n_layers)] == shown
    if architecture in ("gemma2", "gemma3"):
        assert shown[0] is not None and shown[1] is None  # the case a window on every layer would get wrong


@pytest.mark.parametrize("architecture", ["gemma2", "gemma3", "llama", "gpt2"])
def test_logits_from_the_final_norm_are_logits_from_resid(architecture):
    """compute_logits' path equals the model's own logits_from_resid, cap included. Exact: the same final norm output,
    the same F.linear and the same in-place softcap_, in the same order."""
    model = random_model(architecture, seed=3)
    resid = torch.randn(2, 5, model.cfg.d_model)
    with torch.no_grad():
        expected = model.logits_from_resid(resid)
        normed = model.ln_final(resid)
        assert torch.equal(logits_from_normed(model, normed, final_softcap(model)), expected)
        if architecture.startswith("gemma"):  # the cap bites here, so leaving it out could not pass
            assert (logits_from_normed(model, normed, None) - expected).abs().max() > 1e-2


def test_a_family_whose_logits_from_resid_is_unknown_is_refused():
    model = random_model("llama")

    class Scaled(type(model)):
        def logits_from_resid(self, resid, columns=None):
            return 2 * super().logits_from_resid(resid, columns)

    model.__class__ = Scaled
    with pytest.raises(NotImplementedError, match="Scaled.logits_from_resid changes the logits"):
        final_softcap(model)


LLAMA = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    hidden_size=64,
    num_attention_heads=2,
    num_key_value_heads=2,
    intermediate_size=96,
    num_hidden_layers=2,
    vocab_size=320,
)


def checkpoint(tmp_path, name, **config):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_checkpoints_refused_before_an_engine_starts(tmp_path):
    check_supported(checkpoint(tmp_path, "llama", **LLAMA))
    mistral = {**LLAMA, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 6}
    check_supported(checkpoint(tmp_path, "mistral", **mistral))
    # Llama reads no sliding_window (as transformers' Llama): vLLM would impose it on every layer
    with pytest.raises(NotImplementedError, match="would give it the checkpoint's sliding_window 6"):
        check_supported(checkpoint(tmp_path, "llama_window", **LLAMA, sliding_window=6))
    bloom = {**LLAMA, "architectures": ["BloomForCausalLM"], "model_type": "bloom"}
    with pytest.raises(ValueError, match="hooked on vLLM runs .* holds BloomForCausalLM"):
        check_supported(checkpoint(tmp_path, "bloom", **bloom))
