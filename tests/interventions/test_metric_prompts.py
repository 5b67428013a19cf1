"""A metric knows the prompts its answers belong to, and every call that runs it refuses other prompts.

The silent case (issue 31): `circuit.faithfulness(held_clean, held_corrupt, metric)` with the discovery
prompts' `logit_diff` read the held-out logits at the discovery prompts' answer ids and returned 3.14
(1.01 with the held-out answers), since only the prompt count was checked. Each refusal here is checked
to happen before anything runs (no hook left), and each accepted case to give the value of the same
metric built without prompts (binding changes which prompts are accepted, never a value): exactly, since both
run the same forward and the same metric operations on the same numbers.
"""

from __future__ import annotations

import pytest
import torch

import hooked
import hooked.sae
from hooked import circuits, metrics, patch, tasks
from hooked.testing import random_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def no_hooks(model) -> bool:
    return all(not point.listening for point in model.hook_dict.values())


@pytest.fixture(scope="module")
def ioi():
    return hooked.load("hooked/ioi-gpt2")


@pytest.fixture(scope="module")
def found():
    return tasks.ioi(8, seed=0)


@pytest.fixture(scope="module")
def held():
    return tasks.ioi_heldout(8)


# ----------------------------------------------------------------------------- the case
def test_faithfulness_on_held_out_prompts_with_the_discovery_metric_is_refused(ioi, found, held):
    metric = metrics.logit_diff(ioi, found.correct, found.incorrect)  # answers only, as the user wrote it
    c = circuits.discover(
        ioi, ioi.to_tokens(found.clean), ioi.to_tokens(found.corrupt), metric, method="eap", n_edges=20
    )
    held_clean, held_corrupt = ioi.to_tokens(held.clean), ioi.to_tokens(held.corrupt)
    with pytest.raises(ValueError, match=r"Circuit.faithfulness: the metric logit_diff\(n=8\) was built for other"):
        c.faithfulness(held_clean, held_corrupt, metric)
    with pytest.raises(ValueError, match="built for other prompts"):
        c.faithfulness(held_clean, held_corrupt)  # the metric it was found with, implied
    with pytest.raises(ValueError, match="built for other prompts"):
        c.curve([5, 10], held_clean, held_corrupt, metric)
    assert no_hooks(ioi)
    # The held-out task's own metric is accepted, and gives what the answers-only metric of those answers gives.
    held_metric = metrics.logit_diff(ioi, held)
    expected = c.faithfulness(held_clean, held_corrupt, metrics.logit_diff(ioi, held.correct, held.incorrect))
    assert c.faithfulness(held_clean, held_corrupt, held_metric) == expected
    # On the prompts it was found on, the discovery metric still works, given or implied.
    assert c.faithfulness(ioi.to_tokens(found.clean), ioi.to_tokens(found.corrupt), metric) == c.faithfulness()


def test_a_task_metric_accepts_its_prompts_however_they_are_tokenized(ioi, found):
    """Clean or corrupt, text or ids, left or right padding (with its mask), with or without BOS: one set of prompts."""
    bound, plain = metrics.logit_diff(ioi, found), metrics.logit_diff(ioi, found.correct, found.incorrect)
    variants = {"L0H0": hooked.ablate.hooks(ioi, "L0H0")}
    right = ioi.to_tokens(found.clean, padding_side="right")
    right_mask = ioi.tokenizer.mask_for(right, True, padding_side="right")
    no_bos = ioi.to_tokens(found.clean, prepend_bos=False)
    for prompts, mask in [
        (found.clean, None),
        (found.corrupt, None),
        (ioi.to_tokens(found.clean), None),
        (right, right_mask),
        (no_bos, ioi.tokenizer.mask_for(no_bos, False)),
    ]:
        expected = hooked.sweep(ioi, prompts, variants, plain, attention_mask=mask)
        result = hooked.sweep(ioi, prompts, variants, bound, attention_mask=mask)
        torch.testing.assert_close(result.values, expected.values, rtol=0, atol=0)


def test_every_entry_point_refuses_other_prompts(ioi, found, held):
    metric = metrics.logit_diff(ioi, found)
    clean, corrupt = ioi.to_tokens(held.clean), ioi.to_tokens(held.corrupt)
    calls = {
        "hooked.sweep": lambda: hooked.sweep(ioi, clean, {"L0H0": hooked.ablate.hooks(ioi, "L0H0")}, metric),
        "patch.attribution": lambda: patch.attribution(ioi, corrupt, clean, metric),
        "circuits.patch_edges": lambda: circuits.patch_edges(ioi, clean, corrupt, {"a": ["L0H0->logits"]}, metric),
        "circuits.path_patch": lambda: circuits.path_patch(ioi, clean, corrupt, ["L0H0"], ["logits"], metric),
        "circuits.attribute": lambda: circuits.attribute(ioi, clean, corrupt, metric),
        "circuits.discover": lambda: circuits.discover(ioi, clean, corrupt, metric, method="eap", n_edges=5),
    }
    for caller, call in calls.items():
        with pytest.raises(ValueError, match=rf"{caller}: the metric logit_diff\(n=8\) was built for other prompts"):
            call()
        assert no_hooks(ioi)
    with pytest.raises(ValueError, match="hooked.sweep: .* built for other prompts"):
        patch.head_sweep(ioi, corrupt, clean, metric)  # activation patching runs through the sweep


def test_the_error_names_both_prompts_and_the_fix(ioi, found, held):
    metric = metrics.logit_diff(ioi, found)
    with pytest.raises(ValueError) as error:
        hooked.sweep(ioi, held.clean, {"L0H0": hooked.ablate.hooks(ioi, "L0H0")}, metric)
    message = str(error.value)
    assert repr(held.clean[0]) in message and repr(found.clean[0]) in message
    assert "metrics.logit_diff(model, task)" in message and "prompts=" in message
    with pytest.raises(ValueError, match="these are 4 prompts, those 8"):
        hooked.sweep(ioi, found.clean[:4], {"L0H0": hooked.ablate.hooks(ioi, "L0H0")}, metric)


def test_token_metrics_and_loss_know_their_prompts(ioi, found, held):
    variants = {"L0H0": hooked.ablate.hooks(ioi, "L0H0")}
    for build in (metrics.probability, metrics.log_prob, metrics.rank):
        metric = build(ioi, found)
        assert metric.tokens == build(ioi, found.correct).tokens
        hooked.sweep(ioi, found.clean, variants, metric)
        with pytest.raises(ValueError, match="built for other prompts"):
            hooked.sweep(ioi, held.clean, variants, metric)
    loss = metrics.loss(ioi, found.clean)
    hooked.sweep(ioi, found.clean, variants, loss)
    with pytest.raises(ValueError, match=r"built for other prompts .*metrics.loss\(model, these prompts\)"):
        hooked.sweep(ioi, held.clean, variants, loss)  # the same shape of tokens: before, only the shape was checked


@pytest.mark.unchecked
def test_building_a_metric_for_prompts_checks_them(ioi, found):
    with pytest.raises(ValueError, match="the metric has 4 answers .* but 8 prompts"):
        metrics.logit_diff(ioi, found.correct[:4], found.incorrect[:4], prompts=found.clean)
    with pytest.raises(TypeError, match="takes the answers and the prompts from the task"):
        metrics.logit_diff(ioi, found, found.incorrect)
    with pytest.raises(TypeError, match="needs the incorrect answers"):
        metrics.logit_diff(ioi, found.correct)
    with pytest.raises(ValueError, match="prompts= needs the model"):
        metrics.logit_diff(None, [1, 2], [3, 4], prompts=torch.tensor([[5, 6], [7, 8]]))


def test_answer_ids_with_prompts_on_a_model_without_tokenizer():
    """The explicit-ids route: a random model, no tokenizer, prompts as ids (no BOS to leave out)."""
    model = random_model("gpt2", n_layers=2, d_model=16)
    generator = torch.Generator().manual_seed(0)
    clean, corrupt, other = (torch.randint(0, model.cfg.d_vocab, (3, 5), generator=generator) for _ in range(3))
    metric = metrics.logit_diff(model, [1, 2, 3], [4, 5, 6], prompts=clean)
    plain = metrics.logit_diff(model, [1, 2, 3], [4, 5, 6])
    expected = circuits.patch_edges(model, clean, corrupt, {"a": ["L0H0->logits"]}, plain)
    result = circuits.patch_edges(model, clean, corrupt, {"a": ["L0H0->logits"]}, metric)
    torch.testing.assert_close(result.values, expected.values, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"prompt 0 here is token ids \["):
        circuits.patch_edges(model, other, corrupt, {"a": ["L0H0->logits"]}, metric)
    with pytest.raises(ValueError, match="built for other prompts"):
        metrics.check_prompts(metric, model, corrupt, None, "here")  # one set: prompts= names only those


def test_sae_attribute_refuses_other_prompts():
    from tests.sae.dictionaries import random_dictionary

    model = random_model("gpt2", n_layers=2, d_model=16)
    generator = torch.Generator().manual_seed(1)
    clean, corrupt, other = (torch.randint(0, model.cfg.d_vocab, (2, 4), generator=generator) for _ in range(3))
    sae = random_dictionary(16, "blocks.0.hook_resid_post")
    metric = metrics.logit_diff(model, [1, 2], [3, 4], prompts=clean)
    hooked.sae.attribute(model, clean, corrupt, metric, saes=[sae])
    with pytest.raises(ValueError, match="hooked.sae.attribute: the metric .* built for other prompts"):
        hooked.sae.attribute(model, other, corrupt, metric, saes=[sae])
    assert no_hooks(model)
