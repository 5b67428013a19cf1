"""`hooked.evals` against TransformerLens 3.9's `evals` on the same random GPT-2 weights."""

import warnings

import pytest
import torch

import hooked
from hooked import evals
from hooked.testing import build_gpt2_checkpoint
from tests.transformer_lens.tl_reference import tl_gpt2

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from transformer_lens import evals as tl_evals


@pytest.fixture(scope="module")
def tl(gpt2_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tl_gpt2(gpt2_dir)
    model.tokenizer.padding_side = "right"  # TransformerLens' default (the reference model pads on the left)
    return model


@pytest.fixture(scope="module")
def long_pair(tmp_path_factory):
    """A checkpoint with room for the sanity paragraph (217 tokens of the test tokenizer) and MMLU prompts."""
    directory = build_gpt2_checkpoint(tmp_path_factory.mktemp("gpt2-256"), n_layer=1, n_positions=256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hooked.load(directory), tl_gpt2(directory)


def test_sanity_check(long_pair):
    model, reference = long_pair
    got = evals.sanity_check(model)
    torch.testing.assert_close(got, tl_evals.sanity_check(reference), atol=1e-5, rtol=1e-5)
    tokens = model.to_tokens(evals.SANITY_TEXT)
    torch.testing.assert_close(
        got, torch.nn.functional.cross_entropy(model(tokens)[0, :-1], tokens[0, 1:]), atol=1e-5, rtol=1e-5
    )


MMLU = [
    {
        "question": f"What is {a} + {b}?",
        "choices": [str(a + b + d) for d in (-1, 0, 1, 2)],
        "answer": 1,
        "subject": subject,
    }
    for a, b, subject in [(1, 2, "math"), (3, 4, "math"), (2, 2, "math"), (5, 1, "arith"), (7, 2, "arith")]
]


def test_mmlu_eval_on_given_examples(long_pair, monkeypatch):
    model, reference = long_pair
    monkeypatch.setattr(
        tl_evals,
        "make_mmlu_data_loader",
        lambda subjects=None, split="test", num_samples=None: [e for e in MMLU if subjects in (None, e["subject"])][
            :num_samples
        ],
    )
    seen = {"ours": [], "theirs": []}  # the prompts each model is run on, token for token
    handles = [
        m.register_forward_pre_hook(
            lambda module, args, kwargs, key=key: seen[key].append(args[0].tolist()), with_kwargs=True
        )
        for m, key in ((model, "ours"), (reference, "theirs"))
    ]
    try:
        got = evals.mmlu_eval(model, data=MMLU)
        assert got == tl_evals.mmlu_eval(reference)
    finally:
        for handle in handles:
            handle.remove()
    assert seen["ours"] == seen["theirs"] and len(seen["ours"]) == 5
    assert got["num_total"] == 5 and set(got["subject_scores"]) == {"math", "arith"}
    assert evals.mmlu_eval(model, subjects="math", num_samples=2, data=MMLU) == tl_evals.mmlu_eval(
        reference, subjects="math", num_samples=2
    )
    with pytest.raises(ValueError, match="does not download"):
        evals.mmlu_eval(model)


@pytest.mark.parametrize("prepend_bos", [None, False])
def test_induction_loss(gpt2, tl, monkeypatch, prepend_bos):
    # TransformerLens draws ids up to 20000, past this tiny vocabulary; cap both draws at it, same seed.
    randint = torch.randint
    monkeypatch.setattr(torch, "randint", lambda low, high, size: randint(low, min(high, gpt2.cfg.d_vocab), size))
    torch.manual_seed(3)
    got = evals.induction_loss(gpt2, batch_size=2, subseq_len=7, prepend_bos=prepend_bos)
    torch.manual_seed(3)
    want = tl_evals.induction_loss(tl, batch_size=2, subseq_len=7, prepend_bos=prepend_bos, device="cpu")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_induction_loss_by_hand(gpt2):
    torch.manual_seed(4)
    got = evals.induction_loss(gpt2, batch_size=2, subseq_len=6, prepend_bos=False)
    torch.manual_seed(4)
    half = torch.randint(100, gpt2.cfg.d_vocab, (2, 6))
    tokens = torch.cat([half, half], dim=1)
    losses = torch.nn.functional.cross_entropy(gpt2(tokens)[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none")
    torch.testing.assert_close(got, losses[:, 7:].mean(), atol=1e-5, rtol=1e-5)  # targets 8.. (TransformerLens' slice)


@pytest.mark.parametrize("symmetric", [False, True])
def test_ioi_eval(gpt2, tl, symmetric):
    ours = evals.IOIDataset(gpt2.tokenizer, num_samples=12, symmetric=symmetric, seed=5)
    theirs = tl_evals.IOIDataset(tl.tokenizer, num_samples=12, symmetric=symmetric, seed=5)
    assert ours.samples == theirs.samples and len(ours) == 12
    for i in range(len(ours)):
        for key in ("prompt", "IO", "S"):
            assert torch.equal(ours[i][key], theirs[i][key]), (i, key)
    got = evals.ioi_eval(gpt2, dataset=ours, batch_size=5)
    want = tl_evals.ioi_eval(tl, dataset=theirs, batch_size=5)
    assert got.keys() == want.keys()
    assert got["Accuracy"] == want["Accuracy"]
    assert got["Logit Difference"] == pytest.approx(want["Logit Difference"], abs=1e-5)
    assert want["Logit Difference"] != 0


def test_evaluate_needs_data_loaders(gpt2, tl):
    with pytest.raises(ValueError, match="does not download"):
        evals.evaluate(gpt2)
    generator = torch.Generator().manual_seed(0)
    batches = [{"tokens": torch.randint(0, gpt2.cfg.d_vocab, (2, 6), generator=generator)} for _ in range(4)]
    losses = evals.evaluate(gpt2, truncate=1, data_loaders={"mine": batches})
    want = sum(gpt2(b["tokens"], return_type="loss").item() for b in batches[:2]) / 2
    assert losses == {"mine_loss": pytest.approx(want, abs=1e-6)}
    assert evals.evaluate_on_dataset(gpt2, batches, truncate=1) == pytest.approx(
        tl_evals.evaluate_on_dataset(tl, batches, truncate=1, device="cpu"), abs=1e-6
    )
