"""`FactoredMatrix` and the weight stacks (`W_Q` ... `b_out`, `OV`, `QK`), against the dense product and
against TransformerLens 3.9 on the same weights.

Properties (hypothesis, float64): every method agrees with the matrix A @ B formed densely, and with
TransformerLens' `FactoredMatrix` on the same factors. Models: GPT-2 (tl_gpt2 of
tests/transformer_lens/tl_reference.py) and a grouped-query Qwen3 (tl_qwen3), both loaded unfolded, must give
TransformerLens' weights, circuits and spectra, and the circuits must reproduce the cached activations.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hooked.factored import FactoredMatrix
from hooked.testing import random_model
from tests.transformer_lens.tl_reference import grouped_qwen3_pair, tl_gpt2

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from transformer_lens import FactoredMatrix as TLFactoredMatrix

SETTINGS = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
ATOL = 1e-9  # float64 property tests


def close(ours, theirs, atol=ATOL):
    assert ours.shape == theirs.shape, f"{tuple(ours.shape)} != {tuple(theirs.shape)}"
    torch.testing.assert_close(ours, theirs, rtol=0, atol=atol)


@st.composite
def factors(draw, square: bool = False, max_dim: int = 6):
    """(A, B) float64 with leading axes that broadcast (sometimes only one factor has them)."""
    leading = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    ldim, mdim = draw(st.integers(1, max_dim)), draw(st.integers(1, max_dim))
    rdim = ldim if square else draw(st.integers(1, max_dim))
    a_leading = leading if draw(st.booleans()) or not leading else (1,) * len(leading)
    b_leading = leading if a_leading != leading or draw(st.booleans()) else leading[1:]
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    A = torch.randn(*a_leading, ldim, mdim, generator=generator, dtype=torch.float64)
    B = torch.randn(*b_leading, mdim, rdim, generator=generator, dtype=torch.float64)
    return A, B


def same_multiset(ours: torch.Tensor, theirs: torch.Tensor, atol: float) -> None:
    """Complex values equal as multisets (zeros padded to the longer): nearest unused match for each."""
    ours, theirs = ours.flatten().tolist(), theirs.flatten().tolist()
    ours += [0j] * (len(theirs) - len(ours))
    theirs += [0j] * (len(ours) - len(theirs))
    for value in sorted(ours, key=abs, reverse=True):
        nearest = min(range(len(theirs)), key=lambda i: abs(theirs[i] - value))
        assert abs(theirs[nearest] - value) < atol, (value, theirs)
        theirs.pop(nearest)


# ----------------------------------------------------------------------------- against the dense product
@settings(max_examples=60, **SETTINGS)
@given(factors())
def test_products_and_shape_match_the_dense_matrix(pair):
    A, B = pair
    m, dense = FactoredMatrix(A, B), A @ B
    close(m.AB, dense)
    assert m.shape == dense.shape and m.ndim == dense.ndim
    assert (m.ldim, m.mdim, m.rdim) == (A.shape[-2], A.shape[-1], B.shape[-1])
    assert m.has_leading_dims == (dense.ndim > 2)
    close(m.T.AB, dense.transpose(-2, -1))
    first, second = m.pair
    close(first @ second, dense)
    close(m.unsqueeze(0).AB, dense.unsqueeze(0))
    close(m.get_corner(2), dense[tuple(slice(2) for _ in range(dense.ndim))])
    for scaled in (m * 2.5, 2.5 * m, m * torch.tensor(2.5, dtype=torch.float64)):
        close(scaled.AB, 2.5 * dense)
    if m.ldim == m.rdim:
        close(m.BA, B @ A)


@settings(max_examples=60, **SETTINGS)
@given(factors())
def test_svd_reconstructs_the_dense_matrix(pair):
    A, B = pair
    m, dense = FactoredMatrix(A, B), A @ B
    U, S, V = m.svd()
    k = min(m.ldim, m.mdim, m.rdim)
    assert U.shape[-2:] == (m.ldim, k) and S.shape[-1] == k and V.shape[-2:] == (m.rdim, k)
    close((U * S[..., None, :]) @ V.transpose(-2, -1), dense)
    close(S, torch.linalg.svdvals(dense)[..., :k])
    eye = torch.eye(k, dtype=torch.float64)
    close(U.transpose(-2, -1) @ U, eye.expand(*S.shape[:-1], k, k))
    close(V.transpose(-2, -1) @ V, eye.expand(*S.shape[:-1], k, k))
    assert (m.U, m.S, m.V) == (U, S, V)  # computed once
    close(m.norm(), torch.linalg.matrix_norm(dense))
    even = m.make_even()
    close(even.AB, dense)
    close(torch.linalg.svdvals(even.A)[..., :k], S.sqrt())
    close(torch.linalg.svdvals(even.B)[..., :k], S.sqrt())
    close(U @ m.collapse_l(), dense)
    close(m.collapse_r() @ V.transpose(-2, -1), dense)
    with pytest.warns(DeprecationWarning, match="use .V"):
        assert m.Vh is V


@settings(max_examples=60, **SETTINGS)
@given(factors(square=True))
def test_eigenvalues_are_those_of_the_dense_matrix(pair):
    A, B = pair
    m, dense = FactoredMatrix(A, B), A @ B
    eigenvalues = m.eigenvalues
    assert eigenvalues.is_complex() and eigenvalues.shape == (*dense.shape[:-2], m.mdim)
    flat_ours, flat_dense = eigenvalues.reshape(-1, m.mdim), torch.linalg.eigvals(dense).reshape(-1, m.ldim)
    for ours, theirs in zip(flat_ours, flat_dense, strict=True):
        same_multiset(ours, theirs, atol=1e-6)


@st.composite
def index_into(draw, shape: torch.Size):
    """An index for a FactoredMatrix of `shape` and the same selection of the dense matrix: ints on the
    row and column axes keep the axis (length 1), as TransformerLens."""
    n_leading = len(shape) - 2
    ours, dense = [], []
    for axis in range(draw(st.integers(1, len(shape)))):
        size, keep_axis = shape[axis], axis >= n_leading
        # At most one list (torch would pair several up), never on the column axis (torch then moves the
        # paired axes of B to the front: TransformerLens' indexing has the same limit).
        kinds = ["int", "slice"] + (
            ["list"] if axis <= n_leading and not any(isinstance(e, list) for e in ours) else []
        )
        kind = draw(st.sampled_from(kinds))
        if kind == "int":
            i = draw(st.integers(-size, size - 1))
            ours.append(i)
            dense.append(slice(i, i + 1 if i != -1 else None) if keep_axis else i)
        elif kind == "slice":
            start = draw(st.integers(0, size - 1))
            ours.append(slice(start, draw(st.integers(start + 1, size))))
            dense.append(ours[-1])
        else:
            ours.append(draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=3)))
            dense.append(ours[-1])
    return tuple(ours), tuple(dense)


@settings(max_examples=80, **SETTINGS)
@given(st.data())
def test_indexing_then_product_equals_product_then_indexing(data):
    A, B = data.draw(factors())
    m = FactoredMatrix(A, B)
    index, dense_index = data.draw(index_into(m.shape))
    picked = m[index]
    assert isinstance(picked, FactoredMatrix)
    close(picked.AB, m.AB[dense_index])
    theirs = TLFactoredMatrix(A, B)[index]
    close(picked.A, theirs.A)
    close(picked.B, theirs.B)


@settings(max_examples=60, **SETTINGS)
@given(factors(), st.integers(1, 8), st.integers(0, 2**31))
def test_matmul_with_tensors_and_factored_matrices_on_both_sides(pair, width, seed):
    A, B = pair
    m, dense = FactoredMatrix(A, B), A @ B
    generator = torch.Generator().manual_seed(seed)
    right = torch.randn(m.rdim, width, generator=generator, dtype=torch.float64)
    left = torch.randn(width, m.ldim, generator=generator, dtype=torch.float64)
    for product, expected in ((m @ right, dense @ right), (left @ m, left @ dense)):
        assert isinstance(product, FactoredMatrix)
        close(product.AB, expected)
    # the narrower middle is kept: mdim, or the side that is already narrower
    assert (m @ right).mdim == min(m.mdim, m.rdim)
    assert (left @ m).mdim == min(m.mdim, m.ldim)
    vector_r = torch.randn(m.rdim, generator=generator, dtype=torch.float64)
    vector_l = torch.randn(m.ldim, generator=generator, dtype=torch.float64)
    close(m @ vector_r, dense @ vector_r)
    close(vector_l @ m, vector_l @ dense)
    other = FactoredMatrix(
        torch.randn(m.rdim, 2, generator=generator, dtype=torch.float64),
        torch.randn(2, width, generator=generator, dtype=torch.float64),
    )
    close((m @ other).AB, dense @ other.AB)
    close((other.T @ m.T).AB, (dense @ other.AB).transpose(-2, -1))


@settings(max_examples=40, **SETTINGS)
@given(factors(square=True))
def test_every_method_equals_transformer_lens(pair):
    A, B = pair
    ours, theirs = FactoredMatrix(A, B), TLFactoredMatrix(A, B)
    assert ours.shape == theirs.shape and (ours.ldim, ours.mdim, ours.rdim) == (theirs.ldim, theirs.mdim, theirs.rdim)
    assert repr(ours) == repr(theirs) and ours.ndim == theirs.ndim
    for name in ("AB", "BA", "U", "S", "V", "eigenvalues"):
        close(getattr(ours, name), getattr(theirs, name), atol=1e-8)
    for name in ("norm", "collapse_l", "collapse_r", "get_corner"):
        close(getattr(ours, name)(), getattr(theirs, name)(), atol=1e-8)
    for name in ("T", "make_even"):
        mine, reference = getattr(ours, name), getattr(theirs, name)
        mine, reference = (mine(), reference()) if callable(mine) else (mine, reference)
        close(mine.A, reference.A, atol=1e-8)
        close(mine.B, reference.B, atol=1e-8)
    right = torch.ones(ours.rdim, 3, dtype=torch.float64)
    for mine, reference in (
        (ours @ right, theirs @ right),
        (right.T @ ours, right.T @ theirs),
        (ours * 3, theirs * 3),
        (ours.unsqueeze(0), theirs.unsqueeze(0)),
    ):
        close(mine.A, reference.A)
        close(mine.B, reference.B)


# ----------------------------------------------------------------------------- errors
@pytest.mark.unchecked
def test_bad_shapes_and_operands_raise():
    m = FactoredMatrix(torch.randn(2, 4, 3), torch.randn(3, 5))
    with pytest.raises(ValueError, match="inner axis"):
        FactoredMatrix(torch.randn(4, 3), torch.randn(2, 5))
    with pytest.raises(ValueError, match="leading axes do not broadcast"):
        FactoredMatrix(torch.randn(2, 4, 3), torch.randn(3, 3, 5))
    with pytest.raises(ValueError, match="at least two axes"):
        FactoredMatrix(torch.randn(4), torch.randn(4, 2))
    with pytest.raises(ValueError, match="BA needs a square"):
        _ = m.BA
    with pytest.raises(ValueError, match="BA needs a square"):
        _ = m.eigenvalues
    with pytest.raises(ValueError, match="too many entries"):
        m[0, 1, 2, 3]
    with pytest.raises(ValueError, match="scalar"):
        m * torch.ones(2)
    with pytest.raises(ValueError, match=r"cannot multiply a FactoredMatrix of shape \(2, 4, 5\)"):
        m @ torch.randn(4, 2)
    with pytest.raises(ValueError, match=r"cannot multiply a matrix of shape \(2, 5\)"):
        torch.randn(2, 5) @ m
    assert repr(m) == "FactoredMatrix: Shape(torch.Size([2, 4, 5])), Hidden Dim(3)"


# ----------------------------------------------------------------------------- models against TransformerLens
@pytest.fixture(scope="module")
def tl(gpt2_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tl_gpt2(gpt2_dir, with_tokenizer=False)


@pytest.fixture(scope="module")
def qwen3_pair(tmp_path_factory):
    """A grouped-query Qwen3 (4 query heads over 2 key/value heads), hooked and TransformerLens, same weights."""
    return grouped_qwen3_pair(tmp_path_factory.mktemp("qwen3-gqa"))


WEIGHT_NAMES = (
    "W_Q",
    "W_K",
    "W_V",
    "W_O",
    "b_Q",
    "b_K",
    "b_V",
    "b_O",
    "W_in",
    "W_out",
    "b_in",
    "b_out",
    "W_E",
    "W_U",
    "b_U",
)


def assert_weights_match(ours, theirs, names):
    """Exact (atol=0): both libraries hold the checkpoint's numbers, rearranged (views, reshapes, copies)."""
    for name in names:
        close(getattr(ours, name).detach(), getattr(theirs, name).detach(), atol=0)
    for block, tl_block in zip(ours.blocks, theirs.blocks, strict=True):
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            close(getattr(block.attn, name).detach(), getattr(tl_block.attn, name).detach(), atol=0)
        for name in ("W_in", "W_out", "b_in", "b_out"):
            close(getattr(block.mlp, name).detach(), getattr(tl_block.mlp, name).detach(), atol=0)


def assert_circuits_match(ours, theirs):
    with torch.no_grad():
        for name in ("OV", "QK"):
            mine, reference = getattr(ours, name), getattr(theirs, name)
            assert isinstance(mine, FactoredMatrix) and mine.shape == reference.shape
            close(mine.A, reference.A, atol=0)
            close(mine.B, reference.B, atol=0)
            close(mine.AB, reference.AB, atol=1e-6)
            close(mine.S, reference.S, atol=1e-5)
            close(mine.norm(), reference.norm(), atol=1e-5)
            close(mine.eigenvalues, reference.eigenvalues, atol=1e-5)
            close(mine.get_corner(4), reference.get_corner(4), atol=1e-6)
            for i in range(ours.cfg.n_layers):
                block_circuit = getattr(ours.blocks[i].attn, name)
                close(block_circuit.AB, getattr(theirs.blocks[i].attn, name).AB, atol=1e-6)
                close(block_circuit[1].AB, mine[i, 1].AB, atol=0)  # the same factors, the same product
            close((ours.W_E @ mine[0, 1] @ ours.W_U).AB, (theirs.W_E @ reference[0, 1] @ theirs.W_U).AB, atol=1e-5)


def test_gpt2_weights_and_circuits_match_transformer_lens(gpt2, tl):
    assert_weights_match(gpt2, tl, WEIGHT_NAMES + ("W_pos", "W_E_pos"))
    assert_circuits_match(gpt2, tl)


def test_grouped_query_weights_are_repeated_per_query_head_as_transformer_lens(qwen3_pair):
    ours, theirs = qwen3_pair
    assert ours.W_K.shape == (2, 4, 32, 8) and ours.b_V.shape == (2, 4, 8)
    assert_weights_match(ours, theirs, WEIGHT_NAMES)
    assert_circuits_match(ours, theirs)
    for block, tl_block in zip(ours.blocks, theirs.blocks, strict=True):
        # exact: the checkpoint's numbers, rearranged
        close(block.attn.W_K_grouped.detach(), tl_block.attn._W_K.detach(), atol=0)
        close(block.attn.W_V_grouped.detach(), tl_block.attn._W_V.detach(), atol=0)
        close(block.attn.W_K[3], block.attn.W_K_grouped[1], atol=0)  # query head 3 reads key/value head 3 // 2
        close(block.attn.b_K_grouped, tl_block.attn._b_K.detach(), atol=0)
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        close(ours(tokens), theirs(tokens), atol=1e-5)  # the reference computes the same function


def test_ov_circuit_reproduces_each_heads_write(gpt2, tokens):
    """hook_result[h] = pattern[h] @ (ln1(x) @ OV[h] + b_V[h] @ W_O[h])."""
    _, cache = gpt2.run_with_cache(
        tokens, names_filter=["blocks.1.hook_resid_pre", "blocks.1.attn.hook_pattern", "blocks.1.attn.hook_result"]
    )
    attn = gpt2.blocks[1].attn
    with torch.no_grad():
        x = gpt2.blocks[1].ln1(cache["resid_pre", 1])
        values = (
            torch.einsum("bkm,hmn->bhkn", x, attn.OV.AB) + torch.einsum("hd,hdm->hm", attn.b_V, attn.W_O)[None, :, None]
        )
        result = torch.einsum("bhqk,bhkn->bqhn", cache["pattern", 1], values)
    close(result, cache["result", 1], atol=1e-5)


def test_qk_circuit_reproduces_the_attention_scores(gpt2, tokens):
    """scores * sqrt(d_head) = x_q QK x_k^T + the bias terms, where the query is the left factor."""
    _, cache = gpt2.run_with_cache(tokens, names_filter=["blocks.0.hook_resid_pre", "blocks.0.attn.hook_attn_scores"])
    attn = gpt2.blocks[0].attn
    with torch.no_grad():
        x = gpt2.blocks[0].ln1(cache["resid_pre", 0])
        q_bias = torch.einsum("bkm,hmd,hd->bhk", x, attn.W_K, attn.b_Q)[:, :, None, :]
        k_bias = torch.einsum("bqm,hmd,hd->bhq", x, attn.W_Q, attn.b_K)[:, :, :, None]
        both = (attn.b_Q * attn.b_K).sum(-1)[None, :, None, None]
        scores = torch.einsum("bqm,hmn,bkn->bhqk", x, attn.QK.AB, x) + q_bias + k_bias + both
    causal = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).tril()
    close(scores[..., causal] / gpt2.cfg.d_head**0.5, cache["attn_scores", 0][..., causal], atol=1e-5)


def test_stacks_follow_the_parameters_they_read(gpt2):
    """Views of the loaded weights: editing a parameter shows in the block's W_Q and the next stack."""
    attn = gpt2.blocks[0].attn
    before = gpt2.W_Q.clone()
    original = attn.c_attn.weight[0, 0].item()
    with torch.no_grad():
        attn.c_attn.weight[0, 0] = 5.0
        try:
            for edited in (attn.W_Q[0], gpt2.W_Q[0, 0], attn.QK.A[0], gpt2.QK.A[0, 0]):
                assert edited[0, 0] == 5.0
                assert torch.equal(edited[1:], before[0, 0, 1:])
        finally:
            attn.c_attn.weight[0, 0] = original  # the shared model, restored bit for bit
    assert torch.equal(gpt2.W_Q, before)


def test_mlp_stacks_of_a_model_with_sparse_layers_raise_naming_the_block():
    model = random_model("qwen3_moe", n_layers=2, decoder_sparse_step=2)  # block 1 sparse, block 0 dense
    assert model.W_Q.shape == (2, 4, 32, 8) and model.OV.shape == (2, 4, 32, 32)
    for name in ("W_in", "W_out", "b_in"):
        with pytest.raises(
            ValueError, match=rf"model.{name} stacks blocks\[i\].mlp.{name}.*block 1: .*mixture-of-experts"
        ):
            getattr(model, name)
    all_sparse = random_model("qwen3_moe", n_layers=2)
    assert all_sparse.W_in.shape == (2, 4, 32, 16)  # [n_layers n_experts d_model d_expert_mlp]
