"""circuit-tracer 0.5.0's attribution graphs of tiny Llama checkpoints, run in circuit-tracer's own venv
(tests/circuit_tracer_venv.py) by tests/graphs/circuit_tracer_reference.py; hooked's tests never import it.

    python circuit_tracer_side.py WORK    # WORK/jobs.json -> WORK/{name}.safetensors + WORK/{name}.json per job

A job's settings are `attribute`'s keyword arguments; `attribution_targets` comes as JSON (`targets` below).

The replacement model is built offline. TransformerLens 3.2.1's `from_pretrained` takes only its own list of
model names and reads their configs from the hub, so this does by hand what circuit-tracer's
`TransformerLensReplacementModel.from_pretrained_and_transcoders` does through it
(`replacement_model_transformerlens.py`): transformers 4.57.3 loads the checkpoint directory, a
`HookedTransformerConfig` is filled as TransformerLens' `loading_from_pretrained.py` fills it for a
`LlamaForCausalLM`, TransformerLens' own `convert_llama_weights` maps the weights, and they are loaded with
`fold_ln=False, center_writing_weights=False, center_unembed=False`, the processing circuit-tracer asks for; then
circuit-tracer's `_configure_replacement_model` attaches the transcoders (loaded by circuit-tracer's
`load_transcoders_from_cache` from their folder) as `from_pretrained_and_transcoders` does. The tokenizer is the
checkpoint's tokenizer.json as a transformers tokenizer whose BOS, EOS and PAD are `<|endoftext|>` (circuit-tracer
decodes the logit targets' strings with it and reads its special ids).

Each job also saves the logits of the same tokens from the replacement model (its frozen-gradient hooks leave the
forward values alone) and from transformers' LlamaForCausalLM, for the test that the model is the checkpoint's.
"""

import json
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from circuit_tracer import attribute
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from circuit_tracer.utils.caching import load_transcoders_from_cache
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights

END_OF_TEXT = "<|endoftext|>"


def tokenizer(checkpoint: Path):
    """The checkpoint's tokenizer.json as a transformers tokenizer, saved and reloaded because TransformerLens
    reloads a tokenizer by its `name_or_path` (to turn `add_bos_token` on)."""
    built = PreTrainedTokenizerFast(
        tokenizer_file=str(checkpoint / "tokenizer.json"),
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
    )
    directory = Path(tempfile.mkdtemp(prefix="ct_tokenizer_"))
    built.save_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory)


def rope_theta(checkpoint: Path) -> float:
    """The checkpoint's RoPE base, from transformers 5's `rope_parameters` or transformers 4's `rope_theta`;
    only plain RoPE, the kind TransformerLens' Llama config has."""
    config = json.loads((checkpoint / "config.json").read_text())
    rope = config.get("rope_parameters") or {"rope_theta": config.get("rope_theta", 1e4), "rope_type": "default"}
    if rope.get("rope_type", "default") != "default" or config.get("rope_scaling"):
        raise ValueError(f"{checkpoint}: the reference builds plain RoPE only, not {rope}")
    return float(rope["rope_theta"])


def tl_config(hf_config, theta: float) -> HookedTransformerConfig:
    """TransformerLens 3.2.1's config of a LlamaForCausalLM (`loading_from_pretrained.py`, the
    "LlamaForCausalLM" branch, with the RoPE base it reads for a checkpoint with one), float32 on the CPU."""
    if hf_config.head_dim * hf_config.num_attention_heads != hf_config.hidden_size:
        raise ValueError("TransformerLens' Llama config takes d_head = hidden_size / num_attention_heads")
    if hf_config.attention_bias or hf_config.mlp_bias:
        raise ValueError("TransformerLens' convert_llama_weights writes zero biases: no attention_bias / mlp_bias")
    return HookedTransformerConfig(
        d_model=hf_config.hidden_size,
        d_head=hf_config.hidden_size // hf_config.num_attention_heads,
        n_heads=hf_config.num_attention_heads,
        d_mlp=hf_config.intermediate_size,
        n_layers=hf_config.num_hidden_layers,
        n_ctx=hf_config.max_position_embeddings,
        eps=hf_config.rms_norm_eps,
        d_vocab=hf_config.vocab_size,
        act_fn=hf_config.hidden_act,
        n_key_value_heads=(
            hf_config.num_key_value_heads if hf_config.num_key_value_heads != hf_config.num_attention_heads else None
        ),
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        rotary_dim=hf_config.hidden_size // hf_config.num_attention_heads,
        rotary_base=theta,
        final_rms=True,
        gated_mlp=True,
        original_architecture="LlamaForCausalLM",
        model_name="tiny-random-llama",
        tokenizer_prepends_bos=False,
        dtype=torch.float32,
        device="cpu",
    )


def replacement_model(checkpoint: Path, transcoders: Path):
    """circuit-tracer's TransformerLens replacement model of the checkpoint with the transcoders, and
    transformers' model of the checkpoint."""
    hf = LlamaForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32, attn_implementation="eager").eval()
    theta = rope_theta(checkpoint)
    if float(hf.config.rope_theta) != theta:
        raise ValueError(f"transformers 4.57.3 read rope_theta {hf.config.rope_theta}, the checkpoint says {theta}")
    cfg = tl_config(hf.config, theta)
    model = TransformerLensReplacementModel(cfg, tokenizer(checkpoint))
    model.load_and_process_state_dict(
        convert_llama_weights(hf, cfg), fold_ln=False, center_writing_weights=False, center_unembed=False
    )
    set_or_clt, _ = load_transcoders_from_cache(
        transcoders.name, cache_dir=transcoders.parent, device=torch.device("cpu"), dtype=torch.float32
    )
    model._configure_replacement_model(set_or_clt)
    return model, hf


def targets(spec: dict):
    """A job's `attribution_targets` as circuit-tracer takes them (circuit_tracer_reference.as_targets, which this
    venv cannot import: hooked's tests are not on its path)."""
    if "ids" in spec:
        return torch.tensor(spec["ids"], dtype=torch.long)
    if "strings" in spec:
        return list(spec["strings"])
    return [(label, weight, torch.tensor(vector, dtype=torch.float32)) for label, weight, vector in spec["custom"]]


def run(job: dict, work: Path) -> None:
    model, hf = replacement_model(Path(job["checkpoint"]), Path(job["transcoders"]))
    tokens = torch.tensor(job["tokens"], dtype=torch.long)
    with torch.no_grad():
        tl_logits = model(tokens[None])[0]
        hf_logits = hf(tokens[None]).logits[0]
    settings = dict(job["settings"])
    if "attribution_targets" in settings:
        settings["attribution_targets"] = targets(settings["attribution_targets"])
    graph = attribute(tokens, model, **settings)
    tensors = {
        "input_tokens": graph.input_tokens,
        "active_features": graph.active_features,
        "activation_values": graph.activation_values,
        "selected_features": graph.selected_features,
        "adjacency": graph.adjacency_matrix,
        "logit_ids": graph.logit_token_ids,
        "logit_probabilities": graph.logit_probabilities,
        "tl_logits": tl_logits,
        "hf_logits": hf_logits,
    }
    save_file(
        {name: tensor.detach().contiguous() for name, tensor in tensors.items()}, work / f"{job['name']}.safetensors"
    )
    strings = {
        "token_strs": [target.token_str for target in graph.logit_targets],
        "input_string": graph.input_string,
        "vocab_size": graph.vocab_size,
        "n_layers": graph.cfg.n_layers,
        "scan": graph.scan,
    }
    (work / f"{job['name']}.json").write_text(json.dumps(strings))


if __name__ == "__main__":
    work = Path(sys.argv[1])
    for job in json.loads((work / "jobs.json").read_text()):
        run(job, work)
