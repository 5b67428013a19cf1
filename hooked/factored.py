"""`FactoredMatrix`: a matrix kept as the product of two factors, A @ B, as TransformerLens 3.9 has it.

A head's OV circuit W_V @ W_O and QK circuit W_Q @ W_K^T are [d_model d_model] matrices of rank at
most d_head. Kept factored, their SVD, eigenvalues and norm cost O(d_model * d_head^2) instead of
O(d_model^3), and a product with an embedding or unembedding ([d_vocab d_model]) stays factored
through the narrow middle. The semantics follow TransformerLens 3.9's `FactoredMatrix`
(transformer_lens/FactoredMatrix.py), method for method; tests/transformer_lens/test_factored.py compares the two on
the same weights.

Axes: A is [... ldim mdim], B is [... mdim rdim]; leading axes broadcast (a model's `OV` is
[n_layers head_index d_model d_model], factored through d_head).

    ov = model.blocks[1].attn.OV           # [head_index d_model d_model]
    ov[3].S                                # head 3's singular values [d_head]
    (model.W_E @ ov[3] @ model.W_U).AB     # the full OV circuit of head 3, [d_vocab d_vocab]
"""

from __future__ import annotations

import functools
import warnings

import torch
from jaxtyping import Complex, Float
from torch import Tensor

from hooked.hooks import AssertionValueError


class FactoredMatrix:
    """The matrix A @ B without forming it: A [... ldim mdim], B [... mdim rdim], leading axes broadcast.

    m = FactoredMatrix(W_V, W_O)   # [head_index d_model d_model] through d_head
    m.AB                           # the product, [head_index d_model d_model]
    m.S, m.norm()                  # singular values [head_index d_head], Frobenius norms [head_index]
    m[0] @ unembed                 # still factored: FactoredMatrix [d_model d_vocab]
    """

    def __init__(self, A: Float[Tensor, "... ldim mdim"], B: Float[Tensor, "... mdim rdim"]):
        if A.ndim < 2 or B.ndim < 2:
            raise ValueError(
                f"FactoredMatrix takes two factors of at least two axes, got shapes {tuple(A.shape)} and "
                f"{tuple(B.shape)}"
            )
        if A.shape[-1] != B.shape[-2]:
            raise AssertionValueError(
                f"FactoredMatrix factors must match on the inner axis: A {tuple(A.shape)}, B {tuple(B.shape)}"
            )
        self.ldim, self.mdim, self.rdim = A.shape[-2], A.shape[-1], B.shape[-1]
        self.has_leading_dims = A.ndim > 2 or B.ndim > 2
        try:
            leading = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        except RuntimeError as error:
            raise ValueError(
                f"FactoredMatrix factors' leading axes do not broadcast: A {tuple(A.shape)}, B {tuple(B.shape)}"
            ) from error
        self.shape = torch.Size((*leading, self.ldim, self.rdim))
        # Views, not copies: a factor shared by every head stays one tensor in memory.
        self.A = A.broadcast_to((*leading, self.ldim, self.mdim))
        self.B = B.broadcast_to((*leading, self.mdim, self.rdim))

    # ------------------------------------------------------------------ products
    def __matmul__(self, other: Tensor | FactoredMatrix) -> FactoredMatrix | Tensor:
        """`self @ other`: a FactoredMatrix for a matrix or a FactoredMatrix, a tensor [... ldim] for a vector."""
        if isinstance(other, FactoredMatrix):
            return (self @ other.A) @ other.B
        if other.ndim < 2:  # a vector: the result is a vector, nothing left to factor
            return (self.A @ (self.B @ other.unsqueeze(-1))).squeeze(-1)
        if other.shape[-2] != self.rdim:
            raise AssertionValueError(
                f"cannot multiply a FactoredMatrix of shape {tuple(self.shape)} by a matrix of shape "
                f"{tuple(other.shape)}"
            )
        # Keep the narrower of the two middles: mdim, or rdim when that is already narrower.
        if self.rdim > self.mdim:
            return FactoredMatrix(self.A, self.B @ other)
        return FactoredMatrix(self.AB, other)

    def __rmatmul__(self, other: Tensor) -> FactoredMatrix | Tensor:
        """`other @ self`: a FactoredMatrix for a matrix, a tensor [... rdim] for a vector."""
        if other.shape[-1] != self.ldim:
            raise AssertionValueError(
                f"cannot multiply a matrix of shape {tuple(other.shape)} by a FactoredMatrix of shape "
                f"{tuple(self.shape)}"
            )
        if other.ndim < 2:
            return ((other.unsqueeze(-2) @ self.A) @ self.B).squeeze(-2)
        if self.ldim > self.mdim:
            return FactoredMatrix(other @ self.A, self.B)
        return FactoredMatrix(other, self.AB)

    def __mul__(self, scalar: int | float | Tensor) -> FactoredMatrix:
        """Scaled by a number (or a one-element tensor): A is scaled, B is kept."""
        if isinstance(scalar, Tensor) and scalar.numel() != 1:
            raise AssertionValueError(
                f"a FactoredMatrix is multiplied by a scalar, not a tensor of shape {tuple(scalar.shape)}; use @ for "
                "matrices"
            )
        return FactoredMatrix(self.A * scalar, self.B)

    def __rmul__(self, scalar: int | float | Tensor) -> FactoredMatrix:
        return self * scalar

    @property
    def AB(self) -> Float[Tensor, "... ldim rdim"]:
        """The product, formed: [... ldim rdim] (can be large)."""
        return self.A @ self.B

    @property
    def BA(self) -> Float[Tensor, "... mdim mdim"]:
        """The product the other way round, B @ A [... mdim mdim]: needs ldim == rdim. It has AB's non-zero
        eigenvalues."""
        if self.ldim != self.rdim:
            raise AssertionValueError(
                f"BA needs a square FactoredMatrix (ldim == rdim), this one has shape {tuple(self.shape)}"
            )
        return self.B @ self.A

    @property
    def T(self) -> FactoredMatrix:
        """The transpose, (A @ B)^T = B^T @ A^T, still factored."""
        return FactoredMatrix(self.B.transpose(-2, -1), self.A.transpose(-2, -1))

    @property
    def pair(self) -> tuple[Tensor, Tensor]:
        """The factors, (A, B)."""
        return self.A, self.B

    # ------------------------------------------------------------------ spectrum
    @functools.cached_property
    def _svd(self) -> tuple[Tensor, Tensor, Tensor]:
        # A = Ua Sa Vha and B = Ub Sb Vhb, so AB = Ua (Sa Vha Ub Sb) Vhb: only the small middle matrix
        # [min(ldim, mdim) min(mdim, rdim)] needs a new SVD; the outer orthogonal factors absorb its U and V.
        Ua, Sa, Vha = torch.linalg.svd(self.A, full_matrices=False)
        Ub, Sb, Vhb = torch.linalg.svd(self.B, full_matrices=False)
        middle = ((Sa[..., :, None] * Vha) @ Ub) * Sb[..., None, :]
        Um, Sm, Vhm = torch.linalg.svd(middle, full_matrices=False)
        return Ua @ Um, Sm, Vhb.transpose(-2, -1) @ Vhm.transpose(-2, -1)

    def svd(self) -> tuple[Float[Tensor, "... ldim k"], Float[Tensor, "... k"], Float[Tensor, "... rdim k"]]:
        """(U, S, V) with AB = U @ diag(S) @ V^T, k = min(ldim, mdim, rdim); computed once per matrix.

        As TransformerLens, the third factor is V (columns are right singular vectors), not V^T.
        """
        return self._svd

    @property
    def U(self) -> Float[Tensor, "... ldim k"]:
        return self.svd()[0]

    @property
    def S(self) -> Float[Tensor, "... k"]:
        return self.svd()[1]

    @property
    def V(self) -> Float[Tensor, "... rdim k"]:
        """Right singular vectors: AB = U @ diag(S) @ V^T."""
        return self.svd()[2]

    @property
    def Vh(self) -> Float[Tensor, "... rdim k"]:
        """V, under TransformerLens' old name (deprecated there too: it never was V^H)."""
        warnings.warn(
            "FactoredMatrix.Vh returns V (right singular vectors), as TransformerLens 3.9; use .V",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.svd()[2]

    @property
    def eigenvalues(self) -> Complex[Tensor, "... mdim"]:
        """The eigenvalues of BA (complex): AB's non-zero eigenvalues, computed on the mdim x mdim matrix.

        If BA v = k v then AB (Av) = A (BA v) = k Av. 16-bit factors are computed in float32 (eig has no
        16-bit kernel).
        """
        square = self.BA
        if square.dtype in (torch.float16, torch.bfloat16):
            square = square.float()
        return torch.linalg.eigvals(square)

    def norm(self) -> Float[Tensor, ...]:
        """The Frobenius norm, from the singular values: sqrt(sum S^2), one per leading index."""
        return self.S.pow(2).sum(-1).sqrt()

    def make_even(self) -> FactoredMatrix:
        """The same matrix factored as (U sqrt(S), sqrt(S) V^T): both halves carry half the spectrum."""
        root = self.S.sqrt()
        return FactoredMatrix(self.U * root[..., None, :], root[..., :, None] * self.V.transpose(-2, -1))

    def collapse_l(self) -> Float[Tensor, "... k rdim"]:
        """diag(S) @ V^T: the matrix with its left orthogonal factor U removed."""
        return self.S[..., :, None] * self.V.transpose(-2, -1)

    def collapse_r(self) -> Float[Tensor, "... ldim k"]:
        """U @ diag(S): the matrix with its right orthogonal factor V^T removed."""
        return self.U * self.S[..., None, :]

    # ------------------------------------------------------------------ shape and indexing
    @property
    def ndim(self) -> int:
        return len(self.shape)

    def unsqueeze(self, k: int) -> FactoredMatrix:
        """A new axis at `k` in both factors (counted as in each factor, as TransformerLens)."""
        return FactoredMatrix(self.A.unsqueeze(k), self.B.unsqueeze(k))

    def get_corner(self, k: int = 3) -> Tensor:
        """The top-left k x ... x k corner of AB (every axis cut to k), formed from k rows and k columns only."""
        corner = self.A[..., :k, :] @ self.B[..., :, :k]
        return corner[tuple(slice(k) for _ in range(corner.ndim))]

    def __getitem__(self, index) -> FactoredMatrix:
        """Index the leading axes, then optionally the rows (ldim) and the columns (rdim), as TransformerLens.

        An int on a leading axis drops it; an int on the row or column axis keeps it (length 1), so
        the result is always a FactoredMatrix.
        """
        index = index if isinstance(index, tuple) else (index,)
        n_leading = self.ndim - 2
        given = sum(entry is not None for entry in index)  # None adds an axis and indexes none
        if given <= n_leading:
            return FactoredMatrix(self.A[index], self.B[index])
        if given > self.ndim:
            raise ValueError(f"index {index} has too many entries for a FactoredMatrix of shape {tuple(self.shape)}")
        *leading, last = index
        if given == n_leading + 1:  # leading axes, then rows of A
            return FactoredMatrix(self.A[(*leading, _keep_axis(last))], self.B[tuple(leading)])
        *leading, rows = leading
        return FactoredMatrix(self.A[(*leading, _keep_axis(rows))], self.B[(*leading, slice(None), _keep_axis(last))])

    def __repr__(self) -> str:
        return f"FactoredMatrix: Shape({self.shape}), Hidden Dim({self.mdim})"


def _keep_axis(entry):
    """An int index as a length-1 slice (the row and column axes are never dropped); anything else as is."""
    if isinstance(entry, int):
        return slice(entry, entry + 1 if entry != -1 else None)
    return entry


def ov_circuit(attention) -> FactoredMatrix:
    """An attention module's OV circuits, W_V @ W_O: [head_index d_model d_model] through d_head."""
    return FactoredMatrix(attention.W_V, attention.W_O)


def qk_circuit(attention) -> FactoredMatrix:
    """An attention module's QK circuits, W_Q @ W_K^T: [head_index d_model d_model] through d_head
    (rows read the query's residual stream, columns the key's)."""
    return FactoredMatrix(attention.W_Q, attention.W_K.transpose(-2, -1))
