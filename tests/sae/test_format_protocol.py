"""A dictionary file format is one module and one entry in `hooked.sae.formats.FORMATS` (docs/adding-a-format.md).

A made-up format is declared here, as a new format module would be (`toy.json` naming the point and widths,
`toy.pt` holding W_enc [d_in, d_sae], W_dec [d_sae, d_in], b_enc, b_dec, a relu SAE), and added to the list:
`hooked.sae.load` then finds it, the dictionary splices into a model and computes what its weights say (compared
with the arithmetic written out in plain torch on the file's tensors), `hooked.sae.save(format="toy")` writes it
back and the hub fetches its files. Then what the list's loop refuses: a directory two formats claim, a keyword the
format's reader does not take.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch

import hooked.sae
from hooked.sae import formats
from hooked.sae.dictionary import Dictionary, DictionaryConfig
from hooked.sae.formats.files import InMemory
from hooked.sae.formats.layout import Stored, build, check
from hooked.testing import random_model

HOOK = "blocks.0.hook_resid_post"
D_SAE = 24
ATOL = 1e-5  # float32 rounding of the same products in another order


# ----------------------------------------------------------------------------- the format, as its module would be
def _detect(path: Path) -> bool:
    return (path / "toy.json").is_file()


def _read(path: Path, *, hook_name, hook_name_out, device, dtype, model=None) -> Dictionary:
    raw = json.loads((path / "toy.json").read_text())
    cfg = DictionaryConfig(
        d_in=raw["d_in"],
        d_sae=raw["d_sae"],
        hook_name=hook_name or raw["hook_name"],
        apply_b_dec_to_input=False,
        dtype=dtype or "float32",
        device=device,
    )
    layout = {name: Stored(name) for name in ("W_enc", "W_dec", "b_enc", "b_dec")}
    source = InMemory(torch.load(path / "toy.pt", weights_only=True), str(path / "toy.pt"))
    check(cfg, source, layout, skip=False, config_file=str(path / "toy.json"), model=model)
    return build(cfg, source, layout, skip=False)


def _write(dictionary: Dictionary, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    cfg = dictionary.cfg
    (directory / "toy.json").write_text(json.dumps({"hook_name": cfg.hook_name, "d_in": cfg.d_in, "d_sae": cfg.d_sae}))
    tensors = {name: getattr(dictionary, name).detach().cpu() for name in ("W_enc", "W_dec", "b_enc", "b_dec")}
    torch.save(tensors, directory / "toy.pt")
    return directory


TOY = types.SimpleNamespace(
    NAME="toy",
    FILES=("toy.json", "toy.pt"),
    LOOKS_FOR="toy.json + toy.pt (the toy format)",
    detect=_detect,
    read=_read,
    write=_write,
)


@pytest.fixture
def with_toy(monkeypatch):
    """FORMATS with the toy format's entry, as its line in hooked/sae/formats/__init__.py would add it."""
    monkeypatch.setattr(formats, "FORMATS", [*formats.FORMATS, TOY])


@pytest.fixture(scope="module")
def model():
    return random_model("gpt2", seed=1, n_layers=2)


def toy_files(directory: Path, d_in: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A toy directory written by hand (not by the format's writer); its tensors."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        "W_enc": 0.3 * torch.randn(d_in, D_SAE, generator=generator),
        "W_dec": 0.3 * torch.randn(D_SAE, d_in, generator=generator),
        "b_enc": 0.1 * torch.randn(D_SAE, generator=generator) - 0.05,
        "b_dec": 0.1 * torch.randn(d_in, generator=generator),
    }
    directory.mkdir(parents=True)
    (directory / "toy.json").write_text(json.dumps({"hook_name": HOOK, "d_in": d_in, "d_sae": D_SAE}))
    torch.save(tensors, directory / "toy.pt")
    return tensors


# ----------------------------------------------------------------------------- a new format: one module, one entry
def test_a_format_declared_here_loads_splices_and_saves(with_toy, model, tmp_path):
    assert isinstance(TOY, formats.Format)
    tensors = toy_files(tmp_path / "toy", model.cfg.d_model)
    sae = hooked.sae.load(tmp_path / "toy", model=model)
    assert isinstance(sae, Dictionary) and sae.hook_name == HOOK
    for name, stored in tensors.items():  # a copy of the file's values: equal to the bit
        assert torch.equal(getattr(sae, name).detach(), stored), name
    assert torch.equal(hooked.sae.load(tmp_path / "toy" / "toy.pt").W_enc.detach(), tensors["W_enc"])  # its file

    def reconstruction(x, hook):  # relu(x W_enc + b_enc) W_dec + b_dec, from the file's tensors
        return torch.relu(x @ tensors["W_enc"] + tensors["b_enc"]) @ tensors["W_dec"] + tensors["b_dec"]

    tokens = torch.randint(0, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(0))
    spliced = model.run_with_saes(tokens, saes=[sae], use_error_term=False)
    explicit = model.run_with_hooks(tokens, fwd_hooks=[(HOOK, reconstruction)])
    torch.testing.assert_close(spliced, explicit, atol=ATOL, rtol=0)
    assert (spliced - model(tokens)).abs().max() > 1e-2  # the reconstruction is not the activation: a real test

    written = hooked.sae.save(sae, tmp_path / "out", format="toy")
    assert sorted(p.name for p in written.iterdir()) == ["toy.json", "toy.pt"]
    saved = torch.load(written / "toy.pt", weights_only=True)
    assert all(torch.equal(saved[name], tensors[name]) for name in tensors)
    assert json.loads((written / "toy.json").read_text()) == {"hook_name": HOOK, "d_in": model.cfg.d_model, "d_sae": 24}
    assert {"toy.json", "toy.pt"} <= set(formats.dictionary_files())  # what a hub path fetches


def test_without_its_entry_the_format_is_unknown(model, tmp_path):
    toy_files(tmp_path / "toy", model.cfg.d_model)
    with pytest.raises(FileNotFoundError, match=r"holds no dictionary hooked.sae knows: .*config\.yaml \(circuit"):
        hooked.sae.load(tmp_path / "toy")
    with pytest.raises(ValueError, match=r"format='toy': hooked.sae.save writes 'saelens', 'circuit-tracer'$"):
        hooked.sae.save(hooked.sae.load("hooked/ioi-gpt2/saes/blocks.2.hook_resid_post"), tmp_path / "o", format="toy")
    assert "toy.pt" not in formats.dictionary_files()


def test_the_unknown_directory_error_lists_every_format(with_toy, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"sae_weights\.safetensors \(SAELens\).*toy\.json \+ toy\.pt"):
        hooked.sae.load(tmp_path / "empty")


# ----------------------------------------------------------------------------- what the loop refuses
def test_a_directory_two_formats_claim_is_refused(monkeypatch):
    greedy = types.SimpleNamespace(
        **vars(TOY) | {"NAME": "greedy", "detect": lambda path: (path / "cfg.json").is_file()}
    )
    monkeypatch.setattr(formats, "FORMATS", [*formats.FORMATS, greedy])
    with pytest.raises(ValueError, match=r"holds the files of 2 formats \(cfg\.json \+ sae_weights.*toy\.json.*ambig"):
        hooked.sae.load("hooked/ioi-gpt2/saes/blocks.2.hook_resid_post")


def test_a_keyword_the_reader_does_not_take_is_refused(with_toy, model, tmp_path):
    toy_files(tmp_path / "toy", model.cfg.d_model)
    with pytest.raises(ValueError, match=r"norm_scaling_factor is for SAELens dictionaries; .*toy is not one"):
        hooked.sae.load(tmp_path / "toy", norm_scaling_factor=2.0)


def test_every_format_follows_the_protocol():
    assert all(isinstance(found, formats.Format) for found in formats.FORMATS)
    assert len({found.NAME for found in formats.FORMATS}) == len(formats.FORMATS)
    # what the hub fetched before the formats declared their files, written out
    assert set(formats.dictionary_files()) == {
        "cfg.json",
        "sae_weights.safetensors",
        "activation_scaler.json",
        "activation_whitening.safetensors",
        "sae.safetensors",
        "params.npz",
        "params.safetensors",
        "config.yaml",
        "layer_*.safetensors",
        "W_enc_*.safetensors",
        "W_dec_*.safetensors",
        "layer_*/cfg.json",
        "layer_*/sae_weights.safetensors",
        "layer_*/activation_scaler.json",
        "layer_*/activation_whitening.safetensors",
    }
