"""Splicing dictionaries (hooked/sae/splice.py) against the same arithmetic written out in plain torch on the weights.

What a splice computes (an SAE replacing its point, a transcoder reading `blocks.L.mlp.hook_in` and replacing
`hook_mlp_out`, a skip transcoder with its `W_skip`, the error term, its gradient), that nothing stays attached
after a call, an exception or a refusal, that it runs on every family (a mixture-of-experts block replaced whole),
and the sparse storage of the features in a cache.
"""

from __future__ import annotations

import pytest
import torch

import hooked
import hooked.sae
from hooked import ablate, processing
from hooked.testing import ARCHITECTURES, random_model
from tests.sae.dictionaries import explicit_acts, random_dictionary, replacing, spliced_names

ATOL = 1e-5  # float32 rounding of the same products in another order


@pytest.fixture(scope="module")
def model():
    return random_model("gpt2", seed=1, n_layers=2)


def tokens_of(model, batch: int = 3, pos: int = 7, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def nothing_attached(model, *dictionaries) -> None:
    assert spliced_names(model) == []
    assert not model.hooks_attached()
    for d in dictionaries:
        assert [p.name for p in d.sae_points()] == [
            f"hook_sae_{n}" for n in ("input", "acts_pre", "acts_post", "recons", "error", "output")
        ]


# ----------------------------------------------------------------------------- what a splice computes
@pytest.mark.parametrize("architecture", ["standard", "gated", "topk", "jumprelu"])
@pytest.mark.parametrize("apply_b_dec_to_input", [False, True])
def test_an_sae_replaces_its_point_by_the_explicit_reconstruction(model, architecture, apply_b_dec_to_input):
    tokens = tokens_of(model)
    sae = random_dictionary(
        model.cfg.d_model,
        "blocks.0.hook_resid_post",
        architecture=architecture,
        apply_b_dec_to_input=apply_b_dec_to_input,
    )
    spliced = model.run_with_saes(tokens, saes=[sae], use_error_term=False)
    explicit = model.run_with_hooks(tokens, fwd_hooks=replacing(sae))
    torch.testing.assert_close(spliced, explicit, atol=ATOL, rtol=0)
    assert (spliced - model(tokens)).abs().max() > 1e-2  # the reconstruction is not the activation: a real test
    nothing_attached(model, sae)


@pytest.mark.parametrize("skip", [False, True])
def test_a_transcoder_reads_the_mlp_input_and_replaces_its_output(model, skip):
    tokens = tokens_of(model)
    tc = random_dictionary(
        model.cfg.d_model, "blocks.1.mlp.hook_in", hook_name_out="blocks.1.hook_mlp_out", skip=skip, seed=3
    )
    spliced = model.run_with_saes(tokens, saes=[tc])
    torch.testing.assert_close(spliced, model.run_with_hooks(tokens, fwd_hooks=replacing(tc)), atol=ATOL, rtol=0)
    if skip:  # SAELens' HookedSAETransformer leaves W_skip out of the splice: that is another output
        with torch.no_grad():
            kept, tc.W_skip.data = tc.W_skip.data, torch.zeros_like(tc.W_skip)
        without_skip = model.run_with_hooks(tokens, fwd_hooks=replacing(tc))
        tc.W_skip.data = kept
        assert (spliced - without_skip).abs().max() > 1e-2


def test_the_error_term_leaves_the_model_as_it_is(model):
    tokens = tokens_of(model)
    sae = random_dictionary(model.cfg.d_model, "blocks.0.hook_resid_post", architecture="topk")
    tc = random_dictionary(model.cfg.d_model, "blocks.1.mlp.hook_in", hook_name_out="blocks.1.hook_mlp_out", seed=2)
    plain = model(tokens)
    torch.testing.assert_close(
        model.run_with_saes(tokens, saes=[sae, tc], use_error_term=True), plain, atol=ATOL, rtol=0
    )
    assert (model.run_with_saes(tokens, saes=[sae, tc], use_error_term=False) - plain).abs().max() > 1e-2


@pytest.mark.parametrize("transcoder", [False, True])
def test_zeroing_a_feature_under_the_error_term_removes_its_decoder_row_times_its_activation(model, transcoder):
    tokens = tokens_of(model)
    if transcoder:
        d = random_dictionary(model.cfg.d_model, "blocks.0.mlp.hook_in", hook_name_out="blocks.0.hook_mlp_out", seed=4)
    else:
        d = random_dictionary(model.cfg.d_model, "blocks.0.hook_resid_post", seed=4)
    _, cache = model.run_with_cache_with_saes(tokens, saes=[d], use_error_term=True)
    feature = int(cache[f"{d.hook_name_out}.hook_sae_acts_post"].sum((0, 1)).argmax())  # an active one
    captured = {}

    def capture(x, hook):
        captured["x"] = x

    def remove_the_feature(out, hook):  # the written point minus a_f W_dec[f], a_f from the point read
        acts = explicit_acts(d, captured.pop("x") if transcoder else out)
        return out - acts[..., feature, None] * d.W_dec[feature]

    explicit = model.run_with_hooks(
        tokens, fwd_hooks=[(d.hook_name, capture)] * transcoder + [(d.hook_name_out, remove_the_feature)]
    )
    with model.saes([d], use_error_term=True):
        zeroed = model.run_with_hooks(
            tokens, fwd_hooks=ablate.hooks(model, f"L0.{'mlp_out' if transcoder else 'resid_post'}.F{feature}", "zero")
        )
    torch.testing.assert_close(zeroed, explicit, atol=ATOL, rtol=0)
    assert (zeroed - model(tokens)).abs().max() > 1e-3


def test_gradients_reach_the_features_and_not_through_the_error_term(model):
    """SAELens' semantics: the error is added without gradient, so d output / d input runs through the encoder and
    decoder only, not the identity the error term adds to the value."""
    tokens = tokens_of(model)
    sae = random_dictionary(model.cfg.d_model, "blocks.0.hook_resid_post", seed=5)
    leaves = {}

    def leaf(x, hook):  # registered before the splice: the input the dictionary reads
        leaves[hook.name] = x.detach().requires_grad_(True)
        return leaves[hook.name]

    with model.hooks(fwd_hooks=[(sae.hook_name, leaf)]), model.saes([sae], use_error_term=True):
        acts = {}
        with model.hooks(fwd_hooks=[(sae.hook_sae_acts_post.name, lambda a, hook: acts.setdefault("a", a))]):
            logits = model(tokens)
    metric = logits[:, -1].logsumexp(-1).sum()
    through_features, through_input = torch.autograd.grad(metric, [acts["a"], leaves[sae.hook_name]])
    assert through_features.abs().sum() > 0

    def explicit(x, hook):  # out = recons(x) + stopgrad(x - recons(x))
        leaves["explicit"] = x.detach().requires_grad_(True)
        recons = explicit_acts(sae, leaves["explicit"]) @ sae.W_dec + sae.b_dec
        return recons + (leaves["explicit"] - recons).detach()

    logits = model.run_with_hooks(tokens, fwd_hooks=[(sae.hook_name, explicit)])
    (reference,) = torch.autograd.grad(logits[:, -1].logsumexp(-1).sum(), [leaves["explicit"]])
    torch.testing.assert_close(through_input, reference, atol=1e-5, rtol=1e-4)

    def identity(x, hook):
        leaves["plain"] = x.detach().requires_grad_(True)
        return leaves["plain"]

    logits = model.run_with_hooks(tokens, fwd_hooks=[(sae.hook_name, identity)])
    (plain,) = torch.autograd.grad(logits[:, -1].logsumexp(-1).sum(), [leaves["plain"]])
    assert (through_input - plain).abs().max() > 1e-3  # the error term passed no gradient on


# ----------------------------------------------------------------------------- nothing stays attached
def test_nothing_stays_attached_after_a_call_or_an_exception(model):
    tokens = tokens_of(model)
    sae = random_dictionary(model.cfg.d_model, "blocks.1.hook_resid_post")
    tc = random_dictionary(model.cfg.d_model, "blocks.0.mlp.hook_in", hook_name_out="blocks.0.hook_mlp_out", seed=1)
    plain = model(tokens)
    model.run_with_saes(tokens, saes=[sae, tc])
    nothing_attached(model, sae, tc)
    model.run_with_cache_with_saes(tokens, saes=[sae, tc])
    nothing_attached(model, sae, tc)
    with pytest.raises(RuntimeError, match="inside the block"):
        with model.saes([sae, tc]):
            assert len(spliced_names(model)) == 12
            model(tokens)
            raise RuntimeError("inside the block")
    nothing_attached(model, sae, tc)

    def failing(activation, hook):
        raise ValueError("a hook failed")

    with pytest.raises(ValueError, match="a hook failed"):
        model.run_with_hooks(tokens, fwd_hooks=[(sae.hook_name, failing)])
    with pytest.raises(ValueError, match="a hook failed"):
        with model.saes([sae]):
            model.run_with_hooks(tokens, fwd_hooks=[(sae.hook_sae_acts_post.name, failing)])
    nothing_attached(model, sae, tc)
    torch.testing.assert_close(model(tokens), plain, atol=0, rtol=0)  # exact: the same forward on the same input


def refusals(model):
    d_model = model.cfg.d_model
    return {
        "unknown hook": (
            random_dictionary(d_model, "blocks.0.hook_resid_pots"),
            KeyError,
            r"blocks\.0\.hook_resid_pots.*did you mean 'blocks\.0\.hook_resid_post'",
        ),
        "d_in": (
            random_dictionary(d_model + 1, "blocks.0.hook_resid_post"),
            ValueError,
            rf"cfg\.d_in is {d_model + 1}",
        ),
        "dtype": (
            random_dictionary(d_model, "blocks.0.hook_resid_post", dtype=torch.float64),
            ValueError,
            r"torch\.float64 on cpu, the model torch\.float32.*sae\.to\(model\.dtype\)",
        ),
        "device": (
            random_dictionary(d_model, "blocks.0.hook_resid_post").to("meta"),
            ValueError,
            r"on meta, the model torch\.float32 on cpu",
        ),
        "processing": (
            random_dictionary(d_model, "blocks.0.hook_resid_post", processing={"center_writing_weights": True}),
            ValueError,
            r"trained on a model with center_writing_weights=True.*changes blocks\.0\.hook_resid_post",
        ),
        "reads after it writes": (
            random_dictionary(d_model, "blocks.1.mlp.hook_in", hook_name_out="blocks.0.hook_mlp_out"),
            ValueError,
            r"reads blocks\.1\.mlp\.hook_in, which the forward reaches after blocks\.0\.hook_mlp_out",
        ),
    }


@pytest.mark.parametrize("case", ["unknown hook", "d_in", "dtype", "device", "processing", "reads after it writes"])
@pytest.mark.parametrize("how", ["run_with_saes", "saes", "run_with_cache_with_saes", "add_sae"])
def test_every_refusal_leaves_nothing_half_done(model, case, how):
    tokens = tokens_of(model)
    good = random_dictionary(model.cfg.d_model, "blocks.0.hook_resid_mid", seed=9)
    bad, error, message = refusals(model)[case]
    plain = model(tokens)
    with pytest.raises(error, match=message):
        if how == "run_with_saes":
            model.run_with_saes(tokens, saes=[good, bad])
        elif how == "run_with_cache_with_saes":
            model.run_with_cache_with_saes(tokens, saes=[good, bad])
        elif how == "add_sae":
            model.add_sae(bad)
        else:
            with model.saes([good, bad]):
                pytest.fail("the block ran")
    nothing_attached(model, good)
    assert model.hook_dict[good.hook_name].sizes == {}
    torch.testing.assert_close(model(tokens), plain, atol=0, rtol=0)  # exact: the same forward on the same input


def test_fold_ln_is_refused_only_where_it_changes_what_the_dictionary_reads(model):
    """fold_ln moves each norm's gain into the weights that read it: the residual stream keeps its values, so an SAE
    there trained with fold_ln splices into a model without it and computes the same; a transcoder reading
    mlp.hook_in (after ln2's gain) reads other values, and is refused, naming the point."""
    tokens = tokens_of(model)
    folded = random_model("gpt2", seed=1, n_layers=2)
    processing.process_weights(
        folded, fold_ln=True, center_writing_weights=False, center_unembed=False, fold_value_biases=False
    )
    assert folded.processing["fold_ln"] and not model.processing["fold_ln"]
    sae = random_dictionary(model.cfg.d_model, "blocks.0.hook_resid_post", processing={"fold_ln": True})
    point = "blocks.0.hook_resid_post.hook_sae_acts_post"
    _, here = model.run_with_cache_with_saes(tokens, saes=[sae], names_filter=[point])
    _, there = folded.run_with_cache_with_saes(tokens, saes=[sae], names_filter=[point])
    torch.testing.assert_close(here[point], there[point], atol=ATOL, rtol=0)  # folding: float32 reassociation
    assert here[point].abs().max() > 1e-2
    tc = random_dictionary(
        model.cfg.d_model, "blocks.1.mlp.hook_in", hook_name_out="blocks.1.hook_mlp_out", processing={"fold_ln": True}
    )
    with pytest.raises(ValueError, match=r"fold_ln=True.*fold_ln changes blocks\.1\.mlp\.hook_in"):
        model.run_with_saes(tokens, saes=[tc])
    folded.run_with_saes(tokens, saes=[tc])  # its own processing: taken
    nothing_attached(model, sae, tc)
    _, unfolded_in = model.run_with_cache(tokens, names_filter=["blocks.1.mlp.hook_in"])
    _, folded_in = folded.run_with_cache(tokens, names_filter=["blocks.1.mlp.hook_in"])
    assert (unfolded_in["blocks.1.mlp.hook_in"] - folded_in["blocks.1.mlp.hook_in"]).abs().max() > 1e-2


def test_two_dictionaries_on_one_point_and_a_dictionary_twice_are_refused(model):
    first = random_dictionary(model.cfg.d_model, "blocks.0.hook_resid_post")
    second = random_dictionary(model.cfg.d_model, "blocks.0.hook_resid_post", seed=1)
    tc = random_dictionary(model.cfg.d_model, "blocks.0.mlp.hook_in", hook_name_out="blocks.0.hook_resid_post")
    for pair in ([first, second], [first, tc]):
        with pytest.raises(ValueError, match=r"two dictionaries write blocks\.0\.hook_resid_post"):
            model.run_with_saes(tokens_of(model), saes=pair)
        nothing_attached(model, *pair)
    with pytest.raises(ValueError, match="appears twice"):
        model.run_with_saes(tokens_of(model), saes=[first, first])
    with model.saes([first]):  # a second splice of a spliced one, or onto its point, inside the block
        with pytest.raises(ValueError, match="already spliced"):
            model.run_with_saes(tokens_of(model), saes=[first])
        model.add_sae(random_dictionary(model.cfg.d_model, "blocks.1.hook_resid_post"))
        with pytest.raises(ValueError, match="two dictionaries write"):
            model.add_sae(second)
        model.reset_saes()
        assert len(spliced_names(model)) == 6  # the block's own remain
    nothing_attached(model, first, second)


# ----------------------------------------------------------------------------- every family
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_an_sae_and_a_transcoder_splice_into_every_family(arch):
    model = random_model(arch, seed=2)
    last = model.cfg.n_layers - 1
    layer = next((i for i in range(model.cfg.n_layers) if model.cfg.is_sparse(i)), last)
    if arch in ("qwen3_moe", "mixtral"):
        assert model.cfg.is_sparse(layer)  # the transcoder replaces a whole mixture-of-experts block's output
    tokens = tokens_of(model, 2, 6)
    sae = random_dictionary(model.cfg.d_model, "blocks.0.hook_resid_post", architecture="topk")
    tc = random_dictionary(
        model.cfg.d_model, f"blocks.{layer}.mlp.hook_in", hook_name_out=f"blocks.{layer}.hook_mlp_out", seed=1
    )
    spliced = model.run_with_saes(tokens, saes=[sae, tc])
    explicit = model.run_with_hooks(tokens, fwd_hooks=replacing(sae) + replacing(tc))
    torch.testing.assert_close(spliced, explicit, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        model.run_with_saes(tokens, saes=[sae, tc], use_error_term=True), model(tokens), atol=1e-4, rtol=1e-4
    )
    with model.saes([sae, tc]):
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_sae_acts_post"))
        assert set(cache) == {sae.hook_sae_acts_post.name, tc.hook_sae_acts_post.name}
    nothing_attached(model, sae, tc)


# ----------------------------------------------------------------------------- sparse features in a cache
def test_sparse_features_equal_the_dense_cache_in_less_memory(model):
    tokens = tokens_of(model, 4, 9)
    sae = random_dictionary(model.cfg.d_model, "blocks.1.hook_resid_post", architecture="topk", d_sae=64, k=4)
    tc = random_dictionary(
        model.cfg.d_model, "blocks.0.mlp.hook_in", hook_name_out="blocks.0.hook_mlp_out", d_sae=64, seed=1
    )
    logits, dense = model.run_with_cache_with_saes(tokens, saes=[sae, tc])
    sparse_logits, sparse = model.run_with_cache_with_saes(tokens, saes=[sae, tc], sparse_features=True)
    # exact: the same spliced forward on the same input; the sparse cache holds a copy of the same features
    torch.testing.assert_close(sparse_logits, logits, atol=0, rtol=0)
    assert set(sparse) == set(dense)
    for name in dense:
        if name.endswith("hook_sae_acts_post"):
            assert sparse[name].layout == torch.sparse_coo
            assert torch.equal(sparse[name].to_dense(), dense[name])
        else:
            assert sparse[name].layout == torch.strided and torch.equal(sparse[name], dense[name])
    features = "blocks.1.hook_resid_post.hook_sae_acts_post"
    stored = sparse[features]
    assert stored._nnz() == 4 * 9 * 4  # k per token
    sparse_bytes = stored.indices().numel() * 8 + stored.values().numel() * 4
    assert sparse_bytes == 28 * 4 * 9 * 4 < dense[features].numel() * 4  # 28 bytes per active feature
    _, one = model.run_with_cache_with_saes(
        tokens, saes=[sae], sparse_features=True, names_filter=[features], pos_slice=-1, device="cpu"
    )
    _, alone = model.run_with_cache_with_saes(tokens, saes=[sae], names_filter=[features])
    # exact: the same forward on the same input; pos_slice keeps a copy of the last position's features
    assert torch.equal(one[features].to_dense(), alone[features][:, -1:])


def test_a_dictionary_named_for_another_model_is_refused_unless_allowed(gpt2_dir):
    """ioi-gpt2's transcoders have ioi-qwen3moe's widths, so nothing else stops them: their metadata's model_name
    does, naming both models and the override; the same files splice into their own model, and into a model loaded
    from a directory (whose folder name says little) with a warning."""
    gpt2, moe = hooked.load("hooked/ioi-gpt2"), hooked.load("hooked/ioi-qwen3moe")
    transcoder = hooked.sae.load("hooked/ioi-gpt2/saes/transcoders/layer_0")
    assert transcoder.cfg.metadata.model_name == "hooked/ioi-gpt2"
    tokens = gpt2.to_tokens(["When Mary and John went to the store, John gave a drink to"])
    with pytest.raises(ValueError, match=r"trained on 'hooked/ioi-gpt2'.*this model is 'hooked/ioi-qwen3moe'.*"
                       r"allow_other_model = True"):  # fmt: skip
        moe.run_with_saes(tokens, saes=[transcoder])
    with pytest.raises(ValueError, match="allow_other_model"):
        hooked.sae.evaluate(moe, transcoder, tokens)
    nothing_attached(moe, transcoder)
    gpt2.run_with_saes(tokens, saes=[transcoder])  # its own model
    transcoder.allow_other_model = True
    moe.run_with_saes(tokens, saes=[transcoder])  # told to: taken
    transcoder.allow_other_model = False
    local = hooked.load(gpt2_dir)
    sae = random_dictionary(local.cfg.d_model, "blocks.0.hook_resid_post", metadata={"model_name": "hooked/ioi-gpt2"})
    with pytest.warns(UserWarning, match="loaded from a directory"):
        local.run_with_saes(tokens_of(local), saes=[sae])
    named = random_model("gpt2", seed=1, n_layers=1)  # built in memory: its name is no model's
    other = random_dictionary(named.cfg.d_model, "blocks.0.hook_resid_post", metadata={"model_name": "someone/else"})
    named.run_with_saes(tokens_of(named), saes=[other])
