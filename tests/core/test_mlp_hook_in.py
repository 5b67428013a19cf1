"""`blocks.{i}.mlp.hook_in`, in every architecture: it holds what the MLP reads (the pre-MLP norm's output, its weight
included; OLMo 2's `resid_mid` itself), what it returns is what the MLP computes on, and a default cache leaves it
out (as `hook_mlp_in`; circuit-tracer's name for the point a transcoder reads).

The references are the block's own modules called directly, without hooks: its `ln2` on the cached residual
stream, and its `mlp` (then its post-MLP norm, on post-norm blocks) on the tensor the hook returned.
"""

import pytest
import torch

from hooked.testing import ARCHITECTURES, random_model

SIZES = {"qwen3_moe": {"mlp_only_layers": (0,)}}  # a dense layer and a sparse one: both MLP kinds
NO_PRE_MLP_NORM = {"olmo2"}  # the MLP reads resid_mid as it is
POST_MLP_NORM = {"olmo2": "ln2", "gemma2": "ln2_post", "gemma3": "ln2_post"}  # between the MLP and hook_mlp_out


@pytest.fixture(scope="module", params=ARCHITECTURES)
def model(request):
    return random_model(request.param, **SIZES.get(request.param, {}))


@pytest.fixture(scope="module")
def tokens(model):
    return torch.randint(0, model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(0))


def test_mlp_hook_in_holds_the_pre_mlp_norm_of_the_residual_stream(model, tokens):
    stream = "hook_resid_pre" if model.cfg.parallel_attn_mlp else "hook_resid_mid"  # a parallel block's MLP
    names = [f"blocks.{i}.{name}" for i in range(model.cfg.n_layers) for name in (stream, "mlp.hook_in")]
    _, cache = model.run_with_cache(tokens, names_filter=names)
    assert set(cache.keys()) == set(names)
    for i, block in enumerate(model.blocks):
        norm = torch.nn.Identity() if model.family in NO_PRE_MLP_NORM else block.ln2
        with torch.no_grad():
            expected = norm(cache[f"blocks.{i}.{stream}"])
        torch.testing.assert_close(cache[f"blocks.{i}.mlp.hook_in"], expected, msg=f"layer {i}")


@pytest.mark.parametrize("replacement", ["zeros", "random"])
def test_what_mlp_hook_in_returns_is_what_the_mlp_reads(model, tokens, replacement):
    for i, block in enumerate(model.blocks):
        shape = (*tokens.shape, model.cfg.d_model)
        generator = torch.Generator().manual_seed(i)
        x = torch.zeros(shape) if replacement == "zeros" else torch.randn(shape, generator=generator)
        with model.hooks(fwd_hooks=[(f"blocks.{i}.mlp.hook_in", lambda activation, hook, x=x: x)]):
            _, cache = model.run_with_cache(tokens, names_filter=[f"blocks.{i}.hook_mlp_out"])
        assert not any(point.fwd_hooks for point in model.hook_dict.values())  # the reference runs unhooked
        with torch.no_grad():
            expected = block.mlp(x)
            if model.family in POST_MLP_NORM:
                expected = getattr(block, POST_MLP_NORM[model.family])(expected)
        torch.testing.assert_close(cache[f"blocks.{i}.hook_mlp_out"], expected, msg=f"layer {i}")


def test_a_default_cache_leaves_mlp_hook_in_out_as_hook_mlp_in(model, tokens):
    """No switch adds it: `set_use_hook_mlp_in(True)` adds `hook_mlp_in` only (TransformerLens' switch)."""
    mlp_in = {f"blocks.{i}.mlp.hook_in" for i in range(model.cfg.n_layers)}
    hook_mlp_in = {f"blocks.{i}.hook_mlp_in" for i in range(model.cfg.n_layers)}
    assert mlp_in <= set(model.hook_names)
    _, cache = model.run_with_cache(tokens)
    assert not (mlp_in | hook_mlp_in) & set(cache.keys())
    model.set_use_hook_mlp_in(True)
    try:
        _, switched = model.run_with_cache(tokens)
    finally:
        model.set_use_hook_mlp_in(False)
    assert set(switched.keys()) - set(cache.keys()) == hook_mlp_in


def test_an_in_place_edit_at_mlp_hook_in_reaches_the_mlp_and_not_the_residual_stream(model, tokens):
    """Zeroing mlp.hook_in in place (as a sweep's row writes do) changes what the MLP reads, never the residual
    stream it was read from: OLMo 2's point, with no norm in between, gets a copy."""
    stream = "hook_resid_pre" if model.cfg.parallel_attn_mlp else "hook_resid_mid"
    names = [f"blocks.0.{stream}", "blocks.0.hook_mlp_out", "blocks.0.hook_resid_post"]
    if model.cfg.parallel_attn_mlp:
        names.append("blocks.0.hook_attn_out")

    def zero_in_place(activation, hook):
        activation.zero_()

    with model.hooks(fwd_hooks=[("blocks.0.mlp.hook_in", zero_in_place)]):
        _, cache = model.run_with_cache(tokens, names_filter=names)
    rest = cache["blocks.0.hook_resid_post"] - cache["blocks.0.hook_mlp_out"]
    if model.cfg.parallel_attn_mlp:
        rest = rest - cache["blocks.0.hook_attn_out"]
    torch.testing.assert_close(rest, cache[f"blocks.0.{stream}"], rtol=1e-5, atol=1e-5)
    assert cache[f"blocks.0.{stream}"].abs().max() > 0  # the stream itself was left alone
