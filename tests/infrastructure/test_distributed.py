"""Tensor, expert and data parallelism (hooked.distributed) against single-process models.

Two processes on this CPU with the gloo backend, launched with torchrun (`python -m
torch.distributed.run --standalone`): tests/infrastructure/distributed_worker.py loads each tiny checkpoint with
`tp=2` (and `tp=1` / no tp for data-parallel sweeps), runs it, and saves what each rank saw; the
tests here compare it with `hooked.load(directory)` in this process. Checkpoints cover GPT-2 (a
vocabulary that does not split evenly), Qwen3 with grouped-query attention, attention biases and an
untied unembedding, Qwen3-MoE with one key/value head (held by both ranks), tied embeddings, a
dense layer and six experts (three per rank), and OLMo 2, whose q/k norms span every head (each rank's
sums of squares all-reduced once per layer), with every key/value head split and with one held by both ranks,
and Gemma 2 and 3 (windows on alternate layers, softcaps, post-norms, two rotary tables, an untied embedding
found by its declaration rather than by W_E, which Gemma scales).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers  # builds the Qwen3 checkpoints (the dev extra)

import hooked
from hooked.testing import build_gpt2_checkpoint, randomize_norms
from tests.families.parity import REORDERED_ULPS, within_ulps_of_magnitude
from tests.infrastructure import distributed_worker as worker

pytestmark = pytest.mark.slow  # make test-fast leaves this file out

REPO = Path(__file__).resolve().parents[2]
ATOL = 1e-5  # float32 rounding: the all-reduces sum partial products in another order (measured <= 1e-6)


def build(directory: Path, config, model_class) -> Path:
    torch.manual_seed(0)
    model = model_class(config).eval()
    randomize_norms(model, 0)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("distributed")
    return {
        "gpt2": build_gpt2_checkpoint(root / "gpt2", n_layer=2, n_embd=64, n_head=4),
        "qwen3": build(
            root / "qwen3",
            transformers.Qwen3Config(
                vocab_size=97,
                hidden_size=64,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                intermediate_size=96,
                num_hidden_layers=2,
                attention_bias=True,
            ),
            transformers.Qwen3ForCausalLM,
        ),
        "qwen3_moe": build(
            root / "qwen3_moe",
            transformers.Qwen3MoeConfig(
                vocab_size=96,
                hidden_size=64,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=16,
                intermediate_size=80,
                moe_intermediate_size=32,
                num_experts=6,
                num_experts_per_tok=2,
                num_hidden_layers=3,
                mlp_only_layers=[0],
                tie_word_embeddings=True,
            ),
            transformers.Qwen3MoeForCausalLM,
        ),
        # Biases on every projection: the cut ones are cut with their rows, the row-parallel ones stay whole.
        "llama": build(
            root / "llama",
            transformers.LlamaConfig(
                vocab_size=97,
                hidden_size=64,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=96,
                num_hidden_layers=2,
                attention_bias=True,
                mlp_bias=True,
            ),
            transformers.LlamaForCausalLM,
        ),
        # A window shorter than the prompts (9 tokens, 4 generated): every rank must apply it.
        "mistral": build(
            root / "mistral",
            transformers.MistralConfig(
                vocab_size=96,
                hidden_size=64,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=96,
                num_hidden_layers=2,
                sliding_window=4,
            ),
            transformers.MistralForCausalLM,
        ),
        # The fused per-head q|k|v layout, partial rotary, and a parallel residual.
        "gpt_neox": build(
            root / "gpt_neox",
            transformers.GPTNeoXConfig(
                vocab_size=96,
                hidden_size=64,
                num_attention_heads=4,
                intermediate_size=128,
                num_hidden_layers=2,
                rotary_pct=0.5,
                use_parallel_residual=True,
            ),
            transformers.GPTNeoXForCausalLM,
        ),
        # Experts split over ranks (4 experts, top-2) under Mistral's attention.
        "mixtral": build(
            root / "mixtral",
            transformers.MixtralConfig(
                vocab_size=96,
                hidden_size=64,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=32,
                num_local_experts=4,
                num_experts_per_tok=2,
                num_hidden_layers=2,
            ),
            transformers.MixtralForCausalLM,
        ),
        # OLMo 2's q_norm / k_norm span every head: each rank holds two heads of both and their weights' slices.
        "olmo2": build(
            root / "olmo2",
            transformers.Olmo2Config(
                vocab_size=96,
                hidden_size=64,
                num_attention_heads=4,
                num_key_value_heads=4,
                intermediate_size=96,
                num_hidden_layers=2,
            ),
            transformers.Olmo2ForCausalLM,
        ),
        # k_norm over one kv head that both ranks hold (counted once in the all-reduced sum); biases; tied.
        "olmo2_mqa": build(
            root / "olmo2_mqa",
            transformers.Olmo2Config(
                vocab_size=96,
                hidden_size=64,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=16,
                intermediate_size=96,
                num_hidden_layers=2,
                attention_bias=True,
                tie_word_embeddings=True,
            ),
            transformers.Olmo2ForCausalLM,
        ),
        # Gemma 2: untied (its W_E is the table scaled, so the table is found by its declaration), a window on
        # alternate layers shorter than the prompts, both softcaps, pre- and post-norms.
        "gemma2": build(
            root / "gemma2",
            transformers.Gemma2Config(
                vocab_size=96,
                hidden_size=64,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                intermediate_size=96,
                num_hidden_layers=2,
                sliding_window=4,
                query_pre_attn_scalar=16,
                attn_logit_softcapping=5.0,
                final_logit_softcapping=3.0,
                tie_word_embeddings=False,
            ),
            transformers.Gemma2ForCausalLM,
        ),
        # Gemma 3: per-head q/k norms, a local and a global rotary table (linear scaling on the global one), a
        # window on alternate layers shorter than the prompts.
        "gemma3": build(
            root / "gemma3",
            transformers.Gemma3TextConfig(
                vocab_size=96,
                hidden_size=64,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                intermediate_size=96,
                num_hidden_layers=2,
                sliding_window=4,
                sliding_window_pattern=2,
                query_pre_attn_scalar=16,
                rope_parameters={
                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                },
            ),
            transformers.Gemma3ForCausalLM,
        ),
    }


def launch(mode: str, checkpoints: dict[str, Path], out: Path, processes: int = 2) -> list[dict]:
    """Run the worker on `processes` ranks; a hang fails the test at the subprocess timeout."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(processes),
        str(Path(__file__).with_name("distributed_worker.py")),
        mode,
        str(out),
        *(f"{name}={directory}" for name, directory in checkpoints.items()),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(processes)]


@pytest.fixture(scope="module")
def ranks(checkpoints, tmp_path_factory) -> list[dict]:
    return launch("main", checkpoints, tmp_path_factory.mktemp("main"))


@pytest.fixture(scope="module")
def single(checkpoints) -> dict[str, hooked.HookedTransformer]:
    return {name: hooked.load(directory) for name, directory in checkpoints.items()}


ARCHS = [
    "gpt2",
    "qwen3",
    "qwen3_moe",
    "llama",
    "mistral",
    "gpt_neox",
    "mixtral",
    "olmo2",
    "olmo2_mqa",
    "gemma2",
    "gemma3",
]
# All-reduces per layer beyond the two sublayers': OLMo 2's q_norm and k_norm share one (their sums of squares).
EXTRA_ALL_REDUCES_PER_LAYER = {"olmo2": 1, "olmo2_mqa": 1}


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_at_tp2_equal_tp1(ranks, single, arch):
    model = single[arch]
    tokens = worker.prompt_tokens(model.cfg)
    padded, mask = worker.padded_prompt(model.cfg)
    with torch.no_grad():
        expected, expected_padded = model(tokens), model(padded, attention_mask=mask)
    for rank in ranks:
        torch.testing.assert_close(rank[arch]["logits"], expected, rtol=0, atol=ATOL)
        torch.testing.assert_close(rank[arch]["logits_padded"], expected_padded, rtol=0, atol=ATOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_cached_hook_is_whole_and_equal_on_every_rank(ranks, single, arch):
    model = single[arch]
    _, cache = model.run_with_cache(worker.prompt_tokens(model.cfg))
    assert len(cache) == len(model.default_cache_names())  # every point but the split inputs (as TransformerLens)
    for rank in ranks:
        cached = rank[arch]["cache"]
        assert list(cached) == list(cache.keys())
        for name, value in cache.items():
            assert cached[name].shape == value.shape, name  # TransformerLens' shapes: every head, every neuron
            if value.dtype.is_floating_point:
                # the all-reduces sum partial products in another order, and a rank's attention runs over half the
                # heads (other shapes, other BLAS blocking): float32 rounding, which follows the magnitudes a tensor is
                # made of (Gemma's residual stream, embeddings times sqrt(d_model), reaches 10+), not each element
                within_ulps_of_magnitude(cached[name], value, REORDERED_ULPS, name)
            else:
                assert torch.equal(cached[name], value), name


@pytest.mark.parametrize("arch", ARCHS)
def test_head_results_from_a_cache_of_z_equal_tp1(ranks, single, arch):
    model = single[arch]
    _, cache = model.run_with_cache(
        worker.prompt_tokens(model.cfg),
        names_filter=lambda hook: hook.endswith(("hook_z", "hook_resid_post", "hook_scale")),
    )
    through = cache.stack_head_results(layer=-1, pos_slice=-1, through_post_norm=True)
    for rank in ranks:
        torch.testing.assert_close(rank[arch]["head_results_through"], through, rtol=1e-6, atol=ATOL)
    if any(
        getattr(block, "output_norms", ()) for block in model.blocks
    ):  # post-norms: refused at tp=1, alike on every rank
        with pytest.raises(ValueError, match="normalises its sublayer outputs") as refused:
            cache.stack_head_results(layer=-1, pos_slice=-1)
        assert [rank[arch]["head_results"] for rank in ranks] == [f"ValueError: {refused.value}"] * len(ranks)
        return
    expected = cache.stack_head_results(layer=-1, pos_slice=-1)
    torch.testing.assert_close(through, expected, rtol=0, atol=0)  # no post-norm: the flag changes nothing
    for rank in ranks:
        torch.testing.assert_close(rank[arch]["head_results"], expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_expert_results_at_tp2_equal_tp1(ranks, single, arch):
    model = single[arch]
    _, cache = model.run_with_cache(worker.prompt_tokens(model.cfg))
    expected = cache.stack_expert_results(pos_slice=-1)
    for rank in ranks:
        torch.testing.assert_close(rank[arch]["expert_results"], expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_ablations_at_tp2_equal_tp1(ranks, single, arch):
    model = single[arch]
    tokens = worker.prompt_tokens(model.cfg)
    hooks = worker.with_model(worker.ablation_hooks(model.cfg), model)
    assert set(hooks) == set(ranks[0][arch]["ablations"])
    with torch.no_grad():
        clean = model(tokens)
        for label, pairs in hooks.items():
            expected = model.run_with_hooks(tokens, fwd_hooks=pairs)
            assert (expected - clean).abs().max() > 10 * ATOL, (
                f"{label} does not change the logits: the check would be empty"
            )
            for rank in ranks:
                torch.testing.assert_close(rank[arch]["ablations"][label], expected, rtol=0, atol=ATOL, msg=label)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_hook_that_differs_between_ranks_gives_the_first_ranks_result(ranks, single, arch):
    """The hook adds the rank's number: rank 0 adds 0, so both ranks must compute the unhooked model."""
    model = single[arch]
    with torch.no_grad():
        expected = model(worker.prompt_tokens(model.cfg))
    for rank in ranks:
        torch.testing.assert_close(rank[arch]["rank_dependent"], expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_collectives_only_where_a_hook_listens(ranks, single, arch):
    n_layers = single[arch].cfg.n_layers
    counts = ranks[0][arch]["collectives"]
    all_reduces = 1 + (2 + EXTRA_ALL_REDUCES_PER_LAYER.get(arch, 0)) * n_layers
    # Unhooked: the embedding and one all-reduce per sublayer, the logits gathered, the inputs compared once.
    assert counts["unhooked"] == {
        "all_reduce": all_reduces,
        "all_gather_single": 1,
        "broadcast": 0,
        "all_gather_object": 1,
    }
    # A hook that reads z: z gathered once more, the outcome of its hooks compared, nothing broadcast.
    assert counts["reading"]["all_gather_single"] == 2 and counts["reading"]["broadcast"] == 0
    # A hook that writes z: the first rank's result is broadcast once.
    assert counts["writing"]["all_gather_single"] == 2 and counts["writing"]["broadcast"] == 1
    assert counts["reading"]["all_reduce"] == counts["writing"]["all_reduce"] == all_reduces
    if "qk_norms" in counts:  # reading q_norm's and k_norm's hooks: the per-head points gathered, no all-reduce more
        # hook_normalized of both norms is split by head; hook_scale is too in Qwen3's per-head norms, and
        # replicated ([batch pos 1]) in OLMo 2's whole-projection ones.
        gathered = {"qwen3": 3, "qwen3_moe": 3, "olmo2": 2, "olmo2_mqa": 2, "gemma3": 3}[arch]
        assert counts["qk_norms"]["all_reduce"] == all_reduces
        assert counts["qk_norms"]["all_gather_single"] == 1 + gathered


@pytest.mark.parametrize("arch", ARCHS)
def test_sweep_at_tp2_equals_the_single_process_sweep(ranks, single, arch):
    model = single[arch]
    expected = hooked.sweep(
        model, worker.prompt_tokens(model.cfg), worker.sweep_variants(model.cfg), worker.sweep_metric(model)
    )
    for rank in ranks:
        result = rank[arch]["sweep"]
        assert result["variants"] == expected.variants
        torch.testing.assert_close(result["values"], expected.values, rtol=0, atol=ATOL)
        torch.testing.assert_close(result["base"], expected.base, rtol=0, atol=ATOL)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("how", ["dp_sweep", "world_sweep"])
def test_data_parallel_sweep_splits_the_variants_and_equals_one_process(ranks, single, arch, how):
    model = single[arch]
    variants = worker.sweep_variants(model.cfg)
    expected = hooked.sweep(model, worker.prompt_tokens(model.cfg), variants, worker.sweep_metric(model))
    ran = [set(rank[arch][how]["ran"]) for rank in ranks]
    assert ran[0] and ran[1] and not ran[0] & ran[1], "each rank runs its own share of the variants"
    assert ran[0] | ran[1] == set(variants)
    for rank in ranks:
        torch.testing.assert_close(
            rank[arch][how]["values"], expected.values, rtol=0, atol=ATOL
        )  # MoE: rows batched differently


@pytest.mark.parametrize("arch", ARCHS)
def test_generation_and_unembedding_rows_at_tp2(ranks, single, arch):
    model = single[arch]
    padded, mask = worker.padded_prompt(model.cfg)
    expected = model.generate(padded, max_new_tokens=4, attention_mask=mask, return_type="tokens")
    ids = torch.tensor([0, model.cfg.d_vocab // 2, model.cfg.d_vocab - 1])
    for rank in ranks:
        # Token ids from logits equal to ATOL (the all-reduces sum in another order): no two logits nearly tie here.
        # The unembedding rows are gathered from the shards, a copy: exact.
        assert torch.equal(rank[arch]["generated"], expected)
        torch.testing.assert_close(rank[arch]["directions"], model.tokens_to_residual_directions(ids), rtol=0, atol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_each_rank_holds_its_shard(ranks, single, arch):
    """Each rank's parameters: the split ones halved, the replicated ones (norms, position table, router,
    output biases, and key/value projections when there are fewer kv heads than ranks) whole."""
    model = single[arch]
    total = sum(p.numel() for p in model.parameters())
    whole = [
        "ln",
        "norm",
        "wpe",
        "mlp.gate.",
        "attn.c_proj.bias",
        "mlp.c_proj.bias",
        "o_proj.bias",
        "down_proj.bias",
        "attn.dense.bias",
        "dense_4h_to_h.bias",
    ]
    whole += ["k_proj", "v_proj"] if model.cfg.n_kv_heads < 2 else []
    # OLMo 2's q/k norms span every head: their weights are cut with the heads (k_norm's is whole with one kv head).
    cut = ["q_norm"] + (["k_norm"] if model.cfg.n_kv_heads >= 2 else []) if arch.startswith("olmo2") else []
    replicated = sum(
        p.numel()
        for name, p in model.named_parameters()
        if any(part in name for part in whole) and not any(part in name for part in cut)
    )
    for rank in ranks:
        assert rank[arch]["local_parameters"] == pytest.approx((total - replicated) / 2 + replicated, rel=0.01)


@pytest.fixture(scope="module")
def hybrid(checkpoints, tmp_path_factory) -> list[dict]:
    chosen = {name: checkpoints[name] for name in ("gpt2", "qwen3_moe")}
    return launch("hybrid", chosen, tmp_path_factory.mktemp("hybrid"), processes=4)


@pytest.mark.parametrize("arch", ["gpt2", "qwen3_moe"])
def test_sweep_over_data_parallel_groups_of_tensor_parallel_ranks(hybrid, single, arch):
    """Four ranks, tp=2: ranks 0-1 and 2-3 each hold one copy and run half of the variants."""
    model = single[arch]
    tokens = worker.prompt_tokens(model.cfg)
    variants = worker.sweep_variants(model.cfg)
    expected = hooked.sweep(model, tokens, variants, worker.sweep_metric(model))
    with torch.no_grad():
        logits = model(tokens)
    results = [rank[arch] for rank in hybrid]
    assert [(r["dp_rank"], r["tp_rank"]) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert (
        results[0]["ran"] == results[1]["ran"] and results[2]["ran"] == results[3]["ran"]
    )  # a copy's ranks run together
    first, second = set(results[0]["ran"]), set(results[2]["ran"])
    assert first and second and not first & second and first | second == set(variants)
    for result in results:
        torch.testing.assert_close(result["values"], expected.values, rtol=0, atol=ATOL)
        torch.testing.assert_close(result["logits"], logits, rtol=0, atol=ATOL)


# ----------------------------------------------------------------------------- failures
@pytest.fixture(scope="module")
def failures(checkpoints, tmp_path_factory) -> list[dict]:
    return launch("failures", {"gpt2": checkpoints["gpt2"]}, tmp_path_factory.mktemp("failures"))


@pytest.mark.parametrize(
    "case, on_rank_1, on_rank_0, text",
    [
        ("hook_raises_on_one_rank", "ValueError", "RankFailedError", "a mistake in this hook on rank 1"),
        ("bad_input_on_one_rank", "ValueError", "RankFailedError", "out of range"),
        ("cache_with_failing_hook", "KeyError", "RankFailedError", "hook_nope"),
        ("sweep_variant_fails_on_one_rank", "VariantError", "RankFailedError", "a mistake in this hook on rank 1"),
        ("dp_sweep_share_fails", "VariantError", "RankFailedError", "a mistake in this hook on rank 1"),
        ("different_inputs", "RankFailedError", "RankFailedError", "different"),
        ("wrong_shape_everywhere", "ValueError", "ValueError", "must keep the shape"),
    ],
)
def test_a_failing_rank_makes_every_rank_raise(failures, case, on_rank_1, on_rank_0, text):
    first, second = failures[0][case], failures[1][case]
    assert (first["raised"], second["raised"]) == (on_rank_0, on_rank_1), (first, second)
    assert text in second["message"] and text in first["message"], (first, second)
    if on_rank_0 == "RankFailedError" and on_rank_1 != "RankFailedError":
        assert "rank 1" in first["message"]


def test_after_failures_no_hook_is_left_and_the_model_still_works(failures):
    for rank in failures:
        assert rank["hooks_left"] == 0
        torch.testing.assert_close(rank["after"], rank["first"], rtol=0, atol=0)  # the same forward on each rank, twice


def test_a_stalled_rank_ends_in_an_error_after_the_timeout_not_a_hang(checkpoints, tmp_path):
    ranks = launch("stalled", {"gpt2": checkpoints["gpt2"]}, tmp_path)
    forward = ranks[0]["forward"]
    assert forward["raised"] is not None, "rank 0 returned although rank 1 never joined the collective"
    assert forward["seconds"] >= worker.STALL_TIMEOUT_S * 0.9  # it waited for the timeout, then raised
    assert ranks[1] == {"slept": True}


@pytest.mark.parametrize("arch", ARCHS)
def test_shard_bytes_predicts_what_each_rank_loaded(ranks, checkpoints, arch):
    from hooked.weights import shard_bytes

    predicted = shard_bytes(str(checkpoints[arch]), 2, torch.float32)
    for index, rank in enumerate(ranks):
        assert predicted[index]["total"] == rank[arch]["local_parameters"] * 4
        assert predicted[index]["split"] + predicted[index]["replicated"] == predicted[index]["total"]


# ----------------------------------------------------------------------------- single process
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_read_part_into_reads_exactly_the_slice(tmp_path, dtype):
    """Every dim, every range, into a contiguous or a strided destination, with or without a dtype change."""
    from safetensors.torch import save_file

    from hooked.weights import SafetensorsFile

    tensors = {
        "a": torch.randn(4, 6, 5, generator=torch.Generator().manual_seed(0)).to(dtype),
        "b": torch.randn(7, generator=torch.Generator().manual_seed(1)).to(dtype),
    }
    save_file(tensors, tmp_path / "t.safetensors")
    with SafetensorsFile(tmp_path / "t.safetensors") as file:
        for key, tensor in tensors.items():
            for dim in range(tensor.ndim):
                for start, stop in [(0, tensor.shape[dim]), (1, 3), (2, 2), (tensor.shape[dim] - 1, tensor.shape[dim])]:
                    expected = tensor.narrow(dim, start, stop - start)
                    for target_dtype in (dtype, torch.float32):
                        into = torch.full(expected.shape, float("nan"), dtype=target_dtype)
                        assert torch.equal(file.read_part_into(key, dim, start, stop, into), expected.to(target_dtype))
                    wide = torch.full((*expected.shape[:-1], expected.shape[-1] + 2), float("nan"), dtype=dtype)
                    file.read_part_into(key, dim, start, stop, wide[..., 1:-1])  # a strided destination
                    assert torch.equal(wide[..., 1:-1], expected) and wide[..., 0].isnan().all()
        with pytest.raises(hooked.CheckpointError, match="not \\[2, 9\\)"):
            file.read_part_into("a", 1, 2, 9, torch.empty(4, 7, 5, dtype=dtype))


def test_tp_without_torchrun_says_how_to_launch(checkpoints, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="torchrun --nproc-per-node"):
        hooked.load(checkpoints["gpt2"], tp=2)


@pytest.mark.parametrize(
    "config, tp, message",
    [
        (
            dict(num_attention_heads=4, num_key_value_heads=2),
            3,
            "n_heads \\(attention heads\\) = 4 is not divisible by tp=3",
        ),
        (dict(num_attention_heads=6, num_key_value_heads=3), 2, "n_kv_heads \\(key/value heads\\) = 3 neither divides"),
    ],
)
def test_a_tp_that_does_not_split_the_model_is_refused_before_reading(config, tp, message):
    from hooked.weights import shard_bytes

    base = dict(
        architectures=["Qwen3ForCausalLM"],
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=1,
        head_dim=8,
        vocab_size=50,
    )
    with pytest.raises(ValueError, match=message):
        shard_bytes({**base, **config}, tp)
