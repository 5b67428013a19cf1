"""`hooked.plot` and `hooked.logit_lens`: files written, labels and cells as given, values checked by hand.

Pixels are never compared: a figure is checked through what matplotlib holds (tick labels, titles, the
image arrays, the line data), and the logit lens against the residual stream unembedded by hand.
"""

import sys
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import hooked  # noqa: E402
from hooked import metrics, plot, tasks  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def model():
    return hooked.load("hooked/ioi-gpt2")


@pytest.fixture(scope="module")
def task(model):
    return tasks.ioi(10, seed=1, model=model)


@pytest.fixture(scope="module")
def cache(model, task):
    _, cache = model.run_with_cache(task.clean)
    return cache


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _ticks(labels) -> list[str]:
    return [label.get_text() for label in labels]


# ----------------------------------------------------------------------------- attention_pattern
def test_a_heads_pattern_is_drawn_over_its_tokens(model, task, tmp_path):
    prompt = task.clean[0]
    tokens = model.to_str_tokens(prompt)
    _, cache = model.run_with_cache(prompt)
    pattern = cache["pattern", 2][0, 3]
    path = tmp_path / "figures" / "L2H3.png"
    figure = plot.attention_pattern(pattern, tokens, path, title="L2H3")
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 5_000
    axes = figure.axes[0]
    assert _ticks(axes.get_xticklabels()) == tokens  # keys
    assert _ticks(axes.get_yticklabels()) == tokens  # queries
    assert axes.get_title() == "L2H3"
    torch.testing.assert_close(torch.as_tensor(axes.images[0].get_array().data), pattern)


def test_a_pattern_of_fewer_queries_labels_the_last_tokens(tmp_path):
    tokens = ["<bos>", "a", "$5 and $6", "\n"]
    pattern = torch.softmax(torch.randn(2, 4), -1)  # two decode steps' queries over four keys
    figure = plot.attention_pattern(pattern, tokens, tmp_path / "steps.pdf")
    assert (tmp_path / "steps.pdf").read_bytes()[:4] == b"%PDF"
    axes = figure.axes[0]
    # "$" is not read as mathtext, a newline is shown as \n
    assert _ticks(axes.get_xticklabels()) == ["<bos>", "a", r"\$5 and \$6", "\\n"]
    assert _ticks(axes.get_yticklabels()) == [r"\$5 and \$6", "\\n"]


def test_a_pattern_of_the_wrong_shape_names_the_fix(model, task):
    _, cache = model.run_with_cache(task.clean[:3])  # left-padded: the columns outnumber a short prompt's tokens
    with pytest.raises(
        ValueError, match=r"one head's pattern \[query_pos key_pos\].*cache\['pattern', layer\]\[prompt, head\]"
    ):
        plot.attention_pattern(cache["pattern", 0], model.to_str_tokens(task.clean[0]))
    short = min(task.clean[:3], key=lambda prompt: len(model.to_str_tokens(prompt)))
    tokens = model.to_str_tokens(short)
    with pytest.raises(ValueError, match=r"pattern\[-n:, -n:\] with n = len\(tokens\)"):
        plot.attention_pattern(cache["pattern", 0][0, 0], tokens)
    n = len(tokens)
    plot.attention_pattern(cache["pattern", 0][0, 0][-n:, -n:], tokens)  # the fix it names works


# ----------------------------------------------------------------------------- layer_head_grid
def test_the_grid_has_one_cell_per_layer_and_head(model, tmp_path):
    values = torch.randn(model.cfg.n_layers, model.cfg.n_heads)
    path = tmp_path / "grid.svg"
    figure = plot.layer_head_grid(values, path, title="scores", label="change in logit diff", model=model)
    assert b"<svg" in path.read_bytes()[:1000]
    axes = figure.axes[0]
    shown = axes.images[0].get_array()
    assert shown.shape == (model.cfg.n_layers, model.cfg.n_heads)
    torch.testing.assert_close(torch.as_tensor(shown.data), values)
    assert _ticks(axes.get_xticklabels()) == [str(h) for h in range(model.cfg.n_heads)]
    assert _ticks(axes.get_yticklabels()) == [str(layer) for layer in range(model.cfg.n_layers)]
    assert axes.get_xlabel() == "head" and axes.get_ylabel() == "layer" and axes.get_title() == "scores"
    assert len(axes.texts) == values.numel()  # each cell's value written in it
    limit = float(values.abs().max())  # both signs: a scale centred on 0
    assert axes.images[0].get_clim() == pytest.approx((-limit, limit))
    assert figure.axes[1].get_ylabel() == "change in logit diff"


def test_a_tensor_of_the_wrong_shape_names_the_fix(model):
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    with pytest.raises(ValueError, match=r"\[n_layers n_heads\] tensor, got shape \[3, 4, 4\].*values.mean\(0\)"):
        plot.layer_head_grid(torch.rand(3, 4, 4))
    with pytest.raises(ValueError, match=r"got shape \[16\].*reshape\(n_layers, n_heads\)"):
        plot.layer_head_grid(torch.rand(16))
    with pytest.raises(
        ValueError, match=rf"\[{n_layers} {n_heads}\] \(n_layers n_heads\).*got shape \[{n_layers + 1}, {n_heads}\]"
    ):
        plot.layer_head_grid(torch.rand(n_layers + 1, n_heads), model=model)
    wide = SimpleNamespace(cfg=SimpleNamespace(n_layers=2, n_heads=4))  # all it reads of a model
    with pytest.raises(ValueError, match=r"it is \[n_heads n_layers\]: pass values.T"):
        plot.layer_head_grid(torch.rand(4, 2), model=wide)
    with pytest.raises(TypeError, match=r"values must be a tensor"):
        plot.layer_head_grid("L0H0")


# ----------------------------------------------------------------------------- logit lens
def _lens_by_hand(model, cache, correct, incorrect=None) -> torch.Tensor:
    """[point batch]: accumulated_resid(apply_ln=True) at the last column, times the unembedding, by hand."""
    normed = cache.accumulated_resid(apply_ln=True, pos_slice=-1)  # [point batch d_model], ln_final applied
    logits = normed @ model.W_U  # [point batch d_vocab]
    rows = torch.arange(logits.shape[1])
    if incorrect is None:
        return logits.softmax(-1)[:, rows, correct]
    return logits[:, rows, correct] - logits[:, rows, incorrect]


def test_the_logit_lens_unembeds_each_layers_residual_stream(model, task, cache):
    correct = torch.tensor([model.to_single_token(answer) for answer in task.correct])
    incorrect = torch.tensor([model.to_single_token(answer) for answer in task.incorrect])
    diff = metrics.logit_diff(model, task.correct, task.incorrect)
    values, labels = hooked.logit_lens(cache, diff)
    assert labels == [f"{layer}_pre" for layer in range(model.cfg.n_layers)] + ["final_post"]
    torch.testing.assert_close(values, _lens_by_hand(model, cache, correct, incorrect), rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(values[-1], diff(model(task.clean)), rtol=1e-4, atol=1e-4)  # the model's own
    assert float(values[-1].mean()) > float(values[0].mean()) + 1.0  # the answer builds up: a real reading

    probability, _ = hooked.logit_lens(cache, metrics.probability(model, task.correct))
    torch.testing.assert_close(probability, _lens_by_hand(model, cache, correct), rtol=1e-4, atol=1e-5)
    kl, _ = hooked.logit_lens(cache, metrics.kl_div())  # compared with the model's own final logits
    assert float(kl[-1].abs().max()) < 1e-5 and float(kl[0].min()) > 0.01
    plain, _ = hooked.logit_lens(cache, lambda logits: logits[:, -1].float().logsumexp(-1))  # any callable
    assert plain.shape == values.shape


def test_the_logit_lens_of_a_prompt_is_the_same_alone_and_in_a_padded_batch(model, task, cache):
    diff = metrics.logit_diff(model, task.correct, task.incorrect)
    batch, _ = hooked.logit_lens(cache, diff)
    row = min(range(len(task)), key=lambda b: len(model.to_str_tokens(task.clean[b])))
    assert cache.attention_mask is not None and not bool(cache.attention_mask[row].all())  # this prompt is padded
    _, alone_cache = model.run_with_cache(task.clean[row])
    alone, _ = hooked.logit_lens(
        alone_cache, metrics.logit_diff(model, task.correct[row : row + 1], task.incorrect[row : row + 1])
    )
    torch.testing.assert_close(alone[:, 0], batch[:, row], rtol=1e-4, atol=1e-4)


def test_the_logit_lens_plot_draws_the_mean_and_each_prompt(model, task, cache, tmp_path):
    diff = metrics.logit_diff(model, task.correct, task.incorrect)
    values, labels = hooked.logit_lens(cache, diff)
    path = tmp_path / "lens.png"
    figure = plot.logit_lens(cache, diff, path)
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 5_000
    axes = figure.axes[0]
    assert _ticks(axes.get_xticklabels()) == labels
    assert axes.get_ylabel() == "logit_diff" and "logit lens" in axes.get_title()
    lines = [line for line in axes.get_lines() if len(line.get_ydata()) == len(labels)]
    assert len(lines) == len(task) + 1  # one per prompt, and the mean
    mean = lines[-1]
    assert mean.get_label() == f"mean over {len(task)} prompts"
    torch.testing.assert_close(torch.as_tensor(mean.get_ydata(), dtype=torch.float32), values.mean(1))


def test_bad_metrics_for_the_logit_lens_name_the_fix(model, task, cache):
    with pytest.raises(ValueError, match=r"last token; make .* with position=-1"):
        hooked.logit_lens(cache, metrics.logit_diff(model, task.correct, task.incorrect, position=None))
    with pytest.raises(ValueError, match=r"one value per prompt, a \[batch\] tensor of 10; got \[\]"):
        hooked.logit_lens(cache, lambda logits: logits.mean())


# ----------------------------------------------------------------------------- circuitsvis
def test_the_circuitsvis_view_renders_the_tokens_and_heads(model, task):
    tokens = model.to_str_tokens(task.clean[0])
    _, cache = model.run_with_cache(task.clean[0])
    view = plot.attention_heads(cache["pattern", 2][0], tokens, layer=2)
    for html in (str(view), view.local_src):  # the CDN page and the offline one
        for token in tokens:
            assert token in html, token
        for head in range(model.cfg.n_heads):
            assert f'"L2H{head}"' in html
    one = str(plot.attention_heads(cache["pattern", 2][0, 1], tokens, head_names=["L2H1 (S-inhibition?)"]))
    assert "L2H1 (S-inhibition?)" in one
    with pytest.raises(ValueError, match=r"\[head_index query_pos key_pos\].*\[:, -n:, -n:\]"):
        plot.attention_heads(cache["pattern", 2][0], tokens[1:])


def test_without_circuitsvis_the_error_names_the_extra(monkeypatch, model, task):
    for name in [name for name in sys.modules if name == "circuitsvis" or name.startswith("circuitsvis.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "circuitsvis", None)  # import circuitsvis now raises ImportError
    with pytest.raises(ImportError, match=r"circuitsvis, which is not installed: pip install 'hooked\[notebooks\]'"):
        plot.attention_heads(torch.rand(4, 5, 5), ["a", "b", "c", "d", "e"])
