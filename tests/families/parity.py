"""What every family's parity test against transformers shares: random checkpoints (and copies with an edited
config), reference outputs, the hooked model's residual streams read through hooks, the bf16 tolerance
transformers itself shows, padded batches and greedy generation against transformers, a sweep and zeroed heads
against plain runs, golden hook lists, the hook shapes, and TransformerLens' model of a checkpoint compared hook
by hook.

A family's test (tests/families/test_qwen3_parity.py, tests/families/test_llama_parity.py, ...) declares its
configs, the hook points of one of its blocks, its tolerances with their reasons and its own checks, and calls
these; nothing here knows a family.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings

import torch

import hooked
from hooked import ablate
from hooked.testing import randomize_norms

# ----------------------------------------------------------------------------- tolerances
# Exact equality holds only where both sides run the same kernels in the same order (check_bit_exact). Where
# they do not (another batch shape or padding through the matmuls, SDPA against eager, a fold of the weights),
# float32 rounding grows with the magnitudes the sums are made of, so the tolerance is a number of float32 ulps
# of the largest magnitude. Measured at most 64 (a Gemma 2 prompt alone against its left-padded batch, logits
# capped at 2.0, under ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE); twice that leaves room for another CPU.
REORDERED_ULPS = 128


def within_ulps_of_magnitude(ours: torch.Tensor, theirs: torch.Tensor, ulps: int, msg: str = "") -> None:
    """`ours` equals `theirs` to `ulps` float32 ulps of the largest magnitude in `theirs` (rtol 0)."""
    atol = ulps * torch.finfo(torch.float32).eps * theirs.abs().max().item()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=atol, msg=msg or None)


# ----------------------------------------------------------------------------- checkpoints and references
def build_checkpoint(directory, hf_config, model_class, seed: int = 0, **save_kwargs):
    """Save a random transformers model (norms and biases randomised) into `directory`."""
    torch.manual_seed(seed)
    model = model_class(hf_config).eval()
    randomize_norms(model, seed)
    model.save_pretrained(directory, **save_kwargs)
    return directory


def build_checkpoints(tmp_path_factory, configs: dict, model_class) -> dict:
    """One random checkpoint per case (`configs`: name -> transformers config), seeded by the case's index.
    The directory names are neutral: TransformerLens' convert_hf_model_config reads family names out of paths."""
    return {
        name: build_checkpoint(tmp_path_factory.mktemp(f"case{index}"), config, model_class, seed=index)
        for index, (name, config) in enumerate(configs.items())
    }


def copy_checkpoint(source, destination):
    shutil.copytree(source, destination)
    return destination


def edited_checkpoint(source, destination, **changes):
    """A copy of the checkpoint `source` whose config.json has `changes` written over it."""
    copy_checkpoint(source, destination)
    config = json.loads((destination / "config.json").read_text())
    (destination / "config.json").write_text(json.dumps({**config, **changes}))
    return destination


def hf_reference(directory, model_class, attn_implementation: str):
    model = model_class.from_pretrained(directory, attn_implementation=attn_implementation, dtype=torch.float32)
    return model.eval()


def hf_outputs(model, tokens, attention_mask=None):
    """Logits and hidden states: [i] = resid_pre of block i for i < n_layers, [-1] = after the final norm.

    use_cache=False: with its KV cache transformers' eager attention multiplies contiguous copies of k and v
    (the cache concatenates them), where hooked multiplies views of the projection; a batched matmul may round
    differently on the two layouts (it does under MKL_CBWR=COMPATIBLE), so a bit-exact comparison needs both
    sides on the same layout."""
    with torch.no_grad():
        out = model(tokens, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
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
    """Max abs difference of the logits, the final norm's output and each block's resid_pre."""
    logits, resid_pre, final = hooked_result
    ref_logits, ref_hidden = reference
    diffs = {
        "logits": (logits - ref_logits).abs().max().item(),
        "final_norm": (final - ref_hidden[-1]).abs().max().item(),
    }
    for i, resid in enumerate(resid_pre):
        diffs[f"resid_pre.{i}"] = (resid - ref_hidden[i]).abs().max().item()
    return diffs


def check_bit_exact(model, reference, tokens, eager: bool) -> None:
    """The hooked model (on its eager attention path if `eager`) against the transformers model `reference`:
    max abs difference 0.0 for the logits, every resid_pre and the final norm's output. Exact by construction:
    hooked runs transformers' operations in its order, on operands of the same shapes and memory layouts, so
    the same kernels sum in the same order on any CPU (a family whose layouts differ fails under
    MKL_CBWR=COMPATIBLE, where a matmul's rounding depends on its operands' strides)."""
    diffs = max_diffs(hooked_outputs(model, tokens, eager=eager), hf_outputs(reference, tokens))
    assert diffs == dict.fromkeys(diffs, 0.0), diffs


def listening_to_expert_slots(model):
    """A context in which hooks listen to the pattern and to the per-slot expert points (hook_expert_pre /
    hook_expert_post): a sparse MLP then takes the other branch of run_experts."""
    is_listened = lambda name: name.endswith("hook_pattern") or "hook_expert_p" in name  # noqa: E731
    return model.hooks(fwd_hooks=[(is_listened, read_pattern)])


def random_tokens(batch: int, pos: int, seed: int = 0, vocab: int = 96) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def bf16_spread(directory, model_class, tokens, attention_mask=None) -> tuple[torch.Tensor, float]:
    """transformers' own bf16 logits (sdpa) and how far its eager path lands from them (max abs): the
    tolerance a bf16 implementation of the same model can be held to."""
    outputs = {}
    for implementation in ("sdpa", "eager"):
        model = model_class.from_pretrained(directory, attn_implementation=implementation, dtype=torch.bfloat16).eval()
        with torch.no_grad():
            outputs[implementation] = model(tokens, attention_mask=attention_mask, use_cache=False).logits.float()
    return outputs["sdpa"], (outputs["eager"] - outputs["sdpa"]).abs().max().item()


def check_bf16_within_spread(directory, model_class, tokens) -> None:
    """bf16: |hooked - transformers sdpa| <= transformers' own |eager - sdpa| (bf16_spread)."""
    model = hooked.load(directory, dtype=torch.bfloat16)
    reference, spread = bf16_spread(directory, model_class, tokens)
    with torch.no_grad():
        logits = model(tokens)
    assert logits.dtype == torch.bfloat16
    assert (logits.float() - reference).abs().max().item() <= spread, directory


# ----------------------------------------------------------------------------- padded batches and generation
def left_padded(lengths, seed=10):
    """Random prompts of `lengths` tokens (prompt i seeded by seed + i), left-padded into one batch with its mask."""
    prompts = [random_tokens(1, n, seed=seed + i)[0] for i, n in enumerate(lengths)]
    tokens = torch.zeros(len(prompts), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for row, prompt in enumerate(prompts):
        tokens[row, -len(prompt) :] = prompt
        mask[row, -len(prompt) :] = 1
    return prompts, tokens, mask


def check_left_padded_batch(model, hf, lengths):
    """A left-padded batch equals transformers with its attention_mask (SDPA and eager paths) and each prompt
    run alone, to REORDERED_ULPS of the logits' magnitude: the padded rows' masks are built differently, and a
    prompt alone runs other matmul shapes than the batch, so the sums round differently."""
    prompts, tokens, mask = left_padded(lengths)
    with torch.no_grad():
        batched = model(tokens, attention_mask=mask)
        with hooked.layers.attention_backend("eager"):
            eager = model(tokens, attention_mask=mask)
        reference = hf(tokens, attention_mask=mask).logits
        real = mask.bool()
        within_ulps_of_magnitude(batched[real], reference[real], REORDERED_ULPS, "batch against transformers")
        within_ulps_of_magnitude(eager[real], reference[real], REORDERED_ULPS, "eager batch against transformers")
        for row, prompt in enumerate(prompts):
            alone = model(prompt[None])[0]
            within_ulps_of_magnitude(batched[row, -len(prompt) :], alone, REORDERED_ULPS, f"prompt {row} alone")


def check_greedy_generation(model, hf, lengths, new_tokens=12):
    """`model.generate` greedy (with its KV cache, and without: a full forward per step) equals transformers'
    generate(do_sample=False), token for token."""
    _, tokens, mask = left_padded(lengths, seed=20)
    with torch.no_grad():
        reference = hf.generate(
            tokens, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    ours = model.generate(tokens, new_tokens, attention_mask=mask, stop_at_eos=False)
    # Token ids: the argmax of logits equal to float32 rounding (bit-exact on one layout); no near-tie here
    assert torch.equal(ours, reference), (ours, reference)
    without_cache = model.generate(tokens, new_tokens, attention_mask=mask, stop_at_eos=False, use_past_kv_cache=False)
    assert torch.equal(without_cache, reference)


# ----------------------------------------------------------------------------- interventions
def last_token_kl(logits, base_logits=None, attention_mask=None):
    base = base_logits[:, -1].float().log_softmax(-1)
    return (base.exp() * (base - logits[:, -1].float().log_softmax(-1))).sum(-1)


def check_sweep_equals_each_alone(model, tokens, attention_mask=None):
    """A sweep of two head ablations equals each run alone with `run_with_hooks` (last-token KL, <= 2e-6)."""
    variants = {
        "L0H1": [("blocks.0.attn.hook_z", ablate.zero(heads=1))],
        "L1H0": [("blocks.1.attn.hook_z", ablate.zero(heads=0))],
    }
    result = hooked.sweep(model, tokens, variants, last_token_kl, attention_mask=attention_mask, progress=False)
    with torch.no_grad():
        base = model(tokens, attention_mask=attention_mask)
        for name, pairs in variants.items():
            alone = last_token_kl(
                model.run_with_hooks(tokens, attention_mask=attention_mask, fwd_hooks=pairs), base_logits=base
            )
            assert alone.abs().max() > 1e-6, name  # the ablation does something
            torch.testing.assert_close(result[name], alone, rtol=0, atol=2e-6, msg=name)


def check_zero_heads_equals_zeroing_o_proj(
    model, heads: list[int], layer: int = 1, output_projection: str = "o_proj", atol: float = 1e-6
) -> None:
    """`ablate.zero(heads=...)` at `hook_z` equals the model with those heads' columns of the attention's output
    projection zeroed (an explicit edit of the weights; within `atol`, 0 = bit for bit), and changes the logits."""
    import copy

    tokens, d_head = random_tokens(2, 8), model.cfg.d_head
    with torch.no_grad():
        ablated = model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", ablate.zero(heads=heads))])
        edited = copy.deepcopy(model)
        projection = getattr(edited.blocks[layer].attn, output_projection)
        for head in heads:
            projection.weight[:, head * d_head : (head + 1) * d_head] = 0.0
        # atol 0 where exact: zeroing z's slice or the weight's columns runs the same matmuls of the same shapes
        torch.testing.assert_close(ablated, edited(tokens), rtol=0, atol=atol)
        assert (ablated - model(tokens)).abs().max() > 1e-3


# ----------------------------------------------------------------------------- hook names and shapes
EMBED_POINTS = ("hook_embed",)
FINAL_NORM_POINTS = ("ln_final.hook_scale", "ln_final.hook_normalized")


def golden_hook_names(blocks: list[list[str]], embed=EMBED_POINTS, final_norm=FINAL_NORM_POINTS) -> list[str]:
    """A model's hook names in forward order, as its golden list states them: the embedding's points, then for
    each block i the points `blocks[i]` lists (names inside the block) under `blocks.{i}.`, then the final norm's.
    A family declares the points of one block: `golden_hook_names([BLOCK] * n_layers)`."""
    per_block = [f"blocks.{i}.{name}" for i, block in enumerate(blocks) for name in block]
    return [*embed, *per_block, *final_norm]


# TransformerLens' switches for the points a default cache leaves out (split q/k/v inputs, per-head results,
# hook_mlp_in): with all three on, a cache holds every hook point but ON_REQUEST.
SWITCHES = ("set_use_split_qkv_input", "set_use_attn_result", "set_use_hook_mlp_in")
# Points no switch adds to a default cache, kept only when a names_filter asks: mlp.hook_in, what the MLP reads
# (circuit-tracer 0.5's name, the point a transcoder reads). It is hooked's (and circuit-tracer's) addition:
# TransformerLens 3.9 has no such point.
ON_REQUEST = ("mlp.hook_in",)


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
    """Every hook point fires once with the shape `model.hook_shapes` declares: a cache with every switch on holds
    all but the ON_REQUEST points, which a second cache asks for by name; the shapes."""
    tokens = random_tokens(batch, pos)
    ((_, cache),) = cache_every_point([model], tokens)
    on_request = {name for name in model.hook_names if name.endswith(ON_REQUEST)}
    assert len(on_request) == model.cfg.n_layers
    assert set(cache.keys()) == set(model.hook_names) - on_request
    with torch.no_grad():
        _, requested = model.run_with_cache(tokens, names_filter=lambda name: name in on_request)
    assert set(requested.keys()) == on_request
    expected = model.hook_shapes(batch=batch, pos=pos)
    for name in model.hook_names:
        assert tuple((requested if name in on_request else cache)[name].shape) == expected[name], name
    return expected


# ----------------------------------------------------------------------------- TransformerLens 3.9
UNEMBED_POINTS = {"unembed.hook_in", "unembed.hook_out"}  # TransformerLens' unembedding hooks: hooked's has none


def tl_model(directory, hf_class, converter: str, config_fields=None, **processing):
    """TransformerLens 3.9's HookedTransformer on a saved checkpoint's weights, float32. Its config: the fields
    `config_fields(hf_config)` returns (written out by hand for a family TransformerLens maps only by name), or
    else TransformerLens' own mapping (convert_hf_model_config, which reads the directory; a dtype it pins is
    replaced by float32). Its weights: TransformerLens' converter of that name
    (transformer_lens.pretrained.weight_conversions), processed as `processing` says (default: not at all)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import HookedTransformer, HookedTransformerConfig
        from transformer_lens.loading_from_pretrained import convert_hf_model_config
        from transformer_lens.pretrained import weight_conversions

        hf = hf_class.from_pretrained(directory, dtype=torch.float32).eval()
        if config_fields is None:
            known = {field.name for field in dataclasses.fields(HookedTransformerConfig)} - {"tokenizer_name", "dtype"}
            fields = {k: v for k, v in convert_hf_model_config(str(directory)).items() if k in known}
        else:
            fields = config_fields(hf.config)
        cfg = HookedTransformerConfig(**fields, device="cpu", dtype=torch.float32)
        model = HookedTransformer(cfg)
        flags = dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False)
        with torch.no_grad():
            state = getattr(weight_conversions, converter)(hf, cfg)
            model.load_and_process_state_dict(state, **{**flags, **processing})
    return model.eval()


def ln1_head_zero(name, ours, theirs):
    """With the split q/k/v inputs on, TransformerLens normalises each head's copy (its ln1 hooks gain a head
    axis); hooked's ln1 fires once on the unsplit stream: head 0's copy is compared."""
    return ours, (theirs[:, :, 0] if ".ln1." in name else theirs)


# TransformerLens computes each hook point with other operations in another order (einsum projections, rotary
# angles as pos / base ** (2i / d), scale before or after q.k, softmax of its own): the two agree to float32
# rounding, which grows with the magnitudes a tensor is made of, not with each element (an element near 0 made
# from values near 90 carries their rounding). So the tolerance is a number of float32 ulps of the tensor's
# largest magnitude. Measured over Llama, OLMo 2, Gemma 2 and Gemma 3 (wide weights, activations up to ~90) under
# ATen's default, AVX2 and AVX-512 kernels and MKL_CBWR=COMPATIBLE: at most 80 ulps (Gemma 3's capped logits under
# ATen's default kernels; a Gemma 2 score 56, 2e-5 at 3.0); 128 leaves room for another CPU's kernels, and a wrong
# operation is off by percent, not ulps.
TRANSFORMER_LENS_ULPS = 128


def compare_with_transformer_lens(
    model, tl, tokens, only_hooked: set[str], only_transformer_lens: set[str], adjust=None
):
    """Every hook point both models have holds the same tensor, to TRANSFORMER_LENS_ULPS of its largest magnitude
    (the logits are "logits"), after `adjust(name, ours, theirs) -> (ours, theirs)` reconciles a family's layouts;
    masked scores compare where TransformerLens' are finite (it writes -inf, hooked the dtype's minimum).
    `only_hooked` are per-block names, besides ON_REQUEST, which every family has; returns hooked's cache."""
    (tl_logits, tl_cache), (logits, cache) = cache_every_point([tl, model], tokens)
    ours_only = {f"blocks.{i}.{name}" for i in range(model.cfg.n_layers) for name in {*only_hooked, *ON_REQUEST}}
    assert set(tl_cache.keys()) - set(model.hook_names) == only_transformer_lens
    assert set(model.hook_names) - set(tl_cache.keys()) == ours_only
    within_ulps_of_magnitude(logits, tl_logits, TRANSFORMER_LENS_ULPS, "logits")
    for name in set(model.hook_names) - ours_only:
        ours, theirs = cache[name], tl_cache[name]
        if adjust is not None:
            ours, theirs = adjust(name, ours, theirs)
        if name.endswith("hook_attn_scores"):
            visible = torch.isfinite(theirs)
            assert torch.equal(visible, ours > torch.finfo(ours.dtype).min), name
            ours, theirs = ours[visible], theirs[visible]
        within_ulps_of_magnitude(ours, theirs, TRANSFORMER_LENS_ULPS, name)
    return cache


# ----------------------------------------------------------------------------- post-norm families
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
