"""`hooked.sae.load` / `hooked.sae.save` against the formats' own code on random weights.

SAELens 6.54: each architecture built with SAELens' classes (random parameters), saved with `SAE.save_model`,
loaded by hooked; encode, decode, the forward and the hook_sae_* values must equal SAELens' own on random
inputs, for every normalisation mode, rescale_acts_by_decoder_norm and hook_z reshaping. Saved by hooked, SAELens'
`SAE.load_from_disk` must read it back and compute the same. eai-sparsify 1.3.3: `SparseCoder.save_to_disk`,
compared with its forward. Gemma Scope and circuit-tracer: files written by hand as the formats store them,
compared with the formulas those projects compute. Then every refusal, its message naming the field.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from safetensors.torch import save_file

import hooked
import hooked.sae

os.environ.setdefault("SPARSIFY_DISABLE_TRITON", "1")  # eai-sparsify's eager decoder on CPU tensors

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import sae_lens
    from sae_lens import (
        GatedSAE,
        GatedSAEConfig,
        JumpReLUSAE,
        JumpReLUSAEConfig,
        JumpReLUSkipTranscoder,
        JumpReLUSkipTranscoderConfig,
        JumpReLUTranscoder,
        JumpReLUTranscoderConfig,
        SkipTranscoder,
        SkipTranscoderConfig,
        StandardSAE,
        StandardSAEConfig,
        TopKSAE,
        TopKSAEConfig,
        Transcoder,
        TranscoderConfig,
    )
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.training.activation_scaler import ActivationScaler, ActivationWhitening

D_IN, D_SAE, D_OUT = 16, 32, 12
SAE_HOOK = "blocks.0.hook_resid_post"

# name -> (SAELens class, its config class, config fields, the metadata's hook names)
ARCHITECTURES = {
    "standard": (StandardSAE, StandardSAEConfig, {}),
    "standard_no_b_dec_in": (StandardSAE, StandardSAEConfig, {"apply_b_dec_to_input": False}),
    "gated": (GatedSAE, GatedSAEConfig, {}),
    "topk": (TopKSAE, TopKSAEConfig, {"k": 5}),
    "topk_rescaled": (TopKSAE, TopKSAEConfig, {"k": 5, "rescale_acts_by_decoder_norm": True}),
    "jumprelu": (JumpReLUSAE, JumpReLUSAEConfig, {}),
    "transcoder": (Transcoder, TranscoderConfig, {"d_out": D_OUT}),
    "skip_transcoder": (SkipTranscoder, SkipTranscoderConfig, {"d_out": D_OUT}),
    "jumprelu_transcoder": (JumpReLUTranscoder, JumpReLUTranscoderConfig, {"d_out": D_OUT}),
    "jumprelu_skip_transcoder": (JumpReLUSkipTranscoder, JumpReLUSkipTranscoderConfig, {"d_out": D_OUT}),
}


def randomize(module: torch.nn.Module, seed: int = 0) -> None:
    """Random parameters: thresholds positive and small, so some features pass them and some do not."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            values = torch.randn(parameter.shape, generator=generator) * 0.3
            parameter.copy_(values.abs() if "threshold" in name else values)


def saelens_sae(architecture: str, seed: int = 0, **fields):
    cls, cfg_cls, defaults = ARCHITECTURES[architecture]
    transcoder = "transcoder" in architecture
    hooks = {"hook_name": "blocks.0.mlp.hook_in", "hook_name_out": "blocks.0.hook_mlp_out"} if transcoder else {}
    metadata = SAEMetadata(**({"hook_name": SAE_HOOK} | hooks | fields.pop("metadata", {})))
    cfg_fields = defaults | ({"apply_b_dec_to_input": False} if transcoder else {}) | fields
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SAELens' note on model_from_pretrained_kwargs
        sae = cls(cfg_cls(d_in=D_IN, d_sae=D_SAE, metadata=metadata, **cfg_fields))
    randomize(sae, seed)
    return sae.eval()


def inputs(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def saved(sae, directory: Path) -> Path:
    sae.save_model(directory)
    return directory


def saelens_load(directory: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sae_lens.SAE.load_from_disk(directory)


def assert_same(ours: hooked.sae.Dictionary, reference, x: torch.Tensor) -> None:
    """encode, decode, forward and the hook_sae_* values of `ours` equal those of SAELens' `reference`."""
    features = reference.encode(x)
    torch.testing.assert_close(ours.encode(x), features)
    norm = ours.normalize(ours.flatten_input(x))[1] if ours.cfg.normalize_activations != "none" else None
    expected_decode = reference.decode(features)
    if ours.cfg.reshape_activations == "hook_z":
        expected_decode = expected_decode.flatten(-2)
    torch.testing.assert_close(ours.decode(features, norm=norm), expected_decode)
    torch.testing.assert_close(ours(x), reference(x))
    names = ["hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons"]
    _, ours_cache = ours.run_with_cache(x, names_filter=names)
    _, reference_cache = reference.run_with_cache(x, names_filter=names)
    for name in names:
        torch.testing.assert_close(ours_cache[name], reference_cache[name], msg=name)


# ----------------------------------------------------------------------------- SAELens
@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_saelens_directory_loads_with_saelens_outputs(architecture, tmp_path):
    sae = saelens_sae(architecture)
    dictionary = hooked.sae.load(saved(sae, tmp_path))
    transcoder = "transcoder" in architecture
    assert dictionary.hook_name == ("blocks.0.mlp.hook_in" if transcoder else SAE_HOOK)
    assert dictionary.hook_name_out == ("blocks.0.hook_mlp_out" if transcoder else SAE_HOOK)
    assert (dictionary.cfg.d_in, dictionary.cfg.d_sae, dictionary.cfg.d_out) == (
        D_IN,
        D_SAE,
        D_OUT if transcoder else D_IN,
    )
    assert (dictionary.W_skip is not None) == ("skip" in architecture)
    x = inputs(3, 5, D_IN)
    assert_same(dictionary, sae, x)
    assert dictionary.encode(x).count_nonzero() > 0


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_saved_by_hooked_loads_in_saelens_with_the_same_outputs(architecture, tmp_path):
    dictionary = hooked.sae.load(saved(saelens_sae(architecture, seed=3), tmp_path / "in"))
    hooked.sae.save(dictionary, tmp_path / "out")
    reloaded = saelens_load(tmp_path / "out")
    assert type(reloaded).__name__ == type(saelens_sae(architecture)).__name__
    assert reloaded.cfg.metadata.hook_name == dictionary.hook_name
    assert_same(dictionary, reloaded, inputs(2, 4, D_IN, seed=5))
    again = hooked.sae.load(tmp_path / "out")  # and round trip through hooked itself
    for name, parameter in dictionary.named_parameters():  # exact: a copy, the tensors written and read back
        torch.testing.assert_close(getattr(again, name), parameter, rtol=0, atol=0)


@pytest.mark.parametrize("normalize", ["constant_norm_rescale", "layer_norm"])
def test_run_time_normalisation_matches_saelens(normalize, tmp_path):
    sae = saelens_sae("standard", normalize_activations=normalize)
    dictionary = hooked.sae.load(saved(sae, tmp_path))
    assert dictionary.cfg.normalize_activations == normalize
    assert_same(dictionary, sae, inputs(3, 5, D_IN) * 4)
    hooked.sae.save(dictionary, tmp_path / "out")
    assert_same(dictionary, saelens_load(tmp_path / "out"), inputs(3, 5, D_IN) * 4)


@pytest.mark.parametrize("architecture", ["standard", "gated", "topk_rescaled", "jumprelu"])
def test_expected_average_only_in_folds_the_checkpoints_factor(architecture, tmp_path):
    """A checkpoint trained on inputs times `factor` (activation_scaler.json beside it): the loaded dictionary
    reads unscaled inputs. References: SAELens' own fold, and the meaning itself, sae(factor x) / factor."""
    factor = 2.5
    sae = saelens_sae(architecture, normalize_activations="expected_average_only_in")
    saved(sae, tmp_path)
    ActivationScaler(scaling_factor=factor).save(str(tmp_path / "activation_scaler.json"))
    dictionary = hooked.sae.load(tmp_path)
    assert dictionary.cfg.normalize_activations == "none"
    x = inputs(3, 5, D_IN)
    torch.testing.assert_close(dictionary(x), sae(x * factor) / factor)
    sae.fold_activation_norm_scaling_factor(factor)
    assert_same(dictionary, sae, x)
    given = hooked.sae.load(tmp_path / "cfg.json", norm_scaling_factor=factor)  # the factor given instead
    torch.testing.assert_close(given(x), dictionary(x))


@pytest.mark.parametrize("architecture", ["standard", "gated", "topk_rescaled"])
def test_covariance_whitening_is_folded_as_saelens_folds_it(architecture, tmp_path):
    fields = {"apply_b_dec_to_input": False} if architecture == "gated" else {}
    sae = saelens_sae(architecture, normalize_activations="covariance_whitening", **fields)
    saved(sae, tmp_path)
    generator = torch.Generator().manual_seed(7)
    matrix = torch.randn(D_IN, D_IN, generator=generator, dtype=torch.float64) / 4 + torch.eye(
        D_IN, dtype=torch.float64
    )
    mean = torch.randn(D_IN, generator=generator, dtype=torch.float64)
    whitening = ActivationWhitening(mean=mean, matrix=matrix, inverse_matrix=torch.linalg.inv(matrix))
    ActivationScaler(whitening=whitening).save(str(tmp_path / "activation_scaler.json"))
    dictionary = hooked.sae.load(tmp_path)
    x = inputs(3, 5, D_IN)
    whitened = ((x.double() - mean) @ matrix).float()
    unwhitened = (sae(whitened).double() @ whitening.inverse_matrix + mean).float()
    torch.testing.assert_close(dictionary(x), unwhitened, atol=1e-4, rtol=1e-4)
    sae.fold_activation_whitening(mean, matrix, whitening.inverse_matrix)
    assert_same(dictionary, sae, x)


def test_hook_z_dictionary_reshapes_as_saelens(tmp_path):
    sae = saelens_sae("standard", reshape_activations="hook_z", metadata={"hook_name": "blocks.1.attn.hook_z"})
    dictionary = hooked.sae.load(saved(sae, tmp_path))
    assert dictionary.cfg.reshape_activations == "hook_z"
    x = inputs(2, 3, 4, D_IN // 4)  # [batch pos head_index d_head]
    assert dictionary(x).shape == x.shape
    assert_same(dictionary, sae, x)


@pytest.mark.parametrize(
    ("architecture", "factor"), [("batchtopk", None), ("matryoshka_batchtopk", None), ("batchtopk", 3.0)]
)
def test_batchtopk_checkpoint_loads_as_the_jumprelu_saelens_saves_for_inference(architecture, factor, tmp_path):
    """SAELens saves a trained BatchTopK SAE for inference as JumpReLU (threshold = the running topk_threshold,
    decoder norms folded, after folding the input scale: SAETrainer.fit); its training checkpoint (save_model)
    keeps the BatchTopK form, which hooked reads the same way. Reference: SAELens' own save_inference_model,
    loaded by SAELens."""
    from sae_lens.saes.batchtopk_sae import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig
    from sae_lens.saes.matryoshka_batchtopk_sae import (
        MatryoshkaBatchTopKTrainingSAE,
        MatryoshkaBatchTopKTrainingSAEConfig,
    )

    cls, cfg_cls, extra = (
        (BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig, {})
        if architecture == "batchtopk"
        else (MatryoshkaBatchTopKTrainingSAE, MatryoshkaBatchTopKTrainingSAEConfig, {"matryoshka_widths": [8, D_SAE]})
    )
    normalize = "expected_average_only_in" if factor else "none"
    cfg = cfg_cls(
        d_in=D_IN,
        d_sae=D_SAE,
        k=4.0,
        metadata=SAEMetadata(hook_name=SAE_HOOK),
        normalize_activations=normalize,
        **extra,
    )
    sae = cls(cfg)
    randomize(sae)
    sae.topk_threshold = torch.tensor(0.4, dtype=torch.float64)
    sae.save_model(tmp_path / "checkpoint")
    if factor:
        ActivationScaler(scaling_factor=factor).save(str(tmp_path / "checkpoint" / "activation_scaler.json"))
        sae.fold_activation_norm_scaling_factor(factor)
    sae.save_inference_model(tmp_path / "inference")
    reference = saelens_load(tmp_path / "inference")
    assert type(reference).__name__ == "JumpReLUSAE"
    dictionary = hooked.sae.load(tmp_path / "checkpoint")
    assert dictionary.cfg.architecture == "jumprelu"
    x = inputs(3, 5, D_IN)
    assert_same(dictionary, reference, x)
    assert 0 < dictionary.encode(x).count_nonzero() < x.shape[0] * x.shape[1] * D_SAE
    torch.testing.assert_close(hooked.sae.from_saelens(sae)(x), reference(x))  # the training SAE in memory


def test_from_saelens_copies_an_sae_in_memory():
    sae = saelens_sae("gated")
    dictionary = hooked.sae.from_saelens(sae)
    assert_same(dictionary, sae, inputs(3, 5, D_IN))
    assert not dictionary.use_error_term
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SAELens deprecates setting it on the SAE
        sae.use_error_term = True
    assert hooked.sae.from_saelens(sae).use_error_term
    with torch.no_grad():
        dictionary.W_dec.zero_()
    assert sae.W_dec.abs().sum() > 0  # a copy, not a view of SAELens' tensors


def test_processing_comes_from_model_from_pretrained_kwargs(tmp_path):
    """SAELens trains on from_pretrained_no_processing(**model_from_pretrained_kwargs): every flag off unless the
    kwargs turn it on; no kwargs recorded, no knowledge. Saving writes the flags back the same way."""
    flags = hooked.processing.FLAGS
    kwargs = {"fold_ln": True, "center_writing_weights": True, "n_devices": 1}
    processed = hooked.sae.load(
        saved(saelens_sae("standard", metadata={"model_from_pretrained_kwargs": kwargs}), tmp_path / "a")
    )
    assert processed.cfg.processing == {flag: flag in ("fold_ln", "center_writing_weights") for flag in flags}
    plain = hooked.sae.load(
        saved(saelens_sae("standard", metadata={"model_from_pretrained_kwargs": {}}), tmp_path / "b")
    )
    assert plain.cfg.processing == dict.fromkeys(flags, False)
    assert hooked.sae.load(saved(saelens_sae("standard"), tmp_path / "c")).cfg.processing is None
    hooked.sae.save(processed, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "cfg.json").read_text())["metadata"]["model_from_pretrained_kwargs"]
    assert written == kwargs
    assert hooked.sae.load(tmp_path / "out").cfg.processing == processed.cfg.processing


def test_pre_6_config_is_read_as_saelens_reads_it(tmp_path):
    """A SAELens 5 config (flat keys, hook_point, a topk activation_fn): SAELens' load_from_disk upgrades it;
    hooked must read the same SAE."""
    sae = saelens_sae("topk")
    saved(sae, tmp_path)
    old = {
        "d_in": D_IN,
        "d_sae": D_SAE,
        "dtype": "float32",
        "device": "cpu",
        "hook_point": "blocks.0.hook_resid_post",
        "activation_fn_str": "topk",
        "activation_fn_kwargs": {"k": 5},
        "normalize_activations": False,
        "model_name": "gpt2",
        "sae_lens_version": "5.3.0",
    }
    (tmp_path / "cfg.json").write_text(json.dumps(old))
    reference = saelens_load(tmp_path)
    dictionary = hooked.sae.load(tmp_path)
    assert (dictionary.cfg.architecture, dictionary.cfg.k, dictionary.hook_name) == ("topk", 5, SAE_HOOK)
    assert dictionary.cfg.apply_b_dec_to_input  # SAELens' default before 6
    assert_same(dictionary, reference, inputs(3, 5, D_IN))


def test_dtype_and_device_arguments(tmp_path):
    saved(saelens_sae("jumprelu"), tmp_path)
    dictionary = hooked.sae.load(tmp_path, dtype=torch.bfloat16)
    assert dictionary.dtype == torch.bfloat16 and dictionary.cfg.dtype == "bfloat16"
    reference = hooked.sae.load(tmp_path)
    # exact: the same float32 values in the file, rounded to bfloat16 by the same cast
    torch.testing.assert_close(dictionary.W_enc, reference.W_enc.to(torch.bfloat16), rtol=0, atol=0)


def test_model_checks_names_and_gives_its_dtype(gpt2, tmp_path):
    sae = saelens_sae("standard", metadata={"hook_name": "blocks.1.hook_resid_post"})
    d_model = gpt2.cfg.d_model
    cls, cfg_cls, _ = ARCHITECTURES["standard"]
    fitted = cls(cfg_cls(d_in=d_model, d_sae=8, metadata=SAEMetadata(hook_name="blocks.1.hook_resid_post")))
    saved(fitted, tmp_path / "fits")
    dictionary = hooked.sae.load(tmp_path / "fits", model=gpt2)
    assert dictionary.dtype == gpt2.dtype and dictionary.hook_name == "blocks.1.hook_resid_post"
    saved(sae, tmp_path / "narrow")
    with pytest.raises(ValueError, match=r"d_in is 16, but blocks\.1\.hook_resid_post .* is 64 wide"):
        hooked.sae.load(tmp_path / "narrow", model=gpt2)
    with pytest.raises(
        ValueError, match=r"'blocks\.1\.hook_resid_postt' is not a hook point.*nearest.*hook_resid_post"
    ):
        hooked.sae.load(tmp_path / "fits", hook_name="blocks.1.hook_resid_postt", model=gpt2)
    assert hooked.sae.load(tmp_path / "fits", hook_name="blocks.1.hook_resid_postt").hook_name.endswith("postt")


def test_proxy_model_module_names_are_translated(tmp_path):
    """SAELens' HookedProxyLM (model_class_name AutoModelForCausalLM) names Hugging Face modules and never
    processes weights."""
    metadata = {"hook_name": "model.layers.1", "model_class_name": "AutoModelForCausalLM"}
    dictionary = hooked.sae.load(saved(saelens_sae("standard", metadata=metadata), tmp_path))
    assert dictionary.hook_name == "blocks.1.hook_resid_post"
    assert dictionary.cfg.processing == dict.fromkeys(hooked.processing.FLAGS, False)


def test_circuit_tracer_mlp_hook_out_is_the_mlp_modules_output():
    """circuit-tracer's mlp.hook_out is the MLP module's output: before the post-MLP norm where there is one."""
    from hooked.sae.formats.names import to_hooked, to_transformer_lens
    from hooked.testing import random_model

    gemma, gpt2 = random_model("gemma2"), random_model("gpt2")
    assert to_hooked("blocks.0.mlp.hook_out", gemma) == "blocks.0.hook_mlp_out_pre_norm"
    assert to_hooked("blocks.0.mlp.hook_out", gpt2) == "blocks.0.hook_mlp_out"
    assert to_transformer_lens("blocks.0.hook_mlp_out_pre_norm") == "blocks.0.mlp.hook_out"
    assert to_hooked("unembed.hook_in", gpt2) == "ln_final.hook_normalized"
    assert to_hooked("blocks.0.attn.hook_z") == "blocks.0.attn.hook_z"


# ----------------------------------------------------------------------------- eai-sparsify
def sparsify_coder(directory: Path, transcode: bool = False, skip: bool = False, seed: int = 0):
    from sparsify import SparseCoder, SparseCoderConfig

    coder = SparseCoder(D_IN, SparseCoderConfig(num_latents=D_SAE, k=5, transcode=transcode, skip_connection=skip))
    randomize(coder, seed)
    coder.save_to_disk(directory)
    return coder


@pytest.mark.parametrize(
    ("module", "transcode", "skip", "points"),
    [
        ("layers.1", False, False, ("blocks.1.hook_resid_post", "blocks.1.hook_resid_post")),
        ("layers.1.mlp", False, False, ("blocks.1.hook_mlp_out", "blocks.1.hook_mlp_out")),
        ("layers.1.mlp", True, True, ("blocks.1.mlp.hook_in", "blocks.1.hook_mlp_out")),
        ("layers.1", True, False, ("blocks.1.hook_resid_pre", "blocks.1.hook_resid_post")),
    ],
)
def test_sparsify_coder_matches_its_forward(module, transcode, skip, points, tmp_path):
    coder = sparsify_coder(tmp_path / module, transcode, skip)
    dictionary = hooked.sae.load(tmp_path / module)
    assert (dictionary.hook_name, dictionary.hook_name_out) == points
    assert (dictionary.cfg.architecture, dictionary.cfg.k) == ("topk", 5)
    x = inputs(20, D_IN)
    output = coder(x)
    torch.testing.assert_close(dictionary(x), output.sae_out)
    dense = torch.zeros(20, D_SAE).scatter(-1, output.latent_indices, output.latent_acts)
    torch.testing.assert_close(dictionary.encode(x), dense)
    if skip:
        assert dictionary.skip(x).abs().sum() > 0


def test_sparsify_hook_names_can_be_given(tmp_path):
    sparsify_coder(tmp_path / "custom_name", transcode=True)
    with pytest.raises(ValueError, match=r"'custom_name' is not a module .* hook_name="):
        hooked.sae.load(tmp_path / "custom_name")
    dictionary = hooked.sae.load(
        tmp_path / "custom_name", hook_name="blocks.0.mlp.hook_in", hook_name_out="blocks.0.hook_mlp_out"
    )
    assert dictionary.cfg.is_transcoder


# ----------------------------------------------------------------------------- Gemma Scope
def gemma_scope_params(seed: int = 0, d_out: int = D_IN, skip: bool = False) -> dict[str, np.ndarray]:
    generator = np.random.default_rng(seed)
    params = {
        "W_enc": generator.normal(size=(D_IN, D_SAE)),
        "W_dec": generator.normal(size=(D_SAE, d_out)),
        "b_enc": generator.normal(size=D_SAE) * 0.1,
        "b_dec": generator.normal(size=d_out),
        "threshold": np.abs(generator.normal(size=D_SAE)),
    }
    if skip:
        params["affine_skip_connection"] = generator.normal(size=(D_IN, d_out)) * 0.1
    return {key: value.astype(np.float32) for key, value in params.items()}


def gemma_scope_formula(params: dict[str, np.ndarray], x: torch.Tensor) -> torch.Tensor:
    """Gemma Scope's JumpReLU: relu(pre) where pre > threshold, pre = x W_enc + b_enc; then decode (+ skip)."""
    p = {key: torch.from_numpy(value) for key, value in params.items()}
    pre = x @ p["W_enc"] + p["b_enc"]
    output = (pre * (pre > p["threshold"])) @ p["W_dec"] + p["b_dec"]
    return output + x @ p["affine_skip_connection"] if "affine_skip_connection" in p else output


def test_gemma_scope_npz_matches_the_formula(tmp_path):
    params = gemma_scope_params()
    folder = tmp_path / "gemma-scope-2b-pt-res" / "layer_1" / "width_16k" / "average_l0_5"
    folder.mkdir(parents=True)
    np.savez(folder / "params.npz", **params)
    dictionary = hooked.sae.load(folder / "params.npz")  # the path names the layer and the kind: inferred
    assert dictionary.hook_name == "blocks.1.hook_resid_post"
    assert (dictionary.cfg.architecture, dictionary.cfg.apply_b_dec_to_input, dictionary.dtype) == (
        "jumprelu",
        False,
        torch.float32,
    )
    x = inputs(3, 5, D_IN)
    torch.testing.assert_close(dictionary(x), gemma_scope_formula(params, x))
    np.savez(tmp_path / "params.npz", **params)
    given = hooked.sae.load(tmp_path / "params.npz", hook_name="blocks.0.hook_mlp_out")
    torch.testing.assert_close(given(x), gemma_scope_formula(params, x))


def test_gemma_scope_2_affine_transcoder_matches_the_formula(tmp_path):
    params = gemma_scope_params(seed=2, d_out=D_OUT, skip=True)
    folder = tmp_path / "transcoder_all" / "layer_1_width_16k_l0_small_affine"
    folder.mkdir(parents=True)
    stored = {key.replace("W_", "w_"): torch.from_numpy(value) for key, value in params.items()}
    save_file(stored, folder / "params.safetensors")
    dictionary = hooked.sae.load(folder)
    assert (dictionary.hook_name, dictionary.hook_name_out) == ("blocks.1.mlp.hook_in", "blocks.1.hook_mlp_out")
    assert dictionary.W_skip is not None and dictionary.cfg.d_out == D_OUT
    x = inputs(3, 5, D_IN)
    torch.testing.assert_close(dictionary(x), gemma_scope_formula(params, x))


def test_gemma_scope_2_config_json_names_the_point(tmp_path):
    params = gemma_scope_params(seed=4)
    save_file({k.replace("W_", "w_"): torch.from_numpy(v) for k, v in params.items()}, tmp_path / "params.safetensors")
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"architecture": "jump_relu", "hf_hook_point_in": "model.layers.1.post_feedforward_layernorm.output"}
        )
    )
    assert hooked.sae.load(tmp_path / "params.safetensors").hook_name == "blocks.1.hook_mlp_out"


def test_gemma_scope_without_a_hook_name_is_refused(tmp_path):
    np.savez(tmp_path / "params.npz", **gemma_scope_params())
    with pytest.raises(ValueError, match=r"hook_name='blocks\.12\.hook_resid_post'"):
        hooked.sae.load(tmp_path / "params.npz")
    ambiguous = tmp_path / "gemma-scope-2b-pt-res" / "layer_1" / "layer_2"
    ambiguous.mkdir(parents=True)
    np.savez(ambiguous / "params.npz", **gemma_scope_params())
    with pytest.raises(ValueError, match="hook_name="):
        hooked.sae.load(ambiguous / "params.npz")


# ----------------------------------------------------------------------------- circuit-tracer
def circuit_tracer_set(directory: Path, n_layers: int = 2, skip: bool = True, activation: str | None = None):
    """A transcoder set as circuit-tracer's TranscoderSet.to_safetensors writes it (W_enc in F.linear's layout,
    the threshold under activation_function.threshold), its config.yaml as save_transcoders_to_cache writes it."""
    directory.mkdir(parents=True)
    layers = []
    for layer in range(n_layers):
        generator = torch.Generator().manual_seed(layer)
        tensors = {
            "W_enc": torch.randn(D_SAE, D_IN, generator=generator) * 0.3,
            "W_dec": torch.randn(D_SAE, D_IN, generator=generator) * 0.3,
            "b_enc": torch.randn(D_SAE, generator=generator) * 0.1,
            "b_dec": torch.randn(D_IN, generator=generator),
        }
        if activation is None:
            tensors["activation_function.threshold"] = torch.rand(D_SAE, generator=generator) * 0.3
        if skip:
            tensors["W_skip"] = torch.randn(D_IN, D_IN, generator=generator) * 0.1
        save_file(tensors, directory / f"layer_{layer}.safetensors")
        layers.append(tensors)
    config = {
        "model_kind": "transcoder_set",
        "feature_input_hook": "mlp.hook_in",
        "feature_output_hook": "hook_mlp_out",
    }
    config |= {"scan": "test", "model_name": "tiny"} | ({"activation": activation} if activation else {})
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    return layers


def circuit_tracer_formula(tensors: dict[str, torch.Tensor], x: torch.Tensor, activation: str | None) -> torch.Tensor:
    """SingleLayerTranscoder.forward: activation(F.linear(x, W_enc, b_enc)) @ W_dec + b_dec + x @ W_skip.T."""
    pre = F.linear(x, tensors["W_enc"], tensors["b_enc"])
    threshold = tensors.get("activation_function.threshold")
    acts = pre * (pre > threshold) if activation is None else F.relu(pre)
    output = acts @ tensors["W_dec"] + tensors["b_dec"]
    return output + x @ tensors["W_skip"].T if "W_skip" in tensors else output


@pytest.mark.parametrize("activation", [None, "relu"])
def test_circuit_tracer_set_matches_the_formula(activation, tmp_path):
    layers = circuit_tracer_set(tmp_path / "set", activation=activation)
    transcoders = hooked.sae.load(tmp_path / "set")
    assert isinstance(transcoders, list) and len(transcoders) == 2
    for layer, (transcoder, tensors) in enumerate(zip(transcoders, layers, strict=True)):
        assert (transcoder.hook_name, transcoder.hook_name_out) == (
            f"blocks.{layer}.mlp.hook_in",
            f"blocks.{layer}.hook_mlp_out",
        )
        assert transcoder.cfg.architecture == ("jumprelu" if activation is None else "standard")
        x = inputs(3, 5, D_IN, seed=layer)
        torch.testing.assert_close(transcoder(x), circuit_tracer_formula(tensors, x, activation))


def test_circuit_tracer_save_round_trips(tmp_path):
    layers = circuit_tracer_set(tmp_path / "set")
    transcoders = hooked.sae.load(tmp_path / "set")
    hooked.sae.save(transcoders, tmp_path / "out", format="circuit-tracer")
    config = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())
    assert (config["model_kind"], config["feature_input_hook"], config["feature_output_hook"]) == (
        "transcoder_set",
        "mlp.hook_in",
        "hook_mlp_out",
    )
    from safetensors.torch import load_file

    for layer, tensors in enumerate(layers):  # the same file circuit-tracer wrote, key for key
        written = load_file(tmp_path / "out" / f"layer_{layer}.safetensors")
        assert set(written) == set(tensors)
        for key, value in tensors.items():  # exact: a copy of what was loaded, in the file's layout
            torch.testing.assert_close(written[key], value, rtol=0, atol=0)


CIRCUIT_TRACER_SCRIPT = """
import sys, torch, yaml
sys.path.insert(0, sys.argv[1])
from circuit_tracer.transcoder.activation_functions import JumpReLU
from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet, load_transcoder_set
ours, theirs, x = sys.argv[2], sys.argv[3], torch.load(sys.argv[4])
cpu = torch.device("cpu")
hooks = {"feature_input_hook": "mlp.hook_in", "feature_output_hook": "hook_mlp_out"}
files = {i: f"{ours}/layer_{i}.safetensors" for i in range(2)}
loaded = load_transcoder_set(files, scan="t", **hooks, device=cpu, lazy_encoder=False, lazy_decoder=False)
transcoders = {}
for layer in range(2):
    generator = torch.Generator().manual_seed(10 + layer)
    threshold = torch.rand(32, generator=generator) * 0.3
    activation = JumpReLU(threshold, 0.1)
    transcoder = SingleLayerTranscoder(16, 32, activation, layer, skip_connection=True, device=cpu, dtype=torch.float32)
    with torch.no_grad():
        for name, parameter in transcoder.named_parameters():
            if "threshold" not in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    transcoders[layer] = transcoder
made = TranscoderSet(transcoders, **hooks, scan="t")
made.to_safetensors(theirs)
config = {"model_kind": "transcoder_set", **hooks, "scan": "t"}
open(f"{theirs}/config.yaml", "w").write(yaml.dump(config))  # as save_transcoders_to_cache writes it
with torch.no_grad():
    torch.save({"loaded": [t(x) for t in loaded], "made": [t(x) for t in made]}, sys.argv[5])
"""


@pytest.mark.slow
def test_circuit_tracer_reads_what_hooked_writes_and_hooked_reads_what_it_writes(tmp_path):
    """circuit-tracer's own code (0.5.0, from PyPI without its dependencies: it pins transformers<=4.57.3, and
    its transcoder module needs only torch, safetensors and PyYAML) in a process of its own: its
    load_transcoder_set reads a set hooked saved, and hooked reads a set its TranscoderSet.to_safetensors saved;
    the forwards agree."""
    import subprocess
    import sys
    import zipfile

    download = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "circuit-tracer==0.5.0", "-d", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    wheels = list(tmp_path.glob("circuit_tracer-*.whl"))
    if download.returncode != 0 or not wheels:
        pytest.fail(f"circuit-tracer 0.5.0 could not be downloaded from PyPI: {download.stderr[-300:]}")
    zipfile.ZipFile(wheels[0]).extractall(tmp_path / "circuit_tracer_src")
    transcoders = []
    for layer in range(2):
        cfg = hooked.sae.DictionaryConfig(
            d_in=D_IN,
            d_sae=D_SAE,
            hook_name=f"blocks.{layer}.mlp.hook_in",
            hook_name_out=f"blocks.{layer}.hook_mlp_out",
            architecture="jumprelu",
        )
        transcoder = hooked.sae.Dictionary(cfg, skip=True)
        randomize(transcoder, layer)
        transcoders.append(transcoder)
    hooked.sae.save(transcoders, tmp_path / "ours", format="circuit-tracer")
    (tmp_path / "theirs").mkdir()
    x = inputs(6, D_IN)
    torch.save(x, tmp_path / "x.pt")
    paths = [tmp_path / name for name in ("circuit_tracer_src", "ours", "theirs", "x.pt", "out.pt")]
    run = subprocess.run(
        [sys.executable, "-c", CIRCUIT_TRACER_SCRIPT, *map(str, paths)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    outputs = torch.load(tmp_path / "out.pt")
    theirs = hooked.sae.load(tmp_path / "theirs")
    for layer in range(2):
        torch.testing.assert_close(outputs["loaded"][layer], transcoders[layer](x))
        torch.testing.assert_close(theirs[layer](x), outputs["made"][layer])
        assert theirs[layer].cfg.architecture == "jumprelu" and theirs[layer].W_skip is not None


def test_circuit_tracer_gpt2_transcoders_splice(gpt2, tmp_path):
    """A set saved by hooked from dictionaries fitted to the tiny GPT-2 loads against it and splices."""
    d_model = gpt2.cfg.d_model
    transcoders = []
    for layer in range(gpt2.cfg.n_layers):
        cfg = hooked.sae.DictionaryConfig(
            d_in=d_model,
            d_sae=8,
            hook_name=f"blocks.{layer}.mlp.hook_in",
            hook_name_out=f"blocks.{layer}.hook_mlp_out",
            architecture="topk",
            k=3,
        )
        transcoder = hooked.sae.Dictionary(cfg, skip=True)
        randomize(transcoder, layer)
        transcoders.append(transcoder)
    with pytest.warns(UserWarning, match="local-folder loader"):  # circuit-tracer would read it without TopK
        hooked.sae.save(transcoders, tmp_path / "set", format="circuit-tracer")
    loaded = hooked.sae.load(tmp_path / "set", model=gpt2)
    tokens = torch.randint(0, gpt2.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(gpt2.run_with_saes(tokens, saes=loaded), gpt2.run_with_saes(tokens, saes=transcoders))


# ----------------------------------------------------------------------------- bad input
def test_unknown_architecture_is_refused(tmp_path):
    saved(saelens_sae("standard"), tmp_path)
    config = json.loads((tmp_path / "cfg.json").read_text()) | {"architecture": "abstopk"}
    (tmp_path / "cfg.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"architecture 'abstopk' is not one hooked\.sae reads"):
        hooked.sae.load(tmp_path)


def test_missing_weights_file_is_refused(tmp_path):
    saved(saelens_sae("standard"), tmp_path)
    (tmp_path / "sae_weights.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no sae_weights\.safetensors"):
        hooked.sae.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        hooked.sae.load(tmp_path / "elsewhere")


@pytest.mark.parametrize(("field", "value", "axis"), [("d_in", 20, "d_in"), ("d_sae", 40, "d_sae")])
def test_weights_disagreeing_with_the_config_are_refused(field, value, axis, tmp_path):
    saved(saelens_sae("standard"), tmp_path)
    config = json.loads((tmp_path / "cfg.json").read_text()) | {field: value}
    (tmp_path / "cfg.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"W_enc .* is \[16, 32\].*its {axis} is .* says {axis}={value}.*fix {axis}"):
        hooked.sae.load(tmp_path)


def test_a_tensor_the_architecture_does_not_use_is_refused(tmp_path):
    """A skip transcoder's config swapped for a plain transcoder's would drop W_skip silently."""
    saved(saelens_sae("skip_transcoder"), tmp_path)
    config = json.loads((tmp_path / "cfg.json").read_text()) | {"architecture": "transcoder"}
    (tmp_path / "cfg.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"holds \['W_skip'\], which a standard transcoder does not use"):
        hooked.sae.load(tmp_path)


def test_expected_average_only_in_without_a_factor_is_refused(tmp_path):
    saved(saelens_sae("standard", normalize_activations="expected_average_only_in"), tmp_path)
    with pytest.raises(ValueError, match=r"expected_average_only_in.*norm_scaling_factor="):
        hooked.sae.load(tmp_path)
    saved(saelens_sae("standard"), tmp_path / "plain")
    with pytest.raises(ValueError, match=r"norm_scaling_factor=2.0 is given, but .* says normalize_activations='none'"):
        hooked.sae.load(tmp_path / "plain", norm_scaling_factor=2.0)


def test_missing_hook_name_and_misplaced_hook_name_out_are_refused(tmp_path):
    sae = saelens_sae("standard")
    sae.cfg.metadata = SAEMetadata()
    saved(sae, tmp_path)
    with pytest.raises(ValueError, match=r"records no hook_name .* hook_name="):
        hooked.sae.load(tmp_path)
    with pytest.raises(ValueError, match=r"hook_name_out=.* is a transcoder's output point"):
        hooked.sae.load(tmp_path, hook_name=SAE_HOOK, hook_name_out="blocks.0.hook_mlp_out")


def test_sparsify_groupmax_is_refused(tmp_path):
    sparsify_coder(tmp_path / "layers.0")
    config = json.loads((tmp_path / "layers.0" / "cfg.json").read_text()) | {"activation": "groupmax"}
    (tmp_path / "layers.0" / "cfg.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"activation 'groupmax'"):
        hooked.sae.load(tmp_path / "layers.0")


def test_circuit_tracer_bad_sets_are_refused(tmp_path):
    circuit_tracer_set(tmp_path / "gap", n_layers=3)
    (tmp_path / "gap" / "layer_1.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"not for \[1\]"):
        hooked.sae.load(tmp_path / "gap")
    with pytest.raises(ValueError, match=r"give the directory .* config\.yaml"):
        hooked.sae.load(tmp_path / "gap" / "layer_0.safetensors")
    circuit_tracer_set(tmp_path / "clt", n_layers=1)
    (tmp_path / "clt" / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "model_kind": "cross_layer_transcoder",
                "feature_input_hook": "hook_resid_mid",
                "feature_output_hook": "hook_mlp_out",
            }
        )
    )
    with pytest.raises((FileNotFoundError, ValueError), match=r"W_enc_0"):  # a set's files under a CLT's config
        hooked.sae.load(tmp_path / "clt")


def test_save_refuses_what_the_format_cannot_hold(tmp_path):
    cfg = hooked.sae.DictionaryConfig(
        d_in=8, d_sae=16, hook_name="blocks.0.mlp.hook_in", hook_name_out="blocks.0.hook_mlp_out", architecture="gated"
    )
    with pytest.raises(ValueError, match="no gated transcoder"):
        hooked.sae.save(hooked.sae.Dictionary(cfg), tmp_path / "a")
    sae = hooked.sae.Dictionary(hooked.sae.DictionaryConfig(d_in=8, d_sae=16, hook_name=SAE_HOOK))
    with pytest.raises(ValueError, match="format='safetensors'"):
        hooked.sae.save(sae, tmp_path / "b", format="safetensors")
    with pytest.raises(ValueError, match="cannot be a circuit-tracer transcoder: it is an SAE"):
        hooked.sae.save([sae], tmp_path / "c", format="circuit-tracer")
