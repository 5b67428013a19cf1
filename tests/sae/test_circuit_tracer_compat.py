"""hooked's circuit-tracer files against circuit-tracer 0.5.0 itself: a CLT and a transcoder set written by
hooked are loaded by circuit-tracer's own loader (`utils/caching.py` `load_transcoders_from_cache`, which reads
config.yaml and calls `load_clt` / `load_transcoder_set`), and a CLT circuit-tracer writes (`to_safetensors`) is
loaded by hooked; each side encodes and decodes the same fixed inputs and the numbers are compared.

circuit-tracer pins transformers<=4.57.3 (hooked's tests run transformers 5), so it runs in a venv of its own
(tests/circuit_tracer_venv.py); the two sides exchange tensors as .safetensors files.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest
import torch
from safetensors.torch import load_file, save_file

from hooked.sae import CLTConfig, CrossLayerTranscoder, Dictionary, DictionaryConfig
from hooked.sae.formats.circuit_tracer_clt import load_circuit_tracer_clt, save_circuit_tracer
from tests.circuit_tracer_venv import venv_python

pytestmark = pytest.mark.slow

N_LAYERS, D_MODEL, D_SAE, POSITIONS = 3, 16, 24, 7


# Run in the circuit-tracer venv: for each job, load the folder with circuit-tracer's loader and save what it
# computes on the inputs; then write a CLT of circuit-tracer's own for hooked to read.
CIRCUIT_TRACER_SIDE = textwrap.dedent(
    """
    import json, sys
    import torch, yaml
    from safetensors.torch import load_file, save_file
    from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder
    from circuit_tracer.utils.caching import load_transcoders_from_cache

    work = sys.argv[1]
    jobs = json.load(open(f"{work}/jobs.json"))
    x = load_file(f"{work}/inputs.safetensors")["x"]
    hooks = {}
    for name in jobs["hooked_wrote"]:
        transcoder, config = load_transcoders_from_cache(name, cache_dir=f"{work}/cache", device=torch.device("cpu"))
        hooks[name] = [config["model_kind"], transcoder.feature_input_hook, transcoder.feature_output_hook,
                       type(transcoder).__name__]
        with torch.no_grad():
            features = transcoder.encode(x)
            decoded = transcoder.forward(x) if name.startswith("clt") else transcoder.decode(features, x)
        outputs = {"features": features.contiguous(), "decoded": decoded.contiguous()}
        save_file(outputs, f"{work}/{name}.out.safetensors")
    json.dump(hooks, open(f"{work}/hooks.json", "w"))

    torch.manual_seed(0)
    n_layers, d_sae, d_model = x.shape[0], jobs["d_sae"], x.shape[-1]
    own = CrossLayerTranscoder(n_layers, d_sae, d_model, activation_function="jump_relu", lazy_decoder=False,
                               feature_input_hook="mlp.hook_in", feature_output_hook="hook_mlp_out",
                               device=torch.device("cpu"), dtype=torch.float32)
    with torch.no_grad():
        for name, parameter in own.named_parameters():
            noise = torch.randn(parameter.shape)
            parameter.copy_(noise.abs() * 0.2 if "threshold" in name else noise * 0.3)
        features, decoded = own.encode(x), own.forward(x)
    own.to_safetensors(f"{work}/own")
    yaml.safe_dump({"model_kind": "cross_layer_transcoder", "feature_input_hook": "mlp.hook_in",
                    "feature_output_hook": "hook_mlp_out"}, open(f"{work}/own/config.yaml", "w"))
    save_file({"features": features.contiguous(), "decoded": decoded.contiguous()}, f"{work}/own.out.safetensors")
    """
)


def random_clt(architecture: str, seed: int) -> CrossLayerTranscoder:
    clt = CrossLayerTranscoder(CLTConfig(n_layers=N_LAYERS, d_in=D_MODEL, d_sae=D_SAE, architecture=architecture))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in clt.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(noise.abs() * 0.2 if name.endswith("threshold") else noise * 0.3)
    return clt


def random_transcoder(layer: int, seed: int) -> Dictionary:
    points = {"hook_name": f"blocks.{layer}.mlp.hook_in", "hook_name_out": f"blocks.{layer}.hook_mlp_out"}
    tc = Dictionary(DictionaryConfig(d_in=D_MODEL, d_sae=D_SAE, architecture="jumprelu", **points), skip=True)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in tc.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(noise.abs() * 0.2 if name == "threshold" else noise * 0.3)
    return tc


def test_circuit_tracer_reads_what_hooked_writes_and_hooked_reads_what_circuit_tracer_writes(tmp_path):
    python = venv_python()
    x = torch.randn(N_LAYERS, POSITIONS, D_MODEL, generator=torch.Generator().manual_seed(5))
    save_file({"x": x}, tmp_path / "inputs.safetensors")
    clts = {"clt_jumprelu": random_clt("jumprelu", 1), "clt_relu": random_clt("standard", 2)}
    transcoders = [random_transcoder(layer, 10 + layer) for layer in range(N_LAYERS)]
    for name, clt in clts.items():
        save_circuit_tracer(clt, tmp_path / "cache" / name)
    save_circuit_tracer(transcoders, tmp_path / "cache" / "set")
    jobs = {"hooked_wrote": [*clts, "set"], "d_sae": D_SAE}
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    (tmp_path / "side.py").write_text(CIRCUIT_TRACER_SIDE)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    done = subprocess.run(
        [str(python), str(tmp_path / "side.py"), str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]

    hooks = json.loads((tmp_path / "hooks.json").read_text())
    for name in clts:
        assert hooks[name] == ["cross_layer_transcoder", "mlp.hook_in", "hook_mlp_out", "CrossLayerTranscoder"]
    assert hooks["set"] == ["transcoder_set", "mlp.hook_in", "hook_mlp_out", "TranscoderSet"]

    with torch.no_grad():
        for name, clt in clts.items():  # circuit-tracer's numbers on hooked's files
            theirs = load_file(tmp_path / f"{name}.out.safetensors")
            assert 0.05 < (theirs["features"] > 0).float().mean() < 0.95
            torch.testing.assert_close(clt.encode(x), theirs["features"])
            torch.testing.assert_close(clt(x), theirs["decoded"], atol=1e-5, rtol=1e-5)
        theirs = load_file(tmp_path / "set.out.safetensors")
        for layer, tc in enumerate(transcoders):
            torch.testing.assert_close(tc.encode(x[layer]), theirs["features"][layer])
            torch.testing.assert_close(tc(x[layer]), theirs["decoded"][layer], atol=1e-5, rtol=1e-5)

        own = load_circuit_tracer_clt(tmp_path / "own")  # hooked's numbers on circuit-tracer's files
        theirs = load_file(tmp_path / "own.out.safetensors")
        assert own.cfg.hook_name == "blocks.{layer}.mlp.hook_in" and own.cfg.architecture == "jumprelu"
        torch.testing.assert_close(own.encode(x), theirs["features"])
        torch.testing.assert_close(own(x), theirs["decoded"], atol=1e-5, rtol=1e-5)
