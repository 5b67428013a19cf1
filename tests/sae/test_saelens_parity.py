"""hooked's splice against SAELens 6.54's `HookedSAETransformer` on TransformerLens 3.9, on the same weights.

The model: the tiny random GPT-2 of tests/conftest.py, in hooked and, through TransformerLens' own converter
(tests/transformer_lens/tl_reference.py), in a `HookedSAETransformer`. The dictionaries: SAELens SAEs with random
parameters (an SAE on the residual stream, a JumpReLU transcoder replacing an MLP, a TopK SAE on hook_z),
converted with `hooked.sae.from_saelens`. Logits, every hook_sae_* value, the error term and the gradients that
reach the features must agree. The last test shows, side by side, the three places where SAELens is wrong and
hooked is not.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

import hooked.sae
from hooked.sae.dictionary import POINT_NAMES
from tests.transformer_lens.tl_reference import tl_gpt2

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from sae_lens import (
        HookedSAETransformer,
        JumpReLUTranscoder,
        JumpReLUTranscoderConfig,
        SkipTranscoder,
        SkipTranscoderConfig,
        StandardSAE,
        StandardSAEConfig,
        TopKSAE,
        TopKSAEConfig,
    )
    from sae_lens.saes.sae import SAEMetadata


def random_sae(cls, cfg_cls, seed: int, hook_name: str, hook_name_out: str | None = None, **fields):
    metadata = SAEMetadata(hook_name=hook_name, **({"hook_name_out": hook_name_out} if hook_name_out else {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sae = cls(cfg_cls(metadata=metadata, **fields))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in sae.named_parameters():
            values = torch.randn(parameter.shape, generator=generator) * 0.2
            parameter.copy_(values.abs() if name == "threshold" else values)
    return sae.eval()


@pytest.fixture(scope="module")
def saelens_model(gpt2_dir):
    """TransformerLens 3.9's GPT-2 of the same checkpoint, as SAELens' HookedSAETransformer (which adds mlp.hook_in)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TransformerLens 3.9's deprecation notice for HookedTransformer
        reference = tl_gpt2(gpt2_dir, with_tokenizer=False)
        model = HookedSAETransformer(reference.cfg)
    model.load_state_dict(reference.state_dict())
    return model.eval()


@pytest.fixture(scope="module")
def peers(gpt2):
    """The same three dictionaries in SAELens and in hooked."""
    d_model, heads = gpt2.cfg.d_model, gpt2.cfg.n_heads * gpt2.cfg.d_head
    ours = [
        random_sae(StandardSAE, StandardSAEConfig, 0, "blocks.0.hook_resid_post", d_in=d_model, d_sae=48),
        random_sae(
            JumpReLUTranscoder,
            JumpReLUTranscoderConfig,
            1,
            "blocks.1.mlp.hook_in",
            "blocks.1.hook_mlp_out",
            d_in=d_model,
            d_sae=48,
            d_out=d_model,
            apply_b_dec_to_input=False,
        ),
        random_sae(
            TopKSAE, TopKSAEConfig, 2, "blocks.1.attn.hook_z", d_in=heads, d_sae=40, k=6, reshape_activations="hook_z"
        ),
    ]
    return ours, [hooked.sae.from_saelens(sae, model=gpt2) for sae in ours]


@pytest.fixture
def tokens(gpt2):
    """Random ids from 1: the pad id (0) at a row's end would read as right padding, refused without a mask."""
    return torch.randint(1, gpt2.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(3))


def writes(sae) -> str:
    return sae.cfg.metadata.hook_name_out or sae.cfg.metadata.hook_name


def test_run_with_saes_logits_match(gpt2, saelens_model, peers, tokens):
    theirs, ours = peers
    expected = saelens_model.run_with_saes(tokens, saes=theirs)
    logits = gpt2.run_with_saes(tokens, saes=ours)
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(logits, gpt2(tokens), atol=1e-2)  # the dictionaries changed something


@pytest.mark.parametrize("use_error_term", [False, True])
def test_hook_sae_values_match(gpt2, saelens_model, peers, tokens, use_error_term):
    theirs, ours = peers
    expected_logits, expected = saelens_model.run_with_cache_with_saes(
        tokens, saes=theirs, use_error_term=use_error_term
    )
    logits, cache = gpt2.run_with_cache_with_saes(tokens, saes=ours, use_error_term=use_error_term)
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)
    if use_error_term:  # the error term gives the model its own output back
        torch.testing.assert_close(logits, gpt2(tokens), atol=1e-4, rtol=1e-4)
    for sae in theirs:
        for point in POINT_NAMES:
            name = f"{writes(sae)}.{point}"
            if point == "hook_sae_error" and not use_error_term:
                assert name not in cache and name not in expected.cache_dict
                continue
            torch.testing.assert_close(cache[name], expected[name], atol=1e-4, rtol=1e-4, msg=name)


def test_run_with_hooks_with_saes_matches(gpt2, saelens_model, peers, tokens):
    """A hook on a spliced point, named as SAELens names it, through SAELens' run_with_hooks_with_saes on both."""
    theirs, ours = peers
    name = f"{writes(theirs[0])}.hook_sae_acts_post"

    def zero_features(acts, hook):
        acts[..., :10] = 0
        return acts

    for sae in theirs:  # SAELens' run_with_hooks_with_saes reads each SAE's own flag (no use_error_term keyword)
        sae.use_error_term = True
    try:
        expected = saelens_model.run_with_hooks_with_saes(tokens, saes=theirs, fwd_hooks=[(name, zero_features)])
    finally:
        for sae in theirs:
            sae.use_error_term = False
    got = gpt2.run_with_hooks_with_saes(tokens, saes=ours, fwd_hooks=[(name, zero_features)], use_error_term=True)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert (got - gpt2(tokens)).abs().max() > 1e-3  # the edit moved the logits
    assert not hooked.sae.spliced(gpt2)  # the splice ends with the call


def test_gradients_reach_the_features_as_in_saelens(gpt2, saelens_model, peers, tokens):
    """With the error term, the output is the model's own, and the gradient of a logit reaches each feature
    through the reconstruction only (the error is taken without gradient), in both libraries alike."""
    theirs, ours = peers
    names = [f"{writes(sae)}.hook_sae_acts_post" for sae in theirs]

    def grads(run) -> dict[str, torch.Tensor]:
        kept = {}

        def keep(activation, hook):
            activation.retain_grad()
            kept[hook.name] = activation

        logits = run([(name, keep) for name in names])
        logits[:, -1, :5].sum().backward()
        return {name: kept[name].grad for name in names}

    def run_saelens(hooks):
        for sae in theirs:
            saelens_model.add_sae(sae, use_error_term=True)
        try:
            return saelens_model.run_with_hooks(tokens, fwd_hooks=hooks)
        finally:
            saelens_model.reset_saes()

    def run_hooked(hooks):
        with gpt2.saes(saes=ours, use_error_term=True), gpt2.hooks(fwd_hooks=hooks):
            return gpt2(tokens)

    expected, got = grads(run_saelens), grads(run_hooked)
    for name in names:
        assert got[name] is not None and got[name].abs().sum() > 0, name
        torch.testing.assert_close(got[name], expected[name], atol=1e-4, rtol=1e-4, msg=name)


def test_where_saelens_is_wrong(gpt2, saelens_model, tokens, caplog):
    """Side by side: hooked's behaviour and SAELens 6.54's on the three points issue 29 names."""
    d_model = gpt2.cfg.d_model
    # 1. A skip transcoder: SAELens' splice (_SAEWrapper.forward: decode(encode(x))) leaves W_skip out, although
    # its own SkipTranscoder.forward includes it; hooked's spliced output is the transcoder's forward.
    skip = random_sae(
        SkipTranscoder,
        SkipTranscoderConfig,
        4,
        "blocks.0.mlp.hook_in",
        "blocks.0.hook_mlp_out",
        d_in=d_model,
        d_sae=32,
        d_out=d_model,
        apply_b_dec_to_input=False,
    )
    ours = hooked.sae.from_saelens(skip)
    _, cache = gpt2.run_with_cache_with_saes(tokens, saes=[ours])
    _, theirs = saelens_model.run_with_cache_with_saes(tokens, saes=[skip])
    x = cache["blocks.0.hook_mlp_out.hook_sae_input"]
    torch.testing.assert_close(theirs["blocks.0.hook_mlp_out.hook_sae_input"], x, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        with_skip, without_skip = skip(x), skip.decode(skip.encode(x))
    torch.testing.assert_close(cache["blocks.0.hook_mlp_out.hook_sae_output"], with_skip, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(theirs["blocks.0.hook_mlp_out.hook_sae_output"], without_skip, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(with_skip, without_skip, atol=1e-3)

    # 2. A hook the model does not have: SAELens logs a warning and runs the model without it; hooked refuses,
    # naming the nearest points.
    missing = random_sae(StandardSAE, StandardSAEConfig, 5, "blocks.5.hook_resid_post", d_in=d_model, d_sae=16)
    with caplog.at_level(logging.WARNING):
        skipped = saelens_model.run_with_saes(tokens, saes=[missing])
    torch.testing.assert_close(skipped, saelens_model(tokens))  # the SAE silently did nothing
    with pytest.raises(
        KeyError, match=r"'blocks\.5\.hook_resid_post' is not a hook point.*blocks\.\d\.hook_resid_post"
    ):
        gpt2.run_with_saes(tokens, saes=[hooked.sae.from_saelens(missing)])
    with pytest.raises(ValueError, match=r"not a hook point .* nearest are 'blocks\.\d\.hook_resid_post'"):
        hooked.sae.from_saelens(missing, model=gpt2)

    # 3. d_in that is not the point's width: SAELens fails inside the forward with torch's raw shape error;
    # hooked refuses before anything runs, naming cfg.d_in and the point's width.
    narrow = random_sae(StandardSAE, StandardSAEConfig, 6, "blocks.0.hook_resid_post", d_in=d_model // 2, d_sae=16)
    with pytest.raises(RuntimeError, match="size of tensor a|cannot be multiplied"):
        saelens_model.run_with_saes(tokens, saes=[narrow])
    with pytest.raises(
        ValueError, match=rf"cfg\.d_in is {d_model // 2}, but blocks\.0\.hook_resid_post .* {d_model} wide"
    ):
        gpt2.run_with_saes(tokens, saes=[hooked.sae.from_saelens(narrow)])
    assert not any(point._fwd for point in gpt2.hook_dict.values())  # nothing left attached


def test_saelens_names_typed_from_memory(gpt2, gpt2_dir, tokens):
    """SAELens' HookedSAETransformer is hooked's model class; every other SAELens name typed at hooked.sae is
    answered with what to write instead, naming only functions hooked.sae has."""
    import re

    import sae_lens

    from hooked.sae import _SAELENS

    model = hooked.sae.HookedSAETransformer.from_pretrained_no_processing(gpt2_dir)
    assert isinstance(model, hooked.HookedTransformer)
    theirs = random_sae(StandardSAE, StandardSAEConfig, 0, "blocks.1.hook_resid_pre", d_in=gpt2.cfg.d_model, d_sae=16)
    theirs.cfg.metadata.model_name = "tiny-gpt2"
    sae = hooked.sae.from_saelens(theirs)
    # SAELens 6's metadata reads by attribute, None for what it lacks
    for key in ("hook_name", "model_name", "sae_lens_version", "neuronpedia_id"):
        assert getattr(sae.cfg.metadata, key) == getattr(theirs.cfg.metadata, key), key
    moved = hooked.sae.from_saelens(theirs, hook_name="blocks.0.hook_resid_post")
    assert moved.cfg.metadata.hook_name == "blocks.0.hook_resid_post"  # where it sits, not the file's record
    with pytest.raises(AttributeError, match=r"set sae.cfg.hook_name"):
        moved.cfg.metadata.hook_name = "blocks.1.hook_resid_post"
    torch.testing.assert_close(model.run_with_saes(tokens, saes=[sae]), gpt2.run_with_saes(tokens, saes=[sae]))
    for name, instead in _SAELENS.items():
        assert hasattr(sae_lens, name), f"{name} is not a SAELens 6.54 name"
        with pytest.raises(AttributeError, match=re.escape(f"SAELens' {name} is {instead}")):
            getattr(hooked.sae, name)
        for function in re.findall(r"hooked\.sae\.(\w+)", instead):
            assert hasattr(hooked.sae, function), (name, function)
    with pytest.raises(AttributeError, match=r"has no attribute 'Nothing'$"):
        hooked.sae.Nothing  # noqa: B018


@pytest.mark.parametrize("kind", ["standard", "jumprelu", "gated", "topk"])
def test_fold_W_dec_norm_as_saelens_folds_it(gpt2, kind):
    """Folded, the parameters are SAELens' folded ones, the output is unchanged and each feature grows by its
    decoder norm (a TopK one ranking by contribution reported that already); a TopK dictionary that ranks
    pre-activations is refused, as SAELens refuses it."""
    from sae_lens import GatedSAE, GatedSAEConfig, JumpReLUSAE, JumpReLUSAEConfig

    classes = {
        "standard": (StandardSAE, StandardSAEConfig, {}),
        "jumprelu": (JumpReLUSAE, JumpReLUSAEConfig, {}),
        "gated": (GatedSAE, GatedSAEConfig, {}),
        "topk": (TopKSAE, TopKSAEConfig, {"k": 5, "rescale_acts_by_decoder_norm": True}),
    }
    cls, cfg_cls, extra = classes[kind]
    d_model = gpt2.cfg.d_model
    theirs = random_sae(cls, cfg_cls, 4, "blocks.0.hook_resid_post", d_in=d_model, d_sae=24, **extra)
    ours = hooked.sae.from_saelens(theirs)
    x = torch.randn(3, 5, d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before_out, before_acts = ours(x), ours.encode(x)
    norms = ours.fold_W_dec_norm()
    theirs.fold_W_dec_norm()
    for name, parameter in theirs.named_parameters():
        torch.testing.assert_close(getattr(ours, name), parameter, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), before_out, rtol=1e-5, atol=1e-5)
        # TopK ranking by contribution reports pre-activation x norm already: its features stay as they were
        expected = before_acts if kind == "topk" else before_acts * norms
        torch.testing.assert_close(ours.encode(x), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.W_dec.norm(dim=-1), torch.ones(24))

    if kind == "topk":
        ranking = random_sae(TopKSAE, TopKSAEConfig, 5, "blocks.0.hook_resid_post", d_in=d_model, d_sae=24, k=5)
        with pytest.raises(NotImplementedError):  # SAELens' own refusal of this case, which hooked's mirrors
            ranking.fold_W_dec_norm()
        with pytest.raises(ValueError, match=r"safe only with rescale_acts_by_decoder_norm=True"):
            hooked.sae.from_saelens(ranking).fold_W_dec_norm()


def test_a_saelens_sae_without_a_hook_name_names_from_saelens_fix(gpt2):
    """The fix an SAE in memory without a hook name needs is from_saelens's own keyword, not load's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sae = StandardSAE(StandardSAEConfig(d_in=gpt2.cfg.d_model, d_sae=8))
    assert sae.cfg.metadata.hook_name is None
    with pytest.raises(ValueError, match=r"records no hook_name .*hooked\.sae\.from_saelens\(sae, hook_name=") as e:
        hooked.sae.from_saelens(sae)
    assert "hooked.sae.load" not in str(e.value)
    assert hooked.sae.from_saelens(sae, hook_name="blocks.0.hook_resid_post").hook_name == "blocks.0.hook_resid_post"
