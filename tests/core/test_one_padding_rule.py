"""One padding rule for every entry point that takes token ids (issue 39): the model, `run_with_saes`,
`hooked.sae.evaluate`, `hooked.sae.attribute`, `hooked.sae.train` and `hooked.graphs.attribute(_batch)` read a
tensor given without `attention_mask=` alike (`model.padding_mask`), or refuse it alike.

The bundled IOI GPT-2's BOS, EOS and pad are one id, 0. `model.to_tokens(texts, prepend_bos=False)` pads with it,
so the ids cannot say whether a padded row's last pad is a BOS (as every call that takes no `prepend_bos=` reads
ids) or padding: the forward read a BOS there and the padded row's logits differed from the prompt alone by 16.5.
`train` used every position of padded rows, pads included, and the graphs made the pads token nodes. Each result
here is checked against the prompt run alone, unpadded.
"""

from __future__ import annotations

import pytest
import torch

import hooked
import hooked.sae
from hooked import graphs
from hooked.testing import random_model
from tests.core.test_padding_sides import padded
from tests.graphs.test_attribute import transcoder_set
from tests.graphs.test_attribute_batch import assert_same
from tests.sae.dictionaries import random_dictionary

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: a second thread only waits

PAD = 0  # the bundled IOI GPT-2's BOS, EOS and pad id
PROMPTS = ["When Mary and John went to the store, John gave a drink to", "Mary went home", "John and Mary"]
RESID = "blocks.1.hook_resid_post"
TOL = dict(atol=1e-4, rtol=1e-4)  # float32 logits of order 10, the padded row's attention over other columns


@pytest.fixture(scope="module")
def model():
    return hooked.load("hooked/ioi-gpt2")


@pytest.fixture(scope="module")
def sae(model):
    return random_dictionary(model.cfg.d_model, RESID, d_sae=32)


# ----------------------------------------------------------------------------- prepend_bos=False, pad id = BOS id
def test_ids_made_without_bos_are_refused_where_a_pad_would_read_as_a_bos(model, sae):
    tokens = model.to_tokens(PROMPTS, prepend_bos=False)
    rows = [model.to_tokens(p, prepend_bos=False)[0].tolist() for p in PROMPTS]
    expected, mask = padded(rows)
    assert torch.equal(tokens, expected) and not bool(mask.all())  # left-padded with the BOS id, no BOS
    metric = hooked.metrics.logit_diff(model, [" Mary"] * 3, [" John"] * 3)
    calls = {
        "forward": lambda: model(tokens),
        "run_with_cache": lambda: model.run_with_cache(tokens),
        "run_with_saes": lambda: model.run_with_saes(tokens, saes=[sae]),
        "evaluate": lambda: hooked.sae.evaluate(model, sae, tokens),
        "sae.attribute": lambda: hooked.sae.attribute(model, tokens, tokens, metric, saes=[sae]),
        "train": lambda: hooked.sae.train(model, tokens, hook_name=RESID, d_sae=8, k=2, progress=False),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="does not begin with the BOS") as caught:
            call()
        assert "attention_mask=" in str(caught.value) and "prepend_bos=False" in str(caught.value), name
    # With the mask, or read as made (prepend_bos=False), each row is its prompt alone.
    for logits in (model(tokens, attention_mask=mask), model(tokens, prepend_bos=False)):
        for i, row in enumerate(rows):
            alone = model(torch.tensor([row]), attention_mask=torch.ones(1, len(row), dtype=torch.bool))[0]
            torch.testing.assert_close(logits[i, mask[i]], alone, **TOL)
    # evaluate with the mask counts the real tokens only, and its clean loss is the mean over their next tokens
    per_token = [model(torch.tensor([row]), return_type="loss", loss_per_token=True)[0].detach() for row in rows]
    (row,) = hooked.sae.evaluate(model, sae, tokens, attention_mask=mask)
    assert row["n_tokens"] == sum(map(len, rows))
    assert row["ce_clean"] == pytest.approx(float(torch.cat(per_token).double().mean()), rel=1e-4)


def test_to_tokens_without_bos_refuses_ids_the_default_reading_would_get_wrong(model):
    """A prompt that begins with `<|endoftext|>` made without BOS reads, as calls without prepend_bos= read ids
    (BOS prepended), as a BOS plus padding: to_tokens refuses it, as it refuses such ids read its own way."""
    with pytest.raises(ValueError, match="begins with '<|endoftext|>'"):
        model.to_tokens(["<|endoftext|>Mary went home", "John"], prepend_bos=False)


# ----------------------------------------------------------------------------- hooked.sae.train
def test_train_reads_padding_from_ids_as_the_forward_does(model):
    rows = [model.to_tokens(p)[0].tolist() for p in PROMPTS]
    left, mask = padded(rows)
    kwargs = dict(hook_name=RESID, d_sae=8, k=2, batch_tokens=16, progress=False, seed=3)
    read = hooked.sae.train(model, left, **kwargs)
    given = hooked.sae.train(model, left, attention_mask=mask, **kwargs)
    assert read.cfg.metadata["n_training_tokens"] == sum(map(len, rows)) < left.numel()  # the pads left out
    # the same rows and mask give the same stream, batches and steps, in the same order: equal exactly
    for name, parameter in given.named_parameters():
        assert torch.equal(getattr(read, name), parameter), name
    right, _ = padded(rows, "right")
    with pytest.raises(ValueError, match="look padded on the right"):
        hooked.sae.train(model, right, **kwargs)


# ----------------------------------------------------------------------------- hooked.graphs
@pytest.fixture(scope="module")
def tiny(model):
    """A 2-layer random GPT-2 in float64 with the IOI model's tokenizer (pad id = BOS id), and its transcoders."""
    tiny = random_model("gpt2", seed=1, n_layers=2, d_vocab=model.cfg.d_vocab).to(torch.float64)
    tiny.tokenizer = model.tokenizer
    return tiny, transcoder_set(tiny, skip=False)


def test_a_padded_row_attributes_as_its_prompt_alone(tiny):
    model, transcoders = tiny
    rows = [[PAD, 17, 42, 8, 25, 11], [PAD, 9, 14], [PAD, 40, 41, 5]]  # BOS first; each length once
    left, mask = padded(rows)
    settings = dict(max_n_logits=3, desired_logit_prob=0.9, batch_size=4)
    alone = [graphs.attribute(model, torch.tensor(row), transcoders, **settings) for row in rows]
    for kwargs in ({}, dict(attention_mask=mask)):  # padding read from the ids, then given
        read = graphs.attribute_batch(model, left, transcoders, **kwargs, **settings)
        assert [graph.input_tokens.tolist() for graph in read] == rows  # no pad became a token node
        for graph, reference in zip(read, alone, strict=True):
            assert_same(graph, reference)
    one = graphs.attribute(model, left[1], transcoders, attention_mask=mask[1], **settings)
    assert_same(one, alone[1])
    edit = {(0, 1, 0): 0.0}  # intervene reads its prompt as attribute does, so positions match the graph's
    edited = graphs.intervene(model, left[1], transcoders, edit, attention_mask=mask[1])
    reference = graphs.intervene(model, torch.tensor(rows[1]), transcoders, edit)
    assert edited.tokens.tolist() == rows[1]
    assert torch.equal(edited.logits, reference.logits)  # the same ids through the same kernels
    right, _ = padded(rows, "right")
    with pytest.raises(ValueError, match="look padded on the right"):
        graphs.attribute_batch(model, right, transcoders, **settings)
    no_bos, _ = padded([row[1:] for row in rows])
    with pytest.raises(ValueError, match="does not begin with the BOS"):
        graphs.attribute_batch(model, no_bos, transcoders, **settings)
