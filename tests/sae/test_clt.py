"""Cross-layer transcoders (hooked/sae/clt.py): the arithmetic against an explicit torch computation on the weights,
the splice against an explicit `run_with_hooks`, the error term, bad input refused with nothing left attached."""

from __future__ import annotations

import pytest
import torch

from hooked.interventions import ablate
from hooked.sae import CLTConfig, CrossLayerTranscoder
from hooked.testing import random_model

N_LAYERS, D_MODEL, D_SAE = 3, 32, 24


def random_clt(
    n_layers: int = N_LAYERS, architecture: str = "jumprelu", skip: bool = False, seed: int = 0, **cfg
) -> CrossLayerTranscoder:
    """A CLT with random weights, drawn so that some features fire and others do not."""
    clt = CrossLayerTranscoder(
        CLTConfig(n_layers=n_layers, d_in=D_MODEL, d_sae=D_SAE, architecture=architecture, **cfg), skip=skip
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in clt.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(noise.abs() * 0.3 if name.endswith("threshold") else noise * 0.3)
    return clt


def explicit_outputs(clt: CrossLayerTranscoder, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [n_layers, ..., d_sae], outputs [n_layers, ..., d_out]) from the weights: every decoder laid out
    in one dense [source, d_sae, target, d_out] tensor, zero where the target comes before the source."""
    n, cfg = clt.cfg.n_layers, clt.cfg
    acts = []
    for layer, module in enumerate(clt.layers):
        pre = torch.einsum("...i,if->...f", x[layer], module.W_enc) + module.b_enc
        fires = pre > module.threshold if module.threshold is not None else pre > 0
        acts.append(torch.where(fires, pre, torch.zeros_like(pre)))
    acts = torch.stack(acts)
    dense = torch.zeros(n, cfg.d_sae, n, cfg.d_out)
    for source, module in enumerate(clt.layers):
        dense[source, :, source:] = module.W_dec
    out = torch.einsum("l...f,lfmd->m...d", acts, dense) + torch.stack([m.b_dec for m in clt.layers])[:, None, None]
    if clt.has_skip:
        out = out + torch.stack([x[m] @ clt.layers[m].W_skip for m in range(n)])
    return acts, out


@pytest.mark.parametrize("architecture", ["jumprelu", "standard"])
@pytest.mark.parametrize("skip", [False, True])
def test_encode_and_decode_equal_explicit_torch_on_the_weights(architecture, skip):
    clt = random_clt(architecture=architecture, skip=skip)
    x = torch.randn(N_LAYERS, 2, 5, D_MODEL, generator=torch.Generator().manual_seed(1))
    acts, out = explicit_outputs(clt, x)
    with torch.no_grad():
        assert 0.05 < (clt.encode(x) > 0).float().mean() < 0.95  # some features fire, some do not
        torch.testing.assert_close(clt.encode(x), acts)
        torch.testing.assert_close(clt.decode(acts, x), out)
        torch.testing.assert_close(clt(x), out)


def test_jumprelu_is_circuit_tracers_below_a_negative_threshold():
    """circuit-tracer's JumpReLU is pre * (pre > threshold): a negative pre-activation above a negative threshold
    passes (SAELens' relu(pre) * (pre > threshold) would zero it)."""
    clt = random_clt(n_layers=1)
    with torch.no_grad():
        clt.layers[0].threshold.fill_(-1.0)
        pre = torch.tensor([[-0.5] * D_SAE, [-1.5] * D_SAE])
        acts = clt.activate(0, pre)
    assert (acts[0] == -0.5).all() and (acts[1] == 0).all()  # exact: pre times 1 or 0


def test_decode_of_a_skip_clt_needs_the_inputs():
    clt = random_clt(skip=True)
    with pytest.raises(ValueError, match=r"clt.decode\(acts, x\)"):
        clt.decode(torch.zeros(N_LAYERS, 1, D_SAE))


# ----------------------------------------------------------------------------- spliced into a model
def model_and_tokens(architecture: str = "gpt2"):
    model = random_model(architecture, n_layers=N_LAYERS, d_model=D_MODEL)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(2))
    return model, tokens


def explicit_hooks(clt: CrossLayerTranscoder, acts: dict[int, torch.Tensor]) -> list:
    """Hooks that splice `clt` by hand: keep each layer's MLP input, replace each MLP output by explicit_outputs'."""
    inputs: dict[int, torch.Tensor] = {}

    def keep(activation, hook):
        inputs[hook.layer()] = activation

    def replace(activation, hook):
        layer = hook.layer()
        x = torch.stack([inputs[source] if source <= layer else inputs[0] for source in range(clt.cfg.n_layers)])
        features, out = explicit_outputs(clt, x)
        acts[layer] = features[layer]
        return out[layer]

    n = clt.cfg.n_layers
    return [(f"blocks.{layer}.mlp.hook_in", keep) for layer in range(n)] + [
        (f"blocks.{layer}.hook_mlp_out", replace) for layer in range(n)
    ]


@pytest.mark.parametrize("architecture", ["gpt2", "qwen3_moe"])
def test_splice_equals_an_explicit_run_with_hooks(architecture):
    """The spliced CLT replaces every layer's MLP output (a whole mixture-of-experts block's, on Qwen3-MoE) by
    the decoding of the features of every layer up to it, as hooks written by hand on the weights do."""
    model, tokens = model_and_tokens(architecture)
    clt = random_clt(skip=True)
    explicit_acts: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        expected = model.run_with_hooks(tokens, fwd_hooks=explicit_hooks(clt, explicit_acts))
        logits, cache = model.run_with_cache_with_saes(tokens, saes=[clt])
        plain = model(tokens)
    torch.testing.assert_close(logits, expected)
    assert (logits - plain).abs().max() > 1e-2  # the CLT changed something: the comparison is not vacuous
    for layer in range(N_LAYERS):
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_mlp_out.hook_sae_acts_post"], explicit_acts[layer])
    assert not any(name.endswith("hook_sae_error") for name in cache.keys())


def test_sparse_features_of_every_layer_equal_the_dense_cache():
    """run_with_cache_with_saes(sparse_features=True) keeps every layer's features sparse, a CLT given alone too."""
    model, tokens = model_and_tokens()
    clt = random_clt()
    with torch.no_grad():
        _, dense = model.run_with_cache_with_saes(tokens, saes=[clt])
        _, sparse = model.run_with_cache_with_saes(tokens, saes=clt, sparse_features=True)
    features = [f"blocks.{layer}.hook_mlp_out.hook_sae_acts_post" for layer in range(N_LAYERS)]
    assert set(sparse) == set(dense)
    for name in features:  # exact: the same forward on the same input, its features stored sparse (a copy)
        assert sparse[name].layout == torch.sparse_coo and torch.equal(sparse[name].to_dense(), dense[name])
        assert 0 < sparse[name]._nnz() < dense[name].numel()  # some features fire, others do not
    assert all(sparse[name].layout == torch.strided for name in set(dense) - set(features))


def test_use_error_term_leaves_the_logits_unchanged_and_the_features_live():
    model, tokens = model_and_tokens()
    clt = random_clt(skip=True)
    with torch.no_grad():
        plain, clean_cache = model.run_with_cache(tokens)
        logits, cache = model.run_with_cache_with_saes(tokens, saes=[clt], use_error_term=True)
    torch.testing.assert_close(logits, plain)
    for layer in range(N_LAYERS):  # the error is what the CLT misses at each output point
        out = cache[f"blocks.{layer}.hook_mlp_out.hook_sae_recons"]
        if clt.has_skip:
            out = out + cache[f"blocks.{layer}.hook_mlp_out.hook_sae_input"] @ clt.layers[layer].W_skip
        torch.testing.assert_close(
            cache[f"blocks.{layer}.hook_mlp_out.hook_sae_error"], clean_cache[f"blocks.{layer}.hook_mlp_out"] - out
        )

    # Editing layer 0's features moves layer 0's output by exactly their decoding, error term and all.
    acts_0 = cache["blocks.0.hook_mlp_out.hook_sae_acts_post"]
    with torch.no_grad(), model.saes([clt], use_error_term=True):
        with model.hooks(fwd_hooks=ablate.hooks(model, [f"L0.mlp_out.F{f}" for f in range(D_SAE)])):
            _, edited = model.run_with_cache(tokens, names_filter="blocks.0.hook_mlp_out")
    torch.testing.assert_close(
        edited["blocks.0.hook_mlp_out"], clean_cache["blocks.0.hook_mlp_out"] - acts_0 @ clt.decoder(0)[:, 0]
    )

    # Gradients reach every layer's features through the outputs (not through the error, taken without them).
    grads = {}

    def keep_grad(activation, hook):
        activation.retain_grad()
        grads[hook.name] = activation

    with model.saes([clt], use_error_term=True):
        names = [f"blocks.{layer}.hook_mlp_out.hook_sae_acts_post" for layer in range(N_LAYERS)]
        model.run_with_hooks(tokens, fwd_hooks=[(name, keep_grad) for name in names]).sum().backward()
    assert all(grads[name].grad is not None and grads[name].grad.abs().sum() > 0 for name in names)


def test_generation_with_a_clt_spliced_is_the_same_with_and_without_the_kv_cache():
    """Each generation step is a forward of its own (layer 0 reads first): the KV cache changes nothing."""
    model, tokens = model_and_tokens()
    clt = random_clt()
    with model.saes([clt]):
        cached = model.generate(tokens, max_new_tokens=3, use_past_kv_cache=True, do_sample=False)
        full = model.generate(tokens, max_new_tokens=3, use_past_kv_cache=False, do_sample=False)
    # Token ids: the argmax of logits equal to float32 rounding (the KV cache sums in another order); no near-tie here
    assert torch.equal(cached, full)


def test_features_are_components_addressed_under_each_layers_output():
    model, tokens = model_and_tokens()
    clt = random_clt()
    with model.saes([clt]):
        listed = ablate.components(model, "features:2")
        assert len(listed) == D_SAE and listed[5] == "L2.mlp_out.F5"
        ((name, fn),) = ablate.hooks(model, "L2.mlp_out.F5")
        assert name == "blocks.2.hook_mlp_out.hook_sae_acts_post"
        with torch.no_grad(), model.hooks(fwd_hooks=[(name, fn)]):
            _, cache = model.run_with_cache(tokens, names_filter=name)
    assert (cache[name][..., 5] == 0).all()  # exact: the zeros the hook wrote are the values read back


# ----------------------------------------------------------------------------- bad input, and nothing left behind
def assert_nothing_attached(model, clt: CrossLayerTranscoder, names_before: list[str]) -> None:
    assert list(model.hook_dict) == names_before
    assert not [name for name, point in model.hook_dict.items() if point.listening]
    for layer in range(clt.cfg.n_layers):
        assert [point.name for point in clt.sae_points(layer)] == [
            f"layers.{layer}.{point}"
            for point in (
                "hook_sae_input",
                "hook_sae_acts_pre",
                "hook_sae_acts_post",
                "hook_sae_recons",
                "hook_sae_error",
                "hook_sae_output",
            )
        ]


def test_an_error_inside_the_block_leaves_nothing_attached():
    model, tokens = model_and_tokens()
    clt = random_clt()
    names = list(model.hook_dict)
    with pytest.raises(KeyError, match="inside"), model.saes([clt]):
        model(tokens)
        raise KeyError("inside")
    assert_nothing_attached(model, clt, names)
    model.add_sae(clt)
    assert "blocks.1.hook_mlp_out.hook_sae_acts_post" in model.hook_dict
    model.reset_saes()
    assert_nothing_attached(model, clt, names)
    with torch.no_grad():
        torch.testing.assert_close(model.run_with_saes(tokens, saes=[clt], use_error_term=True), model(tokens))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: random_clt(n_layers=2), r"cross-layer transcoder has 2 layers and the model 3"),
        (lambda: random_clt(n_layers=4), r"cross-layer transcoder has 4 layers and the model 3"),
        (
            lambda: CrossLayerTranscoder(CLTConfig(n_layers=N_LAYERS, d_in=D_MODEL + 1, d_sae=D_SAE)),
            r"cfg.d_in is 33, but blocks.0.mlp.hook_in of this model is 32 wide",
        ),
        (
            lambda: CrossLayerTranscoder(CLTConfig(n_layers=N_LAYERS, d_in=D_MODEL, d_sae=D_SAE, d_out=8)),
            r"cfg.d_out is 8, but blocks.0.hook_mlp_out of this model is 32 wide",
        ),
        (lambda: random_clt().to(torch.float64), r"is torch.float64 on cpu, the model torch.float32.*sae.to\("),
        (
            lambda: random_clt(hook_name="blocks.{layer}.mlp.hook_input"),
            r"'blocks.0.mlp.hook_input' is not a hook point.*did you mean 'blocks.0.mlp.hook_in'",
        ),
        (
            lambda: random_clt(hook_name="blocks.{layer}.hook_resid_post"),
            r"layer 0 reads blocks.0.hook_resid_post, which the forward does not reach before blocks.0.hook_mlp_out",
        ),
    ],
    ids=["fewer layers", "more layers", "d_in", "d_out", "dtype", "no such point", "reads after it writes"],
)
def test_bad_input_is_refused_before_anything_is_attached(make, message):
    model, tokens = model_and_tokens()
    clt, names = make(), list(model.hook_dict)
    with pytest.raises((ValueError, KeyError), match=message):
        model.run_with_saes(tokens, saes=[clt])
    with pytest.raises((ValueError, KeyError), match=message):
        model.add_sae(clt)
    assert_nothing_attached(model, clt, names)


def test_a_clt_splices_in_one_place_at_once():
    model, tokens = model_and_tokens()
    clt = random_clt()
    with model.saes([clt]), pytest.raises(ValueError, match="already spliced"):
        model.run_with_saes(tokens, saes=[clt])


def test_a_config_names_one_point_per_layer():
    with pytest.raises(ValueError, match=r"template with \{layer\}"):
        CLTConfig(n_layers=2, d_in=4, d_sae=4, hook_name="blocks.0.mlp.hook_in")
    with pytest.raises(ValueError, match="relu, or circuit-tracer's JumpReLU"):
        CLTConfig(n_layers=2, d_in=4, d_sae=4, architecture="topk")


# ----------------------------------------------------------------------------- sweeps
def each_alone(model, tokens, variants: dict, metric) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack([metric(model.run_with_hooks(tokens, fwd_hooks=hooks)) for hooks in variants.values()])


@pytest.mark.parametrize("use_error_term", [False, True])
def test_a_sweep_over_clt_features_equals_each_variant_alone(use_error_term):
    """Variants on any layer's features join where layer 0 reads, so each sees every layer's features; a variant
    before the CLT's first read (a head of layer 0) and one with no hook share the batch."""
    import hooked
    from hooked.interventions.metrics import logit_diff

    model, tokens = model_and_tokens()
    clt = random_clt(skip=True)
    metric = logit_diff(model, [3, 5], [7, 9])
    addresses = [f"L{layer}.mlp_out.F{feature}" for layer in range(N_LAYERS) for feature in (1, 4, 9)]
    with model.saes([clt], use_error_term=use_error_term):
        variants = {address: ablate.hooks(model, address) for address in [*addresses, "L0H1"]}
        variants["steer L1.F2"] = [("blocks.1.hook_mlp_out.hook_sae_acts_post", steer_feature_2)]
        variants["nothing"] = []
        swept = hooked.sweep(model, tokens, variants, metric, max_rows=4 * tokens.shape[0])
        alone = each_alone(model, tokens, variants, metric)
    torch.testing.assert_close(swept.values, alone, atol=1e-5, rtol=1e-5)
    assert (alone[:-1] - alone[-1]).abs().amax(-1).gt(1e-4).sum() >= len(variants) // 2  # most variants matter


def steer_feature_2(activation, hook):
    activation[..., 2] = 3.0


def test_a_sweep_variant_inside_the_clts_span_joins_where_layer_0_reads():
    """A head of layer 1 alone would join the batch after layer 0's features were read; its rows start where layer
    0 reads instead (the write hooks' `reads_from`), so it gives the same numbers as the variant alone."""
    import hooked
    from hooked.interventions.metrics import logit_diff

    model, tokens = model_and_tokens()
    clt = random_clt()
    metric = logit_diff(model, [3, 5], [7, 9])
    with model.saes([clt]):
        variants = {
            "L0.mlp_out.F1": ablate.hooks(model, "L0.mlp_out.F1"),
            "L1H0": ablate.hooks(model, "L1H0"),
            "L1.mlp": ablate.hooks(model, "L1.mlp"),
        }
        swept = hooked.sweep(model, tokens, variants, metric)
        alone = each_alone(model, tokens, variants, metric)
    torch.testing.assert_close(swept.values, alone, atol=1e-5, rtol=1e-5)
    names = list(model.hook_dict)
    assert not any("sae" in name for name in names)


# ----------------------------------------------------------------------------- circuit-tracer's files
def write_circuit_tracer_clt(folder, weights: dict, config: str | None) -> None:
    """A CLT folder as circuit-tracer lays it out, written with the safetensors package (not hooked's writer)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    n_layers = len(weights["W_enc"])
    for i in range(n_layers):
        encoder = {
            f"W_enc_{i}": weights["W_enc"][i],
            f"b_enc_{i}": weights["b_enc"][i],
            f"b_dec_{i}": weights["b_dec"][i],
        }
        encoder |= {f"threshold_{i}": weights["threshold"][i]} if "threshold" in weights else {}
        save_file(encoder, folder / f"W_enc_{i}.safetensors")
        save_file({f"W_dec_{i}": weights["W_dec"][i]}, folder / f"W_dec_{i}.safetensors")
    if config is not None:
        (folder / "config.yaml").write_text(config)


def random_circuit_tracer_weights(n_layers: int = N_LAYERS, seed: int = 3) -> dict:
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=generator) * 0.3

    return {
        "W_enc": [draw(D_SAE, D_MODEL) for _ in range(n_layers)],  # F.linear's [d_transcoder, d_model]
        "b_enc": [draw(D_SAE) for _ in range(n_layers)],
        "b_dec": [draw(D_MODEL) for _ in range(n_layers)],
        "threshold": [draw(D_SAE).abs() for _ in range(n_layers)],
        "W_dec": [draw(D_SAE, n_layers - i, D_MODEL) for i in range(n_layers)],
    }


def test_a_circuit_tracer_folder_loads_and_computes_what_its_weights_say(tmp_path):
    from hooked.sae.formats.circuit_tracer_clt import load_circuit_tracer_clt

    weights = random_circuit_tracer_weights()
    config = "model_kind: cross_layer_transcoder\nfeature_input_hook: mlp.hook_in\nfeature_output_hook: mlp.hook_out\n"
    write_circuit_tracer_clt(tmp_path / "clt", weights, config)
    clt = load_circuit_tracer_clt(tmp_path / "clt")
    assert clt.cfg.hook_names()[1] == "blocks.1.mlp.hook_in" and clt.cfg.hook_names_out()[2] == "blocks.2.hook_mlp_out"
    assert clt.cfg.architecture == "jumprelu" and not clt.has_skip

    x = torch.randn(N_LAYERS, 4, D_MODEL, generator=torch.Generator().manual_seed(4))
    expected = torch.zeros(N_LAYERS, 4, D_MODEL)  # circuit-tracer's arithmetic, on its own layout
    for source in range(N_LAYERS):
        pre = torch.nn.functional.linear(x[source], weights["W_enc"][source], weights["b_enc"][source])
        acts = pre * (pre > weights["threshold"][source])
        for target in range(source, N_LAYERS):
            expected[target] += acts @ weights["W_dec"][source][:, target - source]
    expected += torch.stack(weights["b_dec"])[:, None]
    assert all(module.W_dec is None for module in clt.layers)  # decoders wait until first used
    with torch.no_grad():
        torch.testing.assert_close(clt(x), expected)
    assert all(module.W_dec is not None for module in clt.layers)


def test_lazy_decoders_are_read_in_the_dtype_the_clt_has_by_then(tmp_path):
    from hooked.sae.formats.circuit_tracer_clt import load_circuit_tracer_clt

    write_circuit_tracer_clt(tmp_path / "clt", random_circuit_tracer_weights(), None)  # no config.yaml
    clt = load_circuit_tracer_clt(tmp_path / "clt", hook_name="mlp.hook_in").to(torch.float64)
    eager = load_circuit_tracer_clt(tmp_path / "clt", dtype=torch.float64, lazy_decoder=False)
    assert clt.cfg.hook_name_out == "blocks.{layer}.hook_mlp_out"  # circuit-tracer's load_clt defaults
    assert eager.cfg.hook_name == "blocks.{layer}.hook_resid_mid" and clt.cfg.hook_name == "blocks.{layer}.mlp.hook_in"
    assert clt.layers[2].W_dec is None and eager.layers[2].W_dec.dtype == torch.float64
    assert clt.decoder(2).dtype == torch.float64
    torch.testing.assert_close(clt.decoder(0), eager.decoder(0))


def test_hooked_writes_circuit_tracers_layout_and_reads_it_back(tmp_path):
    from safetensors import safe_open

    from hooked.sae.formats.circuit_tracer_clt import load_circuit_tracer_clt, save_circuit_tracer

    clt = random_clt(skip=False)
    save_circuit_tracer(clt, tmp_path / "clt")
    import yaml

    assert yaml.safe_load((tmp_path / "clt" / "config.yaml").read_text()) == {
        "model_kind": "cross_layer_transcoder",
        "feature_input_hook": "mlp.hook_in",
        "feature_output_hook": "hook_mlp_out",
    }
    with safe_open(tmp_path / "clt" / "W_enc_1.safetensors", "pt") as file:
        assert set(file.keys()) == {"W_enc_1", "b_enc_1", "b_dec_1", "threshold_1"}
        torch.testing.assert_close(file.get_tensor("W_enc_1"), clt.layers[1].W_enc.T)
    with safe_open(tmp_path / "clt" / "W_dec_1.safetensors", "pt") as file:
        torch.testing.assert_close(file.get_tensor("W_dec_1"), clt.decoder(1))
    back = load_circuit_tracer_clt(tmp_path / "clt")
    x = torch.randn(N_LAYERS, 3, D_MODEL)
    with torch.no_grad():
        torch.testing.assert_close(back(x), clt(x))

    skip = random_clt(skip=True)
    with pytest.warns(UserWarning, match="circuit-tracer 0.5.0 does not read a CLT's skip"):
        save_circuit_tracer(skip, tmp_path / "skip")
    with torch.no_grad():
        torch.testing.assert_close(load_circuit_tracer_clt(tmp_path / "skip")(x), skip(x))


def test_a_transcoder_set_is_written_as_circuit_tracer_lays_it_out(tmp_path):
    from safetensors import safe_open

    from hooked.sae import Dictionary, DictionaryConfig
    from hooked.sae.formats.circuit_tracer_clt import save_circuit_tracer

    def transcoder(layer: int, architecture: str = "jumprelu", **cfg) -> Dictionary:
        names = {"hook_name": f"blocks.{layer}.mlp.hook_in", "hook_name_out": f"blocks.{layer}.hook_mlp_out"}
        tc = Dictionary(
            DictionaryConfig(d_in=D_MODEL, d_sae=D_SAE, architecture=architecture, **names, **cfg), skip=True
        )
        with torch.no_grad():
            for parameter in tc.parameters():
                parameter.normal_().abs_()
        return tc

    transcoders = [transcoder(layer) for layer in range(N_LAYERS)]
    save_circuit_tracer(transcoders, tmp_path / "set")
    assert "model_kind: transcoder_set" in (tmp_path / "set" / "config.yaml").read_text()
    with safe_open(tmp_path / "set" / "layer_2.safetensors", "pt") as file:
        assert set(file.keys()) == {"W_enc", "W_dec", "b_enc", "b_dec", "activation_function.threshold", "W_skip"}
        torch.testing.assert_close(file.get_tensor("W_enc"), transcoders[2].W_enc.T)
        torch.testing.assert_close(file.get_tensor("W_skip"), transcoders[2].W_skip)

    with pytest.raises(
        ValueError, match="transcoder 1 of the set.*circuit-tracer 0.5.0's transcoders are relu or JumpReLU"
    ):
        save_circuit_tracer([transcoders[0], transcoder(1, "topk", k=3)], tmp_path / "topk")
    with pytest.raises(ValueError, match="transcoder 1 of the set.*at its layer, the set's transcoder reads blocks.1"):
        save_circuit_tracer([transcoders[0], transcoders[2]], tmp_path / "order")
    with pytest.raises(FileExistsError, match="layer_2.safetensors"):
        save_circuit_tracer(transcoders[:2], tmp_path / "set")


@pytest.mark.parametrize(
    "config, error, message",
    [
        ("model_kind: transcoder_set\n", ValueError, r"model_kind: transcoder_set.*hooked.sae.load\(path\)"),
        (
            "feature_input_hook: hook_resid_middle\n",
            ValueError,
            r"'hook_resid_middle' has no equivalent.*'hook_resid_mid'",
        ),
        ("feature_output_hook: mlp.hook_post\n", ValueError, r"no equivalent hook point.*hook_name_out="),
    ],
)
def test_a_folder_hooked_cannot_read_is_refused_naming_the_fix(tmp_path, config, error, message):
    from hooked.sae.formats.circuit_tracer_clt import load_circuit_tracer_clt

    write_circuit_tracer_clt(tmp_path, random_circuit_tracer_weights(), config)
    with pytest.raises(error, match=message):
        load_circuit_tracer_clt(tmp_path)


def test_a_folder_with_missing_or_mismatched_files_is_refused(tmp_path):
    from hooked.sae.formats.circuit_tracer_clt import load_circuit_tracer_clt

    weights = random_circuit_tracer_weights()
    write_circuit_tracer_clt(tmp_path / "gap", weights, None)
    (tmp_path / "gap" / "W_enc_1.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="has no W_enc_1.safetensors"):
        load_circuit_tracer_clt(tmp_path / "gap")
    weights["W_dec"][1] = weights["W_dec"][1][:, :1].contiguous()
    write_circuit_tracer_clt(tmp_path / "short", weights, None)
    with pytest.raises(ValueError, match=r"W_dec_1 \[24, 1, 32\]; this CLT's layer 1 decodes .* \[24, 2, 32\]"):
        load_circuit_tracer_clt(tmp_path / "short")
