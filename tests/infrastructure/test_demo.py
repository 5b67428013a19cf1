"""`make demo` (`python -m hooked.demo`): the story on the bundled IOI model, with its numbers re-derived here."""

import csv
import json
import re

import pytest
import torch

import hooked
import hooked.sae
from hooked import ablate, metrics, tasks
from hooked.circuits import Circuit
from hooked.demo import _features_chapter, _graph_chapter, _qk_section, main
from tests.sae.dictionaries import explicit_acts


def test_the_demo_tells_the_ablation_story_on_the_bundled_model(tmp_path, capsys):
    out = main(["--out", str(tmp_path / "demo"), "--n", "8"])
    printed = capsys.readouterr().out
    story = json.loads((out / "story.json").read_text())
    for file in (
        "head-sweep-resample.csv",
        "head-sweep-resample.json",
        "head-sweep-resample.png",
        "circuit.png",
        "circuit.json",
        "circuit-edges.csv",
        "circuit-faithfulness.csv",
        "circuit-faithfulness.json",
        "circuit-faithfulness.png",
        "feature-scores.csv",
        "feature-ablations.csv",
        "feature-ablations.json",
        "graph.png",
        "graph-ablations.csv",
        "graph-ablations.json",
    ):
        assert (out / file).stat().st_size > 0, file
    for section in (
        "1. ",
        "2. ",
        "3. ",
        "4. ",
        "5. ",
        "6. circuit discovery",
        "7. the features",
        "8. the attribution graph",
        "9. saved",
    ):
        assert section in printed

    # Re-derive the headline numbers without the demo's code: a trained model, and a head whose
    # corrupt-resampled output costs most of the logit difference.
    model = hooked.load("hooked/ioi-gpt2")
    task = tasks.ioi(n=8, seed=1, template="store")
    metric = metrics.logit_diff(model, task.correct, task.incorrect)
    with torch.no_grad():
        clean = metric(model(model.to_tokens(task.clean))).mean().item()
        _, corrupt = model.run_with_cache(task.corrupt)
        resampled = (
            metric(
                model.run_with_hooks(
                    model.to_tokens(task.clean),
                    fwd_hooks=ablate.hooks(model, story["top_head"], "resample", source=corrupt),
                )
            )
            .mean()
            .item()
        )
    assert abs(story["clean_logit_diff"] - clean) < 1e-4 and clean >= 3.0
    row = next(r for r in story["rows"] if r["method"] == "resample (from corrupt)")
    assert abs(row["logit_diff"] - resampled) < 1e-4
    assert resampled < clean / 2  # the head the sweep picked matters

    # The circuit: about 10% of the 479 edges (pruned), its heads printed with the inputs they use, and a
    # faithfulness on held-out prompts (held-out names and templates) that the saved circuit reproduces.
    summary = story["circuit"]
    circuit = Circuit.from_json(out / "circuit.json", model=model)
    assert summary["graph_edges"] == 479 and summary["edges"] == len(circuit.edges) <= 47
    assert circuit.method == "eap-ig" and summary["heads"] == circuit.heads
    for head, inputs in circuit.heads.items():
        assert f"   {head:<7} {','.join(inputs):<6}" in printed
    held = tasks.ioi_heldout(n=8)
    held_metric = metrics.logit_diff(model, held.correct, held.incorrect)
    assert abs(circuit.faithfulness(held.clean, held.corrupt, held_metric) - summary["held_out_faithfulness"]) < 1e-4
    assert summary["faithfulness"] > 0.8 and summary["held_out_faithfulness"] > 0.8
    assert (
        f"{summary['held_out_faithfulness']:.3f} on 8 held-out prompts (held-out names in held-out templates)"
        in printed
    )
    curve = json.loads((out / "circuit-faithfulness.json").read_text())["curve"]
    assert curve[-1]["edges"] == 479 and abs(curve[-1]["held_out_faithfulness"] - 1) < 1e-4
    with (out / "circuit-edges.csv").open() as file:
        assert [row["edge"] for row in csv.DictReader(file)] == [str(edge) for edge in circuit.edges]

    # The features: the top ones of the bundled SAE, resampled from the corrupt prompts together by a hook written
    # here, cost what the demo says, more than any draw of as many random active features, and most of the answer.
    features = story["features"]
    top = [row["feature"] for row in features["top"]]
    assert features["sae"] == "hooked/ioi-gpt2/saes/blocks.2.hook_resid_post" and len(top) == 10
    for row in features["top"]:
        assert f"   {row['feature']:<20} score {row['score']:+.3f}   alone {row['alone']:+.3f}" in printed
    with (out / "feature-scores.csv").open() as file:
        assert [row["feature"] for row in csv.DictReader(file)][:10] == top
    sae = hooked.sae.load(features["sae"], model=model)
    point = "blocks.2.hook_resid_post.hook_sae_acts_post"
    indices = [int(feature.rsplit(".F", 1)[1]) for feature in top]
    with torch.no_grad(), model.saes([sae], use_error_term=True):
        _, corrupt_features = model.run_with_cache(task.corrupt, names_filter=[point])

        def resample(acts, hook):
            acts = acts.clone()
            acts[..., indices] = corrupt_features[point][..., indices]
            return acts

        tokens = model.to_tokens(task.clean)
        spliced = metric(model(tokens)).mean().item()
        ablated = metric(model.run_with_hooks(tokens, fwd_hooks=[(point, resample)])).mean().item()
    assert abs(spliced - clean) < 1e-3  # the error term keeps the model's output
    assert abs(features["top_resampled"] - (ablated - spliced)) < 1e-3
    assert features["top_resampled"] < min(features["random_resampled"]) and ablated < clean / 2
    assert all(row["alone"] < 0 for row in features["top"])  # each alone lowers it too
    assert features["transcoders"]["top_resampled"] < -clean / 4


def test_the_graph_chapter_names_features_whose_ablation_a_hand_written_hook_confirms(tmp_path, capsys):
    """Chapter 8's ablation numbers re-derived without hooked.graphs, the splice or sweeps: each transcoder feature
    zeroed by subtracting activation x decoder row from the MLP's output, the activation computed from the weights."""
    model = hooked.load("hooked/ioi-gpt2")
    task = tasks.ioi(n=16, seed=1, template="store")
    args = type("Args", (), {"model": "hooked/ioi-gpt2", "seed": 1})()
    with torch.no_grad():
        story = _graph_chapter(model, task, args, tmp_path)
    printed = capsys.readouterr().out
    assert (tmp_path / "graph.png").stat().st_size > 0 and (tmp_path / "graph-ablations.csv").stat().st_size > 0
    assert story["prompt"] == task.clean[0] and story["answer"] == task.correct[0]
    path = [row["feature"] for row in story["path_features"]]
    assert len(path) == 5 and story["pruned_nodes"] < story["nodes"] / 5
    for row in story["path_features"]:
        assert f"   {row['feature']:<20} {row['strength']:.3f}   alone {row['alone']:+.3f}" in printed

    transcoders = hooked.sae.load("hooked/ioi-gpt2/saes/transcoders", model=model)
    tokens = torch.tensor(
        [model.tokenizer.bos_token_id, *model.tokenizer.encode(task.clean[0], add_special_tokens=False)]
    )
    answer, other = model.to_single_token(task.correct[0]), model.to_single_token(task.incorrect[0])
    assert tokens[story["io_position"]] == answer

    def zeroed(addresses: list[str]) -> torch.Tensor:
        """The last position's logits with each `L{layer}.mlp_out.F{feature}@{position}` zeroed by hand."""
        spots = [
            tuple(int(part) for part in re.fullmatch(r"L(\d+)\.mlp_out\.F(\d+)@(\d+)", a).groups()) for a in addresses
        ]
        inputs = {}
        active.clear()

        def read(x, hook):
            inputs[int(hook.name.split(".")[1])] = x

        def write(out, hook):
            layer, out = int(hook.name.split(".")[1]), out.clone()
            acts = explicit_acts(transcoders[layer], inputs[layer])
            for spot_layer, feature, position in spots:
                if spot_layer == layer:  # its activation now, after the edits of earlier layers
                    active.append(bool(acts[0, position, feature] > 0))
                    out[0, position] -= acts[0, position, feature] * transcoders[layer].W_dec[feature]
            return out

        hooks = [(f"blocks.{layer}.mlp.hook_in", read) for layer in range(4)] + [
            (f"blocks.{layer}.hook_mlp_out", write) for layer in range(4)
        ]
        with torch.no_grad():
            return model.run_with_hooks(tokens[None], fwd_hooks=hooks)[0, -1]

    active: list[bool] = []
    clean, ablated = zeroed([]), zeroed(path)
    assert all(active)  # features the prompt activates (each of a later layer too, with the earlier ones zeroed)
    difference = lambda logits: float(logits[answer] - logits[other])  # noqa: E731
    assert abs(story["logit_diff"] - difference(clean)) < 1e-3
    assert abs(story["path_zeroed"] - (difference(ablated) - difference(clean))) < 1e-3
    assert abs(story["path_answer_logit"] - float(ablated[answer] - clean[answer])) < 1e-3
    assert abs(story["path_other_logit"] - float(ablated[other] - clean[other])) < 1e-3
    for draw, change, answer_change in zip(
        story["random_features"], story["random_zeroed"], story["random_answer_logit"], strict=True
    ):
        logits = zeroed(draw)
        assert abs(change - (difference(logits) - difference(clean))) < 1e-3
        assert abs(answer_change - float(logits[answer] - clean[answer])) < 1e-3
    # the features the graph names move the answer's logit more than any draw of as many random active ones
    assert story["path_answer_logit"] < -3 and abs(story["path_answer_logit"]) > 3 * max(
        abs(change) for change in story["random_answer_logit"]
    )


def test_the_features_chapter_is_skipped_for_a_model_without_bundled_dictionaries(tmp_path, capsys):
    args = type("Args", (), {"model": "gpt2", "seed": 1})()
    assert _features_chapter(None, None, None, None, None, 0.0, args, tmp_path) is None
    printed = capsys.readouterr().out
    assert printed.strip() == "7. features: gpt2 has no bundled dictionary (hooked/ioi-gpt2 has, docs/saes.md); skipped"
    assert not any(tmp_path.iterdir())


def test_the_demo_leaves_the_callers_grad_mode_alone(tmp_path):
    assert torch.is_grad_enabled()
    main(["--out", str(tmp_path / "demo"), "--n", "2"])
    assert torch.is_grad_enabled()


def test_the_graph_chapter_explains_where_the_top_heads_attend_with_the_models_own_scores(capsys):
    """Chapter 8's QK section against the model's own pattern and scores (hook_pattern, hook_attn_scores): the key
    each head attends to, its scores there, and the key-side totals adding up to the score."""
    model = hooked.load("hooked/ioi-gpt2")
    task = tasks.ioi(n=16, seed=1, template="store")
    transcoders = hooked.sae.load("hooked/ioi-gpt2/saes/transcoders", model=model)
    tokens = torch.tensor(
        [model.tokenizer.bos_token_id, *model.tokenizer.encode(task.clean[0], add_special_tokens=False)]
    )
    answer, other = model.to_single_token(task.correct[0]), model.to_single_token(task.incorrect[0])
    io_position = int((tokens == answer).nonzero()[0])
    with torch.no_grad():
        rows = _qk_section(model, tokens, transcoders, ["L2H2", "L2H1"], other, io_position)
        _, cache = model.run_with_cache(tokens[None], names_filter=lambda n: n.startswith("blocks.2.attn.hook_"))
    printed = capsys.readouterr().out
    for row, head in zip(rows, (2, 1), strict=True):
        pattern = cache["blocks.2.attn.hook_pattern"][0, head, -1]
        scores = cache["blocks.2.attn.hook_attn_scores"][0, head, -1]
        assert row["key"] == int(pattern.argmax()) and row["weight"] == pytest.approx(float(pattern.max()), abs=1e-5)
        for entry in row["scores"]:
            assert entry["score"] == pytest.approx(float(scores[entry["key"]]), abs=1e-4)
            assert sum(entry["key_totals"].values()) == pytest.approx(entry["score"], abs=1e-3)
        assert f"L2H{head} attends to" in printed
