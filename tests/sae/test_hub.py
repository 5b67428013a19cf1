"""Dictionaries read from the Hugging Face hub's cache, laid out as huggingface_hub lays it out (blobs named by
their hash, snapshots of links into them, refs/main), offline: `hooked.sae.load("hf://owner/repo/path")` must read
what loading the same files from a plain directory reads, fetch only a dictionary's files, follow a circuit-tracer
config's hf:// files, and say what is wrong when the repository, the path or the cache does not hold it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import sae_lens  # the dev extra: the reference for releases
import torch
import yaml

import hooked
import hooked.sae
from tests.sae.dictionaries import random_dictionary
from tests.sae.test_formats import D_IN, circuit_tracer_formula, circuit_tracer_set, gemma_scope_params, inputs

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty hub cache, offline: `publish` puts repositories in it."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return tmp_path / "hub"


def publish(cache: Path, repo_id: str, source: Path, revision: str = REVISION, ref: str | None = "main") -> Path:
    """Copy the tree `source` into the cache as repository `repo_id` at `revision`, as huggingface_hub stores a
    download: each file's bytes in blobs/<sha256>, the snapshot's files links to them. Returns the snapshot."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref is not None:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(revision)
    return snapshot


def same_dictionary(a, b) -> None:
    """The same dictionary, but for the Neuronpedia id that loading by release and id adds to the metadata. The
    parameters compare exactly (torch.equal): both read the same bytes (the cache's blobs are copies of the files)."""

    def cfg(d):
        return dataclasses.replace(d.cfg, metadata={k: v for k, v in d.cfg.metadata.items() if k != "neuronpedia_id"})

    assert cfg(a) == cfg(b)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(p, q), name


def test_a_saelens_folder_loads_from_the_hub_as_from_a_directory(hub, tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    asked = []  # the allow_patterns of every snapshot_download
    real = huggingface_hub.snapshot_download
    monkeypatch.setattr(
        huggingface_hub, "snapshot_download", lambda *a, **k: asked.append(k["allow_patterns"]) or real(*a, **k)
    )
    release = tmp_path / "release"
    for layer in (0, 1):
        d = random_dictionary(D_IN, f"blocks.{layer}.hook_resid_post", seed=layer)
        hooked.sae.save(d, release / f"blocks.{layer}.hook_resid_post")
    saved = {f"blocks.1.hook_resid_post/{p.name}" for p in (release / "blocks.1.hook_resid_post").iterdir()}
    (release / "README.md").write_text("not a dictionary")
    (release / "blocks.1.hook_resid_post" / "sparsity.safetensors").write_bytes(b"feature densities, not read")
    snapshot = publish(hub, "someone/tiny-saes", release)
    local = hooked.sae.load(release / "blocks.1.hook_resid_post")
    for name in ("hf://someone/tiny-saes/blocks.1.hook_resid_post", "someone/tiny-saes/blocks.1.hook_resid_post"):
        got = hooked.sae.load(name)
        same_dictionary(got, local)
        assert got.hook_name == "blocks.1.hook_resid_post"
    pinned = hooked.sae.load(f"hf://someone/tiny-saes/blocks.0.hook_resid_post?revision={REVISION}")
    same_dictionary(pinned, hooked.sae.load(release / "blocks.0.hook_resid_post"))
    same_dictionary(hooked.sae.load("hf://someone/tiny-saes/blocks.0.hook_resid_post", revision=REVISION), pinned)
    same_dictionary(hooked.sae.load(f"someone/tiny-saes/blocks.0.hook_resid_post@{REVISION}"), pinned)
    older = random_dictionary(D_IN, "blocks.0.hook_resid_post", seed=7)  # another commit, not on main
    hooked.sae.save(older, tmp_path / "older" / "blocks.0.hook_resid_post")
    publish(hub, "someone/tiny-saes", tmp_path / "older", revision="f" * 40, ref=None)
    name = f"hf://someone/tiny-saes/blocks.0.hook_resid_post?revision={'f' * 40}"
    same_dictionary(hooked.sae.load(name), hooked.sae.load(tmp_path / "older" / "blocks.0.hook_resid_post"))
    same_dictionary(hooked.sae.load("someone/tiny-saes/blocks.0.hook_resid_post"), pinned)  # main is unchanged
    # what a download would fetch of the repository: that folder's dictionary files, nothing else
    files = [str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file()]
    fetched = set(filter_repo_objects(files, allow_patterns=asked[0]))
    assert fetched == saved and len(saved) >= 2, (fetched, saved)


def test_a_gemma_scope_file_in_the_cache_names_its_layer_by_its_path(hub, tmp_path):
    """Gemma Scope's point is read off the repository's name and the folders (layer_1, ...-res): in the cache the
    file is a link into blobs/, so the folders must be read, not the link's target."""
    params = gemma_scope_params()
    folder = tmp_path / "repo" / "layer_1" / "width_16k" / "average_l0_5"
    folder.mkdir(parents=True)
    np.savez(folder / "params.npz", **params)
    publish(hub, "google/gemma-scope-tiny-pt-res", tmp_path / "repo")
    d = hooked.sae.load("hf://google/gemma-scope-tiny-pt-res/layer_1/width_16k/average_l0_5/params.npz")
    assert d.hook_name == "blocks.1.hook_resid_post"
    folder_load = hooked.sae.load("hf://google/gemma-scope-tiny-pt-res/layer_1/width_16k/average_l0_5")
    same_dictionary(folder_load, d)
    x = inputs(2, 3, D_IN)
    p = {key: torch.from_numpy(value) for key, value in params.items()}
    pre = x @ p["W_enc"] + p["b_enc"]
    torch.testing.assert_close(d(x), (pre * (pre > p["threshold"])) @ p["W_dec"] + p["b_dec"])


def test_a_circuit_tracer_config_naming_hub_files_is_followed(hub, tmp_path):
    """circuit-tracer's configs list their layers as hf://owner/repo/file URIs, often in another repository."""
    layers = circuit_tracer_set(tmp_path / "weights", activation="relu")
    (tmp_path / "weights" / "config.yaml").unlink()
    publish(hub, "someone/transcoder-weights", tmp_path / "weights")
    config = {
        "model_kind": "transcoder_set",
        "feature_input_hook": "mlp.hook_in",
        "feature_output_hook": "hook_mlp_out",
        "activation": "relu",
        "transcoders": [
            f"hf://someone/transcoder-weights/layer_{layer}.safetensors?revision={REVISION}" for layer in range(2)
        ],
    }
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "config.yaml").write_text(yaml.safe_dump(config))
    publish(hub, "someone/transcoders", tmp_path / "set")
    for name in ("hf://someone/transcoders", tmp_path / "set"):  # on the hub, or a local config naming hub files
        transcoders = hooked.sae.load(name)
        assert [t.hook_name for t in transcoders] == ["blocks.0.mlp.hook_in", "blocks.1.mlp.hook_in"]
        for layer, (transcoder, tensors) in enumerate(zip(transcoders, layers, strict=True)):
            x = inputs(2, 3, D_IN, seed=layer)
            torch.testing.assert_close(transcoder(x), circuit_tracer_formula(tensors, x, "relu"))


@pytest.mark.unchecked
def test_what_the_hub_cannot_give_is_named(hub, tmp_path):
    d = random_dictionary(D_IN, "blocks.0.hook_resid_post")
    hooked.sae.save(d, tmp_path / "release" / "blocks.0.hook_resid_post")
    publish(hub, "someone/tiny-saes", tmp_path / "release")
    with pytest.raises(FileNotFoundError, match=r"someone/tiny-saes has no dictionary at 'blocks\.0\.hook_resid_pre'"):
        hooked.sae.load("hf://someone/tiny-saes/blocks.0.hook_resid_pre")
    with pytest.raises(FileNotFoundError, match=r"did you mean 'blocks\.0\.hook_resid_post'"):
        hooked.sae.load("hf://someone/tiny-saes/blocks.0.hook_resid_pre")
    with pytest.raises(FileNotFoundError, match=r"not in the Hugging Face cache.*offline mode"):
        hooked.sae.load("hf://someone/other-saes/blocks.0.hook_resid_post")
    with pytest.raises(FileNotFoundError, match=r"not a local path, nor a hub path"):
        hooked.sae.load("hf://someone")
    with pytest.raises(ValueError, match=r"revision 'a' but revision='b'"):
        hooked.sae.load("hf://someone/tiny-saes/blocks.0.hook_resid_post?revision=a", revision="b")
    with pytest.raises(ValueError, match=r"revision='b' is for a path on the hub"):
        hooked.sae.load(tmp_path / "release" / "blocks.0.hook_resid_post", revision="b")
    with pytest.raises(ValueError, match=r"revision='b' is for a path on the hub"):
        hooked.sae.load("hooked/ioi-gpt2/saes/transcoders", revision="b")
    with pytest.raises(FileNotFoundError, match=r"does not exist"):
        hooked.sae.load(tmp_path / "nowhere")  # an absolute path is never sent to the hub


@pytest.mark.unchecked
def test_a_saelens_release_name_points_at_its_hub_path(hub):
    """SAELens' registry (installed with the dev extra) is read for the error, not imported."""
    with pytest.raises(FileNotFoundError) as error:
        hooked.sae.load("gpt2-small-res-jb")
    assert "SAELens release" in str(error.value)
    assert "hf://jbloom/GPT2-Small-SAEs-Reformatted/" in str(error.value)
    with pytest.raises(FileNotFoundError) as error:
        hooked.sae.load("gpt2-small-res-jb/blocks.8.hook_resid_pre")
    assert "hf://jbloom/GPT2-Small-SAEs-Reformatted/blocks.8.hook_resid_pre" in str(error.value)
    assert "'blocks.8.hook_resid_pre'" in str(error.value)


# ============================================================================= what SAELens' registry adds
def legacy_release_folder(directory: Path, hook: str, d_in: int, seed: int, **old_fields) -> Path:
    """A dictionary as the early SAELens releases store it: the weights, and a SAELens 0.x cfg.json (flat keys,
    `hook_point`, no `model_from_pretrained_kwargs`)."""
    hooked.sae.save(random_dictionary(d_in, hook, seed=seed), directory)
    cfg = {
        "d_in": d_in,
        "d_sae": 32,
        "dtype": "float32",
        "device": "cpu",
        "hook_point": hook,
        "model_name": "gpt2-small",
        "normalize_activations": False,
        "sae_lens_version": "0.5.1",
    } | old_fields
    (directory / "cfg.json").write_text(json.dumps(cfg))
    (directory / "activation_scaler.json").unlink(missing_ok=True)
    return directory


def saelens_from_pretrained(release: str, sae_id: str):
    """SAELens 6.54's own SAE.from_pretrained, reading the same offline hub cache."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sae_lens.SAE.from_pretrained(release, sae_id, device="cpu")


def test_release_facts_are_saelens_registry_entry_for_entry():
    """hub.RELEASE_FACTS holds, for every release SAELens reads without a conversion, the config_overrides that
    change the numbers and every SAE's norm_scaling_factor, as SAELens' registry has them, and nothing else."""
    from hooked.sae.formats import hub as hub_module

    registry = hub_module._saelens_registry()
    assert registry is not None  # SAELens is in the dev extra: its registry is the reference
    expected: dict[str, tuple[dict, dict]] = {}
    for entry in registry.values():
        if entry.get("conversion_func"):
            continue
        overrides = {
            key: value
            for key, value in (entry.get("config_overrides") or {}).items()
            if key in ("model_from_pretrained_kwargs", "normalize_activations", "hook_name", "d_in", "d_sae")
        }
        factors = {sae["path"]: sae["norm_scaling_factor"] for sae in entry["saes"] if "norm_scaling_factor" in sae}
        if overrides or factors:
            assert entry["repo_id"] not in expected, entry["repo_id"]  # one release per repository among these
            expected[entry["repo_id"]] = (overrides, factors)
    assert hub_module.RELEASE_FACTS == expected


def test_a_release_trained_on_centred_weights_says_so_and_is_refused_by_an_unprocessed_model(hub, tmp_path, gpt2):
    """gpt2-small-res-jb's files do not say its SAEs read a model with centred writing weights; SAELens'
    registry does, and from_pretrained records it. hooked must too, and refuse the unprocessed model."""
    hook = "blocks.0.hook_resid_pre"
    d_model = gpt2.cfg.d_model
    legacy_release_folder(tmp_path / "repo" / hook, hook, d_model, seed=3)
    publish(hub, "jbloom/GPT2-Small-SAEs-Reformatted", tmp_path / "repo")
    reference = saelens_from_pretrained("gpt2-small-res-jb", hook)
    assert reference.cfg.metadata.model_from_pretrained_kwargs == {"center_writing_weights": True}
    d = hooked.sae.load(f"hf://jbloom/GPT2-Small-SAEs-Reformatted/{hook}")
    assert d.cfg.processing is not None and d.cfg.processing["center_writing_weights"] is True
    assert not any(on for flag, on in d.cfg.processing.items() if flag != "center_writing_weights")
    x = inputs(2, 3, d_model)
    torch.testing.assert_close(d(x), reference(x))
    with pytest.raises(ValueError, match="center_writing_weights=True"):
        gpt2.run_with_saes(torch.tensor([[1, 2, 3]]), saes=[d])
    assert hooked.sae.load(tmp_path / "repo" / hook).cfg.processing is None  # the same files, read locally: unknown
    by_id = hooked.sae.load("gpt2-small-res-jb", sae_id=hook)
    # by release and id, the registry's Neuronpedia id is recorded too, as SAELens' from_pretrained records it
    assert by_id.cfg.metadata.neuronpedia_id == reference.cfg.metadata.neuronpedia_id is not None
    same_dictionary(by_id, d)
    same_dictionary(hooked.sae.load(release="gpt2-small-res-jb", sae_id=hook), d)  # SAELens' keywords
    from hooked.sae import SAE  # SAELens' loaders under their names

    from_pretrained = SAE.from_pretrained("gpt2-small-res-jb", hook)
    assert from_pretrained.cfg.metadata.neuronpedia_id == reference.cfg.metadata.neuronpedia_id
    same_dictionary(from_pretrained, d)
    same_dictionary(SAE.load_from_disk(tmp_path / "repo" / hook), hooked.sae.load(tmp_path / "repo" / hook))
    folded = SAE.from_pretrained(release="gpt2-small-res-jb", sae_id=hook, fold_W_dec_norm=True)
    torch.testing.assert_close(folded.W_dec.norm(dim=-1), torch.ones(folded.cfg.d_sae))
    torch.testing.assert_close(folded(x), reference(x))
    with pytest.raises(TypeError, match=r"hooked.sae.SAE only loads"):
        SAE(d.cfg)
    torch.testing.assert_close(by_id(x), reference(x))


@pytest.mark.unchecked
@pytest.mark.parametrize(
    "name, repository", [("gemma", "mwhanna/gemma-scope-transcoders"), ("llama", "mntss/transcoder-Llama-3.2-1B")]
)
def test_circuit_tracers_names_for_its_transcoder_sets_point_at_their_repositories(hub, name, repository):
    with pytest.raises(
        FileNotFoundError, match=rf"circuit-tracer's '{name}' transcoders are hooked.sae.load\('hf://{repository}'\)"
    ):
        hooked.sae.load(name)


@pytest.mark.unchecked
def test_a_release_and_sae_id_that_saelens_does_not_list_are_named(hub, monkeypatch):
    with pytest.raises(ValueError, match=r"'gpt2-smal-res-jb' is not a release.*did you mean 'gpt2-small-res-jb'"):
        hooked.sae.load("gpt2-smal-res-jb", "blocks.8.hook_resid_pre")
    with pytest.raises(ValueError, match=r"has no SAE 'blocks.8.hook_resid_pos'.*'blocks.8.hook_resid_pre'"):
        hooked.sae.load("gpt2-small-res-jb", "blocks.8.hook_resid_pos")
    with pytest.raises(FileNotFoundError, match=r"GPT2-Small-SAEs-Reformatted.*not in the Hugging Face cache"):
        hooked.sae.load("gpt2-small-res-jb", "blocks.8.hook_resid_pre")  # listed, but this cache does not hold it
    with pytest.raises(ValueError, match=r"release='gpt2-small-res-jb' needs sae_id="):
        hooked.sae.load(release="gpt2-small-res-jb")
    with pytest.raises(ValueError, match=r"give the release once"):
        hooked.sae.load("gpt2-small-res-jb", "blocks.8.hook_resid_pre", release="gpt2-small-res-jb")
    with pytest.raises(TypeError, match=r"load\(\) needs what to load"):
        hooked.sae.load()
    monkeypatch.setattr(hooked.sae.formats.hub, "_saelens_registry", lambda: None)  # SAELens not installed
    with pytest.raises(ValueError, match=r"SAELens is not installed: pip install sae-lens, or give the SAE's hub"):
        hooked.sae.load("gpt2-small-res-jb", "blocks.8.hook_resid_pre")


def test_a_release_norm_scaling_factor_is_folded_as_saelens_folds_it(hub, tmp_path):
    path = "gemma_2b_blocks.12.hook_resid_post_16384"
    folder = legacy_release_folder(
        tmp_path / "repo" / path, "blocks.12.hook_resid_post", D_IN, seed=5, normalize_activations=True
    )
    publish(hub, "jbloom/Gemma-2b-Residual-Stream-SAEs", tmp_path / "repo")
    reference = saelens_from_pretrained("gemma-2b-res-jb", "blocks.12.hook_resid_post")
    d = hooked.sae.load(f"jbloom/Gemma-2b-Residual-Stream-SAEs/{path}")
    x = inputs(2, 3, D_IN) * 4
    torch.testing.assert_close(d.encode(x), reference.encode(x))
    torch.testing.assert_close(d(x), reference(x))
    # by release and id, as SAELens takes them: the registry maps the id to a folder of another name
    same_dictionary(hooked.sae.load("gemma-2b-res-jb", "blocks.12.hook_resid_post"), d)
    with pytest.raises(ValueError, match="expected_average_only_in"):
        hooked.sae.load(folder)  # locally nothing gives the factor: refused, not guessed
    with pytest.raises(ValueError, match="registry gives"):
        hooked.sae.load(f"jbloom/Gemma-2b-Residual-Stream-SAEs/{path}", norm_scaling_factor=2.0)
