"""`hooked.attention_to_positions`: attention from END to the named positions of a task, per head.

Every value is checked against the pattern read directly from `run_with_cache` on a left-padded batch
(prompts of different lengths), at each prompt's own columns found by hand from its token count.
"""

import pytest
import torch

import hooked
from hooked import tasks


@pytest.fixture(scope="module", params=["hooked/ioi-gpt2", "hooked/ioi-qwen3moe"])
def model(request):
    return hooked.load(request.param)


@pytest.fixture(scope="module")
def task(model):
    task = tasks.ioi(12, seed=3, model=model)
    lengths = {len(model.to_str_tokens(prompt)) for prompt in task.clean}
    assert len(lengths) > 1  # the batch is padded: the prompts differ in length
    return task


def _by_hand(model, task, query: str, names: list[str]) -> torch.Tensor:
    """[prompt layer head_index name] from run_with_cache: prompt b's tokens are the last n_b columns."""
    _, cache = model.run_with_cache(task.clean, names_filter=lambda name: name.endswith("hook_pattern"))
    width = cache["pattern", 0].shape[-1]
    values = torch.zeros(len(task), model.cfg.n_layers, model.cfg.n_heads, len(names))
    for b, prompt in enumerate(task.clean):
        pad = width - len(model.to_str_tokens(prompt))  # left padding before prompt b's first token
        end = pad + int(task.positions[query][b])
        for layer in range(model.cfg.n_layers):
            for i, name in enumerate(names):
                values[b, layer, :, i] = cache["pattern", layer][b, :, end, pad + int(task.positions[name][b])]
    return values


def test_each_value_is_the_pattern_at_the_prompts_own_columns(model, task):
    att = hooked.attention_to_positions(model, task)
    assert att.names == ("IO", "S1", "S2") and att.query == "END"
    expected = _by_hand(model, task, "END", ["IO", "S1", "S2"])
    assert att.values.shape == (len(task), model.cfg.n_layers, model.cfg.n_heads, 3)
    torch.testing.assert_close(att.values, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(att.mean, expected.mean(0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(att["S2"], expected[..., 2].mean(0), rtol=1e-5, atol=1e-6)
    assert float(att.values.max()) > 0.5  # some head looks at a name: the test reads real attention


def test_the_table_has_one_row_per_head_and_the_mean_over_prompts(model, task):
    att = hooked.attention_to_positions(model, task)
    table = att.table()
    assert list(table.columns) == ["IO", "S1", "S2"]
    assert list(table.index.names) == ["layer", "head"]
    assert len(table) == model.cfg.n_layers * model.cfg.n_heads
    expected = _by_hand(model, task, "END", ["IO", "S1", "S2"]).mean(0)
    for layer, head in [(0, 0), (2, 3), (model.cfg.n_layers - 1, model.cfg.n_heads - 1)]:
        for i, name in enumerate(["IO", "S1", "S2"]):
            assert table.loc[(layer, head), name] == pytest.approx(float(expected[layer, head, i]), rel=1e-5, abs=1e-6)


def test_a_prompt_reads_the_same_alone_and_in_a_padded_batch(model, task):
    batch = hooked.attention_to_positions(model, task)
    longest = max(range(len(task)), key=lambda b: len(model.to_str_tokens(task.clean[b])))
    shortest = min(range(len(task)), key=lambda b: len(model.to_str_tokens(task.clean[b])))
    for row in (shortest, longest):
        alone = hooked.attention_to_positions(model, task[row : row + 1])
        torch.testing.assert_close(alone.values[0], batch.values[row], rtol=1e-4, atol=1e-6)
    chunked = hooked.attention_to_positions(model, task, batch_size=5)  # 5 + 5 + 2, each padded its own way
    torch.testing.assert_close(chunked.values, batch.values, rtol=1e-4, atol=1e-6)


def test_another_query_and_names(model, task):
    att = hooked.attention_to_positions(model, task, names=["S1", "IO"], query="S2")
    assert att.names == ("S1", "IO") and att.query == "S2"
    torch.testing.assert_close(att.values, _by_hand(model, task, "S2", ["S1", "IO"]), rtol=1e-5, atol=1e-6)


def test_the_heatmap_draws_one_grid_per_name(model, task, tmp_path):
    import matplotlib.pyplot as plt

    att = hooked.attention_to_positions(model, task)
    path = tmp_path / "end.png"
    figure = att.heatmap(path)
    try:
        assert path.stat().st_size > 5_000
        grids = [axes for axes in figure.axes if axes.images]
        assert [axes.get_title() for axes in grids] == ["END → IO", "END → S1", "END → S2"]
        for axes, name in zip(grids, att.names, strict=True):
            shown = axes.images[0].get_array()
            assert shown.shape == (model.cfg.n_layers, model.cfg.n_heads)
            torch.testing.assert_close(torch.as_tensor(shown.data), att[name])
    finally:
        plt.close(figure)


def test_bad_input_names_the_fix(model, task):
    with pytest.raises(ValueError, match=r"no position 'S3'.*'IO', 'S1', 'S2', 'END'"):
        hooked.attention_to_positions(model, task, names=["IO", "S3"])
    with pytest.raises(ValueError, match=r"no position 'START'"):
        hooked.attention_to_positions(model, task, query="START")
    with pytest.raises(
        ValueError, match=r"no token positions.*tasks.ioi\(\.\.\., model=model\).*with_positions\(model\)"
    ):
        hooked.attention_to_positions(model, tasks.ioi(4, seed=0))
    with pytest.raises(ValueError, match=r"batch_size must be a positive int"):
        hooked.attention_to_positions(model, task, batch_size=0)


def test_positions_made_for_other_tokens_raise(model, task):
    """Positions made with another prepend_bos (or tokenizer) point at other tokens: refused, not read."""
    other = task.with_positions(model, prepend_bos=not model.default_prepend_bos)  # both bundled tokenizers have a BOS
    with pytest.raises(ValueError, match=r"do not match this model's tokens.*task.with_positions\(model\)"):
        hooked.attention_to_positions(model, other)
    # Read with the prepend_bos they were made with, they are right again.
    att = hooked.attention_to_positions(model, other, prepend_bos=not model.default_prepend_bos)
    assert att.values.shape[0] == len(task)


def test_positions_given_by_hand_are_range_checked(gpt2):
    """A task without recorded name spans: its positions are read as given, and one past a prompt raises."""
    prompts = ["a b c", "a b c d e f"]
    lengths = [len(gpt2.to_str_tokens(prompt)) for prompt in prompts]
    task = tasks.Task(
        "hand",
        prompts,
        ["x", "y"],
        [" a", " b"],
        [" b", " a"],
        seed=0,
        token_positions={"END": [n - 1 for n in lengths], "FIRST": [0, 0], "FAR": [lengths[0], 1]},
    )
    att = hooked.attention_to_positions(gpt2, task, names=["FIRST"])
    expected = _by_hand(gpt2, task, "END", ["FIRST"])
    torch.testing.assert_close(att.values, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(
        ValueError, match=rf"position {lengths[0]} does not exist in prompt 0, which has {lengths[0]} tokens"
    ):
        hooked.attention_to_positions(gpt2, task, names=["FAR"])


def test_the_figures_quoted_in_the_docs():
    """docs/analysis.md quotes these for the bundled GPT-2 model on tasks.ioi(32, seed=0)."""
    from hooked import metrics

    model = hooked.load("hooked/ioi-gpt2")
    task = tasks.ioi(32, seed=0, model=model)
    table = hooked.attention_to_positions(model, task).table()
    quoted = {
        (1, 1): (0.555, 0.374, 0.052),
        (2, 2): (0.000, 0.000, 1.000),
        (2, 3): (0.497, 0.500, 0.000),
        (3, 3): (0.001, 0.000, 0.966),
    }
    for head, values in quoted.items():
        assert table.loc[head, ["IO", "S1", "S2"]].tolist() == pytest.approx(values, abs=6e-4), head
    assert min(table.loc[(2, h), "S2"] for h in (0, 1, 2)) >= 0.997
    _, cache = model.run_with_cache(task.clean)
    lens, _ = hooked.logit_lens(cache, metrics.logit_diff(model, task.correct, task.incorrect))
    assert lens.mean(1).tolist() == pytest.approx([-0.281, -1.103, -0.776, 10.77, 13.165], abs=6e-3)
