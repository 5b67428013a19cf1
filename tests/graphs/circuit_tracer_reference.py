"""circuit-tracer 0.5.0's attribution graph as the reference for `hooked.graphs.attribute`: tiny random Llama
checkpoints and circuit-tracer transcoder folders built here, and circuit-tracer's `attribute` run on them in its
own venv (tests/circuit_tracer_venv.py) by tests/graphs/circuit_tracer_side.py, whose docstring says how its
TransformerLens replacement model is built offline.

    checkpoint = build_llama_checkpoint(tmp / "gqa", n_kv_heads=2)
    folder = hooked.sae.save(random_transcoder_set(3, 32, 40, skip=True), tmp / "set", format="circuit-tracer")
    graphs = circuit_tracer_graphs({"set": Job(checkpoint, folder, tokens, settings)})

Every job of one call runs in one process (importing circuit-tracer takes seconds). A graph is kept under
~/.cache/hooked-tests/circuit-tracer-graphs, named by a hash of everything it depends on (the checkpoint's and
the transcoders' files, the tokens, the settings and the side script), so a rerun with the same inputs reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from hooked.sae import CLTConfig, CrossLayerTranscoder, Dictionary, DictionaryConfig
from hooked.testing import build_tokenizer, randomize_norms
from tests.circuit_tracer_venv import VENV, venv_python

SIDE = Path(__file__).with_name("circuit_tracer_side.py")
CACHE = VENV.parent / "circuit-tracer-graphs"
PROMPT = "When Mary and John went to the store, John gave a drink to"


def build_llama_checkpoint(
    directory: Path,
    *,
    n_layers: int = 3,
    d_model: int = 32,
    n_heads: int = 4,
    n_kv_heads: int = 4,
    d_mlp: int = 64,
    vocab_size: int = 300,
    n_ctx: int = 64,
    seed: int = 0,
) -> Path:
    """A random transformers LlamaForCausalLM (norm weights randomised) with a byte-level BPE tokenizer whose
    `<|endoftext|>` (id 0) is BOS and EOS, saved into `directory`. Plain RoPE and d_head = d_model / n_heads,
    the shape TransformerLens' Llama config takes; weights N(0, 0.2) and the unembedding N(0, 0.4), so the
    next-token distribution has a clear top (transformers' 0.02 would make it flat)."""
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    bos, vocab_size = build_tokenizer(directory, vocab_size)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=d_model,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        intermediate_size=d_mlp,
        num_hidden_layers=n_layers,
        max_position_embeddings=n_ctx,
        bos_token_id=bos,
        eos_token_id=bos,
        initializer_range=0.2,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    randomize_norms(model, seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    model.save_pretrained(directory)
    return directory


def as_targets(spec: dict):
    """A job's `attribution_targets` as JSON ({"ids": [...]}, {"strings": [...]} or {"custom": [[label, weight,
    [floats]]]}) as `attribute` takes them, in hooked and in circuit-tracer (circuit_tracer_side.py, which cannot
    import this file, reads them the same way)."""
    if "ids" in spec:
        return torch.tensor(spec["ids"], dtype=torch.long)
    if "strings" in spec:
        return list(spec["strings"])
    return [(label, weight, torch.tensor(vector, dtype=torch.float32)) for label, weight, vector in spec["custom"]]


def prompt_tokens(checkpoint: Path, prompt: str = PROMPT) -> list[int]:
    """The prompt's token ids from the checkpoint's tokenizer, BOS first (circuit-tracer prepends none then)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    return [tokenizer.token_to_id("<|endoftext|>"), *tokenizer.encode(prompt, add_special_tokens=False).ids]


def _fill(module: torch.nn.Module, seed: int, scales: dict[str, tuple[float, float]]) -> None:
    """Each parameter `mean + std * N(0, 1)` by the first key of `scales` its name ends with (`abs` of the
    noise for thresholds), from a generator seeded `seed`."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            mean, std = next(value for key, value in scales.items() if name.endswith(key))
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(mean + std * (noise.abs() if name.endswith("threshold") else noise))


# Encoders tuned so that about a fifth of the features fire on a Llama's normalised MLP input (norm ~ sqrt(d_model)):
# a relu transcoder by a negative encoder bias, a JumpReLU one by its threshold.
RELU = {"b_enc": (-2.0, 0.3), "W_skip": (0.0, 0.1), "": (0.0, 0.3)}
JUMPRELU = {"threshold": (1.8, 0.3), "W_skip": (0.0, 0.1), "": (0.0, 0.3)}


def random_transcoder_set(
    n_layers: int, d_model: int, d_sae: int, *, skip: bool, architecture: str = "jumprelu", seed: int = 0
) -> list[Dictionary]:
    """One random transcoder per layer, reading `blocks.{i}.mlp.hook_in` and writing `blocks.{i}.hook_mlp_out`
    (circuit-tracer's `mlp.hook_in` / `hook_mlp_out`), with a skip matrix W_skip if `skip`."""
    transcoders = []
    for layer in range(n_layers):
        points = {"hook_name": f"blocks.{layer}.mlp.hook_in", "hook_name_out": f"blocks.{layer}.hook_mlp_out"}
        config = DictionaryConfig(d_in=d_model, d_sae=d_sae, architecture=architecture, **points)
        transcoder = Dictionary(config, skip=skip)
        _fill(transcoder, seed + layer, JUMPRELU if architecture == "jumprelu" else RELU)
        transcoders.append(transcoder)
    return transcoders


def random_clt(n_layers: int, d_model: int, d_sae: int, seed: int = 0) -> CrossLayerTranscoder:
    """A random JumpReLU cross-layer transcoder reading each layer's `mlp.hook_in` and writing its own and every
    later layer's `hook_mlp_out` (no skip: circuit-tracer 0.5.0's load_clt builds none)."""
    clt = CrossLayerTranscoder(CLTConfig(n_layers=n_layers, d_in=d_model, d_sae=d_sae, architecture="jumprelu"))
    _fill(clt, seed, JUMPRELU)
    return clt


@dataclass(frozen=True)
class Job:
    """One attribution: circuit-tracer's `attribute(tokens, model, **settings)` with the replacement model of the
    checkpoint and the transcoder folder (settings: max_n_logits, desired_logit_prob, max_feature_nodes,
    batch_size)."""

    checkpoint: Path
    transcoders: Path
    tokens: list[int]
    settings: dict


@dataclass
class Reference:
    """circuit-tracer's Graph (its fields, as tensors), and the logits of the job's tokens from the replacement
    model and from transformers 4.57.3's LlamaForCausalLM of the same checkpoint ([n_pos, d_vocab] each)."""

    input_tokens: torch.Tensor
    active_features: torch.Tensor
    activation_values: torch.Tensor
    selected_features: torch.Tensor
    adjacency: torch.Tensor
    logit_targets: list[tuple[str, int]]
    logit_probabilities: torch.Tensor
    input_string: str
    vocab_size: int
    n_layers: int
    tl_logits: torch.Tensor
    hf_logits: torch.Tensor


def _key(job: Job) -> str:
    digest = hashlib.sha256(SIDE.read_bytes())
    for folder in (job.checkpoint, job.transcoders):
        for file in sorted(folder.iterdir()):
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
    digest.update(json.dumps([job.tokens, job.settings], sort_keys=True).encode())
    return digest.hexdigest()[:32]


def _read(key: str) -> Reference:
    tensors = load_file(CACHE / f"{key}.safetensors")
    strings = json.loads((CACHE / f"{key}.json").read_text())
    return Reference(
        input_tokens=tensors["input_tokens"],
        active_features=tensors["active_features"],
        activation_values=tensors["activation_values"],
        selected_features=tensors["selected_features"],
        adjacency=tensors["adjacency"],
        logit_targets=list(zip(strings["token_strs"], tensors["logit_ids"].tolist(), strict=True)),
        logit_probabilities=tensors["logit_probabilities"],
        input_string=strings["input_string"],
        vocab_size=strings["vocab_size"],
        n_layers=strings["n_layers"],
        tl_logits=tensors["tl_logits"],
        hf_logits=tensors["hf_logits"],
    )


def circuit_tracer_graphs(jobs: dict[str, Job]) -> dict[str, Reference]:
    """circuit-tracer's graph of each job, by the job's name: read from the cache, the others computed in one run
    of circuit-tracer's venv (failing with its error output if that run fails)."""
    keys = {name: _key(job) for name, job in jobs.items()}
    missing = [name for name, key in keys.items() if not (CACHE / f"{key}.json").exists()]
    if missing:
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="circuit_tracer_graphs_") as work:
            work = Path(work)
            listed = [
                {
                    "name": keys[name],
                    "checkpoint": str(jobs[name].checkpoint),
                    "transcoders": str(jobs[name].transcoders),
                    "tokens": jobs[name].tokens,
                    "settings": jobs[name].settings,
                }
                for name in missing
            ]
            (work / "jobs.json").write_text(json.dumps(listed))
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
            done = subprocess.run(
                [str(venv_python()), str(SIDE), str(work)], capture_output=True, text=True, env=env, timeout=1800
            )
            if done.returncode != 0:
                raise RuntimeError(f"circuit-tracer's attribute failed:\n{done.stderr[-4000:]}")
            for name in missing:  # the json last: its presence marks a complete entry
                for suffix in (".safetensors", ".json"):
                    shutil.move(work / f"{keys[name]}{suffix}", CACHE / f"{keys[name]}{suffix}")
    return {name: _read(key) for name, key in keys.items()}
