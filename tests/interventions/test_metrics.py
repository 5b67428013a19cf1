"""Metrics against plain torch written out prompt by prompt, on random logits and on the tiny GPT-2.

Each reference loops over the prompts and positions in float64, so it shares no code path (no
gather, no masking trick) with the metric it checks. Where a metric is compared with itself (called on the
full logits against `compute` on the columns it reduces to, bf16 against the float32 it casts to, a mask
stored against one given at call time) the same operations run on the same numbers: exact (rtol=0, atol=0).
"""

import dataclasses
import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hooked import metrics
from hooked.models.base import HookedTransformer

BATCH, POS, VOCAB = 4, 6, 13


@pytest.fixture
def logits() -> torch.Tensor:
    return torch.randn(BATCH, POS, VOCAB, generator=torch.Generator().manual_seed(0)) * 3


@pytest.fixture
def base_logits() -> torch.Tensor:
    return torch.randn(BATCH, POS, VOCAB, generator=torch.Generator().manual_seed(1)) * 3


# Left padding: row 0 has 2 pad columns, row 2 has 4, rows 1 and 3 none.
MASK = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6, [0, 0, 0, 0, 1, 1], [1] * 6], dtype=torch.bool)
CORRECT, INCORRECT = [3, 7, 3, 12], [5, 3, 0, 5]


def real_positions(row: int) -> list[int]:
    return [p for p in range(POS) if MASK[row, p]]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def with_garbage_at_padding(logits: torch.Tensor) -> torch.Tensor:
    """Logits whose padded columns are wild, so a metric that reads them gives a different number."""
    return torch.where(MASK[..., None], logits, 100 * torch.randn_like(logits))


# ----------------------------------------------------------------------------- answer metrics
def test_logit_diff_is_correct_minus_incorrect_at_the_last_position(logits):
    metric = metrics.logit_diff(None, CORRECT, INCORRECT)
    expected = [float(logits[i, -1, CORRECT[i]].double() - logits[i, -1, INCORRECT[i]].double()) for i in range(BATCH)]
    result = metric(logits)
    assert result.dtype == torch.float32 and result.shape == (BATCH,)
    torch.testing.assert_close(result.double(), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-5)


def test_logit_diff_columns_are_the_sorted_answer_ids_and_compute_reads_them(logits):
    metric = metrics.logit_diff(None, CORRECT, INCORRECT)
    assert metric.columns == (0, 3, 5, 7, 12) and metric.position == -1 and not metric.needs_base
    reduced = logits[:, -1:, :][:, :, [0, 3, 5, 7, 12]]
    torch.testing.assert_close(metric.compute(reduced, None, None), metric(logits), rtol=0, atol=0)
    torch.testing.assert_close(metric.reduce(logits), reduced, rtol=0, atol=0)


def test_logit_diff_over_every_position_averages_real_positions_only(logits):
    metric = metrics.logit_diff(None, CORRECT, INCORRECT, position=None)
    expected = [
        mean([float(logits[i, p, CORRECT[i]] - logits[i, p, INCORRECT[i]]) for p in real_positions(i)])
        for i in range(BATCH)
    ]
    result = metric(with_garbage_at_padding(logits), attention_mask=MASK)
    torch.testing.assert_close(result, torch.tensor(expected), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["probability", "log_prob"])
def test_probability_and_log_prob_over_the_whole_vocabulary(name, logits):
    metric = getattr(metrics, name)(None, CORRECT)
    assert metric.columns is None and metric.position == -1
    expected = []
    for i in range(BATCH):
        row = logits[i, -1].double()
        log_total = torch.log(sum(torch.exp(row[v]) for v in range(VOCAB)))
        log_p = row[CORRECT[i]] - log_total
        expected.append(float(log_p if name == "log_prob" else torch.exp(log_p)))
    result = metric(logits)
    assert result.dtype == torch.float32
    torch.testing.assert_close(result.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-6)


def test_rank_counts_strictly_larger_logits(logits):
    expected = [
        float(sum(1 for v in range(VOCAB) if logits[i, -1, v] > logits[i, -1, CORRECT[i]])) for i in range(BATCH)
    ]
    result = metrics.rank(None, CORRECT)(logits)
    assert result.dtype == torch.float32
    assert result.tolist() == expected


def test_rank_ordering_and_ties():
    row = torch.tensor([0.5, 2.0, 2.0, -1.0, 1.0])
    logits = row.expand(5, 1, 5)  # one prompt per token
    ranks = metrics.rank(None, [0, 1, 2, 3, 4])(logits)
    # 2.0 and 2.0 tie for the top; 1.0 has two above it; 0.5 three; -1.0 four.
    assert ranks.tolist() == [3.0, 0.0, 0.0, 4.0, 2.0]


def test_answers_as_a_long_tensor_or_ints_are_the_same_metric(logits):
    from_list = metrics.logit_diff(None, CORRECT, INCORRECT)
    from_tensor = metrics.logit_diff(None, torch.tensor(CORRECT), torch.tensor(INCORRECT))
    assert from_list == from_tensor and hash(from_list) == hash(from_tensor)
    assert metrics.rank(None, torch.tensor(CORRECT)) == metrics.rank(None, CORRECT)
    assert metrics.rank(None, CORRECT) != metrics.probability(None, CORRECT)


def test_low_precision_logits_are_scored_in_float32(logits):
    half = logits.to(torch.bfloat16)
    for metric in (metrics.logit_diff(None, CORRECT, INCORRECT), metrics.log_prob(None, CORRECT), metrics.kl_div()):
        result = metric(half, base_logits=half.flip(0))
        assert result.dtype == torch.float32
        torch.testing.assert_close(result, metric(half.float(), base_logits=half.flip(0).float()), rtol=0, atol=0)


# ----------------------------------------------------------------------------- KL divergence
def kl_reference(base_row: torch.Tensor, run_row: torch.Tensor) -> float:
    base_row, run_row = base_row.double(), run_row.double()
    p_base = torch.exp(base_row) / torch.exp(base_row).sum()
    p_run = torch.exp(run_row) / torch.exp(run_row).sum()
    return float(sum(p_base[v] * (torch.log(p_base[v]) - torch.log(p_run[v])) for v in range(VOCAB)))


def test_kl_div_of_the_base_against_the_run_at_the_last_position(logits, base_logits):
    metric = metrics.kl_div()
    assert metric.needs_base and metric.columns is None and metric.position == -1
    expected = [kl_reference(base_logits[i, -1], logits[i, -1]) for i in range(BATCH)]
    result = metric(logits, base_logits=base_logits)
    torch.testing.assert_close(result.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-6)
    # KL is not symmetric: the direction matters.
    assert not torch.allclose(result, metric(base_logits, base_logits=logits), atol=1e-3)
    assert metric(logits, base_logits=logits).abs().max() < 1e-5


def test_kl_div_over_every_position_averages_real_positions_only(logits, base_logits):
    metric = metrics.kl_div(position=None)
    expected = [mean([kl_reference(base_logits[i, p], logits[i, p]) for p in real_positions(i)]) for i in range(BATCH)]
    result = metric(
        with_garbage_at_padding(logits), base_logits=with_garbage_at_padding(base_logits), attention_mask=MASK
    )
    torch.testing.assert_close(result.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-6)
    # Without a mask every position counts.
    everywhere = [mean([kl_reference(base_logits[i, p], logits[i, p]) for p in range(POS)]) for i in range(BATCH)]
    torch.testing.assert_close(
        metric(logits, base_logits=base_logits).double(),
        torch.tensor(everywhere, dtype=torch.float64),
        rtol=1e-5,
        atol=1e-6,
    )


def test_kl_div_ignores_tokens_the_base_rules_out(logits):
    base = logits.clone()
    base[..., 0] = float("-inf")  # probability exactly 0 under the base
    result = metrics.kl_div()(logits, base_logits=base)
    assert torch.isfinite(result).all()


# ----------------------------------------------------------------------------- loss
def loss_reference(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor | None) -> list[float]:
    per_prompt = []
    for i in range(tokens.shape[0]):
        terms = []
        for p in range(tokens.shape[1] - 1):
            if mask is None or (mask[i, p] and mask[i, p + 1]):
                row = logits[i, p].double()
                log_total = torch.log(sum(torch.exp(row[v]) for v in range(row.shape[0])))
                terms.append(float(log_total - row[tokens[i, p + 1]]))
        per_prompt.append(mean(terms))
    return per_prompt


def test_loss_per_prompt_over_real_targets(logits):
    tokens = torch.randint(0, VOCAB, (BATCH, POS), generator=torch.Generator().manual_seed(2))
    metric = metrics.loss(None, tokens, attention_mask=MASK)
    assert metric.position is None and metric.columns is None and not metric.needs_base
    result = metric(with_garbage_at_padding(logits))
    assert result.dtype == torch.float32 and result.shape == (BATCH,)
    torch.testing.assert_close(
        result.double(), torch.tensor(loss_reference(logits, tokens, MASK), dtype=torch.float64), rtol=1e-5, atol=1e-5
    )
    # A row alone gives HookedTransformer.loss of that row.
    for i in range(BATCH):
        row_loss = HookedTransformer.loss(logits[i : i + 1], tokens[i : i + 1], MASK[i : i + 1])
        torch.testing.assert_close(result[i], row_loss, rtol=1e-6, atol=1e-6)
    # Unpadded, every target counts; a mask given at call time overrides the stored one.
    unpadded = torch.tensor(loss_reference(logits, tokens, None))
    torch.testing.assert_close(metrics.loss(None, tokens)(logits), unpadded, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(metrics.loss(None, tokens)(logits, attention_mask=MASK), result, rtol=0, atol=0)


def test_loss_on_a_padded_batch_of_text_matches_each_prompt_alone(gpt2):
    texts = [
        "When Mary and John went to the store, John gave a drink to Mary.",
        "The capital of France is Paris.",
        "Tom and Anna",
    ]
    metric = metrics.loss(gpt2, texts)  # the mask comes from the tokenizer
    assert metric.mask is not None
    with torch.no_grad():
        result = metric(gpt2(gpt2.to_tokens(texts)))
        alone = torch.stack([gpt2(text, return_type="loss") for text in texts])
    torch.testing.assert_close(result, alone, rtol=1e-4, atol=1e-4)


def test_loss_of_text_keeps_the_tokenizer_mask_when_a_prompt_begins_with_the_pad_token(gpt2):
    """Ids alone would read the <|endoftext|> of prompt 1 as padding; the tokenizer's own mask says it is real."""
    texts = ["When Mary and John went to the store", "<|endoftext|>Tom and Anna"]
    metric = metrics.loss(gpt2, texts)
    batch = gpt2.tokenizer(texts, return_tensors="pt")
    assert torch.equal(metric.tokens, batch["input_ids"]) and torch.equal(metric.mask, batch["attention_mask"].bool())
    with torch.no_grad():
        result = metric(gpt2(texts))
        alone = torch.stack([gpt2(text, return_type="loss") for text in texts])
    torch.testing.assert_close(result, alone, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- full logits and reduced logits agree
def reduce_by_hand(logits: torch.Tensor, position, columns) -> torch.Tensor:
    if position == -1:
        logits = logits[:, POS - 1 : POS]
    if columns is not None:
        logits = torch.stack([logits[..., c] for c in columns], dim=-1)
    return logits


@pytest.mark.parametrize(
    "make",
    [
        lambda: metrics.logit_diff(None, CORRECT, INCORRECT),
        lambda: metrics.logit_diff(None, CORRECT, INCORRECT, position=None),
        lambda: metrics.probability(None, CORRECT),
        lambda: metrics.log_prob(None, CORRECT, position=None),
        lambda: metrics.rank(None, CORRECT),
        lambda: metrics.kl_div(),
        lambda: metrics.kl_div(position=None),
        lambda: metrics.loss(
            None, torch.randint(0, VOCAB, (BATCH, POS), generator=torch.Generator().manual_seed(3)), MASK
        ),
    ],
    ids=["logit_diff", "logit_diff-all", "probability", "log_prob-all", "rank", "kl_div", "kl_div-all", "loss"],
)
def test_calling_on_full_logits_equals_compute_on_reduced_logits(make, logits, base_logits):
    metric = make()
    assert isinstance(metric, metrics.Metric)
    base = reduce_by_hand(base_logits, metric.position, metric.columns) if metric.needs_base else None
    reduced = metric.compute(reduce_by_hand(logits, metric.position, metric.columns), base, MASK)
    torch.testing.assert_close(metric(logits, base_logits=base_logits, attention_mask=MASK), reduced, rtol=0, atol=0)


# ----------------------------------------------------------------------------- string answers need the model
def test_string_answers_are_resolved_with_the_model(gpt2):
    mary, john = gpt2.to_single_token(" Mary"), gpt2.to_single_token(" John")
    metric = metrics.logit_diff(gpt2, [" Mary", " John"], [" John", " Mary"])
    assert (metric.correct, metric.incorrect) == ((mary, john), (john, mary))
    assert metric == metrics.logit_diff(None, [mary, john], [john, mary])
    with torch.no_grad():
        logits = gpt2(["When Mary and John went to the store, John gave a drink to", "Then, Alice and Bob went"])
    expected = torch.stack([logits[0, -1, mary] - logits[0, -1, john], logits[1, -1, john] - logits[1, -1, mary]])
    torch.testing.assert_close(metric(logits), expected, rtol=0, atol=1e-6)


def test_a_multi_token_answer_is_named(gpt2):
    with pytest.raises(ValueError) as raised:
        metrics.logit_diff(gpt2, [" Mary", " Paris"], [" John", " John"])
    assert "correct[1]" in str(raised.value) and "' Paris'" in str(raised.value) and "3 tokens" in str(raised.value)


def test_an_answer_the_tokenizer_does_not_know_is_refused():
    """On a word-level tokenizer, " Paris" and " Tokyo" both become <|unk|>: a logit difference of 0 that
    means nothing. Every metric taking answer strings refuses them; an id, the unknown token's too, is taken."""
    import hooked

    model = hooked.load("hooked/ioi-gpt2")
    unknown = model.tokenizer.unk_token_id
    with pytest.raises(ValueError) as raised:
        metrics.logit_diff(model, [" Mary", " Paris"], [" John", " John"])
    message = str(raised.value)
    assert "correct[1]: ' Paris' is not in this tokenizer's vocabulary" in message and "'<|unk|>'" in message
    assert "get_vocab()" in message
    with pytest.raises(ValueError, match=r"incorrect\[0\]: ' Tokyo' is not in this tokenizer's vocabulary"):
        metrics.logit_diff(model, [" Mary"], [" Tokyo"])
    for metric in (metrics.probability, metrics.log_prob, metrics.rank):
        with pytest.raises(ValueError, match=r"tokens\[0\]: ' Paris' is not in this tokenizer's vocabulary"):
            metric(model, [" Paris"])
    mary = model.to_single_token(" Mary")
    assert metrics.logit_diff(model, [mary], [unknown]).incorrect == (unknown,)  # an explicit id is the user's choice
    assert metrics.probability(model, ["<|unk|>"]).tokens == (unknown,)  # as is the unknown token written out


def test_string_answers_without_a_model_are_refused():
    with pytest.raises(ValueError, match="pass the model"):
        metrics.probability(None, [" Mary"])


# ----------------------------------------------------------------------------- errors
def test_answer_count_must_match_the_batch(logits):
    metric = metrics.logit_diff(None, [1, 2, 3], [4, 5, 6])
    with pytest.raises(ValueError, match=r"3 answers.*batch of 4"):
        metric(logits)
    with pytest.raises(ValueError, match=r"3 answers.*batch of 4"):
        metrics.rank(None, [1, 2, 3])(logits)


@pytest.mark.unchecked
@pytest.mark.parametrize("shape", [(BATCH, VOCAB), (VOCAB,), (1, BATCH, POS, VOCAB)])
def test_logits_of_the_wrong_rank_are_refused(shape):
    with pytest.raises(ValueError, match=r"\[batch pos d_vocab\]"):
        metrics.logit_diff(None, CORRECT, INCORRECT)(torch.zeros(shape))


def test_compute_refuses_full_logits(logits):
    with pytest.raises(ValueError, match="5 columns"):
        metrics.logit_diff(None, CORRECT, INCORRECT).compute(logits[:, -1:], None, None)
    with pytest.raises(ValueError, match="last position only"):
        metrics.probability(None, CORRECT).compute(logits, None, None)


@pytest.mark.parametrize("position", [0, -2, 3])
def test_only_the_last_position_or_every_position(position):
    with pytest.raises(ValueError, match=r"-1 \(the last position\) or None"):
        metrics.logit_diff(None, CORRECT, INCORRECT, position=position)
    with pytest.raises(ValueError, match=r"-1 \(the last position\) or None"):
        metrics.kl_div(position=position)


@pytest.mark.unchecked
def test_bad_answers_are_refused(logits):
    with pytest.raises(TypeError, match="one answer per prompt"):
        metrics.probability(None, " Mary")
    with pytest.raises(TypeError, match="one answer per prompt"):
        metrics.probability(None, 3)
    with pytest.raises(ValueError, match="3 correct and 2 incorrect"):
        metrics.logit_diff(None, [1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="empty"):
        metrics.rank(None, [])
    with pytest.raises(ValueError, match="non-negative"):
        metrics.rank(None, [1, -1])
    with pytest.raises(TypeError, match="token id"):
        metrics.rank(None, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="vocabulary of 13"):
        metrics.logit_diff(None, [1, 2, 3, 13], [0, 0, 0, 0])(logits)
    with pytest.raises(ValueError, match="vocabulary of 13"):
        metrics.probability(None, [1, 2, 3, 13])(logits)


def test_answer_ids_beyond_the_models_vocabulary_are_refused(gpt2):
    with pytest.raises(ValueError, match=f"vocabulary of {gpt2.cfg.d_vocab}"):
        metrics.probability(gpt2, [gpt2.cfg.d_vocab])


@pytest.mark.unchecked
def test_kl_div_needs_base_logits_of_the_same_shape(logits, base_logits):
    with pytest.raises(ValueError, match="base_logits"):
        metrics.kl_div()(logits)
    with pytest.raises(ValueError, match="base_logits have shape"):
        metrics.kl_div()(logits, base_logits=base_logits[:, :-1])


def test_loss_checks_its_tokens(logits):
    with pytest.raises(ValueError, match="at least 2 positions"):
        metrics.loss(None, torch.tensor([[1], [2]]))
    with pytest.raises(ValueError, match="fewer than 2 real tokens"):
        metrics.loss(None, torch.ones(2, 3, dtype=torch.long), torch.tensor([[0, 0, 1], [1, 1, 1]]))
    with pytest.raises(ValueError, match=r"tokens of shape \(4, 5\)"):
        metrics.loss(None, torch.ones(BATCH, POS - 1, dtype=torch.long))(logits)
    with pytest.raises(ValueError, match="pass the model"):
        metrics.loss(None, ["some text"])


@pytest.mark.unchecked
def test_attention_mask_of_the_wrong_shape_is_refused(logits, base_logits):
    with pytest.raises(ValueError, match="attention_mask has shape"):
        metrics.kl_div(position=None)(logits, base_logits=base_logits, attention_mask=MASK[:, 1:])


# ----------------------------------------------------------------------------- values
def test_reprs_read_like_the_call():
    tokens = torch.zeros(3, 5, dtype=torch.long)
    assert repr(metrics.logit_diff(None, CORRECT, INCORRECT)) == "logit_diff(n=4)"
    assert repr(metrics.logit_diff(None, CORRECT, INCORRECT, position=None)) == "logit_diff(n=4, position=None)"
    assert repr(metrics.probability(None, CORRECT)) == "probability(n=4)"
    assert repr(metrics.log_prob(None, CORRECT)) == "log_prob(n=4)"
    assert repr(metrics.rank(None, CORRECT)) == "rank(n=4)"
    assert repr(metrics.kl_div()) == "kl_div()"
    assert repr(metrics.kl_div(position=None)) == "kl_div(position=None)"
    assert repr(metrics.loss(None, tokens)) == "loss(n=3)"
    names = {metrics.logit_diff(None, CORRECT, INCORRECT).name, metrics.kl_div().name, metrics.loss(None, tokens).name}
    assert names == {"logit_diff", "kl_div", "loss"}


def test_metrics_are_frozen():
    metric = metrics.logit_diff(None, CORRECT, INCORRECT)
    with pytest.raises(dataclasses.FrozenInstanceError):
        metric.position = None


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_any_answer_strings_are_read_as_their_token_or_refused(data):
    """Whatever the answers: a metric holds each answer's own single token, never the unknown token a word
    the tokenizer lacks became (it raises instead)."""
    model = _ioi_model()
    vocab = sorted(word for word in model.tokenizer.get_vocab() if word.isalpha())  # a word-level vocabulary
    known = st.sampled_from(vocab).map(lambda word: " " + word)
    unknown = st.sampled_from([" Paris", " Tokyo", " xylophone", " Zanzibar"])
    answers = data.draw(st.lists(st.one_of(known, unknown), min_size=1, max_size=4), label="answers")
    ids = [model.tokenizer.encode(answer, add_special_tokens=False) for answer in answers]
    if any(ids_ == [model.tokenizer.unk_token_id] for ids_ in ids):
        with pytest.raises(ValueError, match="is not in this tokenizer's vocabulary"):
            metrics.probability(model, answers)
        return
    assert metrics.probability(model, answers).tokens == tuple(i[0] for i in ids)
    assert all(i != [model.tokenizer.unk_token_id] for i in ids)


@functools.lru_cache(maxsize=1)
def _ioi_model():
    import hooked

    return hooked.load("hooked/ioi-gpt2")
