"""The documentation site: `mkdocs build --strict` passes, and the generated hook reference lists
exactly each model's hook names and refuses a hook point it has no description for."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hooked import HookPoint
from hooked.testing import random_model

ROOT = Path(__file__).resolve().parents[2]


def _load_generator():
    spec = importlib.util.spec_from_file_location("hooks_reference", ROOT / "docs" / "hooks_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ref = _load_generator()


@pytest.mark.slow
def test_mkdocs_build_strict_has_no_warning(tmp_path):
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", HF_HUB_OFFLINE="1")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(site),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    warnings = [line for line in output.splitlines() if "WARNING" in line or "ERROR" in line]
    assert not warnings, output
    page = (site / "hooks-reference" / "index.html").read_text()
    for name in (
        "blocks.{i}.attn.hook_z",
        "hook_pos_embed",
        "blocks.{i}.mlp.hook_router_logits",
        "blocks.{i}.mlp.hook_pre_linear",
    ):
        assert name in page
    for page in ("index.html", "transformer-lens/index.html", "api/hooked/index.html", "api/ablate/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api" / "hooked" / "index.html").read_text()
    for identifier in (
        "hooked.load",
        "hooked.HookedTransformer.generate",
        "hooked.HookedTransformer.run_with_cache",
        "hooked.HookedTransformer.run_with_hooks",
        "hooked.KVCache",
        "hooked.generate_variants",
        "hooked.sweep",
        "hooked.SweepResult",
        "hooked.ActivationCache",
    ):
        assert f'id="{identifier}"' in api, identifier
    sae_api = (site / "api" / "sae" / "index.html").read_text()
    for identifier in (
        "hooked.sae.formats.load",
        "hooked.sae.formats.save",
        "hooked.sae.splice.run_with_saes",
        "hooked.sae.attribution.attribute",
        "hooked.sae.training.train",
        "hooked.sae.evaluation.evaluate",
        "hooked.sae.clt.CrossLayerTranscoder",
    ):
        assert f'id="{identifier}"' in sae_api, identifier


@pytest.fixture(scope="module")
def models():
    return ref.build_models()


@pytest.fixture(scope="module")
def page(models):
    return ref.markdown(models)


def test_reference_lists_exactly_every_hook_name(models, page):
    listed = ref.listed_names(page)
    for architecture, model in models.items():
        title = ref.TITLES[architecture][0]
        expected = list(dict.fromkeys(ref.generalise(name)[0] for name in model.hook_dict))
        assert sorted(listed[title]) == sorted(expected), architecture
        assert len(listed[title]) == len(set(listed[title])), architecture  # each name once
        # Every concrete name maps back to a listed one, with the axes the point declares.
        rows = {row["name"]: row for row in ref.rows(model, architecture)}
        for name, point in model.hook_dict.items():
            assert rows[ref.generalise(name)[0]]["axes"] == " ".join(point.axes), name


def test_reference_keeps_firing_order(models):
    for architecture, model in models.items():
        order = [row["name"] for row in ref.rows(model, architecture)]
        for layer in range(model.cfg.n_layers):
            in_block = [ref.generalise(name)[0] for name in model.hook_dict if name.startswith(f"blocks.{layer}.")]
            assert [name for name in order if name in in_block] == in_block, (architecture, layer)


def test_moe_reference_has_both_mlp_kinds(models):
    moe = models["qwen3_moe"]
    assert {moe.cfg.is_sparse(layer) for layer in range(moe.cfg.n_layers)} == {True, False}
    rows = {row["name"]: row["layers"] for row in ref.rows(moe, "qwen3_moe")}
    assert rows["blocks.{i}.mlp.hook_post"] == "dense layers"
    assert rows["blocks.{i}.mlp.hook_expert_post"] == "sparse layers"
    assert rows["blocks.{i}.hook_mlp_out"] == "every"


def test_undescribed_hook_fails_the_reference(models):
    model = random_model("gpt2")
    model.blocks[0].attn.hook_extra = HookPoint("batch pos d_model")
    model.setup_hooks()
    assert "blocks.0.attn.hook_extra" in model.hook_dict
    with pytest.raises(ref.UndocumentedHookError, match=r"blocks\.\{i\}\.attn\.hook_extra"):
        ref.markdown({**models, "gpt2": model})


def test_undescribed_hook_fails_the_mkdocs_hook(monkeypatch, models):
    def with_extra_point():
        model = random_model("qwen3")
        model.hook_extra = HookPoint("batch pos d_model")
        model.setup_hooks()
        return {**models, "qwen3": model}

    monkeypatch.setattr(ref, "build_models", with_extra_point)
    with pytest.raises(ref.UndocumentedHookError, match="hook_extra"):
        ref.on_files([], config=None)


def test_unnamed_axis_fails_the_reference(models):
    model = random_model("gpt2")
    model.blocks[0].hook_odd = HookPoint("batch pos d_mystery")
    model.setup_hooks()
    with pytest.raises(ref.UndocumentedHookError, match="d_mystery"):
        ref.rows(model, "gpt2")


def test_stale_description_fails_the_reference(monkeypatch, models):
    monkeypatch.setitem(ref.MEANINGS, "blocks.{i}.attn.hook_gone", "a hook no model has")
    with pytest.raises(ref.UndocumentedHookError, match="hook_gone"):
        ref.markdown(models)
