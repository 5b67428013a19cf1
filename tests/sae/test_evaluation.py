"""hooked.sae.evaluate: every column against an explicit computation (cross-entropy from the logits of forwards
whose hooks apply the dictionary's formula in plain torch, FVU and feature counts from the clean activations), over
left-padded prompts, in one batch or many."""

from __future__ import annotations

import math

import pytest
import torch

import hooked
import hooked.sae
from hooked.interventions import tasks
from hooked.sae.dictionary import Dictionary, DictionaryConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/sae/conftest.py

RESID = "blocks.1.hook_resid_post"
MLP_IN, MLP_OUT = "blocks.1.mlp.hook_in", "blocks.1.hook_mlp_out"


@pytest.fixture(scope="module")
def model(ioi_gpt2):
    return ioi_gpt2


@pytest.fixture(scope="module")
def prompts():
    return tasks.ioi(12, seed=4).clean  # of different lengths: left padding


def random_dictionary(cfg: DictionaryConfig, seed: int, skip: bool = False) -> Dictionary:
    d = Dictionary(cfg, skip=skip)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in d.named_parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * (0.3 if name != "threshold" else 0.5))
        if cfg.architecture == "jumprelu":
            d.threshold.abs_()
    return d.eval()


@pytest.fixture(scope="module")
def dictionaries():
    sae = random_dictionary(
        DictionaryConfig(d_in=128, d_sae=96, hook_name=RESID, architecture="topk", k=5, apply_b_dec_to_input=True), 0
    )
    transcoder = random_dictionary(
        DictionaryConfig(
            d_in=128, d_sae=80, hook_name=MLP_IN, hook_name_out=MLP_OUT, d_out=128, architecture="jumprelu"
        ),
        1,
        skip=True,
    )
    standard = random_dictionary(DictionaryConfig(d_in=128, d_sae=64, hook_name="blocks.0.hook_resid_post"), 2)
    return [sae, transcoder, standard]


def features_and_output(d: Dictionary, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SAELens' formulas on the weights, in plain torch."""
    centred = x - d.b_dec if d.cfg.apply_b_dec_to_input else x
    pre = centred @ d.W_enc + d.b_enc
    if d.cfg.architecture == "standard":
        acts = pre.relu()
    elif d.cfg.architecture == "jumprelu":
        acts = pre.relu() * (pre > d.threshold)
    else:
        values, indices = pre.topk(d.cfg.k, dim=-1)
        acts = torch.zeros_like(pre).scatter(-1, indices, values.relu())
    out = acts @ d.W_dec + d.b_dec
    return acts, out + (x @ d.W_skip.T if d.W_skip is not None else 0)


def cross_entropy(model, tokens, mask, hooks=()) -> float:
    """Mean next-token cross-entropy over the positions whose token and next token are real, from the logits."""
    logits = model.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=list(hooks))
    nll = -logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    pairs = mask[:, :-1] & mask[:, 1:]
    return float(nll[pairs].double().mean())


def explicit_row(model, d: Dictionary, tokens, mask) -> dict:
    reads, writes = d.hook_name, d.hook_name_out
    _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=[reads, writes])
    acts, out = features_and_output(d, cache[reads][mask])
    y = cache[writes][mask]
    captured = {}

    def capture(activation, hook):
        captured["x"] = activation

    def splice(activation, hook):
        return features_and_output(d, captured["x"])[1]

    hooks = [(reads, capture), (writes, splice)]
    clean = cross_entropy(model, tokens, mask)
    spliced = cross_entropy(model, tokens, mask, hooks)
    zeroed = cross_entropy(model, tokens, mask, [(writes, lambda activation, hook: torch.zeros_like(activation))])
    active = (acts > 0).sum(0)
    return {
        "l0": float((acts > 0).sum(-1).double().mean()),
        "fvu": float((y - out).double().pow(2).sum() / (y - y.mean(0)).double().pow(2).sum()),
        "ce_clean": clean,
        "ce_spliced": spliced,
        "ce_zero_ablated": zeroed,
        "loss_recovered": (zeroed - spliced) / (zeroed - clean),
        "dead_features": int((active == 0).sum()),
        "dense_features": int((active > 0.1 * len(acts)).sum()),
        "n_tokens": len(acts),
    }


def test_every_column_equals_its_explicit_computation(model, prompts, dictionaries):
    tokens, mask = model.tokens_and_mask(prompts, None, None)
    assert not bool(mask.all())  # left-padded: the padding must stay out of every figure
    with torch.no_grad():
        table = hooked.sae.evaluate(model, dictionaries, prompts)
        expected = [explicit_row(model, d, tokens, mask) for d in dictionaries]
    assert len(table) == 3
    for row, want, d in zip(table, expected, dictionaries, strict=True):
        assert row["hook_name"] == d.hook_name and row["hook_name_out"] == d.cfg.hook_name_out
        assert row["d_sae"] == d.cfg.d_sae
        for key, value in want.items():
            assert row[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    # the figures mean something: features fire, and the splice changes the loss
    assert all(0 < row["l0"] and row["ce_spliced"] != row["ce_clean"] for row in table)
    assert any(row["dead_features"] > 0 for row in table) and any(row["dense_features"] > 0 for row in table)


def test_batches_add_up_to_one_pass(model, prompts, dictionaries):
    with torch.no_grad():
        whole = hooked.sae.evaluate(model, dictionaries[:2], prompts, batch_size=64)
        pieces = hooked.sae.evaluate(model, dictionaries[:2], prompts, batch_size=5)
    for a, b in zip(whole, pieces, strict=True):
        for key, value in a.items():
            if isinstance(value, float):
                assert b[key] == pytest.approx(value, rel=1e-5), key
            else:
                assert b[key] == value, key


def test_table_forms(model, prompts, dictionaries, tmp_path):
    table = hooked.sae.evaluate(model, dictionaries[0], prompts[:4])
    assert isinstance(table, list) and set(table[0]) == set(hooked.sae.evaluation.COLUMNS)
    frame = table.to_pandas()
    assert list(frame.columns) == list(hooked.sae.evaluation.COLUMNS) and len(frame) == 1
    assert frame["l0"][0] == table[0]["l0"]
    path = table.to_csv(tmp_path / "eval.csv")
    assert path.read_text().splitlines()[0].split(",")[:2] == ["dictionary", "hook_name"]
    assert not math.isnan(table[0]["loss_recovered"])


def test_a_trained_dictionary_recovers_most_of_the_loss(model):
    """The figures the docs report, on the bundled model: a TopK SAE trained briefly recovers most of the loss."""
    sae = hooked.sae.train(
        model, tasks.ioi(300).clean, hook_name=RESID, architecture="topk", d_sae=128, k=8, n_tokens=40 * 512,
        batch_tokens=512, context_size=32, lr=3e-3, progress=False,
    )  # fmt: skip
    (row,) = hooked.sae.evaluate(model, sae, tasks.ioi(32, seed=8).clean)
    assert row["loss_recovered"] > 0.8 and row["fvu"] < 0.4 and row["l0"] == pytest.approx(8)


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ("not a dictionary", TypeError, "hooked.sae dictionar"),
        ([], TypeError, "non-empty"),
        (DictionaryConfig(d_in=128, d_sae=8, hook_name="blocks.9.hook_resid_post"), KeyError, "not a hook point"),
        (DictionaryConfig(d_in=64, d_sae=8, hook_name=RESID), ValueError, "d_in is 64"),
        (
            (DictionaryConfig(d_in=128, d_sae=16, hook_name=RESID, architecture="topk", k=4),),
            ValueError,
            r"NaN or infinite weights \(W_dec\)",
        ),
    ],
)
def test_bad_input_is_refused_before_anything_runs(model, prompts, bad, error, match):
    if isinstance(bad, DictionaryConfig):
        bad = Dictionary(bad)
    if isinstance(bad, tuple):  # a TopK SAE with a NaN in its decoder: its L0 alone would look plausible
        bad = random_dictionary(bad[0], 0)
        with torch.no_grad():
            bad.W_dec[3, 5] = float("nan")
    with pytest.raises(error, match=match):
        hooked.sae.evaluate(model, bad, prompts)
    assert not any(point._fwd for point in model.hook_dict.values())
    assert not any(".hook_sae_" in name for name in model.hook_dict)


@pytest.mark.parametrize("which", ["bundled", "random"])
def test_special_tokens_left_out_as_saelens_run_evals_leaves_them(model, which, tmp_path):
    """SAELens 6.54's own run_evals on the same weights (the bundled SAE, read by SAELens from its files) and the
    same token rows: exclude_special_tokens=True gives its default figures (BOS positions out, the SAE bypassed
    there), the default False its exclude_special_tokens=False ones; and the BOS position moves the FVU. The bundled
    SAE reconstructs BOS almost exactly (trained on it), so whether it is bypassed there shows in the random one."""
    import collections
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sae_lens import SAE
        from sae_lens.evals import EvalConfig, run_evals
        from sae_lens.training.activation_scaler import ActivationScaler

    prompts = tasks.ioi(120, seed=5).clean
    lengths = model.tokens_and_mask(prompts, None, None)[1].sum(1).tolist()
    common = collections.Counter(lengths).most_common(1)[0][0]
    rows = model.to_tokens([p for p, n in zip(prompts, lengths, strict=True) if n == common])  # no padding: SAELens
    assert rows.shape[0] > 20 and bool((rows[:, 0] == model.tokenizer.bos_token_id).all())  # has none
    if which == "bundled":
        path = hooked.sae.bundled_saes()["hooked/ioi-gpt2/saes/blocks.2.hook_resid_post"]
    else:
        cfg = DictionaryConfig(d_in=128, d_sae=96, hook_name=RESID, architecture="topk", k=5, apply_b_dec_to_input=True)
        path = hooked.sae.save(random_dictionary(cfg, 0), tmp_path / "sae")
    theirs, ours = SAE.load_from_disk(str(path)), hooked.sae.load(path)

    class Store:  # the ActivationsStore surface run_evals reads: these rows, one batch
        context_size, store_batch_size_prompts = rows.shape[1], rows.shape[0]

        def get_batch_tokens(self, n):
            return rows

        def reset_input_dataset(self):
            pass

    config = EvalConfig(
        batch_size_prompts=rows.shape[0], n_eval_reconstruction_batches=1, n_eval_sparsity_variance_batches=1,
        compute_kl=False, compute_ce_loss=True, compute_sparsity_metrics=True, compute_variance_metrics=True,
        compute_l2_norms=False, compute_featurewise_density_statistics=False,
        compute_featurewise_weight_based_metrics=False,
    )  # fmt: skip
    fvus = []
    for exclude in (True, False):
        metrics, _ = run_evals(theirs, Store(), model, ActivationScaler(), config, exclude_special_tokens=exclude)
        (row,) = hooked.sae.evaluate(model, ours, rows, exclude_special_tokens=exclude)
        ce, quality = metrics["model_performance_preservation"], metrics["reconstruction_quality"]
        expected = {
            "l0": metrics["sparsity"]["l0"],
            "fvu": 1 - quality["explained_variance"],
            "ce_clean": ce["ce_loss_without_sae"],
            "ce_spliced": ce["ce_loss_with_sae"],
            "ce_zero_ablated": ce["ce_loss_with_ablation"],
            "loss_recovered": ce["ce_loss_score"],
        }
        for key, value in expected.items():  # SAELens averages in float32, hooked in float64
            assert row[key] == pytest.approx(value, rel=2e-5, abs=1e-6), (exclude, key)
        assert row["n_tokens"] == rows.numel() - (rows.shape[0] if exclude else 0)
        fvus.append(row["fvu"])
    assert abs(fvus[0] - fvus[1]) > 1e-3 * fvus[1]  # BOS counted or not is no rounding matter
    (listed,) = hooked.sae.evaluate(model, ours, rows, exclude_special_tokens=[model.tokenizer.bos_token_id])
    assert listed["fvu"] == pytest.approx(fvus[0], rel=1e-12)
    with pytest.raises(TypeError, match="exclude_special_tokens"):  # the type check in tests, ours without
        hooked.sae.evaluate(model, ours, rows, exclude_special_tokens="bos")
