"""Dictionaries spliced into a tensor-parallel model (tp=2, two processes on this CPU, gloo) compute what they
compute in one process: the splice, a feature held at a value, a sweep over features, generation with the feature
held and a sparse cache (tests/sae/feature_parallel_worker.py, launched as tests/infrastructure/test_distributed.py
launches its worker)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers  # builds the Qwen3-MoE checkpoint (the dev extra)

import hooked
from hooked.testing import build_gpt2_checkpoint
from tests import torchrun
from tests.infrastructure.test_distributed import ATOL, build
from tests.sae import feature_parallel_worker as worker

pytestmark = pytest.mark.slow  # torchrun: two processes


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sae_parallel")
    return {
        "gpt2": build_gpt2_checkpoint(root / "gpt2", n_layer=2, n_embd=64, n_head=4),
        # experts split over the ranks: the transcoder replaces the last block's whole mixture of experts
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


@pytest.mark.parametrize("arch", ["gpt2", "qwen3_moe"])
def test_features_at_tp2_equal_one_process(checkpoints, ranks, arch):
    expected = worker.features(hooked.load(checkpoints[arch]))
    assert expected["is_sparse"] == (arch == "qwen3_moe")
    for rank in ranks:
        got = rank[arch]
        for key in ("spliced", "held"):
            torch.testing.assert_close(got[key], expected[key], rtol=0, atol=ATOL)
        for key in ("values", "base"):
            torch.testing.assert_close(got["sweep"][key], expected["sweep"][key], rtol=0, atol=ATOL)
        # Token ids from logits equal to ATOL (the all-reduces sum in another order): no two logits nearly tie here
        assert torch.equal(got["generated"], expected["generated"])
        for name, dense in expected["features"].items():
            torch.testing.assert_close(got["features"][name], dense, rtol=0, atol=ATOL)
    assert (expected["held"] - expected["spliced"]).abs().max() > 1e-3
