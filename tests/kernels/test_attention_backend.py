"""Which attention path runs, forcing one with `hooked.attention_backend`, and that all agree."""

import pytest
import torch

import hooked
from hooked.layers import AttentionMask, choose_backend


def read(activation, hook):
    return None


def test_default_path_is_sdpa_on_cpu_and_eager_when_the_pattern_is_hooked(gpt2):
    attn = gpt2.blocks[0].attn
    q = torch.zeros(1, 3, 4, 16)
    mask = AttentionMask(None, 3, 3)
    assert choose_backend(q, mask, attn.hook_attn_scores, attn.hook_pattern) == "sdpa"
    with gpt2.hooks(fwd_hooks=[("blocks.0.attn.hook_attn_scores", read)]):
        assert choose_backend(q, mask, attn.hook_attn_scores, attn.hook_pattern) == "eager"
    with hooked.attention_backend("eager"):
        assert choose_backend(q, mask, attn.hook_attn_scores, attn.hook_pattern) == "eager"


def test_forced_eager_is_the_pattern_path_bit_for_bit(gpt2, tokens):
    with torch.no_grad():
        hooked_pattern = gpt2.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith("hook_pattern"), read)])
        with hooked.attention_backend("eager"):
            forced = gpt2(tokens)
        with hooked.attention_backend("sdpa"):
            sdpa = gpt2(tokens)
    # Exact: each pair runs the same path (eager, then SDPA) on the same input; a hook that reads changes nothing
    assert torch.equal(forced, hooked_pattern)
    assert torch.equal(sdpa, gpt2(tokens).detach())


@pytest.mark.unchecked
def test_forcing_a_path_that_cannot_serve_raises(gpt2, tokens):
    with pytest.raises(RuntimeError, match=r"cannot serve blocks\.0\.attn\.hook_pattern"):
        with hooked.attention_backend("sdpa"):
            gpt2.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", read)])
    with pytest.raises(ValueError, match="'triton', 'sdpa' or 'eager'"):
        with hooked.attention_backend("flash"):
            pass


def test_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present, so 'triton' can serve here")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        with hooked.attention_backend("triton"):
            pass


def test_triton_refuses_a_mask_with_holes(gpt2):
    tokens = torch.tensor([[5, 6, 7, 8]])
    with pytest.raises(RuntimeError, match="left padding only"):
        with hooked.attention_backend("triton"), torch.no_grad():
            gpt2(tokens, attention_mask=torch.tensor([[1, 0, 1, 1]]))


def test_triton_path_under_the_interpreter_matches_sdpa(gpt2):
    tokens = torch.randint(0, gpt2.cfg.d_vocab, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(tokens)
    mask[1, :3] = 0
    with torch.no_grad():
        reference = gpt2(tokens, attention_mask=mask)
        with hooked.attention_backend("triton"):
            _, cache = gpt2.run_with_cache(tokens, attention_mask=mask, names_filter=lambda n: n.endswith("hook_z"))
            logits = gpt2(tokens, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(logits[real], reference[real], rtol=0, atol=2e-5)
    _, sdpa_cache = gpt2.run_with_cache(tokens, attention_mask=mask, names_filter=lambda n: n.endswith("hook_z"))
    torch.testing.assert_close(cache["z", 1][real], sdpa_cache["z", 1][real], rtol=0, atol=2e-5)


def test_triton_z_is_a_view_of_the_output_projection_input(gpt2):
    """In-place edits of z reach c_proj on the Triton path too: zeroing a head == zeroing its weight rows."""
    tokens = torch.randint(0, gpt2.cfg.d_vocab, (1, 7), generator=torch.Generator().manual_seed(4))

    def zero_head(z, hook):
        z[:, :, 2] = 0.0

    with torch.no_grad(), hooked.attention_backend("triton"):
        ablated = gpt2.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)])
    with torch.no_grad():
        clean = gpt2.run_with_hooks(
            tokens, fwd_hooks=[("blocks.1.attn.hook_z", lambda z, h: z.index_fill(2, torch.tensor([2]), 0.0))]
        )
    torch.testing.assert_close(ablated, clean, rtol=0, atol=2e-5)


QWEN_CASES = ["gqa_tied", "yarn_bias", "moe_k2"]


@pytest.fixture(scope="module")
def qwen_models(tmp_path_factory):
    """Qwen3 with GQA 8->2 and with multi-query + YaRN, and a top-2 Qwen3-MoE, built as in their parity tests."""
    import transformers

    from tests.families.parity import build_checkpoint
    from tests.families.test_qwen3_moe import MOE_CASES
    from tests.families.test_qwen3_parity import DENSE_CASES, VOCAB

    models = {}
    for name in QWEN_CASES[:2]:
        config = transformers.Qwen3Config(vocab_size=VOCAB, **DENSE_CASES[name])
        models[name] = hooked.load(
            build_checkpoint(tmp_path_factory.mktemp(name), config, transformers.Qwen3ForCausalLM)
        )
    config = transformers.Qwen3MoeConfig(vocab_size=VOCAB, **MOE_CASES["k2_norm"])
    models["moe_k2"] = hooked.load(
        build_checkpoint(tmp_path_factory.mktemp("moe"), config, transformers.Qwen3MoeForCausalLM)
    )
    return models


@pytest.mark.parametrize("case", QWEN_CASES)
def test_qwen_models_with_the_triton_kernel_forced(qwen_models, case):
    """Logits and attention-output gradients through the kernel (interpreter) match SDPA, with left padding."""
    model = qwen_models[case]
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 10), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(tokens)
    mask[0, :4] = 0
    real = mask.bool()

    def run():
        grads = {}
        with torch.enable_grad():
            logits = model.run_with_hooks(
                tokens,
                attention_mask=mask,
                bwd_hooks=[("blocks.0.attn.hook_z", lambda g, hook: grads.__setitem__("z", g))],
            )
            logits[real].logsumexp(-1).sum().backward()
        return logits.detach(), grads["z"]

    reference_logits, reference_grad = run()
    with hooked.attention_backend("triton"):
        logits, grad = run()
    model.zero_grad(set_to_none=True)
    torch.testing.assert_close(logits[real], reference_logits[real], rtol=0, atol=3e-5)
    torch.testing.assert_close(grad[real], reference_grad[real], rtol=0, atol=3e-5)


@pytest.mark.unchecked
def test_automatic_triton_only_where_the_kernel_compiles(monkeypatch):
    """bf16 tl.dot and tf32x3 need compute capability >= 8.0: older GPUs fall back to SDPA on their own,
    and a forced Triton path says why. The capability asked is that of the inputs' device."""
    from types import SimpleNamespace

    from hooked import layers

    asked = []
    capability = {"cuda:0": (9, 0), "cuda:1": (7, 5)}
    monkeypatch.setattr(layers.attention, "triton_available", lambda device=None: True)
    monkeypatch.setattr(
        torch.cuda, "get_device_capability", lambda device: asked.append(str(device)) or capability[str(device)]
    )
    point = hooked.HookPoint("batch head_index query_pos key_pos")
    mask = layers.AttentionMask(None, 4, 4)
    for device, expected in (("cuda:0", "triton"), ("cuda:1", "sdpa")):
        q = SimpleNamespace(is_cuda=True, device=torch.device(device))
        assert layers.choose_backend(q, mask, point, point) == expected
    assert asked == ["cuda:0", "cuda:1"]
    with hooked.attention_backend("triton"), pytest.raises(RuntimeError, match="capability >= 8.0"):
        layers.choose_backend(SimpleNamespace(is_cuda=True, device=torch.device("cuda:1")), mask, point, point)


def test_the_kernel_launches_under_a_guard_for_its_inputs_device(monkeypatch):
    from hooked.kernels.attention import triton_attention

    guarded = []
    real = triton_attention._on_device_of
    monkeypatch.setattr(triton_attention, "_on_device_of", lambda t: guarded.append(t.device) or real(t))
    q = torch.randn(1, 5, 2, 16)
    triton_attention.flash_attention(q, q, q)
    triton_attention.flash_attention(q.clone().requires_grad_(), q, q).sum().backward()
    assert guarded == [q.device] * 3  # forward without grad, forward and backward with it


@pytest.mark.parametrize(
    "family, sizes",
    [
        ("llama", dict(n_heads=4, n_kv_heads=2, rope_scaling=None)),  # grouped queries
        (
            "gpt_neox",
            dict(rotary_dim=2, use_parallel_residual=True),
        ),  # partial rotary (outside the kernel), parallel block
    ],
)
def test_other_families_with_the_triton_kernel_forced(family, sizes):
    """Llama's grouped queries and GPT-NeoX's partial rotary run through the kernel (interpreter): logits and
    z gradients match SDPA on a left-padded batch."""
    from hooked.testing import random_model

    model = random_model(family, seed=4, **sizes)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 9), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(tokens)
    mask[1, :3] = 0
    real = mask.bool()

    def run():
        grads = {}
        with torch.enable_grad():
            logits = model.run_with_hooks(
                tokens,
                attention_mask=mask,
                bwd_hooks=[("blocks.1.attn.hook_z", lambda g, hook: grads.__setitem__("z", g))],
            )
            logits[real].logsumexp(-1).sum().backward()
        return logits.detach(), grads["z"]

    reference_logits, reference_grad = run()
    with hooked.attention_backend("triton"):
        logits, grad = run()
    torch.testing.assert_close(logits[real], reference_logits[real], rtol=0, atol=3e-5)
    torch.testing.assert_close(grad[real], reference_grad[real], rtol=0, atol=3e-5)
