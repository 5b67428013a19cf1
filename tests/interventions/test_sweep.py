"""hooked.sweep: equal to running each variant alone, with the shared prefix computed once, only the
metric's logits computed, errors that name the variant, and results that export what produced them."""

from __future__ import annotations

import json

import pytest
import torch

import hooked
from hooked import ablate


class LastTokenDiff:
    """A metric following the protocol: logit[a] - logit[b] at the last token; records what it was given."""

    name, position, needs_base = "diff", -1, False

    def __init__(self, a: int, b: int):
        self.columns = (a, b)
        self.shapes: list[tuple] = []

    def compute(self, logits, base_logits, attention_mask):
        self.shapes.append(tuple(logits.shape))
        return logits[:, -1, 0] - logits[:, -1, 1]

    def __call__(self, logits, base_logits=None, attention_mask=None):
        return logits[:, -1, self.columns[0]] - logits[:, -1, self.columns[1]]


def kl_from_base(logits, base_logits=None, attention_mask=None):
    """A plain callable (no declared reads): KL(base || run) at every position, averaged."""
    base = base_logits.float().log_softmax(-1)
    return (base.exp() * (base - logits.float().log_softmax(-1))).sum(-1).mean(-1)


def tokens_of(model, batch=3, pos=7, seed=0):
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def every_kind(model, tokens):
    _, reference = model.run_with_cache(tokens_of(model, 4, 9, seed=7))
    _, source = model.run_with_cache(tokens_of(model, *tokens.shape, seed=8))
    variants = {"clean": []}
    for address in (
        ablate.components(model, "heads") + ablate.components(model, "layers") + ["L0.N3", "L1.N7@-1", "L1H2@2"]
    ):
        variants[f"{address} zero"] = ablate.hooks(model, address, "zero")
        variants[f"{address} mean"] = ablate.hooks(model, address, "mean", reference=reference, per_position=True)
        variants[f"{address} resample"] = ablate.hooks(model, address, "resample", source=source)
        variants[f"{address} shuffle"] = ablate.hooks(model, address, "resample", seed=0)
    variants["embed"] = [("hook_embed", ablate.zero(positions=1))]
    variants["final norm"] = [("ln_final.hook_normalized", ablate.zero(positions=-1))]
    variants["two points"] = ablate.hooks(model, ["L0H1", "L1.mlp"], "zero")

    def in_place(z, hook):
        z[:, :, 0] = 0.0

    variants["in place"] = [("blocks.1.attn.hook_z", in_place)]
    return variants


@pytest.mark.parametrize("max_rows", [None, 6])
def test_sweep_equals_each_variant_alone(gpt2, max_rows):
    tokens = tokens_of(gpt2)
    variants = every_kind(gpt2, tokens)
    for metric in (LastTokenDiff(5, 9), kl_from_base):
        result = hooked.sweep(gpt2, tokens, variants, metric, max_rows=max_rows, progress=False)
        with torch.no_grad():
            base_logits = gpt2(tokens)
            assert torch.allclose(result.base, metric(base_logits, base_logits=base_logits), atol=1e-6)
            for name, pairs in variants.items():
                alone = metric(gpt2.run_with_hooks(tokens, fwd_hooks=pairs), base_logits=base_logits)
                assert torch.allclose(result[name], alone, atol=2e-6), name
    assert result["clean"].abs().max() < 1e-6  # the clean variant's KL from the base run


def test_padded_prompts_in_a_sweep_equal_each_prompt_alone(gpt2):
    prompts = ["When Mary and John went to the store, John gave a drink to", "The capital of France is"]
    tokens, mask = gpt2.tokenizer.encode(prompts, prepend_bos=True)
    assert not bool(mask.all())
    variants = {address: ablate.hooks(gpt2, address, "zero") for address in ["L0H1@-1", "L1.mlp@0", "L1H3"]}
    result = hooked.sweep(gpt2, tokens, variants, LastTokenDiff(5, 9), attention_mask=mask)
    for row, prompt in enumerate(prompts):
        alone_tokens = gpt2.to_tokens(prompt)
        for name, pairs in variants.items():
            with torch.no_grad():
                alone = LastTokenDiff(5, 9)(gpt2.run_with_hooks(alone_tokens, fwd_hooks=pairs))
            assert torch.allclose(result[name][row], alone[0], atol=2e-6), (name, row)


def test_layers_before_the_first_hook_run_once(gpt2):
    """Heads of block 1 only: block 0 sees the base run's rows and nothing else."""
    tokens = tokens_of(gpt2)
    rows_seen = {0: 0, 1: 0}
    handles = [
        gpt2.blocks[i].attn.register_forward_hook(
            lambda module, args, out, i=i: rows_seen.__setitem__(i, rows_seen[i] + out.shape[0])
        )
        for i in (0, 1)
    ]
    last_mlp = []  # the last block's MLP is position-wise: with a last-token metric, variants need one position
    handles.append(
        gpt2.blocks[1].mlp.register_forward_hook(lambda module, args, out: last_mlp.append(tuple(out.shape[:2])))
    )
    try:
        variants = {f"L1H{h}": ablate.hooks(gpt2, f"L1H{h}", "zero") for h in range(gpt2.cfg.n_heads)}
        hooked.sweep(gpt2, tokens, variants, LastTokenDiff(1, 2), max_rows=6)
    finally:
        for handle in handles:
            handle.remove()
    assert rows_seen == {0: 3, 1: 3 + 4 * 3}
    assert last_mlp == [(3, 7), (6, 1), (6, 1)]  # the base run in full, then two chunks of 2 variants


def test_the_metric_gets_only_what_it_reads(gpt2):
    metric = LastTokenDiff(5, 9)
    hooked.sweep(gpt2, tokens_of(gpt2), {"L0H0": ablate.hooks(gpt2, "L0H0")}, metric, progress=False)
    assert set(metric.shapes) == {(3, 1, 2)}  # [prompts, last position, 2 columns], never [.., d_vocab]


def test_a_failing_callback_names_the_variant_and_leaves_no_hook(gpt2):
    def broken(activation, hook):
        raise ZeroDivisionError("boom")

    variants = {"fine": ablate.hooks(gpt2, "L0H0"), "broken one": [("blocks.1.hook_mlp_out", broken)]}
    with pytest.raises(hooked.VariantError, match="'broken one', hook blocks.1.hook_mlp_out: ZeroDivisionError: boom"):
        hooked.sweep(gpt2, tokens_of(gpt2), variants, LastTokenDiff(1, 2))
    assert not any(point.listening for point in gpt2.hook_dict.values())


@pytest.mark.parametrize(
    "variants, error, message",
    [
        ({"typo": [("blocks.0.attn.hook_zz", ablate.zero())]}, KeyError, "typo.*did you mean 'blocks.0.attn.hook_z'"),
        ({"wrong axis": [("blocks.0.hook_resid_post", ablate.zero(heads=0))]}, ValueError, "wrong axis.*head_index"),
        ({"too far": [("blocks.0.attn.hook_z", ablate.zero(heads=11))]}, IndexError, "too far.*out of range"),
        ({}, ValueError, "non-empty dict"),
    ],
)
def test_bad_variants_are_refused_before_any_forward(gpt2, variants, error, message):
    calls = []
    handle = gpt2.blocks[0].register_forward_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(error, match=message):
            hooked.sweep(gpt2, tokens_of(gpt2), variants, LastTokenDiff(1, 2))
    finally:
        handle.remove()
    assert calls == []


def test_outside_hooks_are_refused(gpt2):
    with gpt2.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: None)]):
        with pytest.raises(RuntimeError, match="reset_hooks"):
            hooked.sweep(gpt2, tokens_of(gpt2), {"a": []}, LastTokenDiff(1, 2))


def test_result_table_exports_and_provenance(gpt2, tmp_path):
    variants = {f"L{layer}H{h}": ablate.hooks(gpt2, f"L{layer}H{h}") for layer in range(2) for h in range(4)}
    result = hooked.sweep(gpt2, tokens_of(gpt2), variants, LastTokenDiff(5, 9), task={"name": "random tokens"})
    table = result.table()
    assert list(table.index[:2]) == ["base", "L0H0"] and list(table.columns[:2]) == ["diff", "change"]
    assert table.loc["L1H2", "change"] == pytest.approx(result.scores["L1H2"] - result.base_score)
    assert table.loc["L1H2", "p1"] == pytest.approx(float(result["L1H2"][1]))
    result.save(tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "sweep.json").read_text())
    assert (
        saved["provenance"]["model"] == gpt2.name_or_path
        and saved["provenance"]["hooked_version"] == hooked.__version__
    )
    assert saved["provenance"]["variants"]["L1H2"] == ["blocks.1.attn.hook_z: zero(heads=[2])"]
    assert (tmp_path / "run" / "sweep.csv").read_text().splitlines()[0].startswith("variant,diff,change,p0")
    assert (tmp_path / "run" / "sweep.png").stat().st_size > 1000
    loaded = hooked.SweepResult.from_json(tmp_path / "run" / "sweep.json")
    # Exact: JSON holds each float32 as a decimal that reads back to the same number
    assert torch.equal(loaded.values, result.values) and loaded.variants == result.variants
    grid, rows, cols = result.grid()[0], result.grid()[3], result.grid()[4]
    assert (rows, cols) == ([0, 1], [0, 1, 2, 3]) and grid[1, 2] == pytest.approx(result.change["L1H2"])


def test_progress_bar_on_chunked_sweeps(gpt2, capsys):
    variants = {f"L0H{h}": ablate.hooks(gpt2, f"L0H{h}") for h in range(4)}
    hooked.sweep(gpt2, tokens_of(gpt2), variants, LastTokenDiff(1, 2), max_rows=3)
    assert "sweep" in capsys.readouterr().err
