"""Ids padded on the side the model does not read padding from, without a mask: refused, never read as tokens.

The bundled IOI GPT-2 pads on the left and its pad id is its BOS and EOS (`<|endoftext|>`, id 0). Right-padded
ids given to it without `attention_mask=` used to be read as unpadded: the trailing pads were tokens, and every
metric at position -1 of a short row read a pad (issue 31: `circuits.patch_edges` gave base 8.468 where the
left-padded batch gives 13.245). The property test draws the padding side, whether the mask is given and the
row lengths, and checks every entry point that takes ids (the model's, the SAE ones: `run_with_saes`,
`hooked.sae.evaluate`, `attribute` and `train`; and `graphs.attribute_batch`) against the left-padded batch with
its mask (itself checked against each prompt run alone): equal at each row's real positions, or refused naming
the mask.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import hooked
from hooked import ablate, circuits, graphs, metrics, patch
from hooked.sae.training import geometric_median
from hooked.testing import random_model
from tests.sae.dictionaries import random_dictionary

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: a second thread only waits

PAD = 0  # the bundled IOI GPT-2's BOS, EOS and pad id
REFUSAL = "attention_mask="
TOL = dict(atol=1e-4, rtol=1e-4)
SAE_POINT = "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def model():
    return hooked.load("hooked/ioi-gpt2")


@pytest.fixture(scope="module")
def tiny(model):
    """A random 3-layer GPT-2 (d_model 32) with the IOI model's tokenizer: the property test's model."""
    tiny = random_model("gpt2", n_layers=3, d_vocab=model.cfg.d_vocab)
    tiny.tokenizer = model.tokenizer
    assert tiny.default_prepend_bos  # the BOS (the pad id) of each row is real
    return tiny


@pytest.fixture(scope="module")
def dictionaries(tiny):
    """A random SAE on the tiny model's residual stream and a random transcoder per layer (float32)."""
    d = tiny.cfg.d_model
    sae = random_dictionary(d, SAE_POINT, d_sae=16)
    transcoders = [
        random_dictionary(
            d,
            f"blocks.{layer}.mlp.hook_in",
            hook_name_out=f"blocks.{layer}.hook_mlp_out",
            d_sae=12,
            architecture="jumprelu",
            seed=layer,
        )  # fmt: skip
        for layer in range(tiny.cfg.n_layers)
    ]
    return sae, transcoders


@pytest.fixture(scope="module")
def task():
    return hooked.tasks.ioi(6, seed=0)


def padded(rows: list[list[int]], side: str = "left") -> tuple[torch.Tensor, torch.Tensor]:
    """Ids [batch pos] padded with PAD on `side`, and their mask (True = real token)."""
    length = max(len(row) for row in rows)
    tokens = torch.full((len(rows), length), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for i, row in enumerate(rows):
        columns = slice(length - len(row), None) if side == "left" else slice(0, len(row))
        tokens[i, columns] = torch.tensor(row)
        mask[i, columns] = True
    return tokens, mask


# ----------------------------------------------------------------------------- the case
def test_right_padded_ids_without_a_mask_are_refused_everywhere(model, task):
    """Issue 31's reproduction: each call read the trailing pads as tokens and returned a wrong number."""
    clean = model.to_tokens(task.clean, padding_side="right")
    corrupt = model.to_tokens(task.corrupt, padding_side="right")
    assert not bool((clean[:, -1] == PAD).all()) and bool((clean[:, -1] == PAD).any())  # ragged, right-padded
    metric = metrics.logit_diff(model, task.correct, task.incorrect)
    calls = {
        "forward": lambda: model(clean),
        "run_with_cache": lambda: model.run_with_cache(clean),
        "run_with_hooks": lambda: model.run_with_hooks(clean, fwd_hooks=ablate.hooks(model, "L2H2")),
        "loss metric": lambda: metrics.loss(model, clean),
        "sweep": lambda: hooked.sweep(model, clean, {"L2H2": ablate.hooks(model, "L2H2")}, metric),
        "patch_edges": lambda: circuits.patch_edges(model, clean, corrupt, ["L2H2->logits"], metric),
        "path_patch": lambda: circuits.path_patch(model, clean, corrupt, ["L2H2"], ["logits"], metric),
        "attribute": lambda: circuits.attribute(model, clean, corrupt, metric, method="eap"),
        "discover": lambda: circuits.discover(model, clean, corrupt, metric, method="eap", n_edges=3),
        "head_sweep": lambda: patch.head_sweep(model, corrupt, clean, metric),
        "generate": lambda: model.generate(clean, max_new_tokens=1),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="look padded on the right") as caught:
            call()
        assert REFUSAL in str(caught.value) and "padding_side='left'" in str(caught.value), name


def test_right_padded_ids_with_their_mask_give_the_left_padded_numbers(model, task):
    """With the mask the trailing pads are padding: patch_edges and sweep equal the left-padded batch's."""
    batch = model.tokenizer(task.clean, return_tensors="pt", padding_side="right")
    corrupt = model.tokenizer(task.corrupt, return_tensors="pt", padding_side="right")
    assert torch.equal(batch["attention_mask"], corrupt["attention_mask"])
    right, mask, corrupt = batch["input_ids"], batch["attention_mask"], corrupt["input_ids"]
    left, left_corrupt = model.to_tokens(task.clean), model.to_tokens(task.corrupt)
    metric = metrics.logit_diff(model, task.correct, task.incorrect)
    expected = circuits.patch_edges(model, left, left_corrupt, ["L2H2->logits"], metric)
    got = circuits.patch_edges(model, right, corrupt, ["L2H2->logits"], metric, attention_mask=mask)
    torch.testing.assert_close(got.base, expected.base, **TOL)
    torch.testing.assert_close(got.values, expected.values, **TOL)
    zero = {"L2H2": ablate.hooks(model, "L2H2")}
    expected = hooked.sweep(model, left, zero, metric)
    got = hooked.sweep(model, right, zero, metric, attention_mask=mask)
    torch.testing.assert_close(got.values, expected.values, **TOL)
    # The independent reference: each prompt run alone, unpadded, read at its last token.
    last = torch.stack([model(text)[0, -1] for text in task.clean])
    ids = [model.to_single_token(answer) for answer in task.correct], [model.to_single_token(a) for a in task.incorrect]
    alone = last.gather(-1, torch.tensor(ids[0])[:, None])[:, 0] - last.gather(-1, torch.tensor(ids[1])[:, None])[:, 0]
    torch.testing.assert_close(got.base, alone, **TOL)


# ----------------------------------------------------------------------------- what is not refused
def test_rows_ending_in_equally_long_pad_runs_read_as_unpadded(model):
    """Every row ending with one `<|endoftext|>` says nothing of padding: the ids are read whole, as
    TransformerLens' forward reads them."""
    tokens = torch.tensor([[PAD, 5, 6, PAD], [PAD, 7, 8, PAD]])
    torch.testing.assert_close(model(tokens), model(tokens, attention_mask=torch.ones_like(tokens)))


def test_a_left_padded_batch_with_a_bos_only_row_is_read_as_before(model):
    """A row that is all pad ids (an empty prompt, BOS only) reads alike from both ends and is not a reason
    to refuse."""
    tokens, mask = padded([[PAD], [PAD, 5, 6]], "left")
    torch.testing.assert_close(model(tokens), model(tokens, attention_mask=mask))


def test_right_padding_read_on_the_right_and_left_padding_refused_there(model):
    """The rule is the same from the other end: a tokenizer (or call) that reads padding on the right takes
    right-padded ids, and refuses ids whose rows begin in pad runs of different lengths."""
    rows = [[PAD, 5, 6, 7], [PAD, 8]]
    right, mask = padded(rows, "right")
    torch.testing.assert_close(model(right, padding_side="right"), model(right, attention_mask=mask))
    left, _ = padded(rows, "left")
    with pytest.raises(ValueError, match="look padded on the left") as caught:
        model(left, padding_side="right")
    assert "padding_side='right'" in str(caught.value)


@pytest.mark.unchecked
def test_ids_padded_at_both_ends_are_refused(model):
    """Rows whose runs differ at both ends (a right-padded batch whose long prompt begins with the pad id
    after its BOS) cannot say which end is padding; they were read as left-padded, dropping a real BOS."""
    tokens, _ = padded([[PAD, PAD, 5, 6], [PAD, 7, 8]], "right")
    with pytest.raises(ValueError, match="cannot say which end is padding"):
        model(tokens)
    # TransformerLens' reading (`utils.get_attention_mask`) is not strict, and keeps its answer.
    assert hooked.utils.get_attention_mask(model.tokenizer, tokens, prepend_bos=True) is not None


# ----------------------------------------------------------------------------- the property
def _per_row(values: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Each row's real positions of a [batch pos ...] tensor."""
    return [values[i][mask[i]] for i in range(len(mask))]


def _entry_points(model, dictionaries, clean, corrupt, attention_mask, mask, correct, incorrect) -> dict:
    """Every entry point's result on ids `clean` / `corrupt` (mask given or not); `mask` is the true one, used
    only to read the results out at each row's real positions."""
    sae, transcoders = dictionaries
    metric = metrics.logit_diff(model, correct, incorrect)
    zero = {"L1H0": ablate.hooks(model, "L1H0")}
    kw = dict(attention_mask=attention_mask)
    logits = model(clean, **kw)
    _, cache = model.run_with_cache(clean, names_filter="blocks.1.hook_resid_post", **kw)
    generated = model.generate(clean, max_new_tokens=2, stop_at_eos=False, **kw)
    grown = torch.cat([mask, torch.ones(len(mask), 2, dtype=torch.bool)], 1)
    if bool((mask[:, 0]).all()) and not bool(mask.all()):  # right-padded in, right-padded out
        grown = torch.arange(grown.shape[1]) < mask.sum(-1, keepdim=True) + 2
    sweep = hooked.sweep(model, clean, zero, metric, **kw)
    _, clean_cache = model.run_with_cache(clean, **kw)
    heads = patch.head_sweep(model, corrupt, clean_cache, metric, **kw)
    edges = circuits.patch_edges(model, clean, corrupt, ["L1H0->L2H2.v", "L2H2->logits"], metric, **kw)
    path = circuits.path_patch(model, clean, corrupt, ["L1H0"], ["logits"], metric, **kw)
    scores = circuits.attribute(model, clean, corrupt, metric, method="eap", **kw)
    found = circuits.discover(model, clean, corrupt, metric, method="eap", n_edges=4, **kw)
    (evaluated,) = hooked.sae.evaluate(model, sae, clean, **kw)
    features = hooked.sae.attribute(model, clean, corrupt, metric, saes=[sae], **kw)
    # lr so small that b_dec stays the first batch's geometric median (all the tokens): the activations trained on
    trained = hooked.sae.train(model, clean, hook_name=SAE_POINT, d_sae=8, k=2, lr=1e-12, batch_tokens=64,
                               progress=False, **kw)  # fmt: skip
    attributed = graphs.attribute_batch(model, clean, transcoders, max_n_logits=2, batch_size=4, **kw)
    return {
        "forward": _per_row(logits, mask),
        "loss": model(clean, return_type="loss", **kw),
        "run_with_hooks": _per_row(model.run_with_hooks(clean, fwd_hooks=zero["L1H0"], **kw), mask),
        "run_with_cache": _per_row(cache["blocks.1.hook_resid_post"], mask),
        "metric": metric(logits, attention_mask=mask),
        "loss metric": metrics.loss(model, clean, attention_mask)(logits),
        "generate": _per_row(generated, grown),
        "sweep": torch.cat([sweep.base, sweep.values[0]]),
        "head_sweep": heads.values,
        "patch_edges": edges.values,
        "path_patch": path.values,
        "attribute": scores.matrix,
        "discover": [str(edge) for edge in found.edges],
        "run_with_saes": _per_row(model.run_with_saes(clean, saes=[sae], **kw), mask),
        "evaluate": torch.tensor([evaluated[key] for key in ("n_tokens", "l0", "fvu", "ce_clean", "ce_spliced")]),
        "sae.attribute": features.per_prompt,
        "train": torch.cat([torch.tensor([trained.cfg.metadata["n_training_tokens"]]), trained.b_dec.detach()]),
        "graphs.attribute_batch": [graph.adjacency for graph in attributed],
        "graph tokens": [graph.input_tokens.tolist() for graph in attributed],
    }


@pytest.mark.unchecked
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    side=st.sampled_from(["left", "right"]),
    with_mask=st.booleans(),
    lengths=st.lists(st.integers(2, 8), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
# The cases that matter, whatever the draw: ragged rows on each side, with and without the mask.
@example(side="right", with_mask=True, lengths=[2, 7, 4], seed=0)
@example(side="right", with_mask=False, lengths=[5, 3], seed=1)
@example(side="left", with_mask=False, lengths=[3, 8, 2, 5], seed=2)
@example(side="left", with_mask=True, lengths=[6, 2], seed=3)
def test_every_entry_point_equals_the_left_padded_batch_or_refuses(tiny, dictionaries, side, with_mask, lengths, seed):
    model = tiny
    generator = torch.Generator().manual_seed(seed)

    def words(n: int) -> list[int]:  # never the pad id inside a prompt
        return torch.randint(1, model.cfg.d_vocab, (n,), generator=generator).tolist()

    rows = [[PAD, *words(n - 1)] for n in lengths]
    other = [[PAD, *words(n - 1)] for n in lengths]
    correct, incorrect = words(len(rows)), words(len(rows))

    reference_ids, reference_mask = padded(rows, "left")
    reference = _entry_points(
        model, dictionaries, reference_ids, padded(other, "left")[0], reference_mask, reference_mask, correct, incorrect
    )
    # The reference itself: each row's logits equal the prompt run alone; the graphs' tokens are the rows; the
    # dictionary trained on the real tokens' activations, each prompt run alone.
    for row, logits in zip(rows, reference["forward"], strict=True):
        torch.testing.assert_close(logits, model(torch.tensor([row]))[0], **TOL)
    assert reference["graph tokens"] == rows
    alone = torch.cat([model.run_with_cache(torch.tensor([row]))[1][SAE_POINT][0] for row in rows])
    # An SAE's b_dec starts at the first batch's geometric median (checked against scipy in tests/sae/test_training.py);
    # here it is taken of the activations of each prompt run alone, so it checks which tokens training read.
    centre = geometric_median(alone)
    torch.testing.assert_close(reference["train"], torch.cat([torch.tensor([len(alone)]), centre]), **TOL)

    clean, mask = padded(rows, side)
    corrupt = padded(other, side)[0]
    ragged = len(set(lengths)) > 1
    if side == "right" and ragged and not with_mask:
        with pytest.raises(ValueError, match="look padded on the right") as caught:
            _entry_points(model, dictionaries, clean, corrupt, None, mask, correct, incorrect)
        assert REFUSAL in str(caught.value)
        metric = metrics.logit_diff(model, correct, incorrect)
        for call in (  # each entry point refuses on its own, before anything runs
            lambda: model(clean),
            lambda: hooked.sweep(model, clean, {"L1H0": ablate.hooks(model, "L1H0")}, metric),
            lambda: circuits.patch_edges(model, clean, corrupt, ["L1H0->logits"], metric),
            lambda: model.generate(clean, max_new_tokens=1),
            lambda: hooked.sae.evaluate(model, dictionaries[0], clean),
            lambda: hooked.sae.attribute(model, clean, corrupt, metric, saes=[dictionaries[0]]),
            lambda: hooked.sae.train(model, clean, hook_name=SAE_POINT, d_sae=8, k=2, progress=False),
            lambda: graphs.attribute_batch(model, clean, dictionaries[1], max_n_logits=2),
        ):
            with pytest.raises(ValueError, match="look padded on the right"):
                call()
        return
    got = _entry_points(model, dictionaries, clean, corrupt, mask if with_mask else None, mask, correct, incorrect)
    for name, expected in reference.items():
        if name in ("discover", "graph tokens"):
            assert got[name] == expected, name
        elif isinstance(expected, list):
            for a, b in zip(got[name], expected, strict=True):
                torch.testing.assert_close(a, b, **TOL, msg=lambda m, name=name: f"{name}: {m}")
        else:
            torch.testing.assert_close(got[name], expected, **TOL, msg=lambda m, name=name: f"{name}: {m}")
