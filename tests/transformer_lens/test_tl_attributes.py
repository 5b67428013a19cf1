"""The modules, weights and config fields TransformerLens notebooks read, against TransformerLens 3.9 on the same
weights.

`model.embed.W_E`, `model.pos_embed.W_pos`, `model.unembed.W_U` / `b_U`, the norms' `w` / `b`, every block's
attention and MLP weights under TransformerLens' names, and `model.cfg`'s fields, on a GPT-2 and a
grouped-query Qwen3 loaded unprocessed into both libraries (tests/transformer_lens/tl_reference.py).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import hooked
from tests.transformer_lens.tl_reference import grouped_qwen3_pair, tl_gpt2


@pytest.fixture(scope="module")
def gpt2_pair(gpt2_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hooked.load(gpt2_dir), tl_gpt2(gpt2_dir)


@pytest.fixture(scope="module")
def qwen3_pair(tmp_path_factory):
    """A grouped-query Qwen3 (4 query heads over 2 key/value heads), hooked and TransformerLens, same weights."""
    return grouped_qwen3_pair(tmp_path_factory.mktemp("qwen3-attributes"))


def assert_same(ours, theirs, name):
    """Weights are the checkpoint's numbers (exact); computed tensors sum in TransformerLens' order, not hooked's:
    float32 rounding, 32 ulps of the largest magnitude (measured at most 3)."""
    assert ours.shape == theirs.shape, f"{name}: {tuple(ours.shape)} vs TransformerLens' {tuple(theirs.shape)}"
    atol = 32 * torch.finfo(torch.float32).eps * theirs.abs().max().item()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=atol, msg=name)


# ----------------------------------------------------------------- modules at the top of the model
def test_embedding_and_unembedding_modules_hold_transformer_lens_weights(gpt2_pair):
    ours, theirs = gpt2_pair
    assert_same(ours.embed.W_E, theirs.embed.W_E, "embed.W_E")
    assert_same(ours.pos_embed.W_pos, theirs.pos_embed.W_pos, "pos_embed.W_pos")
    assert_same(ours.unembed.W_U, theirs.unembed.W_U, "unembed.W_U")
    assert_same(ours.unembed.b_U, theirs.unembed.b_U, "unembed.b_U")
    assert_same(ours.ln_final.w, theirs.ln_final.w, "ln_final.w")
    assert_same(ours.ln_final.b, theirs.ln_final.b, "ln_final.b")
    # the same tensors as the model-level properties and the parameters, not copies
    assert ours.embed.W_E is ours.wte.weight and ours.pos_embed.W_pos is ours.wpe.weight
    assert torch.equal(ours.unembed.W_U, ours.W_U) and torch.equal(ours.unembed.b_U, ours.b_U)
    assert ours.ln_final.w is ours.ln_final.weight


def test_views_add_no_parameters_or_state_dict_keys(gpt2_pair):
    ours, _ = gpt2_pair
    keys = set(ours.state_dict())
    assert not any(key.startswith(("embed.", "pos_embed.", "unembed.")) for key in keys)
    assert "embed" not in dict(ours.named_modules())


def test_embed_called_as_transformer_lens_and_as_the_first_step(gpt2_pair):
    ours, theirs = gpt2_pair
    tokens = ours.to_tokens(["Hello world", "a b c d e"])
    assert_same(ours.embed(tokens), theirs.embed(tokens), "embed(tokens)")
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    assert_same(
        ours.embed(tokens, positions), theirs.embed(tokens) + theirs.pos_embed(tokens), "embed(tokens, positions)"
    )


def test_pos_embed_called_as_transformer_lens(gpt2_pair):
    ours, theirs = gpt2_pair
    tokens = ours.to_tokens(["Hello world", "a b c d e"])  # left padded: row 0 has padding
    mask = ours.tokenizer(["Hello world", "a b c d e"], return_tensors="pt")["attention_mask"]
    assert not bool(mask.all())
    assert_same(ours.pos_embed(tokens), theirs.pos_embed(tokens), "pos_embed(tokens)")
    assert_same(ours.pos_embed(tokens, 3), theirs.pos_embed(tokens, 3), "pos_embed(tokens, 3)")
    assert_same(
        ours.pos_embed(tokens, 0, attention_mask=mask), theirs.pos_embed(tokens, 0, attention_mask=mask), "with a mask"
    )
    past = torch.cat([mask, torch.ones(2, 2, dtype=mask.dtype)], 1)  # two more columns after a cached prompt
    assert_same(
        ours.pos_embed(tokens[:, :2], tokens.shape[1], attention_mask=past),
        theirs.pos_embed(tokens[:, :2], tokens.shape[1], attention_mask=past),
        "after a past",
    )
    with pytest.raises(ValueError, match="past and present"):
        ours.pos_embed(tokens[:, :2], tokens.shape[1], attention_mask=mask)


def test_unembed_call_is_transformer_lens_and_logits_from_resid_adds_the_norm(gpt2_pair):
    """`model.unembed(x)` is TransformerLens' `x @ W_U + b_U` (a notebook's `unembed(ln_final(resid))` must not
    apply the norm twice); `logits_from_resid(resid)` is the final norm then the unembedding."""
    ours, theirs = gpt2_pair
    tokens = ours.to_tokens("Hello world")
    _, cache = theirs.run_with_cache(tokens)
    resid = cache["blocks.1.hook_resid_post"]
    assert_same(ours.unembed(ours.ln_final(resid)), theirs.unembed(theirs.ln_final(resid)), "unembed(ln_final(resid))")
    assert_same(ours.unembed(resid), theirs.unembed(resid), "unembed(resid)")
    assert_same(ours.logits_from_resid(resid), ours(tokens), "logits_from_resid(resid) is the logits")


def test_rotary_models_have_no_pos_embed_and_rms_norms_no_bias(qwen3_pair):
    ours, theirs = qwen3_pair
    assert not hasattr(theirs, "pos_embed") and not hasattr(ours, "pos_embed")
    assert_same(ours.embed.W_E, theirs.embed.W_E, "embed.W_E")
    assert_same(ours.unembed.W_U, theirs.unembed.W_U, "unembed.W_U")
    assert_same(ours.unembed.b_U, theirs.unembed.b_U, "unembed.b_U")
    assert_same(ours.ln_final.w, theirs.ln_final.w, "ln_final.w")
    assert not hasattr(ours.ln_final, "b") and not hasattr(theirs.ln_final, "b")
    with pytest.raises(AttributeError, match="W_pos"):
        _ = ours.embed.W_pos


def test_unembed_b_U_follows_weight_processing(gpt2_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = hooked.load(gpt2_dir, fold_ln=True)
        theirs = tl_gpt2(gpt2_dir, fold_ln=True)
    assert_same(ours.unembed.W_U, theirs.unembed.W_U, "unembed.W_U after fold_ln")
    assert_same(ours.unembed.b_U, theirs.unembed.b_U, "unembed.b_U after fold_ln")


# ----------------------------------------------------------------- blocks
BLOCK_WEIGHTS = {
    "attn": ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"),
    "mlp": ("W_in", "W_out", "b_in", "b_out"),
    "ln1": ("w", "b"),
    "ln2": ("w", "b"),
}


@pytest.mark.parametrize("pair", ["gpt2_pair", "qwen3_pair"])
def test_block_weights_under_transformer_lens_names(pair, request):
    ours, theirs = request.getfixturevalue(pair)
    gated = ours.cfg.gated_mlp
    for layer in range(ours.cfg.n_layers):
        for module, names in BLOCK_WEIGHTS.items():
            names = names + (("W_gate",) if module == "mlp" and gated else ())
            for name in names:
                theirs_module = getattr(theirs.blocks[layer], module)
                if not hasattr(
                    theirs_module, name
                ):  # RMSNorm has no b; a gated MLP in TransformerLens no b_in on Qwen3
                    assert name in ("b",), f"TransformerLens' blocks[{layer}].{module} has no {name}"
                    assert not hasattr(getattr(ours.blocks[layer], module), name)
                    continue
                assert_same(
                    getattr(getattr(ours.blocks[layer], module), name),
                    getattr(theirs_module, name),
                    f"blocks[{layer}].{module}.{name}",
                )


# ----------------------------------------------------------------- config
CONFIG_FIELDS = (
    "d_model",
    "n_layers",
    "n_heads",
    "d_head",
    "d_mlp",
    "d_vocab",
    "d_vocab_out",
    "act_fn",
    "normalization_type",
    "positional_embedding_type",
    "original_architecture",
    "dtype",
    "n_devices",
    "attention_dir",
    "attn_only",
    "parallel_attn_mlp",
    "use_hook_tokens",
    "gated_mlp",
    "final_rms",
    "rotary_dim",
    "eps",
    "n_key_value_heads",
)


def test_gpt2_config_fields_as_transformer_lens(gpt2_pair):
    ours, theirs = gpt2_pair
    for name in CONFIG_FIELDS + ("n_ctx", "default_prepend_bos"):
        assert getattr(ours.cfg, name) == getattr(theirs.cfg, name) or (
            name == "n_key_value_heads" and theirs.cfg.n_key_value_heads is None  # TransformerLens: None for MHA
        ), f"cfg.{name}: {getattr(ours.cfg, name)!r} vs TransformerLens' {getattr(theirs.cfg, name)!r}"
    assert str(ours.cfg.device) == str(theirs.cfg.device)


def test_qwen3_config_fields_as_transformer_lens(qwen3_pair):
    ours, theirs = qwen3_pair
    for name in CONFIG_FIELDS:
        assert getattr(ours.cfg, name) == getattr(theirs.cfg, name), (
            f"cfg.{name}: {getattr(ours.cfg, name)!r} vs TransformerLens' {getattr(theirs.cfg, name)!r}"
        )


def test_config_dtype_and_model_name_follow_the_model(gpt2_dir):
    model = hooked.load(gpt2_dir, dtype=torch.bfloat16)
    assert model.cfg.dtype == torch.bfloat16
    assert model.cfg.model_name == gpt2_dir.name
    model.name_or_path = "Qwen/Qwen3-0.6B"
    assert model.cfg.model_name == "Qwen3-0.6B"  # TransformerLens' model_name: the hub id's last part
    model.name_or_path = None
    assert model.cfg.model_name == "custom"


# ----------------------------------------------------------------- methods and utils
def test_get_device_as_transformer_lens(monkeypatch):
    from transformer_lens.utilities.devices import get_device as tl_get_device

    from hooked import utils

    monkeypatch.delenv("TRANSFORMERLENS_ALLOW_MPS", raising=False)
    assert utils.get_device() == tl_get_device()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert utils.get_device() == tl_get_device() == "cuda"


@pytest.mark.parametrize("pair", ["gpt2_pair", "qwen3_pair"])
def test_stop_at_layer_returns_the_residual_before_that_block(pair, request):
    ours, theirs = request.getfixturevalue(pair)
    tokens = torch.randint(1, ours.cfg.d_vocab, (2, 6))
    for stop in (0, 1, -1, ours.cfg.n_layers):
        assert_same(ours(tokens, stop_at_layer=stop), theirs(tokens, stop_at_layer=stop), f"stop_at_layer={stop}")
    _, cache = ours.run_with_cache(tokens)
    assert_same(ours(tokens, stop_at_layer=1, return_type="loss"), cache["blocks.1.hook_resid_pre"], "resid_pre 1")


@pytest.mark.parametrize("pair", ["gpt2_pair", "qwen3_pair"])
def test_start_at_layer_takes_a_residual(pair, request):
    ours, theirs = request.getfixturevalue(pair)
    tokens = torch.randint(1, ours.cfg.d_vocab, (2, 6))
    _, cache = ours.run_with_cache(tokens)
    resid = cache["blocks.1.hook_resid_pre"]
    assert_same(ours(resid, start_at_layer=1), theirs(resid, start_at_layer=1), "start_at_layer=1")
    assert_same(ours(resid, start_at_layer=1), ours(tokens), "start_at_layer=1 vs the whole forward")
    assert_same(
        ours(resid, start_at_layer=-1, tokens=tokens, return_type="loss"),
        theirs(resid, start_at_layer=-1, tokens=tokens, return_type="loss"),
        "loss from layer -1",
    )
    assert_same(ours(resid, start_at_layer=1, stop_at_layer=1), resid, "an empty slice of blocks")
    with pytest.raises(ValueError, match="needs tokens="):
        ours(resid, start_at_layer=1, return_type="loss")
    with pytest.raises(ValueError, match="residual stream"):
        ours(tokens, start_at_layer=1)


@pytest.mark.parametrize("pair", ["gpt2_pair", "qwen3_pair"])
def test_start_at_layer_with_a_padding_mask(pair, request):
    """The mask gives the padded rows' positions (rotary) and masks their pads, as in the whole forward."""
    ours, _ = request.getfixturevalue(pair)
    tokens = torch.randint(1, ours.cfg.d_vocab, (2, 6))
    mask = torch.ones_like(tokens)
    mask[1, :2] = 0
    logits, cache = ours.run_with_cache(tokens, attention_mask=mask)
    resumed = ours(cache["blocks.1.hook_resid_pre"], start_at_layer=1, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(resumed[real], logits[real], rtol=0, atol=1e-6)


def test_loss_fn_as_transformer_lens(gpt2_pair):
    ours, theirs = gpt2_pair
    tokens = ours.to_tokens(["Hello world", "a b"])
    logits = ours(tokens)
    mask = torch.ones_like(tokens)
    mask[1, :3] = 0
    for kwargs in ({}, {"per_token": True}, {"attention_mask": mask}, {"attention_mask": mask, "per_token": True}):
        assert_same(
            ours.loss_fn(logits, tokens, **kwargs), theirs.loss_fn(logits, tokens, **kwargs), f"loss_fn {kwargs}"
        )


def test_set_tokenizer_takes_a_hugging_face_tokenizer(gpt2_dir, gpt2_pair):
    _, theirs = gpt2_pair
    model = hooked.load(gpt2_dir)
    before = model.to_tokens(["Hello world", "a b"])
    model.set_tokenizer(theirs.tokenizer)
    assert torch.equal(model.to_tokens(["Hello world", "a b"]), before)
    assert torch.equal(model.to_tokens("Hello world"), theirs.to_tokens("Hello world"))
    assert model.to_str_tokens("Hello world") == theirs.to_str_tokens("Hello world")
    assert model.tokenizer.name_or_path == theirs.tokenizer.name_or_path
    model.set_tokenizer(theirs.tokenizer, default_padding_side="right")  # TransformerLens' default side
    assert torch.equal(
        model.to_tokens(["Hello world", "a b"]), theirs.to_tokens(["Hello world", "a b"], padding_side="right")
    )
    with pytest.raises(ValueError, match="must be 'left'.*or 'right'"):
        model.set_tokenizer(theirs.tokenizer, default_padding_side="up")
    with pytest.raises(TypeError, match="HookedTokenizer"):
        model.set_tokenizer("gpt2")


@pytest.mark.parametrize("form", ["str", "list of str", "ids 1-D", "ids [1 pos]", "numpy", "numpy 1-D"])
def test_to_str_tokens_on_every_input_form(gpt2_pair, form):
    import numpy as np

    ours, theirs = gpt2_pair
    ids = ours.to_tokens("Hello world")
    inputs = {
        "str": "Hello world",
        "list of str": ["Hello", "a b"],
        "ids 1-D": ids[0],
        "ids [1 pos]": ids,
        "numpy": ids.numpy(),
        "numpy 1-D": np.asarray(ids[0]),
    }
    assert ours.to_str_tokens(inputs[form]) == theirs.to_str_tokens(inputs[form])


def test_to_str_tokens_on_a_list_of_ids(gpt2_pair):
    """TransformerLens raises on a list of ints; hooked reads it as ids [pos] (a strict extension)."""
    ours, _ = gpt2_pair
    ids = ours.to_tokens("Hello world")[0]
    assert ours.to_str_tokens(ids.tolist()) == ours.to_str_tokens(ids)


def test_tokens_to_residual_directions_after_fold_ln(gpt2_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = hooked.load(gpt2_dir, fold_ln=True)
        theirs = tl_gpt2(gpt2_dir, fold_ln=True)
    for tokens in (5, torch.tensor([5]), torch.tensor([[3, 4], [5, 6]]), "a"):
        assert_same(
            ours.tokens_to_residual_directions(tokens),
            theirs.tokens_to_residual_directions(tokens),
            f"tokens_to_residual_directions({tokens!r})",
        )


def test_remove_batch_dim_raises_on_a_batch_as_transformer_lens(gpt2_pair):
    ours, theirs = gpt2_pair
    tokens = ours.to_tokens(["Hello world", "a b"])
    _, their_cache = theirs.run_with_cache(tokens)
    with pytest.raises(AssertionError, match="batch size 2"):
        their_cache.remove_batch_dim()
    _, cache = ours.run_with_cache(tokens)
    with pytest.raises(ValueError, match="batch of 1"):
        cache.remove_batch_dim()
    # TransformerLens' run_with_cache(remove_batch_dim=True) silently keeps row 0 of a batch; hooked refuses
    with pytest.raises(ValueError, match="batch of 1"):
        ours.run_with_cache(tokens, remove_batch_dim=True)
    one = tokens[:1]
    _, cache = ours.run_with_cache(one, remove_batch_dim=True)
    _, their_cache = theirs.run_with_cache(one, remove_batch_dim=True)
    for name in ("hook_embed", "blocks.1.attn.hook_pattern", "ln_final.hook_scale"):
        assert_same(cache[name], their_cache[name], f"{name} without the batch axis")
