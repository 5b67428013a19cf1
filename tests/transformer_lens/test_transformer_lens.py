"""The TransformerLens API a notebook uses, compared with TransformerLens 3.9 on the same random weights.

The reference is `tests/transformer_lens/tl_reference.py`: TransformerLens' HookedTransformer with this GPT-2
checkpoint's weights, unfolded, and left padding. Every refusal has its own test.
"""

import contextlib
import dataclasses
import io
import warnings

import pytest
import torch

import hooked
from hooked import utils
from hooked.testing import random_model
from tests.transformer_lens.tl_reference import tl_gpt2

PROMPTS = ["When Mary and John went to the store, John gave a drink to", "Hi", "The cat sat on the mat"]


@pytest.fixture(scope="module")
def tl(gpt2_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tl_gpt2(gpt2_dir)


@pytest.fixture(scope="module")
def tl_utils():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import utils as tl_utils
    return tl_utils


# ----------------------------------------------------------------------------- config
def test_config_fields_are_transformer_lens_values(gpt2, tl):
    for field in (
        "n_layers",
        "d_model",
        "n_heads",
        "d_head",
        "d_mlp",
        "d_vocab",
        "d_vocab_out",
        "n_ctx",
        "act_fn",
        "normalization_type",
        "positional_embedding_type",
        "default_prepend_bos",
        "original_architecture",
        "eps",
    ):
        assert getattr(gpt2.cfg, field) == getattr(tl.cfg, field), field
    assert str(gpt2.cfg.device) == str(tl.cfg.device) == "cpu"
    assert gpt2.cfg.tokenizer_name == gpt2.name_or_path


def test_qwen3_config_names():
    qwen = random_model("qwen3_moe")
    cfg = qwen.cfg
    assert (cfg.act_fn, cfg.normalization_type, cfg.positional_embedding_type) == ("silu", "RMS", "rotary")
    assert cfg.n_ctx == cfg.max_position_embeddings and cfg.d_vocab_out == cfg.d_vocab
    assert cfg.n_key_value_heads == cfg.n_kv_heads and cfg.default_prepend_bos is False
    assert cfg.original_architecture == "Qwen3MoeForCausalLM"


def test_default_prepend_bos_is_settable_and_used(gpt2, tl):
    tokens = gpt2.to_tokens("Hi")
    try:
        gpt2.cfg.default_prepend_bos = False
        tl.cfg.default_prepend_bos = False
        assert torch.equal(gpt2.to_tokens("Hi"), tl.to_tokens("Hi"))
        assert gpt2.to_tokens("Hi").shape[1] == tokens.shape[1] - 1
        # the forward reads it too: the same ids, the same forward, so exact
        torch.testing.assert_close(gpt2("Hi"), gpt2(tokens[:, 1:]), rtol=0, atol=0)
    finally:
        gpt2.cfg.default_prepend_bos = True
        tl.cfg.default_prepend_bos = True


def test_config_fields_stay_fixed(gpt2):
    with pytest.raises(dataclasses.FrozenInstanceError, match="d_model"):
        gpt2.cfg.d_model = 3
    with pytest.raises(AttributeError, match="no field"):
        gpt2.cfg.default_prepend_boss = False
    assert dataclasses.replace(gpt2.cfg, n_layers=1).n_layers == 1
    assert vars(gpt2.cfg)["d_model"] == gpt2.cfg.d_model  # sweep provenance reads vars(cfg)


# ----------------------------------------------------------------------------- forward and hooks
def test_logits_and_activations_match(gpt2, tl):
    tokens = gpt2.to_tokens(PROMPTS[0])
    with torch.no_grad():
        logits, cache = gpt2.run_with_cache(tokens)
        tl_logits, tl_cache = tl.run_with_cache(tokens)
    torch.testing.assert_close(logits, tl_logits, rtol=1e-4, atol=1e-4)
    shared = [
        name for name in gpt2.hook_names if name in tl_cache
    ]  # hook_result: TransformerLens computes it on request
    assert len(shared) >= 2 + 2 * 14  # every concept TransformerLens names is here under its name
    for name in shared:
        ours, theirs = cache[name], tl_cache[name]
        if name.endswith("hook_attn_scores"):  # masked entries: the dtype's minimum here, -inf there (documented)
            causal = torch.ones(ours.shape[-2:], dtype=torch.bool).tril()
            ours, theirs = ours[..., causal], theirs[..., causal]
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4, msg=name)


def test_hook_registry_as_transformer_lens(gpt2):
    name = "blocks.0.hook_resid_pre"
    point = gpt2.hook_dict[name]
    fn = lambda x, hook: None  # noqa: E731
    gpt2.add_hook(name, fn)
    gpt2.add_perma_hook(name, fn)
    gpt2.add_hook(name, fn, dir="bwd")
    assert (len(point.fwd_hooks), len(point.bwd_hooks)) == (2, 1)
    point.remove_hooks("fwd")
    assert (len(point.fwd_hooks), len(point.bwd_hooks)) == (1, 1)  # the permanent one stays
    gpt2.remove_all_hook_fns(direction="bwd")
    assert (len(point.fwd_hooks), len(point.bwd_hooks)) == (1, 0)
    point.ctx["kept"] = 1
    gpt2.remove_all_hook_fns(including_permanent=True)
    assert (len(point.fwd_hooks), point.ctx) == (0, {"kept": 1})  # remove_all_hook_fns keeps ctx
    point.ctx.clear()
    point.add_hook(fn, dir="fwd")
    assert len(point.fwd_hooks) == 1
    point.remove_hooks("both")
    assert not point.fwd_hooks
    assert gpt2.hook_points() == list(gpt2.hook_dict.values())
    assert gpt2.mod_dict["blocks.0.attn"] is gpt2.blocks[0].attn and "" not in gpt2.mod_dict


def test_hook_levels_refused(gpt2):
    for call in (
        lambda: gpt2.remove_all_hook_fns(level=1),
        lambda: gpt2.hook_dict["hook_embed"].remove_hooks(level=1),
        lambda: gpt2.hook_dict["hook_embed"].add_hook(lambda x, h: None, level=1),
    ):
        with pytest.raises(ValueError, match="levels"):
            call()


def test_backward_hook_may_return_a_tuple(gpt2, tl, tokens):
    name = "blocks.1.hook_resid_mid"
    grads = {}

    def double(grad, hook):
        return (2 * grad,)

    def record(grad, hook):
        grads.setdefault(hook.name + str(len(grads)), grad.clone())

    for model, key in ((gpt2, "hooked"), (tl, "tl")):
        model.zero_grad(set_to_none=True)
        loss = model.run_with_hooks(tokens, return_type="loss", bwd_hooks=[(name, double)])
        loss.backward()
        grads[key] = model.W_pos.grad.clone()
        model.zero_grad(set_to_none=True)
        model.run_with_hooks(tokens, return_type="loss").backward()
        grads[key + " plain"] = model.W_pos.grad.clone()
        model.zero_grad(set_to_none=True)
    assert not torch.allclose(grads["hooked"], grads["hooked plain"])  # the returned gradient was used
    torch.testing.assert_close(grads["hooked"], grads["tl"], rtol=1e-4, atol=1e-5)


def test_backward_hook_returning_junk_raises(gpt2, tokens):
    loss = gpt2.run_with_hooks(tokens, return_type="loss", bwd_hooks=[("blocks.0.hook_resid_mid", lambda g, h: "grad")])
    with pytest.raises(TypeError, match="returned str"):
        loss.backward()


def test_attn_result_toggle_is_a_no_op(gpt2, tl):
    gpt2.set_use_attn_result(True)
    tl.set_use_attn_result(True)
    try:
        tokens = gpt2.to_tokens(PROMPTS[1])
        with torch.no_grad():
            _, cache = gpt2.run_with_cache(tokens, names_filter="blocks.0.attn.hook_result")
            _, tl_cache = tl.run_with_cache(tokens, names_filter="blocks.0.attn.hook_result")
        torch.testing.assert_close(
            cache["blocks.0.attn.hook_result"], tl_cache["blocks.0.attn.hook_result"], rtol=1e-4, atol=1e-5
        )
    finally:
        tl.set_use_attn_result(False)
    gpt2.set_use_split_qkv_input(False)
    gpt2.set_use_hook_mlp_in(False)
    gpt2.set_use_attn_in(False)


def test_split_qkv_and_mlp_in_match_transformer_lens(gpt2, tl):
    """TransformerLens' split inputs: the same copies per head, and an edit of one head's input acts alike."""
    tokens = gpt2.to_tokens(PROMPTS[0])  # unpadded (the libraries' padded columns differ and are never read)
    names = ["blocks.1.hook_q_input", "blocks.1.hook_k_input", "blocks.1.hook_v_input", "blocks.1.hook_mlp_in"]

    def shift_head_1(x, hook):  # one head's query (or key/value) input moved: only that head sees it
        x[:, :, 1] *= -3.0

    gpt2.set_use_split_qkv_input(True)
    gpt2.set_use_hook_mlp_in(True)
    tl.set_use_split_qkv_input(True)
    tl.set_use_hook_mlp_in(True)
    try:
        with torch.no_grad():
            _, cache = gpt2.run_with_cache(tokens, names_filter=names)
            _, tl_cache = tl.run_with_cache(tokens, names_filter=names)
            for name in names:
                torch.testing.assert_close(cache[name], tl_cache[name], rtol=1e-4, atol=1e-5)
            for name in names[:3]:
                ours = gpt2.run_with_hooks(tokens, fwd_hooks=[(name, shift_head_1)])
                theirs = tl.run_with_hooks(tokens, fwd_hooks=[(name, shift_head_1)])
                assert not torch.allclose(ours, gpt2(tokens), atol=1e-4)  # the edit changed something
                torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    finally:
        gpt2.set_use_split_qkv_input(False)
        gpt2.set_use_hook_mlp_in(False)
        tl.set_use_split_qkv_input(False)
        tl.set_use_hook_mlp_in(False)


@pytest.mark.parametrize(
    "toggle, hint", [("set_use_attn_in", "ln1.hook_normalized"), ("set_ungroup_grouped_query_attention", "kv_head")]
)
def test_toggles_without_a_hook_point_raise(gpt2, toggle, hint):
    with pytest.raises(ValueError, match=hint):
        getattr(gpt2, toggle)(True)


# ----------------------------------------------------------------------------- tokens
def test_to_tokens_matches(gpt2, tl):
    for prepend_bos in (None, True, False):
        assert torch.equal(
            gpt2.to_tokens(PROMPTS, prepend_bos=prepend_bos), tl.to_tokens(PROMPTS, prepend_bos=prepend_bos)
        )
        assert torch.equal(
            gpt2.to_tokens(PROMPTS[0], prepend_bos=prepend_bos), tl.to_tokens(PROMPTS[0], prepend_bos=prepend_bos)
        )
    assert torch.equal(gpt2.to_tokens(PROMPTS, padding_side="left"), tl.to_tokens(PROMPTS, padding_side="left"))


def test_to_tokens_truncates_to_n_ctx(gpt2, tl):
    long = "a b " * gpt2.cfg.n_ctx
    tokens = gpt2.to_tokens([long, "Hi"])
    assert tokens.shape[1] == gpt2.cfg.n_ctx
    assert torch.equal(tokens, tl.to_tokens([long, "Hi"]))
    assert gpt2.to_tokens(long, truncate=False).shape[1] > gpt2.cfg.n_ctx
    gpt2(tokens)  # runs: the model has n_ctx positions


def test_right_padding_as_transformer_lens(gpt2, tl, tl_utils):
    """padding_side="right" gives TransformerLens' ids and mask; any other side string is refused by name."""
    tokens = gpt2.to_tokens(PROMPTS, padding_side="right")
    assert torch.equal(tokens, tl.to_tokens(PROMPTS, padding_side="right"))
    assert gpt2.tokenizer.padding_side == "left"  # the call's side does not change the tokenizer's
    theirs = tl_utils.get_attention_mask(tl.tokenizer, tokens, True, padding_side="right")
    assert torch.equal(utils.get_attention_mask(gpt2.tokenizer, tokens, True, padding_side="right"), theirs)
    for bad in ("middle", "Right", ""):
        with pytest.raises(ValueError, match="must be 'left'.*or 'right'"):
            gpt2.to_tokens(PROMPTS, padding_side=bad)
        with pytest.raises(ValueError, match="must be 'left'.*or 'right'"):
            gpt2.tokenizer.padding_side = bad
    assert gpt2.tokenizer.padding_side == "left"


def test_to_str_tokens_squeezes_as_transformer_lens(gpt2, tl):
    tokens = gpt2.to_tokens(PROMPTS[0])
    for value in (
        PROMPTS[0],
        PROMPTS,
        tokens,
        tokens[0],
        tokens[0, 3],
        tokens[:, :1],
        tokens.numpy(),
        tokens[0].numpy(),
    ):
        assert gpt2.to_str_tokens(value) == tl.to_str_tokens(value)
    assert gpt2.to_str_tokens(PROMPTS[2], prepend_bos=False) == tl.to_str_tokens(PROMPTS[2], prepend_bos=False)
    assert gpt2.to_str_tokens(gpt2.to_tokens(PROMPTS[:2])) == [
        gpt2.to_str_tokens(row) for row in gpt2.to_tokens(PROMPTS[:2])
    ]


@pytest.mark.unchecked
def test_single_tokens_and_positions(gpt2, tl):
    token = gpt2.to_single_token(" John")
    assert token == tl.to_single_token(" John")
    assert gpt2.to_single_str_token(token) == tl.to_single_str_token(token) == " John"
    with pytest.raises(TypeError, match="int token id"):
        gpt2.to_single_str_token(torch.tensor(token))
    tokens = gpt2.to_tokens(PROMPTS[0])
    for mode in ("first", "last"):
        for single, text in ((" John", PROMPTS[0]), (token, tokens), (torch.tensor(token), tokens[0])):
            assert gpt2.get_token_position(single, text, mode=mode) == tl.get_token_position(single, text, mode=mode)
        assert gpt2.get_token_position(" John", PROMPTS[0], mode, prepend_bos=False) == tl.get_token_position(
            " John", PROMPTS[0], mode, prepend_bos=False
        )
    assert gpt2.get_token_position(" John", PROMPTS[0], "first") != gpt2.get_token_position(" John", PROMPTS[0], "last")
    with pytest.raises(ValueError, match="does not occur"):
        gpt2.get_token_position(" John", "Hi there")
    with pytest.raises(ValueError, match="mode"):
        gpt2.get_token_position(" John", PROMPTS[0], mode="middle")
    with pytest.raises(ValueError, match=r"\[1, pos\]"):
        gpt2.get_token_position(" John", gpt2.to_tokens(PROMPTS))


def test_tokens_to_residual_directions_shapes(gpt2, tl):
    tokens = gpt2.to_tokens(PROMPTS)
    weight = gpt2.ln_final.weight
    for value in (" John", 5, torch.tensor(5), torch.tensor([5]), torch.tensor([[5]]), tokens[0], tokens):
        ours, theirs = gpt2.tokens_to_residual_directions(value), tl.tokens_to_residual_directions(value)
        assert ours.shape == theirs.shape
        # hooked's direction includes the final norm's weight (weights are unfolded): a documented difference
        torch.testing.assert_close(ours, theirs * weight)


def test_tokenizer_answers_hugging_face_calls(gpt2, tl):
    ours, theirs = gpt2.tokenizer, tl.tokenizer
    for attribute in (
        "bos_token",
        "eos_token",
        "pad_token",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "padding_side",
    ):
        assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
    assert ours.encode(" Mary went") == theirs.encode(" Mary went")
    assert ours.encode(" Mary went", add_special_tokens=False) == theirs.encode(" Mary went", add_special_tokens=False)
    ids = ours.encode(PROMPTS[0])
    assert ours.decode(ids) == theirs.decode(ids) and ours.decode(torch.tensor(ids)) == theirs.decode(ids)
    assert ours.batch_decode([ids[:3], ids[3:]]) == theirs.batch_decode([ids[:3], ids[3:]])
    batch, tl_batch = ours(PROMPTS, return_tensors="pt"), theirs(PROMPTS, return_tensors="pt", padding=True)
    assert torch.equal(batch["input_ids"], tl_batch["input_ids"])
    assert torch.equal(batch["attention_mask"], tl_batch["attention_mask"])
    assert ours(" Mary")["input_ids"] == theirs(" Mary")["input_ids"]
    assert ours.name_or_path == str(gpt2.name_or_path) and len(ours) == ours.vocab_size == len(theirs)
    assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)
    assert ours.convert_tokens_to_ids("<|endoftext|>") == theirs.convert_tokens_to_ids("<|endoftext|>")
    with pytest.raises(ValueError, match="padding=True"):
        ours(PROMPTS, padding=False)


# ----------------------------------------------------------------------------- utils
def test_utils_match(gpt2, tl, tl_utils):
    tokens = gpt2.to_tokens(PROMPTS)
    for prepend_bos in (True, False):
        torch.testing.assert_close(
            utils.get_attention_mask(gpt2.tokenizer, tokens, prepend_bos),
            tl_utils.get_attention_mask(tl.tokenizer, tokens, prepend_bos),
            rtol=0,
            atol=0,
        )
    alone = gpt2.to_tokens(PROMPTS[2])
    assert torch.equal(utils.get_attention_mask(gpt2.tokenizer, alone, True), torch.ones_like(alone))
    with torch.no_grad():
        logits = gpt2(tokens)
    mask = utils.get_attention_mask(gpt2.tokenizer, tokens, True)
    for attention_mask in (None, mask):
        for per_token in (False, True):
            torch.testing.assert_close(
                utils.lm_cross_entropy_loss(logits, tokens, attention_mask, per_token),
                tl_utils.lm_cross_entropy_loss(logits, tokens, attention_mask, per_token),
            )
    assert not torch.allclose(
        utils.lm_cross_entropy_loss(logits, tokens, mask), utils.lm_cross_entropy_loss(logits, tokens)
    )
    for per_token in (False, True):
        assert torch.equal(
            utils.lm_accuracy(logits, tokens, per_token), tl_utils.lm_accuracy(logits, tokens, per_token)
        )
    for value in (torch.ones(2, dtype=torch.bfloat16), [1, 2], (3,), 4.0, logits[0, 0]):
        assert (utils.to_numpy(value) == tl_utils.to_numpy(value)).all()
    for name, layer in (("z", 1), ("pattern", 0), ("resid_post", 1), ("embed", None)):
        assert utils.get_act_name(name, layer) == tl_utils.get_act_name(name, layer)
    assert utils.Slice(-1).apply(tokens, dim=1).shape == tl_utils.Slice(-1).apply(tokens, dim=1).shape


def _printed(fn, *args, **kwargs) -> str:
    """What fn prints, without whitespace: TransformerLens prints through rich, which wraps long lines."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args, **kwargs)
    return "".join(out.getvalue().split())


@pytest.mark.parametrize("answer", [" Mary", ["Mary", " went to the store", " John"], "went to the store"])
def test_test_prompt_ranks_match(gpt2, tl, tl_utils, answer):
    prompt = PROMPTS[0]
    ours = _printed(utils.test_prompt, prompt, answer, gpt2, top_k=3)
    # Answers of several lengths: TransformerLens takes each row's first column, right only with right padding.
    tl.tokenizer.padding_side = "right"
    try:
        theirs = _printed(tl_utils.test_prompt, prompt, answer, tl, top_k=3)
    finally:
        tl.tokenizer.padding_side = "left"
    assert "Ranksoftheanswertokens:" in ours and "Top2thtoken" in ours
    assert ours == theirs


# ----------------------------------------------------------------------------- from_pretrained
def test_from_pretrained_on_the_base_class(gpt2_dir, gpt2):
    model = hooked.HookedTransformer.from_pretrained(gpt2_dir, default_prepend_bos=False, device="cpu", dtype="float32")
    assert isinstance(model, hooked.GPT2) and model.cfg.default_prepend_bos is False
    assert model.processing["fold_ln"] and model.cfg.normalization_type == "LNPre"  # processed, as TransformerLens
    falses = dict(
        fold_ln=False,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
        refactor_factored_attn_matrices=False,
    )
    for source in (
        hooked.HookedTransformer.from_pretrained_no_processing(gpt2_dir),
        hooked.HookedTransformer.from_pretrained(gpt2_dir, **falses),
    ):
        for name, parameter in gpt2.named_parameters():  # unprocessed: the checkpoint's own weights
            assert torch.equal(source.get_parameter(name), parameter)


@pytest.mark.parametrize(
    "kwargs, named",
    [
        (dict(n_devices=2), "n_devices"),
        (dict(tokenizer=object()), "tokenizer"),
        (dict(hf_model=object()), "hf_model"),
        (dict(first_n_layers=1), "first_n_layers"),
        (dict(checkpoint_index=3), "checkpoint_index"),
        (dict(move_to_device=False), "move_to_device"),
        (dict(trust_remote_code=True), "trust_remote_code"),
    ],
)
def test_other_transformer_lens_arguments_are_refused(gpt2_dir, kwargs, named):
    with pytest.raises(ValueError, match=named):
        hooked.HookedTransformer.from_pretrained(gpt2_dir, **kwargs)


def test_right_padding_default(gpt2_dir):
    model = hooked.HookedTransformer.from_pretrained(gpt2_dir, default_padding_side="right")
    assert model.tokenizer.padding_side == "right"
    tokens = model.to_tokens(["Hi there", "A"])
    assert tokens[1, -1] == model.tokenizer.pad_token_id and tokens[1, 0] == model.tokenizer.bos_token_id
    with pytest.raises(ValueError, match="must be 'left'.*or 'right'"):
        hooked.HookedTransformer.from_pretrained(gpt2_dir, default_padding_side="top")


def test_loss_per_token_as_transformer_lens(gpt2, gpt2_dir):
    from tests.transformer_lens.tl_reference import tl_gpt2

    reference = tl_gpt2(gpt2_dir)
    prompts = ["When Mary and John went to the store", "Hi there"]
    with torch.no_grad():
        ours = gpt2(prompts, return_type="loss", loss_per_token=True)
        theirs = reference(prompts, return_type="loss", loss_per_token=True)
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            gpt2(prompts, return_type="loss"), reference(prompts, return_type="loss"), rtol=1e-5, atol=1e-5
        )


# ----------------------------------------------------------------------------- generate's defaults
def test_generate_samples_by_default_on_models_built_the_transformer_lens_way(gpt2_dir, gpt2, capsys):
    """TransformerLens 3.9's `generate` samples (`do_sample=True`) and shows a progress bar (`verbose=True`)
    unless told otherwise: so does `generate` on a model from `HookedTransformer.from_pretrained`,
    `from_pretrained_no_processing` or `HookedTransformer(cfg)`; `hooked.load`'s models stay greedy and quiet."""
    prompt = "When Mary and John went to the store"
    for model in (
        hooked.HookedTransformer.from_pretrained_no_processing(gpt2_dir),
        hooked.HookedTransformer(
            hooked.HookedTransformerConfig(
                n_layers=1, d_model=32, n_ctx=16, d_head=8, n_heads=4, d_vocab=50, act_fn="gelu_new"
            )
        ),
    ):
        tokens = torch.tensor([[1, 2, 3, 4]])
        capsys.readouterr()
        sampled = model.generate(tokens, 12, seed=0, stop_at_eos=False)
        assert capsys.readouterr().err  # the progress bar
        assert torch.equal(
            sampled, model.generate(tokens, 12, seed=0, do_sample=True, verbose=False, stop_at_eos=False)
        )
        assert not torch.equal(sampled, model.generate(tokens, 12, do_sample=False, verbose=False, stop_at_eos=False))
    processed = hooked.HookedTransformer.from_pretrained(gpt2_dir)
    assert processed.generate(prompt, 5, seed=1, verbose=False) == processed.generate(
        prompt, 5, seed=1, do_sample=True, verbose=False
    )
    capsys.readouterr()
    greedy = gpt2.generate(prompt, 5)
    assert not capsys.readouterr().err
    assert greedy == gpt2.generate(prompt, 5, do_sample=False)
    with pytest.raises(ValueError, match="do_sample"):  # hooked's own default refuses sampling arguments
        gpt2.generate(prompt, 5, temperature=0.7)
