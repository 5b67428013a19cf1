"""Where a weight's memory comes from: `empty_weight`, an uninitialised tensor whose CPU pages are advised huge.

The advice is madvise(2)'s MADV_HUGEPAGE (Linux transparent huge pages: the kernel's
Documentation/admin-guide/mm/transhuge.rst), given through libc with ctypes before the file is read
into the tensor; elsewhere, or where transparent huge pages are off, it changes nothing.
"""

from __future__ import annotations

import ctypes
import functools
import sys

import torch

HUGE_PAGE = 2 * 1024 * 1024
MADV_HUGEPAGE = 14  # linux/mman.h


@functools.cache
def _madvise():
    """libc's madvise on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return madvise


def empty_weight(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialised weight tensor; on a Linux CPU, its whole 2 MiB pages are asked to be huge pages.

    Decoding one token streams every weight through the CPU once per step, and with 4 KiB pages
    the address translations miss the TLB along the way: huge pages make the same matmuls about 3%
    faster (benchmarks/generate.py). torch's allocator does this only when THP_MEM_ALLOC_ENABLE=1
    is set before torch starts; here the advice is given for the weights alone, before the file is
    read into them (the pages are not yet touched). Where transparent huge pages are off, the advice
    is a no-op.
    """
    tensor = torch.empty(shape, dtype=dtype, device=device)
    madvise = _madvise() if tensor.device.type == "cpu" else None
    if madvise is not None:
        start = -(-tensor.data_ptr() // HUGE_PAGE) * HUGE_PAGE
        end = (tensor.data_ptr() + tensor.nbytes) // HUGE_PAGE * HUGE_PAGE
        if end > start:
            madvise(start, end - start, MADV_HUGEPAGE)  # advice only: a failure changes nothing
    return tensor
