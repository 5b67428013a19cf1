"""A new kind of component is one declaration (hooked/interventions/kinds.py, docs/ablation.md).

The kind declared here is a dimension of the residual stream after a block, `L1.D5`: dimension 5 of
`blocks.1.hook_resid_post`, selected by a new selector `dims=` along `d_model`. It stands in for a
dictionary's features (`L3.F123`, `features=` along `d_sae`): an existing point under an axis no kind
selected on before. Once declared, with no other change, its addresses parse and are suggested when
misspelled, `ablate.hooks` zeroes exactly its slice, `hooked.sweep` runs it and names it in its table,
`components(model, "dims:1")` lists it and `hooked sweep --components dims:1` takes it. The declaration is
removed after each test, so every other test sees the built-in kinds only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import hooked
from hooked import ablate, patch
from hooked.cli import component_kind, plot_components, sweep_addresses
from hooked.interventions import kinds
from hooked.interventions.addresses import parse_address
from hooked.interventions.results import SweepResult
from hooked.testing import random_model

DIMS = kinds.Selector(
    "dims",
    axes=("d_model",),
    where="put it on a residual stream point such as blocks.L.hook_resid_post (or use the address 'L{layer}.D{dim}')",
)
DIMENSIONS = kinds.Kind(
    "dims",  # components(model, "dims:1"), hooked sweep --components dims:1
    "L{layer}.D{dim}",  # the address: L1.D5
    hook="hook_resid_post",  # its point, under blocks.{layer}
    indices={"dim": kinds.Index(DIMS, "d_model", "dimension")},  # dims=5, one of d_model per layer
    listing="layer",
)


@pytest.fixture
def declared():
    kinds.declare(DIMENSIONS)
    try:
        yield DIMENSIONS
    finally:
        kinds.remove("dims")


@pytest.fixture(scope="module")
def gpt2():
    return random_model("gpt2")


def tokens_of(model, batch: int = 3, pos: int = 7) -> torch.Tensor:
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(0))


def zero_dims(layer: int, dims: list[int]):
    """The explicit computation: a copy of the residual stream after block `layer` with `dims` set to 0."""

    def edit(resid: torch.Tensor, hook) -> torch.Tensor:
        resid = resid.clone()
        resid[..., dims] = 0.0  # [batch pos d_model]
        return resid

    return [(f"blocks.{layer}.hook_resid_post", edit)]


def test_its_addresses_parse_and_are_suggested_when_misspelled(declared, gpt2):
    component = parse_address(gpt2, "L1.D5")
    assert (component.hook_name, component.selectors) == ("blocks.1.hook_resid_post", {"dims": (5,)})
    assert parse_address(gpt2, "l-1.d3@-1").selectors == {"positions": (-1,), "dims": (3,)}
    with pytest.raises(
        IndexError, match=r"'L0.D32': dimension 32 is out of range; layer 0 has 32 \(dimensions 0..31\)"
    ):
        parse_address(gpt2, "L0.D32")
    with pytest.raises(ValueError, match=r"did you mean 'L1.D0'.*forms: .*L\{layer\}.D\{dim\}, each optionally"):
        parse_address(gpt2, "L1.D")
    assert "L{layer}.D{dim}" in kinds.address_forms()


def test_ablate_hooks_zero_exactly_the_selected_dimensions(declared):
    for architecture in ("gpt2", "qwen3_moe", "gemma2"):
        model = random_model(architecture)
        tokens = tokens_of(model)
        pairs = ablate.hooks(model, ["L1.D5", "L1.D7"], "zero")
        assert [(name, repr(fn)) for name, fn in pairs] == [("blocks.1.hook_resid_post", "zero(dims=[5, 7])")]
        with torch.no_grad():
            ablated = model.run_with_hooks(tokens, fwd_hooks=pairs)
            expected = model.run_with_hooks(tokens, fwd_hooks=zero_dims(1, [5, 7]))
            clean = model(tokens)
        # Exact: both zero the same entries, then the same forward runs on the same numbers
        torch.testing.assert_close(ablated, expected, rtol=0, atol=0)
        assert not torch.allclose(ablated, clean), architecture  # the zeroed dimensions mattered


def test_its_selector_is_a_keyword_of_every_ablation(declared, gpt2):
    tokens = tokens_of(gpt2)
    assert repr(ablate.zero(heads=1, dims=2, positions=-1)) == "zero(heads=[1], dims=[2], positions=[-1])"
    with pytest.raises(ValueError, match="dims= selects on a d_model axis.*hook_resid_post"):
        gpt2.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", ablate.zero(dims=1))])
    with pytest.raises(IndexError, match=r"dims \[40\] out of range"):
        gpt2.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_post", ablate.zero(dims=40))])
    # A patch keeps it: clean dimension 3 written into a corrupt run, at position -1 only.
    corrupt = tokens_of(gpt2).flip(0)
    _, clean_cache = gpt2.run_with_cache(tokens)
    ((name, fn),) = patch.hooks(gpt2, "L0.D3@-1", clean_cache)
    assert repr(fn) == "patch(source=<cache of 3 prompts>, dims=[3], positions=[-1])"

    def by_hand(resid, hook):
        resid = resid.clone()
        resid[:, -1, 3] = clean_cache[hook.name][:, -1, 3]
        return resid

    with torch.no_grad():  # exact: both write the same cached values, then the same forward runs
        torch.testing.assert_close(
            gpt2.run_with_hooks(corrupt, fwd_hooks=[(name, fn)]),
            gpt2.run_with_hooks(corrupt, fwd_hooks=[(name, by_hand)]),
            rtol=0,
            atol=0,
        )


def test_a_sweep_over_its_components_names_them_in_its_table(declared, gpt2, tmp_path):
    addresses = ablate.components(gpt2, "dims:-1")
    assert addresses == [f"L1.D{i}" for i in range(gpt2.cfg.d_model)]
    assert (component_kind("dims:1"), kinds.listings()[1]) == ("dims:1", ["neurons", "experts", "features", "dims"])
    assert sweep_addresses(gpt2, "dims:-1") == ("dims:1", addresses)  # hooked sweep --components dims:-1
    tokens = tokens_of(gpt2)
    variants = {address: ablate.hooks(gpt2, address) for address in addresses[:6]}
    result = hooked.sweep(gpt2, tokens, variants, lambda logits, **_: logits[:, -1, :4].sum(-1))
    assert [row["variant"] for row in result.rows()] == ["base", *addresses[:6]]
    for dim, address in enumerate(addresses[:6]):
        with torch.no_grad():
            alone = gpt2.run_with_hooks(tokens, fwd_hooks=zero_dims(1, [dim]))[:, -1, :4].sum(-1)
        torch.testing.assert_close(result[address], alone, rtol=0, atol=1e-5)
    grid, rows, columns, row_numbers, column_numbers = result.grid()
    assert (rows, columns, row_numbers, column_numbers) == ("layer", "dimension", [1], list(range(6)))
    # The command's heatmaps: one row (layer x dimension), and past 64 dimensions, rows of 64.
    wide = SweepResult([f"L1.D{i}" for i in range(100)], torch.randn(100, 3), torch.zeros(3), "metric")
    for shown, path in ((result, tmp_path / "row.png"), (wide, tmp_path / "rows.png")):
        plot_components(shown, "dims:1", path)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_testing_strategies_draw_it(declared, gpt2):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from hooked.testing import addresses

    @settings(max_examples=20, deadline=None, database=None)
    @given(st.data())
    def check(data):
        address = data.draw(addresses(gpt2, kinds=("dims",), max_pos=7))
        assert ablate.hooks(gpt2, address)[0][0].endswith("hook_resid_post"), address

    check()


def test_declaring_refuses_what_would_be_ambiguous_and_removing_restores_the_built_in_kinds(gpt2):
    with pytest.raises(ValueError, match="reads like neurons"):
        kinds.declare(
            kinds.Kind("n", "L{layer}.N{n}", hook="mlp.hook_post", indices={"n": kinds.Index(DIMS, "d_model", "n")})
        )
    with pytest.raises(ValueError, match="an ablation's keyword"):
        kinds.declare(
            kinds.Kind(
                "p",
                "L{layer}.P{p}",
                hook="hook_resid_post",
                indices={"p": kinds.Index(kinds.Selector("seed", ("pos",), ""), "pos", "p")},
            )
        )
    with pytest.raises(ValueError, match="names \\['dim'\\], the indices \\[\\]"):
        kinds.Kind("dims", "L{layer}.D{dim}", hook="hook_resid_post")
    kinds.declare(DIMENSIONS)
    kinds.remove("dims")
    assert "dims" not in kinds.KINDS and "dims" not in kinds.SELECTORS
    with pytest.raises(ValueError, match="is not a component address"):
        parse_address(gpt2, "L1.D5")
    with pytest.raises(TypeError, match="no selector dims="):
        ablate.zero(dims=1)
    with pytest.raises(ValueError, match="unknown component kind 'dims:1'"):
        ablate.components(gpt2, "dims:1")
    with pytest.raises(ValueError, match="not a declared kind"):
        kinds.remove("heads")


def test_the_docs_example_declares_a_probe_kind():
    """docs/ablation.md's example, run as written: a kind of probe read after each block, `L3.P123`."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "ablation.md").read_text()
    section = page.split("### A new kind of component", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    try:
        exec(code, {})
        probes = kinds.KINDS["probes"]
        assert probes.hook_name(3) == "blocks.3.probe.hook_probe_acts"
        assert kinds.match("L3.P123@-1")[0] is probes and "L{layer}.P{probe}" in kinds.address_forms()
        assert repr(ablate.zero(probes=123, positions=-1)) == "zero(probes=[123], positions=[-1])"
        gpt2 = random_model("gpt2")  # no probes, no n_probes: its kind is not suggested there, and not counted
        with pytest.raises(ValueError, match="did you mean 'L1H1'"):
            parse_address(gpt2, "L1.H1")
        with pytest.raises(KeyError, match="blocks.1.probe.hook_probe_acts"):
            parse_address(gpt2, "L1.P3")
    finally:
        if "probes" in kinds.KINDS:
            kinds.remove("probes")
