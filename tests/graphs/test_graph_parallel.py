"""Attribution graphs of a tensor-parallel model (tp=2, two processes on this CPU, gloo) equal one process's, on
every rank: a Llama with grouped-query attention (heads split over the ranks) and a Qwen3-MoE whose experts are
split over the ranks and replaced by a transcoder (tests/graphs/graph_parallel_worker.py, launched as
tests/infrastructure/test_distributed.py launches its worker). The backward crosses the attention's collectives:
the all-reduce of the q/k/v projections' input gradient and the output projection's all-reduce."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers  # builds the checkpoints (the dev extra)

import hooked
from tests import torchrun
from tests.graphs import graph_parallel_worker as worker
from tests.infrastructure.test_distributed import build

pytestmark = pytest.mark.slow  # torchrun: two processes

ATOL = 1e-5  # float32 rounding: the all-reduces sum partial products in another order
ROW_RTOL = 1e-5  # an adjacency entry's error over its row's largest entry (measured <= 1.3e-6)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("graph_parallel")
    return {
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
            ),
            transformers.LlamaForCausalLM,
        ),
        "qwen3_moe": build(
            root / "qwen3_moe",
            transformers.Qwen3MoeConfig(
                vocab_size=96,
                hidden_size=64,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                intermediate_size=80,
                moe_intermediate_size=32,
                num_experts=6,
                num_experts_per_tok=2,
                num_hidden_layers=2,
                mlp_only_layers=[0],
            ),
            transformers.Qwen3MoeForCausalLM,
        ),
    }


@pytest.fixture(scope="module")
def ranks(checkpoints, tmp_path_factory) -> list[dict]:
    return torchrun.ranks(worker.__file__, tmp_path_factory.mktemp("ranks"), checkpoints)


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_graph_at_tp2_equals_one_process(checkpoints, ranks, arch):
    model = hooked.load(checkpoints[arch])
    assert model.cfg.n_kv_heads < model.cfg.n_heads  # grouped-query attention
    assert model.cfg.is_sparse(model.cfg.n_layers - 1) == (arch == "qwen3_moe")
    expected = worker.graphs_of(model)
    gradient = expected.pop("gradient")
    assert gradient["grad"].abs().max() > 0.1
    for rank in ranks:
        got = rank[arch]["gradient"]
        # a sum of 1,358 log-probabilities of size ~5 with signs: rounding of ~1e-8 of their sum each
        torch.testing.assert_close(got["loss"], gradient["loss"], rtol=1e-4, atol=1e-4)
        error = (got["grad"] - gradient["grad"]).abs().max() / gradient["grad"].abs().max()
        assert error < ROW_RTOL, f"the gradient is off by {error:.2e} of its largest entry"
        assert not got["plain_forward_has_a_graph"]  # a shard's parameters need no gradient: inference as before
        assert "backward hooks are not supported on a model loaded with tp > 1" in got["backward_hook_refusal"]
    for case, want in expected.items():
        assert want["selected_features"].numel() > 0 and want["logit_ids"].numel() > 0
        assert want["adjacency"].abs().max() > 0.1
        for rank in ranks:
            got = rank[arch][case]
            # integer indices, exact: chosen from values equal to ATOL (the all-reduces sum in another order), none
            # within it of a threshold or a tie here
            for key in ("active_features", "selected_features", "logit_ids"):
                assert torch.equal(got[key], want[key]), (case, key)
            for key in ("activation_values", "logit_probabilities"):
                torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=ATOL, msg=f"{case}: {key}")
            # each entry to float32 rounding of its row's largest (a token's edges reach ~1e3, a feature's ~1)
            scale = want["adjacency"].abs().amax(1, keepdim=True)
            error = ((got["adjacency"] - want["adjacency"]).abs() / (scale + 1e-6)).max()
            assert error < ROW_RTOL, f"{case}: adjacency off by {error:.2e} of its row's largest entry"
