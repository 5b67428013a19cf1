"""hooked.sae.train: each architecture's loss and gradients equal SAELens 6.54's training classes on the same weights
and batch; training on the bundled IOI model reduces the error; the streamed activations are the model's own;
several dictionaries from one pass equal each trained alone; checkpoints load in SAELens with the same outputs."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import hooked
import hooked.sae
import hooked.testing
from hooked.interventions import tasks
from hooked.sae import architectures, training
from hooked.sae.dictionary import DictionaryConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/sae/conftest.py

RESID = "blocks.1.hook_resid_post"
MLP_IN, MLP_OUT = "blocks.1.mlp.hook_in", "blocks.1.hook_mlp_out"
SMALL = dict(d_sae=128, batch_tokens=512, context_size=32, lr=3e-3, progress=False, dead_feature_window=20)


@pytest.fixture(scope="module")
def model(ioi_gpt2):
    return ioi_gpt2


@pytest.fixture(scope="module")
def texts():
    return tasks.ioi(300).clean


@pytest.fixture(scope="module")
def heldout(model):
    """Activations at RESID, MLP_IN and MLP_OUT of prompts the dictionaries never saw, [tokens width]."""
    tokens, valid = model.tokens_and_mask(tasks.ioi(48, seed=99).clean, None, None)
    _, cache = model.run_with_cache(tokens, attention_mask=valid, names_filter=[RESID, MLP_IN, MLP_OUT])
    return {name: cache[name][valid] for name in (RESID, MLP_IN, MLP_OUT)}


def reconstruct(d, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(features, output) of a dictionary computed from its weights in plain torch, SAELens' formulas."""
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


def fvu(y: torch.Tensor, y_hat: torch.Tensor) -> float:
    return float((y - y_hat).pow(2).sum() / (y - y.mean(0)).pow(2).sum())


# ----------------------------------------------------------------------------- the losses, against SAELens
def make_trainer(architecture: str, d_in: int = 16, d_sae: int = 64, k: int | None = None):
    spec = training.DictionarySpec(
        hook_name="h", architecture=architecture, d_sae=d_sae, k=k, hook_name_out=None, skip=False,
        l1_coefficient=0.7, l0_coefficient=0.3, aux_coefficient=0.5, lr=1e-3, dead_feature_window=10,
        resample_dead=False, seed=0,
    )  # fmt: skip
    declaration = architectures.get(architecture)  # its trainer, and the architecture its dictionary runs
    cfg = DictionaryConfig(
        d_in=d_in, d_sae=d_sae, hook_name="h", architecture=declaration.runs.name,
        apply_b_dec_to_input=True, k=k if declaration.runs.k is not None else None,
    )  # fmt: skip
    return declaration.trainer_class()(spec, cfg, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("architecture", ["standard", "topk", "batchtopk", "jumprelu"])
def test_loss_and_gradients_equal_saelens_training_classes(architecture):
    from sae_lens.saes.batchtopk_sae import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig
    from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig
    from sae_lens.saes.sae import TrainStepInput
    from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig

    d_in, d_sae = 16, 64
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(40, d_in, generator=generator) * 3 + 1
    trainer = make_trainer(architecture, d_in, d_sae, k=5 if "topk" in architecture else None)
    trainer.initialize({"h": x})
    ours_d = trainer.dictionary
    with torch.no_grad():
        ours_d.b_enc.copy_(0.3 * torch.randn(d_sae, generator=generator))
        if architecture == "jumprelu":
            ours_d.threshold.copy_(0.5 * torch.rand(d_sae, generator=generator))
    dead = torch.zeros(d_sae, dtype=torch.bool)
    dead[::13] = True  # AuxK's features: 5, fewer than d_in / 2, so its loss is scaled down
    peers = {
        "standard": (StandardTrainingSAE, StandardTrainingSAEConfig(d_in=d_in, d_sae=d_sae, l1_coefficient=0.7)),
        "topk": (TopKTrainingSAE, TopKTrainingSAEConfig(
            d_in=d_in, d_sae=d_sae, k=5, rescale_acts_by_decoder_norm=False, aux_loss_coefficient=0.5)),
        "batchtopk": (BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig(
            d_in=d_in, d_sae=d_sae, k=5, rescale_acts_by_decoder_norm=False, aux_loss_coefficient=0.5)),
        "jumprelu": (JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig(
            d_in=d_in, d_sae=d_sae, l0_coefficient=0.3, jumprelu_bandwidth=training.JUMPRELU_BANDWIDTH)),
    }  # fmt: skip
    peer_class, peer_cfg = peers[architecture]
    peer = peer_class(peer_cfg)
    peer.load_state_dict({name: p.detach().clone() for name, p in ours_d.named_parameters()}, strict=False)
    coefficients = {"standard": {"l1": 0.7}, "jumprelu": {"l0": 0.3}}.get(architecture, {})
    theirs = peer.training_forward_pass(
        TrainStepInput(sae_in=x, coefficients=coefficients, dead_neuron_mask=dead, n_training_steps=0,
                       is_logging_step=False)
    )  # fmt: skip
    ours = trainer.forward({"h": x}, dead)
    torch.testing.assert_close(ours.loss, theirs.loss)
    names = {"mse": "mse_loss", "l1": "l1_loss", "l0": "l0_loss", "auxk": "auxiliary_reconstruction_loss"}
    assert {names[key] for key in ours.parts} == set(theirs.losses)
    for key, value in ours.parts.items():
        torch.testing.assert_close(value, theirs.losses[names[key]])
    ours.loss.backward()
    theirs.loss.backward()
    peer_parameters = dict(peer.named_parameters())
    for name, parameter in ours_d.named_parameters():
        if parameter.grad is not None or name in ("W_enc", "W_dec", "b_enc", "b_dec"):
            torch.testing.assert_close(parameter.grad, peer_parameters[name].grad, rtol=1e-4, atol=1e-4, msg=name)


def test_a_step_is_adam_on_gradients_clipped_to_total_norm_one():
    """Two steps of Run against Adam on the explicit loss's gradients, scaled by hand to total norm MAX_GRAD_NORM
    (torch's clip_grad_norm_ formula, max_norm / (norm + 1e-6)); activations of norm ~50 make every gradient's norm
    far above 1, so unclipped steps differ from the second on (Adam's first step is sign-like either way)."""
    generator = torch.Generator().manual_seed(3)
    batches = [torch.randn(64, 16, generator=generator) * 12 + 4 for _ in range(2)]
    run = training.Run(make_trainer("standard").spec, make_trainer("standard"))
    reference = make_trainer("standard")  # the same seed: the same initial weights
    reference.initialize({"h": batches[0]})
    d = reference.dictionary
    parameters = [d.W_enc, d.b_enc, d.W_dec, d.b_dec]
    adam = torch.optim.Adam(parameters, lr=reference.spec.learning_rate)
    norms = []
    for x in batches:
        run.step({"h": x})
        acts, out = reconstruct(d, x)
        loss = (out - x).pow(2).sum(-1).mean() + 0.7 * (acts * d.W_dec.norm(dim=-1)).sum(-1).mean()
        adam.zero_grad()
        loss.backward()
        norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in parameters))
        norms.append(float(norm))
        with torch.no_grad():
            for p in parameters:
                p.grad *= min(1.0, training.MAX_GRAD_NORM / (float(norm) + 1e-6))
        adam.step()
    assert min(norms) > 100  # the clip acts at both steps
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        torch.testing.assert_close(getattr(run.trainer.dictionary, name), getattr(d, name), msg=name)


def test_an_saes_b_dec_starts_at_the_geometric_median():
    """The first batch's geometric median (scipy's minimiser of the summed distances, an independent solver), not
    its mean, which the few far tokens pull; a transcoder's b_dec stays at its targets' mean."""
    from scipy.optimize import minimize

    generator = torch.Generator().manual_seed(4)
    x = torch.randn(200, 16, generator=generator, dtype=torch.float64)
    x[:4] += 60  # a GPT-2 first position's outsized norm, on a few tokens
    trainer = make_trainer("topk", k=4)
    trainer.initialize({"h": x.float()})
    numpy_x = x.numpy()
    solved = minimize(
        lambda z: ((numpy_x - z) ** 2).sum(-1).__pow__(0.5).sum(), numpy_x.mean(0), method="BFGS", tol=1e-10
    ).x
    torch.testing.assert_close(trainer.dictionary.b_dec, torch.tensor(solved, dtype=torch.float32), atol=1e-3, rtol=0)
    assert float((x.mean(0).float() - trainer.dictionary.b_dec.detach()).norm()) > 0.5  # the mean is elsewhere

    spec = replace(trainer.spec, hook_name_out="o")
    cfg = DictionaryConfig(d_in=16, d_sae=64, hook_name="h", hook_name_out="o", d_out=16, architecture="topk", k=4)
    transcoder = training.TopKTrainer(spec, cfg, torch.Generator().manual_seed(0))
    transcoder.initialize({"h": x.float(), "o": 2 * x.float()})
    torch.testing.assert_close(transcoder.dictionary.b_dec, 2 * x.float().mean(0))


def test_sparse_topk_backward_equals_dense_autograd():
    """The sparse encoder backward (TopKEncode) and the embedding_bag decoder against plain dense torch."""
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(30, 12, generator=generator)
    weights = [torch.randn(shape, generator=generator) * 0.3 for shape in ((12,), (12, 48), (48,), (48, 12))]
    ours = [w.clone().requires_grad_() for w in weights]
    dense = [w.clone().requires_grad_() for w in weights]
    target = torch.randn(30, 12, generator=generator)

    b_dec, W_enc, b_enc, W_dec = ours
    acts, indices = training.TopKEncode.apply(x, b_dec, W_enc, b_enc, 6)
    out = F.embedding_bag(indices, W_dec, per_sample_weights=acts, mode="sum") + b_dec
    (out - target).pow(2).sum().backward()

    b_dec, W_enc, b_enc, W_dec = dense
    pre = (x - b_dec) @ W_enc + b_enc
    values, chosen = pre.topk(6, dim=-1)
    reference = torch.zeros_like(pre).scatter(-1, chosen, values.relu()) @ W_dec + b_dec
    (reference - target).pow(2).sum().backward()

    torch.testing.assert_close(out, reference)
    for mine, theirs in zip(ours, dense, strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad)


def test_the_decoder_constraint_leaves_no_graph():
    """TopK's gradient surgery (the component along each decoder row removed) and renormalisation run without
    autograd: a graph through W_dec.grad would chain each step to the one before and grow the memory every step."""
    trainer = make_trainer("topk", k=4)
    x = torch.randn(30, 16, generator=torch.Generator().manual_seed(3))
    trainer.initialize({"h": x})
    trainer.forward({"h": x}, None).loss.backward()
    trainer.before_update()
    W_dec = trainer.dictionary.W_dec
    assert W_dec.grad.grad_fn is None and not W_dec.grad.requires_grad
    torch.testing.assert_close((W_dec.grad * W_dec).sum(-1), torch.zeros(64), atol=1e-5, rtol=0)  # tangent
    with torch.no_grad():
        W_dec.mul_(2.0)
    trainer.after_update()
    torch.testing.assert_close(W_dec.norm(dim=-1), torch.ones(64))


# ----------------------------------------------------------------------------- training on the IOI model
OPTIONS = {
    "standard": dict(l1_coefficient=1.0),
    "topk": dict(k=8),
    "batchtopk": dict(k=8),
    "jumprelu": dict(l0_coefficient=0.1),
}
STEPS = 40


@pytest.fixture(scope="module")
def trained(model, texts):
    """architecture -> (the SAE at RESID after one step, after STEPS steps), trained once for the module."""
    runs = {}
    for architecture, options in OPTIONS.items():
        runs[architecture] = tuple(
            hooked.sae.train(model, texts, hook_name=RESID, architecture=architecture, n_tokens=n, **options, **SMALL)
            for n in (512, STEPS * 512)
        )
    return runs


@pytest.mark.parametrize(
    ("architecture", "bound"), [("standard", 0.3), ("topk", 0.4), ("batchtopk", 0.4), ("jumprelu", 0.3)]
)
def test_training_reduces_the_error(trained, heldout, architecture, bound):
    """On held-out prompts, computed from the weights in plain torch: the FVU after 40 steps is under `bound` and
    well under that after one step; the dictionary's own forward agrees."""
    x = heldout[RESID]
    start, end = trained[architecture]
    with torch.no_grad():
        before, after = fvu(x, reconstruct(start, x)[1]), fvu(x, reconstruct(end, x)[1])
        torch.testing.assert_close(end(x), reconstruct(end, x)[1], rtol=1e-4, atol=1e-4)
    assert after < bound, (before, after)
    assert after < 0.5 * before, (before, after)
    assert end.cfg.metadata["n_training_tokens"] == STEPS * 512


def test_topk_keeps_k_features_and_unit_decoder_rows(trained, heldout):
    sae = trained["topk"][1]
    with torch.no_grad():
        acts = sae.encode(heldout[RESID])
    assert ((acts > 0).sum(-1) == OPTIONS["topk"]["k"]).all()
    torch.testing.assert_close(sae.W_dec.norm(dim=-1), torch.ones(sae.cfg.d_sae))


def test_batchtopk_saves_as_jumprelu_with_one_threshold(trained, heldout):
    """SAELens saves BatchTopK as JumpReLU with the running threshold for every feature: its mean L0 on new tokens
    stays near k, and its decoder rows are at unit norm."""
    k = OPTIONS["batchtopk"]["k"]
    d = trained["batchtopk"][1]
    assert d.cfg.architecture == "jumprelu" and d.cfg.metadata["training_architecture"] == "batchtopk"
    threshold = d.threshold.detach()
    assert float(threshold.min()) == float(threshold.max()) > 0  # exact: one value, filled into every feature
    with torch.no_grad():
        l0 = float((reconstruct(d, heldout[RESID])[0] > 0).sum(-1).float().mean())
    assert k / 2 < l0 < 2 * k
    torch.testing.assert_close(d.W_dec.norm(dim=-1), torch.ones(d.cfg.d_sae))


def test_standard_and_jumprelu_decoder_rows_are_free(trained):
    """SAELens 6.54 weights the L1 by decoder norms and leaves the rows free: they start at 0.1 and move."""
    for architecture in ("standard", "jumprelu"):
        norms = trained[architecture][1].W_dec.detach().norm(dim=-1)
        assert (norms - training.DECODER_INIT_NORM).abs().max() > 0.01, architecture


def test_transcoder_with_skip_learns_the_mlp(model, texts, heldout):
    tc = hooked.sae.train(
        model, texts, hook_name=MLP_IN, hook_name_out=MLP_OUT, skip=True, architecture="jumprelu",
        l0_coefficient=0.05, n_tokens=30 * 512, **SMALL,
    )  # fmt: skip
    assert tc.cfg.is_transcoder and tc.W_skip is not None and float(tc.W_skip.abs().max()) > 0
    with torch.no_grad():
        out = reconstruct(tc, heldout[MLP_IN])[1]
    assert fvu(heldout[MLP_OUT], out) < 0.4


def test_a_dictionary_on_hook_z_reads_the_heads_flattened(model, texts):
    """attn.hook_z is [batch pos head_index d_head]: the dictionary reads it flattened (SAELens' reshape_activations
    'hook_z') and gives back its shape."""
    point = "blocks.0.attn.hook_z"
    sae = hooked.sae.train(model, texts, hook_name=point, architecture="topk", k=4, n_tokens=4 * 512, **SMALL)
    assert sae.cfg.reshape_activations == "hook_z" and sae.cfg.d_in == model.cfg.n_heads * model.cfg.d_head
    tokens = model.to_tokens(texts[:3])
    _, cache = model.run_with_cache(tokens, names_filter=point)
    with torch.no_grad():
        out = sae(cache[point])
        flat = reconstruct(sae, cache[point].flatten(-2))[1]
    assert out.shape == cache[point].shape
    torch.testing.assert_close(out.flatten(-2), flat, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- the data and the stream
def test_text_rows_are_the_tokenizer_ids_joined_and_cut(model, texts, tmp_path):
    """Texts, a .txt file, a .jsonl file and an iterable of records give the same rows: the texts' ids joined with
    BOS between them, cut into rows of context_size, each starting with BOS, as SAELens 6.54's
    concat_and_batch_sequences cuts them."""
    from sae_lens.tokenization_and_batching import concat_and_batch_sequences

    some = texts[:40]
    bos = model.tokenizer.bos_token_id
    ids = [torch.tensor(model.tokenizer.encode(text, add_special_tokens=False)) for text in some]
    expected = concat_and_batch_sequences(iter(ids), 16, begin_batch_token_id=bos, sequence_separator_token_id=bos)
    expected = [row.tolist() for row in expected]
    (tmp_path / "texts.txt").write_text("\n".join(some) + "\n")
    (tmp_path / "texts.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in some))
    for data in (some, str(tmp_path / "texts.txt"), tmp_path / "texts.jsonl", [{"text": t} for t in some]):
        rows = training.token_rows(model, data, 16, True)
        got = torch.cat(list(rows.batches(7, repeat=False)))
        assert got.tolist() == expected, data


def test_token_tensor_rows(model):
    """Token rows are integer ids: they compare exactly (torch.equal)."""
    ids = torch.randint(1, model.cfg.d_vocab, (6, 10), generator=torch.Generator().manual_seed(0))
    rows = training.token_rows(model, ids, None, True)  # rows as they are
    assert torch.equal(torch.cat(list(rows.batches(4, repeat=False))), ids)
    stream = training.token_rows(model, ids.reshape(-1), 8, True)  # a stream: 7 ids after each BOS
    got = torch.cat(list(stream.batches(4, repeat=False)))
    assert torch.equal(got[:, 0], torch.zeros(len(got), dtype=torch.long))
    assert torch.equal(got[:, 1:].reshape(-1), ids.reshape(-1)[: got.shape[0] * 7])


def test_streamed_activations_are_the_models_own(model):
    """Every token's activation comes out once, shuffled, equal to run_with_cache's, at both points of a transcoder
    still paired."""
    ids = torch.randint(1, model.cfg.d_vocab, (24, 16), generator=torch.Generator().manual_seed(3))
    ids[:, 0] = model.tokenizer.bos_token_id
    rows = training.token_rows(model, ids, None, True)
    stream = training.ActivationStream(model, rows, [MLP_IN, MLP_OUT], 64, 2, 0, torch.device("cpu"), torch.float32)
    batches = list(stream.batches(repeat=False))
    got = {name: torch.cat([b[name] for b in batches]) for name in (MLP_IN, MLP_OUT)}
    _, cache = model.run_with_cache(ids, attention_mask=torch.ones_like(ids, dtype=torch.bool),
                                    names_filter=[MLP_IN, MLP_OUT])  # fmt: skip
    want = {name: cache[name].reshape(-1, cache[name].shape[-1]) for name in (MLP_IN, MLP_OUT)}
    assert not torch.equal(got[MLP_IN], want[MLP_IN])  # shuffled
    # sort the tokens by a random projection of the input: each output row must follow its input row
    projection = torch.randn(want[MLP_IN].shape[-1], generator=torch.Generator().manual_seed(4))
    order_got, order_want = (got[MLP_IN] @ projection).argsort(), (want[MLP_IN] @ projection).argsort()
    for name in (MLP_IN, MLP_OUT):
        torch.testing.assert_close(got[name][order_got], want[name][order_want], rtol=1e-5, atol=1e-5)


def test_the_buffer_mixes_tokens_across_forwards(model):
    """SAELens' mixing buffer: a batch draws on every forward in the buffer, and the half kept back mixes with later
    forwards. Row i is token i + 1 throughout, so a streamed residual (embedding + position) says its row."""
    ids = torch.arange(1, 25)[:, None].repeat(1, 16)  # 6 forwards of 4 rows of 16
    point = "blocks.0.hook_resid_pre"
    rows = training.token_rows(model, ids, None, False)
    stream = training.ActivationStream(model, rows, [point], 64, 4, 0, torch.device("cpu"), torch.float32)
    batches = [batch[point] for batch in stream.batches(repeat=False)]
    _, cache = model.run_with_cache(ids, attention_mask=torch.ones_like(ids, dtype=torch.bool), names_filter=[point])
    every = cache[point].reshape(-1, cache[point].shape[-1])  # [row-major tokens d_model]
    distances = [torch.cdist(batch, every, compute_mode="donot_use_mm_for_euclid_dist") for batch in batches]
    assert max(float(d.min(-1).values.max()) for d in distances) < 1e-4  # each streamed row is some token's
    tokens = [d.argmin(-1) for d in distances]
    assert sorted(torch.cat(tokens).tolist()) == list(range(24 * 16))  # every token once
    forwards = [set((t // 64).tolist()) for t in tokens]  # 64 tokens a forward
    assert forwards[0] == {0, 1, 2, 3}  # the first batch draws on all 4 forwards of the full buffer
    assert forwards[2] & {0, 1, 2, 3} and forwards[2] & {4, 5}  # what was kept, mixed with the next forwards


def test_padded_rows_stream_only_real_tokens_as_each_prompt_alone(model):
    """Left-padded prompts of different lengths with their attention_mask: every real token's activation comes out
    once, equal to the prompt run alone without padding; no padding position comes out."""
    prompts = tasks.ioi(12, seed=7).clean
    tokens, mask = model.tokens_and_mask(prompts, None, None)
    assert not mask.all()  # the prompts differ in length
    rows = training.token_rows(model, tokens, None, True, mask)
    stream = training.ActivationStream(model, rows, [MLP_IN, MLP_OUT], 64, 2, 0, torch.device("cpu"), torch.float32)
    got = {name: torch.cat([b[name] for b in stream.batches(repeat=False)]) for name in (MLP_IN, MLP_OUT)}
    want = {name: [] for name in (MLP_IN, MLP_OUT)}
    for prompt in prompts:
        _, cache = model.run_with_cache(model.to_tokens(prompt), names_filter=[MLP_IN, MLP_OUT])
        for name in want:
            want[name].append(cache[name][0])
    want = {name: torch.cat(values) for name, values in want.items()}
    assert got[MLP_IN].shape == want[MLP_IN].shape == (int(mask.sum()), model.cfg.d_model)
    projection = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(4))
    order_got, order_want = (got[MLP_IN] @ projection).argsort(), (want[MLP_IN] @ projection).argsort()
    for name in (MLP_IN, MLP_OUT):
        torch.testing.assert_close(got[name][order_got], want[name][order_want], rtol=1e-4, atol=1e-4)


def test_several_dictionaries_from_one_pass_equal_each_alone(model, texts):
    settings = [
        dict(hook_name=RESID, architecture="topk", k=6),
        dict(hook_name=MLP_IN, hook_name_out=MLP_OUT, architecture="standard", l1_coefficient=0.5),
        dict(hook_name="blocks.0.hook_resid_post", architecture="jumprelu", d_sae=64, seed=5),
    ]
    common = dict(SMALL, n_tokens=6 * 512)
    together = hooked.sae.train(model, texts, dictionaries=settings, **common)
    assert isinstance(together, list) and len(together) == 3
    for d, one in zip(together, settings, strict=True):
        (alone,) = hooked.sae.train(model, texts, dictionaries=[one], **common)  # the stream seeded as together
        # exact: the same activations (the same forward on the same rows, however far it runs, shuffled by the same
        # seed), trained by the same steps; the dictionaries trained together share nothing else
        for name, parameter in alone.named_parameters():
            torch.testing.assert_close(getattr(d, name), parameter, rtol=0, atol=0, msg=name)


# ----------------------------------------------------------------------------- checkpoints, SAELens' format
@pytest.mark.parametrize(
    "options",
    [
        dict(hook_name=RESID, architecture="topk", k=6),
        dict(hook_name=RESID, architecture="standard"),
        dict(hook_name=RESID, architecture="batchtopk", k=6),
        dict(hook_name=MLP_IN, hook_name_out=MLP_OUT, architecture="jumprelu", skip=True),
        dict(hook_name=MLP_IN, hook_name_out=MLP_OUT, architecture="standard"),
    ],
    ids=["topk", "standard", "batchtopk", "jumprelu_skip_transcoder", "transcoder"],
)
def test_checkpoints_load_in_saelens_with_the_same_outputs(model, texts, heldout, tmp_path, options):
    from sae_lens import SAE

    d = hooked.sae.train(
        model, texts, n_tokens=6 * 512, checkpoint_dir=tmp_path, checkpoint_every=2 * 512, **options, **SMALL
    )
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert folders == sorted(["1024", "2048", "3072", "final_3072"])
    peer = SAE.load_from_disk(tmp_path / "final_3072")
    x = heldout[options["hook_name"]]
    with torch.no_grad():
        torch.testing.assert_close(peer.encode(x), d.encode(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(peer(x), d(x), rtol=1e-5, atol=1e-5)
    metadata = json.loads((tmp_path / "final_3072" / "cfg.json").read_text())["metadata"]
    assert metadata["hook_name"] == options["hook_name"]
    assert metadata.get("hook_name_out") == options.get("hook_name_out")
    assert metadata["context_size"] == 32 and metadata["prepend_bos"] is True
    # SAELens loads the model with from_pretrained_no_processing(**kwargs): the kwargs name the flags that are on
    assert metadata["model_from_pretrained_kwargs"] == {flag: True for flag, on in model.processing.items() if on}
    assert hooked.sae.load(tmp_path / "final_3072").cfg.processing == model.processing == d.cfg.processing


# ----------------------------------------------------------------------------- dead features
def test_resampling_points_dead_features_at_inputs_and_resets_adam():
    trainer = make_trainer("standard")
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(50, 16, generator=generator)
    trainer.initialize({"h": x})
    optimizer = torch.optim.Adam(trainer.parameters(), lr=1e-2)
    step = trainer.forward({"h": x}, None)
    step.loss.backward()
    optimizer.step()
    before = {name: p.detach().clone() for name, p in trainer.dictionary.named_parameters()}
    features = torch.tensor([3, 17])
    trainer.resample(features, {"h": x}, step.recons, optimizer)
    d = trainer.dictionary
    centred = x - d.b_dec
    inputs = centred / centred.norm(dim=-1, keepdim=True)
    for f in features.tolist():
        row = d.W_dec[f] / d.W_dec[f].norm()
        assert (inputs @ row).max() > 1 - 1e-5  # along one token's input
        assert float(d.b_enc[f]) == 0  # exact here and below: resample writes zeros
        state = optimizer.state[d.W_dec]
        assert float(state["exp_avg"][f].abs().max()) == 0 == float(state["exp_avg_sq"][f].abs().max())
    keep = torch.ones(64, dtype=torch.bool)
    keep[features] = False
    torch.testing.assert_close(d.W_dec[keep], before["W_dec"][keep], rtol=0, atol=0)  # exact: rows left as they were


def test_dead_features_are_tracked_and_resampled_every_window(model, texts, monkeypatch):
    """The dead features given to each step (AuxK's) and to `resample` (every `dead_feature_window` steps) are those
    silent for more than `dead_feature_window` steps, counted by hand from what fired at each step (TopK with k=2 and
    no AuxK lets features die)."""
    fired, dead_given, calls = [], [], []
    forward, resample = training.TopKTrainer.forward, training.TopKTrainer.resample

    def recording_forward(self, batch, dead):
        out = forward(self, batch, dead)
        fired.append(out.fired.clone())
        dead_given.append(None if dead is None else dead.clone())
        return out

    def recording_resample(self, features, batch, recons, optimizer):
        calls.append((len(fired), features.clone()))
        resample(self, features, batch, recons, optimizer)

    monkeypatch.setattr(training.TopKTrainer, "forward", recording_forward)
    monkeypatch.setattr(training.TopKTrainer, "resample", recording_resample)
    window = 4
    options = dict(SMALL, dead_feature_window=window, resample_dead=True, aux_coefficient=0.0, n_tokens=22 * 512)
    d = hooked.sae.train(model, texts, hook_name=RESID, architecture="topk", k=2, **options)
    silent = torch.zeros(d.cfg.d_sae, dtype=torch.long)
    expected = []
    for step, (mask, given) in enumerate(zip(fired, dead_given, strict=True), 1):
        dead = silent > window  # what AuxK gets: None when no feature is dead
        # exact: boolean masks, counted from the same steps' fired features
        assert (given is None and not dead.any()) or torch.equal(given, dead), step
        silent += 1
        silent[mask] = 0
        if step % window == 0 and (silent > window).any():
            expected.append((step, (silent > window).nonzero().squeeze(-1)))
            silent[silent > window] = 0
    assert len(expected) >= 2
    assert [step for step, _ in calls] == [step for step, _ in expected]
    for (_, got), (_, want) in zip(calls, expected, strict=True):
        assert got.tolist() == want.tolist()
    assert d.cfg.metadata["num_dead_features"] == int((silent > window).sum())


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(hook_name=RESID, architecture="gated", d_sae=8), ValueError, "cannot be trained"),
        (dict(hook_name=RESID, d_sae=8), ValueError, "needs k="),
        (dict(hook_name=RESID, architecture="standard", d_sae=8, k=3), ValueError, "k=3 is for topk"),
        (dict(hook_name="blocks.1.hook_resid_pots", k=2, d_sae=8), KeyError, "did you mean"),
        (dict(hook_name=MLP_OUT, hook_name_out=MLP_IN, k=2, d_sae=8), ValueError, "reads a point before"),
        (dict(hook_name=RESID, skip=True, k=2, d_sae=8), ValueError, "hook_name_out"),
        (dict(hook_name=RESID, k=2), ValueError, "d_sae="),
        (dict(hook_name=RESID, k=2, d_sae=8, context_size=65), ValueError, "only 64 positions"),
        (dict(hook_name=RESID, k=2, d_sae=8, checkpoint_every=10), ValueError, "checkpoint_dir"),
        (dict(dictionaries=[dict(hook_name=RESID, k=2, d_sae=8, batch_tokens=3)]), TypeError, "unknown setting"),
        (dict(dictionaries=[dict(hook_name=RESID, d_sae=8)]), ValueError, r"dictionaries\[0\]: a topk"),
        (
            dict(hook_name=MLP_IN, hook_name_out=MLP_OUT, k=2, d_sae=8, checkpoint_dir="x"),
            ValueError,
            "no topk transcoder",
        ),
        (dict(hook_name="blocks.1.attn.hook_pattern", k=2, d_sae=8), ValueError, "one vector per position"),
    ],
)
def test_bad_settings_are_refused_before_anything_runs(model, texts, kwargs, error, match):
    with pytest.raises(error, match=match):
        hooked.sae.train(model, texts, progress=False, **kwargs)
    assert not any(point._fwd for point in model.hook_dict.values())


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        (torch.rand(4, 8), ValueError, "integer tensor"),
        (torch.full((2, 8), 10_000), ValueError, "vocabulary"),
        ("no/such/file.txt", FileNotFoundError, "not a file"),
        ([1, 2, 3], TypeError, "holds int"),
        ({"text": "a"}, TypeError, "dict"),
        (42, TypeError, "cannot be a int"),
    ],
)
def test_bad_data_is_refused(model, data, error, match):
    with pytest.raises(error, match=match):
        hooked.sae.train(model, data, hook_name=RESID, k=2, d_sae=8, progress=False)


def test_a_bad_attention_mask_is_refused(model):
    tokens, mask = model.tokens_and_mask(tasks.ioi(4, seed=7).clean, None, None)
    kwargs = dict(hook_name=RESID, k=2, d_sae=8, progress=False)
    with pytest.raises(ValueError, match="goes with token rows"):
        hooked.sae.train(model, tasks.ioi(4, seed=7).clean, attention_mask=mask, **kwargs)
    with pytest.raises(ValueError, match="needs the token rows' shape"):
        hooked.sae.train(model, tokens, attention_mask=mask[:, 1:], **kwargs)
    mask[2] = False
    with pytest.raises(ValueError, match="row 2 has no real token"):
        hooked.sae.train(model, tokens, attention_mask=mask, **kwargs)


def test_texts_need_a_tokenizer():
    model = hooked.testing.random_model("gpt2")
    with pytest.raises(ValueError, match="tokenizer"):
        hooked.sae.train(model, ["a text"], hook_name="blocks.0.hook_resid_post", k=2, d_sae=8, progress=False)


def test_a_config_trains_as_its_keywords_and_a_keyword_beside_it_is_refused(model, texts):
    options = dict(hook_name=RESID, k=4, d_sae=16, n_tokens=1024, batch_tokens=256, context_size=32, progress=False)
    by_keywords = hooked.sae.train(model, texts, **options)
    config = hooked.sae.TrainingConfig(**options)
    by_config = hooked.sae.train(model, texts, config)
    for name, value in by_keywords.state_dict().items():  # exact: the same settings run the same steps
        torch.testing.assert_close(by_config.state_dict()[name], value, atol=0, rtol=0)
    assert not torch.equal(by_config.W_enc, by_config.W_dec.T)  # it did train (the encoder starts as W_dec.T)
    with pytest.raises(TypeError, match=r"given config= and the keyword\(s\) k=, seed= too; set them in the config"):
        hooked.sae.train(model, texts, config, k=8, seed=1)
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) \['d_sea'\]; its settings are hook_name, "):
        hooked.sae.train(model, texts, hook_name=RESID, k=4, d_sea=16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.k = 8  # a config is varied by dataclasses.replace, which leaves the first as it was
    assert dataclasses.replace(config, k=8).k == 8 and config.k == 4


def test_training_under_no_grad_trains_as_with_gradients_and_inference_mode_is_refused(model, texts):
    """A notebook that turned gradients off (torch.set_grad_enabled(False)) still trains, to the same weights."""
    options = dict(hook_name=RESID, k=4, d_sae=16, n_tokens=2048, batch_tokens=256, context_size=32, progress=False)
    with_grad = hooked.sae.train(model, texts, **options)
    with torch.no_grad():
        without = hooked.sae.train(model, texts, **options)
    for name, value in with_grad.state_dict().items():  # exact: train turns gradients on itself, the same steps run
        torch.testing.assert_close(without.state_dict()[name], value, atol=0, rtol=0)
    assert not torch.equal(with_grad.W_enc, with_grad.W_dec.T)  # it did train (the encoder starts as W_dec.T)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="outside torch.inference_mode"):
        hooked.sae.train(model, texts, **options)


def test_nan_activations_are_refused_where_they_enter_naming_the_point_and_positions():
    """A NaN in the embedding of one token id: at blocks.0.hook_resid_pre (before any attention mixes positions) the
    activation is NaN exactly where that token sits. Training there is refused, naming the point and those rows and
    positions, instead of ending with NaN weights."""
    model = hooked.testing.random_model("gpt2", seed=0, n_layers=1)
    poisoned = 7
    with torch.no_grad():
        model.W_E[poisoned] = float("nan")
    ids = torch.randint(8, model.cfg.d_vocab, (40, 12), generator=torch.Generator().manual_seed(1))
    ids[33, 5] = ids[35, 2] = poisoned
    with pytest.raises(ValueError, match=r"blocks\.0\.hook_resid_pre are NaN or infinite at 2 real positions"
                       r" \(row 33 position 5, row 35 position 2;") as error:  # fmt: skip
        hooked.sae.train(
            model, ids, hook_name="blocks.0.hook_resid_pre", architecture="topk", d_sae=32, k=4, batch_tokens=48,
            buffer_batches=2, progress=False,
        )  # fmt: skip
    assert "Nothing was trained on them" in str(error.value)
    clean = hooked.sae.train(
        model, ids[:30], hook_name="blocks.0.hook_resid_pre", architecture="topk", d_sae=32, k=4, batch_tokens=48,
        buffer_batches=2, progress=False,
    )  # fmt: skip
    assert all(bool(torch.isfinite(p).all()) for p in clean.parameters())
