"""`HookedTransformerConfig(...)` then `HookedTransformer(cfg)`, and `HookPoint()` in a user's own module.

A config built with TransformerLens' fields must mean the same function in both libraries: the model each
builds from the same keyword arguments, given the same weights, gives the same logits (GPT-2 and grouped
Qwen3). The random initialisation is checked by its statistics; refusals name the field.
"""

import shutil
import warnings

import pytest
import torch
import transformers
from torch import nn

import hooked
from hooked import HookedRootModule, HookPoint
from hooked.testing import randomize_norms
from tests.transformer_lens.tl_reference import tl_gpt2, tl_qwen3

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import transformer_lens


def _tl_model(**fields):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformer_lens.HookedTransformer(
            transformer_lens.HookedTransformerConfig(**fields, device="cpu")
        ).eval()


@pytest.mark.parametrize("act_fn", ["gelu_new", "relu"])  # relu: TransformerLens' toy configs' (a GPT-2 MLP with ReLU)
def test_gpt2_config_is_transformer_lens_function(gpt2_dir, act_fn):
    loaded = hooked.load(gpt2_dir)
    fields = dict(
        n_layers=2,
        d_model=64,
        d_head=16,
        n_ctx=64,
        d_vocab=loaded.cfg.d_vocab,
        act_fn=act_fn,
        normalization_type="LN",
        eps=loaded.cfg.eps,
    )
    ours = hooked.HookedTransformer(hooked.HookedTransformerConfig(**fields))
    assert type(ours) is hooked.GPT2 and isinstance(ours, hooked.HookedTransformer)
    theirs = _tl_model(**fields)
    for name in (
        "n_layers",
        "d_model",
        "n_heads",
        "d_head",
        "d_mlp",
        "d_vocab",
        "n_ctx",
        "act_fn",
        "normalization_type",
        "positional_embedding_type",
        "eps",
    ):
        assert getattr(ours.cfg, name) == getattr(theirs.cfg, name), name
    state = loaded.state_dict()
    state["lm_head.weight"] = state["wte.weight"].clone()  # an unembedding of its own, as TransformerLens
    ours.load_state_dict(state)
    theirs.load_state_dict(tl_gpt2(gpt2_dir, with_tokenizer=False).state_dict())
    tokens = torch.randint(0, loaded.cfg.d_vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ours(tokens), theirs(tokens), atol=1e-4, rtol=1e-4)
    assert ours.W_U.data_ptr() != ours.W_E.data_ptr()


def test_qwen3_config_is_transformer_lens_function(tmp_path):
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        num_hidden_layers=2,
        max_position_embeddings=128,
    )
    hf = transformers.Qwen3ForCausalLM(config).eval()
    randomize_norms(hf)
    hf.save_pretrained(tmp_path)
    fields = dict(
        n_layers=2,
        d_model=32,
        d_head=8,
        n_heads=4,
        n_key_value_heads=2,
        d_mlp=48,
        d_vocab=64,
        n_ctx=128,
        act_fn="silu",
        normalization_type="RMS",
        positional_embedding_type="rotary",
        gated_mlp=True,
        use_qk_norm=True,
        final_rms=True,
        eps=config.rms_norm_eps,
        rotary_base=config.rope_parameters["rope_theta"],
    )
    ours = hooked.HookedTransformer(hooked.HookedTransformerConfig(**fields))
    assert type(ours) is hooked.Qwen3 and ours.cfg.n_kv_heads == 2
    ours.load_state_dict(hooked.load(tmp_path).state_dict())
    theirs = _tl_model(**fields)
    theirs.load_state_dict(tl_qwen3(tmp_path, hf).state_dict())
    tokens = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ours(tokens), theirs(tokens), atol=1e-4, rtol=1e-4)


def test_tokenizer_name_loads_the_tokenizer_and_its_vocabulary_size(gpt2_dir, tmp_path, monkeypatch):
    """`tokenizer_name` (TransformerLens' toy configs name "gpt2") loads that tokenizer, from a hub cache offline
    with its tokenizer files alone, and infers d_vocab from it as TransformerLens does (the largest id + 1):
    TransformerLens 3.9 given the same tokenizer tokenizes the same text to the same ids."""
    from huggingface_hub import constants

    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / "models--someone--tiny-gpt2" / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for file in gpt2_dir.iterdir():
        if not file.name.endswith(".safetensors"):  # a tokenizer's repository: no weights needed
            shutil.copy(file, snapshot / file.name)
    (tmp_path / "hub" / "models--someone--tiny-gpt2" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--tiny-gpt2" / "refs" / "main").write_text(revision)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    fields = dict(n_layers=1, d_model=10, d_head=5, n_ctx=20, act_fn="relu", use_hook_tokens=True)
    model = hooked.HookedTransformer(hooked.HookedTransformerConfig(**fields, tokenizer_name="someone/tiny-gpt2"))
    reference = tl_gpt2(gpt2_dir)
    assert model.cfg.d_vocab == max(reference.tokenizer.get_vocab().values()) + 1 == model.W_E.shape[0]
    assert torch.equal(model.to_tokens("Hello World!"), reference.to_tokens("Hello World!"))
    assert model.cfg.tokenizer_name == "someone/tiny-gpt2"
    with pytest.raises(hooked.CheckpointError, match="not in the Hugging Face cache"):
        hooked.HookedTransformerConfig(**fields, tokenizer_name="someone/other")
    with pytest.raises(ValueError, match="has no tokenizer files"):
        hooked.HookedTransformerConfig(**fields, tokenizer_name=str(tmp_path / "hub"))
    with pytest.raises(ValueError, match="give d_vocab, or tokenizer_name="):
        hooked.HookedTransformerConfig(**fields)


def test_random_init_is_transformer_lens_gpt2_init():
    cfg = hooked.HookedTransformerConfig(
        n_layers=2, d_model=256, d_head=32, n_ctx=64, d_vocab=500, act_fn="gelu", seed=1
    )
    model = hooked.HookedTransformer(cfg)
    again = hooked.HookedTransformer(
        hooked.HookedTransformerConfig(n_layers=2, d_model=256, d_head=32, n_ctx=64, d_vocab=500, act_fn="gelu", seed=1)
    )
    assert torch.equal(model.W_Q, again.W_Q)  # the seed makes the draw reproducible
    std = 0.8 / 256**0.5
    for weight in (model.W_E, model.W_pos, model.W_Q, model.W_O, model.W_in, model.W_out, model.W_U):
        assert abs(weight.std().item() - std) < 0.05 * std
    for bias in (model.b_Q, model.b_O, model.b_in, model.b_out):
        assert torch.all(bias == 0)
    assert torch.all(model.blocks[0].ln1.weight == 1) and torch.all(model.ln_final.bias == 0)
    assert model.cfg.act_fn == "gelu" and model.cfg.d_mlp == 1024 and model.tokenizer is None
    copy = hooked.HookedTransformer(model.cfg)  # a family config builds too, without taking the model's config
    assert type(copy) is hooked.GPT2 and copy.cfg is not model.cfg and copy.W_Q.shape == model.W_Q.shape
    assert model.cfg.device == torch.device("cpu") and model.cfg._bound_model() is model


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            dict(
                attn_only=True,
                normalization_type="RMS",
                positional_embedding_type="rotary",
                act_fn="silu",
                gated_mlp=True,
                use_qk_norm=True,
                final_rms=True,
            ),
            "attn_only=True (Qwen3 blocks have an MLP",
        ),
        (dict(act_fn="solu_ln"), "act_fn='solu_ln'"),
        (dict(positional_embedding_type="shortformer"), "no hooked family has"),
        (
            dict(normalization_type="RMS", positional_embedding_type="rotary", act_fn="silu", gated_mlp=True),
            "use_qk_norm=False",
        ),
        (dict(n_key_value_heads=2), "n_key_value_heads=2"),
        (dict(bogus=1), "unexpected keyword argument 'bogus'"),
        (dict(use_attention_sinks=True), "use_attention_sinks=True is not supported: no hooked family has it"),
        # a field some families' checkpoints set: named, with the way to get such a model
        (
            dict(use_normalization_before_and_after=True),
            "checkpoints of hooked's Gemma 2, Gemma 3 can set it, and hooked"
            " builds those from a checkpoint only (hooked.load(path)",
        ),
    ],
)
def test_configs_no_family_has_are_refused(fields, message):
    base = dict(n_layers=1, d_model=32, d_head=8, n_ctx=16, d_vocab=50, act_fn="gelu_new")
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        hooked.HookedTransformerConfig(**{**base, **fields})


class Toy(HookedRootModule):
    """TransformerLens' HookedRootModule tutorial: HookPoint() with no arguments, named by setup()."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()
        self.setup()

    def forward(self, x):
        return self.hook_post(torch.relu(self.linear(self.hook_pre(x))))


def test_hook_point_without_axes_in_a_users_module():
    toy = Toy()
    assert list(toy.hook_dict) == ["hook_pre", "hook_post"] and toy.hook_pre.name == "hook_pre"
    x = torch.randn(2, 3)
    zeroed = toy.run_with_hooks(x, fwd_hooks=[("hook_pre", lambda activation, hook: activation * 0)])
    torch.testing.assert_close(zeroed, torch.relu(toy.linear.bias).expand(2, 3))
    out, cache = toy.run_with_cache(x)
    assert list(cache) == ["hook_pre", "hook_post"]
    torch.testing.assert_close(cache["hook_post"], out.detach())
    torch.testing.assert_close(cache["hook_pre"], x)
    _, only = toy.run_with_cache(x, names_filter="hook_pre")
    assert list(only) == ["hook_pre"]
    assert not toy.hook_pre._fwd  # run_with_cache removed its hooks
