"""The transcoders an attribution graph runs through: a transcoder set or a cross-layer transcoder, which answer the
graph's per-layer questions themselves (hooked/sae/transcoders.py). `fitted` takes what a user passes and checks it
against the model (`hooked.sae.check_fits`) before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hooked.sae.clt import CrossLayerTranscoder
from hooked.sae.dictionary import Dictionary
from hooked.sae.fits import check_fits
from hooked.sae.transcoders import TranscoderSet, as_transcoders

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

Transcoders = TranscoderSet | CrossLayerTranscoder  # what the graph's code asks, layer by layer


def fitted(
    transcoders: Sequence[Dictionary] | TranscoderSet | CrossLayerTranscoder, model: HookedTransformer
) -> Transcoders:
    """`transcoders` (a list of per-layer transcoders, layer l at index l, a TranscoderSet or a CLT) as a
    TranscoderSet or a CLT whose features are vectors and which fits `model`; refused with the problem named."""
    tc = as_transcoders(transcoders)
    tc.check_linear()
    check_fits(model, tc)
    return tc
