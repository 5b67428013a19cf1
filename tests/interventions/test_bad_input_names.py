"""Bad names, metrics, sources, selectors and load arguments: each raises naming the argument and the fix.

Variant names that collide as text, or take the base run's name; metrics that return a scalar, a list
or the wrong length; resample sources of other prompts; in-place edits of GPT-2's q, k, v under
autograd; and the arguments of `components`, `hooked.load` and the ablation selectors.
"""

import json
import shutil

import httpx
import huggingface_hub
import pytest
import torch
from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hooked
from hooked import ablate, circuits, patch
from hooked.interventions.results import SweepResult
from hooked.testing import random_model


def tokens_of(model, batch=3, pos=7, seed=0):
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def last_logit(logits, base_logits=None, attention_mask=None):
    return logits[:, -1, 0]


def no_hook_left(model) -> bool:
    return all(not point.listening for point in model.hook_dict.values())


# ----------------------------------------------------------------------------- 5. variant names
@pytest.mark.unchecked
def test_variant_names_that_read_the_same_are_refused(gpt2):
    tokens = tokens_of(gpt2)
    variants = {1: ablate.hooks(gpt2, "L0H0"), "1": ablate.hooks(gpt2, "L0H1")}
    with pytest.raises(ValueError, match=r"variant names 1 and '1' are both '1'.*distinct name"):
        hooked.sweep(gpt2, tokens, variants, last_logit)
    assert no_hook_left(gpt2)
    with pytest.raises(ValueError, match=r"positions= label names 1 and '1' are both '1'"):
        patch.resid_sweep(gpt2, tokens, tokens_of(gpt2, seed=1), last_logit, positions={1: 1, "1": 2})
    clean, corrupt = tokens, tokens_of(gpt2, seed=1)
    with pytest.raises(ValueError, match=r"variant names 0 and '0' are both '0'"):
        circuits.patch_edges(gpt2, clean, corrupt, {0: ["L0H0->L1H0.v"], "0": ["L0H1->L1H0.v"]}, last_logit)
    pairs = {2: (["L0H0"], ["logits"]), "2": (["L0H1"], ["logits"])}
    with pytest.raises(ValueError, match=r"pair names 2 and '2' are both '2'"):
        circuits.path_patch_sweep(gpt2, clean, corrupt, pairs, last_logit)
    with pytest.raises(ValueError, match="are both 'a'"):
        SweepResult(["a", "a"], torch.zeros(2, 3), torch.zeros(3), "m")
    assert no_hook_left(gpt2)


def test_the_base_runs_name_is_reserved(gpt2):
    tokens = tokens_of(gpt2)
    with pytest.raises(ValueError, match=r"variant name 'base' is reserved.*run without any variant.*rename"):
        hooked.sweep(gpt2, tokens, {"base": ablate.hooks(gpt2, "L0H0")}, last_logit)
    with pytest.raises(ValueError, match="'base' is reserved"):
        circuits.patch_edges(gpt2, tokens, tokens_of(gpt2, seed=1), {"base": ["L0H0->L1H0.v"]}, last_logit)
    assert no_hook_left(gpt2)
    result = hooked.sweep(gpt2, tokens, {"L0H0": ablate.hooks(gpt2, "L0H0")}, last_logit)
    assert torch.equal(result["base"], result.base)  # result["base"] is the base row of table(), never a variant
    assert [row["variant"] for row in result.rows()] == ["base", "L0H0"]


# ----------------------------------------------------------------------------- 7. metrics
BAD_METRICS = {
    "a scalar": (lambda logits, **kwargs: logits[:, -1, 0].sum(), "got a scalar"),
    "a list": (lambda logits, **kwargs: logits[:, -1, 0].tolist(), "got a list of 3 values"),
    "the wrong length": (lambda logits, **kwargs: logits[:2, -1, 0], r"got a torch.float32 tensor of shape \[2\]"),
}


@pytest.mark.parametrize("kind", list(BAD_METRICS))
def test_a_metric_must_return_one_value_per_prompt(gpt2, kind):
    metric, got = BAD_METRICS[kind]
    clean, corrupt = tokens_of(gpt2), tokens_of(gpt2, seed=1)
    expected = r"a metric must return one value per prompt, a \[batch\] tensor \(\[3\] here\); " + got
    calls = {
        "sweep": lambda: hooked.sweep(gpt2, clean, {"L0H0": ablate.hooks(gpt2, "L0H0")}, metric),
        "head_sweep": lambda: patch.head_sweep(gpt2, corrupt, clean, metric),
        "attribution": lambda: patch.attribution(gpt2, corrupt, clean, metric),
        "patch_edges": lambda: circuits.patch_edges(gpt2, clean, corrupt, ["L0H0->L1H0.v"], metric),
        "attribute": lambda: circuits.attribute(gpt2, clean, corrupt, metric, method="eap"),
    }
    for name, call in calls.items():
        with pytest.raises((TypeError, ValueError), match=expected):
            call()
        assert no_hook_left(gpt2), name


# ----------------------------------------------------------------------------- 8. resample sources
def test_a_resample_source_of_other_prompts_says_how_they_differ(gpt2):
    tokens = tokens_of(gpt2, batch=3, pos=11)
    for source, differs in [
        (tokens[:, :9], "the source holds 3 prompts of 9 tokens, but this run has 3 prompts of 11 tokens"),
        (tokens[:2], "the source holds 2 prompts of 11 tokens, but this run has 3 prompts of 11 tokens"),
    ]:
        _, cache = gpt2.run_with_cache(source, names_filter="blocks.0.attn.hook_z")
        with pytest.raises(
            ValueError, match=differs + ".*as many prompts as the run, each as long as the prompt it replaces"
        ):
            gpt2.run_with_hooks(tokens, fwd_hooks=ablate.hooks(gpt2, "L0H0", "resample", source=cache))
        assert no_hook_left(gpt2)


def test_a_resample_source_padded_otherwise_names_each_prompts_length(gpt2):
    tokens = tokens_of(gpt2, batch=2, pos=7)
    short_first = torch.tensor([[0, 1, 1, 1, 1, 1, 1], [1] * 7], dtype=torch.bool)
    _, cache = gpt2.run_with_cache(tokens, attention_mask=short_first.flip(0), names_filter="blocks.0.attn.hook_z")
    with pytest.raises(
        ValueError, match=r"the source holds 2 prompts of \[7, 6\] tokens, but this run has 2 prompts of \[6, 7\]"
    ):
        gpt2.run_with_hooks(
            tokens, attention_mask=short_first, fwd_hooks=ablate.hooks(gpt2, "L0H0", "resample", source=cache)
        )
    assert no_hook_left(gpt2)


# ----------------------------------------------------------------------------- 9. in-place q, k, v
@pytest.mark.parametrize("architecture", ["gpt2", "qwen3"])
@pytest.mark.parametrize("point", ["q", "k", "v"])
def test_an_in_place_edit_of_q_k_v_backpropagates_as_an_out_of_place_one(architecture, point):
    model = random_model(architecture, seed=1)
    tokens = tokens_of(model, batch=2, pos=5)
    name = f"blocks.1.attn.hook_{point}"

    def in_place(activation, hook):
        activation[:, :, 0] = 0.0

    def out_of_place(activation, hook):
        keep = torch.ones(activation.shape[2], dtype=activation.dtype)
        keep[0] = 0.0
        return activation * keep[:, None]

    parameters = list(model.parameters())
    results = []
    for edit in (in_place, out_of_place):
        logits = model.run_with_hooks(tokens, fwd_hooks=[(name, edit)])
        grads = torch.autograd.grad(logits.square().sum(), parameters)
        results.append((logits.detach(), grads))
    (logits, grads), (expected_logits, expected_grads) = results
    assert torch.allclose(logits, expected_logits, atol=1e-6)
    for grad, expected in zip(grads, expected_grads, strict=True):
        assert torch.allclose(grad, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(expected_logits, model(tokens), atol=1e-4)  # the edit did something
    assert no_hook_left(model)


# ----------------------------------------------------------------------------- 10. arguments
def test_components_names_its_argument():
    gpt2 = random_model("gpt2")
    with pytest.raises(ValueError, match=r"components\(model, 'experts:0'\): layer 0 has no experts.*'neurons:0'"):
        ablate.components(gpt2, "experts:0")
    with pytest.raises(ValueError, match=r"components\(model, 'neurons:x'\): the layer must be an int"):
        ablate.components(gpt2, "neurons:x")
    with pytest.raises(IndexError, match=r"components\(model, 'neurons:5'\): layer 5 is out of range.*2 layers"):
        ablate.components(gpt2, "neurons:5")
    assert ablate.components(gpt2, "neurons:-1")[0] == "L1.N0"
    moe = random_model("qwen3_moe", decoder_sparse_step=2)  # layer 0 dense, layer 1 sparse
    with pytest.raises(ValueError, match="layer 0 has no experts"):
        ablate.components(moe, "experts:0")
    with pytest.raises(
        ValueError, match=r"components\(model, 'neurons:1'\): layer 1 is a mixture of experts.*'experts:1'"
    ):
        ablate.components(moe, "neurons:1")
    assert ablate.components(moe, "experts:1") == [f"L1.E{i}" for i in range(moe.cfg.n_experts)]


@pytest.fixture
def copied_dir(gpt2_dir, tmp_path):
    directory = tmp_path / "copy"
    shutil.copytree(gpt2_dir, directory)
    return directory


def test_an_invalid_config_json_names_its_path(copied_dir):
    (copied_dir / "config.json").write_text('{"n_layer": 2,')
    with pytest.raises(hooked.CheckpointError, match=rf"{copied_dir / 'config.json'} is not valid JSON.*re-download"):
        hooked.load(copied_dir)
    (copied_dir / "config.json").write_text("[1, 2]")
    with pytest.raises(hooked.CheckpointError, match="holds a JSON list"):
        hooked.load(copied_dir)


def test_an_invalid_shard_index_names_its_path(copied_dir):
    (copied_dir / "model.safetensors.index.json").write_text("{")
    with pytest.raises(hooked.CheckpointError, match="model.safetensors.index.json is not valid JSON"):
        hooked.load(copied_dir)
    (copied_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(hooked.CheckpointError, match='without a "weight_map"'):
        hooked.load(copied_dir)


def test_a_cuda_device_without_cuda_names_the_argument_and_the_fix(gpt2_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for load in (
        lambda: hooked.load(gpt2_dir, device="cuda"),
        lambda: hooked.HookedTransformer.from_pretrained(gpt2_dir, device="cuda:0"),
    ):
        with pytest.raises(RuntimeError, match=r"device='cuda(:0)?', but .*; load with device='cpu'"):
            load()
    with pytest.raises(ValueError, match="device='gpu' is not a torch device"):
        hooked.load(gpt2_dir, device="gpu")


def raise_from(cause):
    def snapshot_download(*args, **kwargs):
        raise LocalEntryNotFoundError("not cached") from cause

    return snapshot_download


def test_the_hub_message_states_the_actual_reason(monkeypatch):
    # HF_HUB_OFFLINE=0 is set, but does not make the hub offline: the request itself failed
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(
        huggingface_hub, "snapshot_download", raise_from(httpx.ConnectError("Name or service not known"))
    )
    with pytest.raises(hooked.CheckpointError) as caught:
        hooked.load("someone/not-a-model")
    message = str(caught.value)
    assert "HF_HUB_OFFLINE is set" not in message
    assert "the hub could not be reached (ConnectError: Name or service not known)" in message
    # offline mode set by TRANSFORMERS_OFFLINE: named, where it used to say the hub could not be reached
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", raise_from(OfflineModeIsEnabled("offline")))
    with pytest.raises(
        hooked.CheckpointError, match=r"offline mode \(TRANSFORMERS_OFFLINE=1\), so the hub was not asked"
    ):
        hooked.load("someone/not-a-model")


@pytest.mark.unchecked
@pytest.mark.parametrize("selector", ["heads", "neurons", "experts", "positions"])
@pytest.mark.parametrize("value", [2.0, [1, 2.0], True, torch.tensor([1.0]), "1"])
def test_a_selector_that_is_not_ints_names_the_argument(selector, value):
    with pytest.raises(TypeError, match=rf"{selector}= takes .*got .*e\.g\. {selector}="):
        ablate.zero(**{selector: value})


@pytest.mark.unchecked
def test_selectors_of_every_entry_point_name_the_argument(gpt2):
    with pytest.raises(TypeError, match=r"heads= takes an int.*got 2.0 \(float\)"):
        patch.activation(tokens_of(gpt2), heads=2.0, model=gpt2)
    with pytest.raises(TypeError, match=r"positions= takes an int.*got 2.0 \(float\)"):
        ablate.hooks(gpt2, "L0H0", positions=2.0)
    with pytest.raises(TypeError, match=r"positions= takes an int.*got 1.5 \(float\)"):
        patch.resid_sweep(gpt2, tokens_of(gpt2), tokens_of(gpt2, seed=1), last_logit, positions=1.5)
    assert ablate.zero(heads=torch.tensor([1, 2])).heads == (1, 2)  # integer tensors stay accepted
    assert no_hook_left(gpt2)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    keys=st.lists(
        st.one_of(st.integers(-3, 12), st.sampled_from(["0", "1", "10", "base", "L0H0", "a"])),
        min_size=1,
        max_size=5,
        unique=True,
    )
)
def test_any_variant_names_either_keep_every_variant_or_raise(gpt2, keys):
    """Whatever the keys: each variant keeps a row of its own under str(key), in order, with its own values
    (variant i zeroes head i % n_heads, so rows are told apart), or the sweep raises before any forward."""
    tokens = tokens_of(gpt2)
    heads = gpt2.cfg.n_heads
    variants = {key: ablate.hooks(gpt2, f"L1H{i % heads}") for i, key in enumerate(keys)}
    texts = [str(key) for key in keys]
    if len(set(texts)) < len(texts) or "base" in texts:
        with pytest.raises(ValueError, match="reserved|are both"):
            hooked.sweep(gpt2, tokens, variants, last_logit)
        assert no_hook_left(gpt2)
        return
    result = hooked.sweep(gpt2, tokens, variants, last_logit)
    assert result.variants == texts and [row["variant"] for row in result.rows()] == ["base", *texts]
    for i, key in enumerate(keys):
        alone = gpt2.run_with_hooks(tokens, fwd_hooks=ablate.hooks(gpt2, f"L1H{i % heads}"))
        torch.testing.assert_close(result[str(key)], last_logit(alone), atol=1e-5, rtol=1e-5)
