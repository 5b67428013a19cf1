"""`make demo` (`python -m hooked.demo`): the story on the bundled IOI model, with its numbers re-derived here."""

import json

import torch

import hooked
from hooked import ablate, metrics, tasks
from hooked.demo import main


def test_the_demo_tells_the_ablation_story_on_the_bundled_model(tmp_path, capsys):
    out = main(["--out", str(tmp_path / "demo"), "--n", "8"])
    printed = capsys.readouterr().out
    story = json.loads((out / "story.json").read_text())
    for file in ("head-sweep-resample.csv", "head-sweep-resample.json", "head-sweep-resample.png"):
        assert (out / file).stat().st_size > 0, file
    for section in ("1. ", "2. ", "3. ", "4. ", "5. ", "6. "):
        assert section in printed

    # Re-derive the headline numbers without the demo's code: a trained model, and a head whose
    # corrupt-resampled output costs most of the logit difference.
    model = hooked.load("hooked/ioi-gpt2")
    task = tasks.ioi(n=8, seed=1, template="store")
    metric = metrics.logit_diff(model, task.correct, task.incorrect)
    with torch.no_grad():
        clean = metric(model(model.to_tokens(task.clean))).mean().item()
        _, corrupt = model.run_with_cache(task.corrupt)
        resampled = metric(model.run_with_hooks(model.to_tokens(task.clean),
                                                fwd_hooks=ablate.hooks(model, story["top_head"], "resample", source=corrupt))).mean().item()
    assert abs(story["clean_logit_diff"] - clean) < 1e-4 and clean >= 3.0
    row = next(r for r in story["rows"] if r["method"] == "resample (from corrupt)")
    assert abs(row["logit_diff"] - resampled) < 1e-4
    assert resampled < clean / 2  # the head the sweep picked matters


def test_the_demo_leaves_the_callers_grad_mode_alone(tmp_path):
    assert torch.is_grad_enabled()
    main(["--out", str(tmp_path / "demo"), "--n", "2"])
    assert torch.is_grad_enabled()
