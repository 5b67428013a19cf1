"""What every family's parity test against transformers shares: random checkpoints, reference outputs,
the hooked model's residual streams read through hooks, and the bf16 tolerance transformers itself shows.

A family's test (tests/families/test_qwen3_parity.py, tests/families/test_llama_parity.py, ...) builds its configs and
calls these; nothing here knows a family.
"""

from __future__ import annotations

import torch

from hooked.testing import randomize_norms


def build_checkpoint(directory, hf_config, model_class, seed: int = 0, **save_kwargs):
    """Save a random transformers model (norms and biases randomised) into `directory`."""
    torch.manual_seed(seed)
    model = model_class(hf_config).eval()
    randomize_norms(model, seed)
    model.save_pretrained(directory, **save_kwargs)
    return directory


def hf_reference(directory, model_class, attn_implementation: str):
    model = model_class.from_pretrained(directory, attn_implementation=attn_implementation, dtype=torch.float32)
    return model.eval()


def hf_outputs(model, tokens, attention_mask=None):
    """Logits and hidden states: [i] = resid_pre of block i for i < n_layers, [-1] = after the final norm."""
    with torch.no_grad():
        out = model(tokens, attention_mask=attention_mask, output_hidden_states=True)
    return out.logits, out.hidden_states


def read_pattern(activation, hook):
    return None  # listening to the pattern switches attention to the eager path


def hooked_outputs(model, tokens, eager: bool):
    """Logits, resid_pre of every block and the final-norm output of the hooked model."""
    fwd_hooks = [(lambda name: name.endswith("hook_pattern"), read_pattern)] if eager else []
    seen = {}

    def keep(x, hook):
        seen[hook.name] = x.clone()

    fwd_hooks.append((lambda name: name.endswith("hook_resid_pre") or name.endswith("hook_resid_post"), keep))
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=fwd_hooks)
        final = model.ln_final(seen[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"])
    resid_pre = [seen[f"blocks.{i}.hook_resid_pre"] for i in range(model.cfg.n_layers)]
    return logits, resid_pre, final


def max_diffs(hooked_result, reference) -> dict[str, float]:
    logits, resid_pre, final = hooked_result
    ref_logits, ref_hidden = reference
    diffs = {
        "logits": (logits - ref_logits).abs().max().item(),
        "final_norm": (final - ref_hidden[-1]).abs().max().item(),
    }
    for i, resid in enumerate(resid_pre):
        diffs[f"resid_pre.{i}"] = (resid - ref_hidden[i]).abs().max().item()
    return diffs


def random_tokens(batch: int, pos: int, seed: int = 0, vocab: int = 96) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def bf16_spread(directory, model_class, tokens, attention_mask=None) -> tuple[torch.Tensor, float]:
    """transformers' own bf16 logits (sdpa) and how far its eager path lands from them (max abs): the
    tolerance a bf16 implementation of the same model can be held to."""
    outputs = {}
    for implementation in ("sdpa", "eager"):
        model = model_class.from_pretrained(directory, attn_implementation=implementation, dtype=torch.bfloat16).eval()
        with torch.no_grad():
            outputs[implementation] = model(tokens, attention_mask=attention_mask).logits.float()
    return outputs["sdpa"], (outputs["eager"] - outputs["sdpa"]).abs().max().item()


# TransformerLens' switches for the points a default cache leaves out (split q/k/v inputs, per-head results,
# hook_mlp_in): with all three on, a cache holds every hook point.
SWITCHES = ("set_use_split_qkv_input", "set_use_attn_result", "set_use_hook_mlp_in")


def cache_every_point(models, tokens) -> list:
    """`run_with_cache(tokens)` of each model (hooked's or TransformerLens') with every switch on, then off
    again whatever happens: [(logits, cache), ...] in the models' order, without gradients."""
    for model in models:
        for setting in SWITCHES:
            getattr(model, setting)(True)
    try:
        with torch.no_grad():
            return [model.run_with_cache(tokens) for model in models]
    finally:
        for model in models:
            for setting in SWITCHES:
                getattr(model, setting)(False)


def check_hook_shapes(model, batch: int = 2, pos: int = 7) -> dict[str, tuple]:
    """Every hook point fires once in a full cache with the shape `model.hook_shapes` declares; the shapes."""
    ((_, cache),) = cache_every_point([model], random_tokens(batch, pos))
    expected = model.hook_shapes(batch=batch, pos=pos)
    assert set(cache.keys()) == set(model.hook_names)
    for name in model.hook_names:
        assert tuple(cache[name].shape) == expected[name], name
    return expected


def check_zero_heads_equals_zeroing_o_proj(model, heads: list[int], layer: int = 1) -> None:
    """`ablate.zero(heads=...)` at `hook_z` equals the model with those heads' columns of o_proj zeroed (an
    explicit edit of the weights), and changes the logits."""
    import copy

    from hooked import ablate

    tokens, d_head = random_tokens(2, 8), model.cfg.d_head
    with torch.no_grad():
        ablated = model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", ablate.zero(heads=heads))])
        edited = copy.deepcopy(model)
        for head in heads:
            edited.blocks[layer].attn.o_proj.weight[:, head * d_head : (head + 1) * d_head] = 0.0
        torch.testing.assert_close(ablated, edited(tokens), rtol=0, atol=1e-6)
        assert (ablated - model(tokens)).abs().max() > 1e-3


def compare_with_transformer_lens(
    model, tl, tokens, only_hooked: set[str], only_transformer_lens: set[str], adjust=None, atol=1e-5
) -> dict:
    """Every hook point both models have holds the same tensor (rtol 1e-5, `atol`: a number, or name -> number;
    the logits are "logits"), after `adjust(name, ours, theirs) -> (ours, theirs)` reconciles a family's layouts;
    masked scores compare where TransformerLens' are finite (it writes -inf, hooked the dtype's minimum).
    `only_hooked` are per-block names; returns hooked's cache."""
    tolerance = atol if callable(atol) else lambda name: atol
    (tl_logits, tl_cache), (logits, cache) = cache_every_point([tl, model], tokens)
    ours_only = {f"blocks.{i}.{name}" for i in range(model.cfg.n_layers) for name in only_hooked}
    assert set(tl_cache.keys()) - set(model.hook_names) == only_transformer_lens
    assert set(model.hook_names) - set(tl_cache.keys()) == ours_only
    torch.testing.assert_close(logits, tl_logits, rtol=1e-5, atol=tolerance("logits"))
    for name in set(model.hook_names) - ours_only:
        ours, theirs = cache[name], tl_cache[name]
        if adjust is not None:
            ours, theirs = adjust(name, ours, theirs)
        if name.endswith("hook_attn_scores"):
            visible = torch.isfinite(theirs)
            assert torch.equal(visible, ours > torch.finfo(ours.dtype).min), name
            ours, theirs = ours[visible], theirs[visible]
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=tolerance(name), msg=name)
    return cache


def check_post_norm_decomposition(model, tokens, norms: tuple[str, str]) -> None:
    """On a post-norm family: the per-head and per-neuron stacks are refused without `through_post_norm`, and
    with it they sum to what the model itself added (its own `hook_attn_out` / `hook_mlp_out`, and the
    residual stream for the full decomposition, whose bias row carries the output biases through the norms).
    `norms` are the block's (attention, MLP) post-norms; their gains must not be 1, or a lost gain would pass."""
    import pytest

    for name in norms:
        assert (getattr(model.blocks[0], name).gain - 1).abs().max() > 0.05
    _, cache = model.run_with_cache(tokens)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    for call in (
        lambda: cache.stack_head_results(),
        lambda: cache.get_neuron_results(0),
        lambda: cache.get_full_resid_decomposition(),
    ):
        with pytest.raises(ValueError, match="pass through_post_norm=True"):
            call()
    for layer in range(n_layers):
        heads = cache.stack_head_results(layer + 1, through_post_norm=True)[-n_heads:]
        out = cache["attn_out", layer]
        bias = (
            model.blocks[layer].attn.b_O.detach()
            * getattr(model.blocks[layer], norms[0]).gain.detach()
            / cache[f"blocks.{layer}.{norms[0]}.hook_scale"]
        )
        torch.testing.assert_close(heads.sum(0) + bias, out, rtol=0, atol=1e-5 * float(out.abs().max()))
        neurons = cache.get_neuron_results(layer, through_post_norm=True)
        out = cache["mlp_out", layer]
        torch.testing.assert_close(neurons.sum(-2), out, rtol=0, atol=1e-5 * float(out.abs().max()))
    resid = cache["resid_post", n_layers - 1]
    for kwargs in ({}, {"pos_slice": -1}, {"expand_neurons": False}, {"layer": 1, "mlp_input": True}):
        full, labels = cache.get_full_resid_decomposition(through_post_norm=True, return_labels=True, **kwargs)
        target = cache["resid_mid", 1] if kwargs.get("mlp_input") else resid
        target = target[:, -1] if "pos_slice" in kwargs else target
        assert labels[-1] == "bias" and full.shape[1:] == target.shape
        torch.testing.assert_close(full.sum(0), target, rtol=0, atol=1e-5 * float(target.abs().max()))
    direction = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    projected = cache.stack_neuron_results(-1, through_post_norm=True, apply_ln=True, project_output_onto=direction)
    full = cache.stack_neuron_results(-1, through_post_norm=True, apply_ln=True) @ direction
    torch.testing.assert_close(projected, full, rtol=1e-5, atol=1e-5)
    cache.cache_dict.pop(f"blocks.0.{norms[0]}.hook_scale")
    with pytest.raises(KeyError, match=f"reads blocks.0.{norms[0]}.hook_scale"):
        cache.stack_head_results(1, through_post_norm=True)
