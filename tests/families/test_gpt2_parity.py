"""GPT-2 against transformers' GPT2LMHeadModel: logits and every residual stream.

Float32 is bit-exact on both attention paths (SDPA when nothing reads the pattern, eager when
something does) because the forward copies transformers 5.24 `modeling_gpt2.py`'s operation order.
"""

import json

import pytest
import torch
import transformers  # the reference implementation (the dev extra): a missing one is a failure, not a skip
from safetensors.torch import load_file, save_file

import hooked
from hooked.testing import build_gpt2_checkpoint
from tests.families.parity import read_pattern


def hf_model(directory, attn_implementation, dtype=torch.float32):
    model = transformers.GPT2LMHeadModel.from_pretrained(
        directory, attn_implementation=attn_implementation, dtype=dtype
    )
    return model.eval()


def hf_block_outputs(model, tokens, **kwargs):
    """Logits and every block output (= resid_post), from forward hooks on HF's blocks.

    use_cache=False: with a cache HF copies k and v into contiguous buffers, and the eager matmul on
    contiguous keys rounds differently from the one on views of the fused projection.
    """
    outputs = []
    handles = [
        block.register_forward_hook(lambda m, i, o: outputs.append(o[0] if isinstance(o, tuple) else o))
        for block in model.transformer.h
    ]
    try:
        with torch.no_grad():
            logits = model(tokens, use_cache=False, **kwargs).logits
    finally:
        for handle in handles:
            handle.remove()
    return logits, outputs


@pytest.mark.parametrize("path, hf_implementation", [("sdpa", "sdpa"), ("eager", "eager")])
def test_float32_bit_exact(gpt2, gpt2_dir, tokens, path, hf_implementation):
    reference_logits, reference_resid = hf_block_outputs(
        hf_model(gpt2_dir, hf_implementation),
        tokens,
    )
    fwd_hooks = [(lambda name: name.endswith("hook_pattern"), read_pattern)] if path == "eager" else []
    fwd_hooks.append(
        (lambda name: name.endswith("hook_resid_post"), lambda x, hook: hook.ctx.__setitem__("seen", x.clone()))
    )
    with torch.no_grad():
        logits = gpt2.run_with_hooks(tokens, fwd_hooks=fwd_hooks)
    assert torch.equal(logits, reference_logits)
    for layer, expected in enumerate(reference_resid):
        point = gpt2.hook_dict[f"blocks.{layer}.hook_resid_post"]
        assert torch.equal(point.ctx.pop("seen"), expected), f"resid_post of block {layer} differs"


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_other_activations_bit_exact(gpt2_dir, tokens, tmp_path, activation):
    """GPT2Config's `activation_function` may name any of transformers' ACT2FN; hooked runs "gelu" and "relu" as
    they do (F.gelu, F.relu): exact, the same kernels in the same order. The neurons hold act(pre)."""
    for file in gpt2_dir.iterdir():
        (tmp_path / file.name).symlink_to(file)
    config = json.loads((gpt2_dir / "config.json").read_text())
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({**config, "activation_function": activation}))
    reference_logits, _ = hf_block_outputs(hf_model(tmp_path, "sdpa"), tokens)
    model = hooked.load(tmp_path)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=["blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_post"])
    assert torch.equal(logits, reference_logits)
    functions = {"gelu": torch.nn.functional.gelu, "relu": torch.relu}
    assert torch.equal(cache["blocks.0.mlp.hook_post"], functions[activation](cache["blocks.0.mlp.hook_pre"]))


def test_sdpa_and_eager_paths_give_the_same_z_and_logits(gpt2, tokens):
    is_z = lambda name: name.endswith("hook_z")  # noqa: E731
    with torch.no_grad():
        fused, fused_cache = gpt2.run_with_cache(tokens, names_filter=is_z)
        eager, eager_cache = gpt2.run_with_cache(tokens, names_filter=lambda n: is_z(n) or n.endswith("hook_pattern"))
    torch.testing.assert_close(fused, eager, rtol=0, atol=1e-5)
    for layer in range(gpt2.cfg.n_layers):
        torch.testing.assert_close(fused_cache["z", layer], eager_cache["z", layer], rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype, bound", [(torch.bfloat16, 0.0), (torch.float16, 0.0)])
def test_half_precision_matches_hf_operation_order(gpt2_dir, tokens, dtype, bound):
    """In 16-bit the same operation order gives the same bits; the measured difference is asserted."""
    model = hooked.load(gpt2_dir, dtype=dtype)
    assert model.dtype == dtype
    reference_logits, reference_resid = hf_block_outputs(hf_model(gpt2_dir, "sdpa", dtype), tokens)
    with torch.no_grad():
        logits = model(tokens)
    difference = (logits.float() - reference_logits.float()).abs().max().item()
    assert difference <= bound, f"{dtype}: max |logit difference| {difference}"


def test_left_padding_matches_hf_with_position_ids(gpt2, gpt2_dir):
    """HF needs explicit position ids for a left-padded batch; hooked derives them from the mask."""
    tokens = torch.randint(0, gpt2.cfg.d_vocab, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(tokens)
    mask[0, :4] = 0
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    reference, _ = hf_block_outputs(hf_model(gpt2_dir, "eager"), tokens, attention_mask=mask, position_ids=position_ids)
    with torch.no_grad():
        logits = gpt2(tokens, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(logits[real], reference[real], rtol=0, atol=1e-5)


def test_left_padded_batch_equals_each_prompt_alone(gpt2):
    prompts = ["When Mary and John went to the store, John gave a drink to", "The capital of France is", "Hi"]
    with torch.no_grad():
        batched = gpt2(prompts)
        for row, prompt in enumerate(prompts):
            alone = gpt2(prompt)
            length = alone.shape[1]
            torch.testing.assert_close(batched[row, -length:], alone[0], rtol=0, atol=1e-5)


def test_sharded_checkpoint_loads_the_same(gpt2, tmp_path, tokens):
    directory = build_gpt2_checkpoint(tmp_path / "sharded", max_shard_size="40KB")
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    sharded = hooked.load(directory)
    with torch.no_grad():
        assert torch.equal(sharded(tokens), gpt2(tokens))  # exact: the same weights through the same forward


def test_hub_key_layout_loads_the_same(gpt2, gpt2_dir, tmp_path, tokens):
    """The hub's original gpt2 file: no `transformer.` prefix, plus causal-mask buffers per block."""
    state = load_file(gpt2_dir / "model.safetensors")
    n_positions = gpt2.cfg.n_ctx
    hub_state = {key.removeprefix("transformer."): value for key, value in state.items()}
    for layer in range(gpt2.cfg.n_layers):
        hub_state[f"h.{layer}.attn.bias"] = torch.tril(torch.ones(n_positions, n_positions)).view(
            1, 1, n_positions, n_positions
        )
        hub_state[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    directory = tmp_path / "hub-layout"
    directory.mkdir()
    save_file(hub_state, directory / "model.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text((gpt2_dir / "config.json").read_text())
    with torch.no_grad():
        assert torch.equal(hooked.load(directory)(tokens), gpt2(tokens))  # the same weights, the same forward
