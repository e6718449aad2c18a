"""A CUDA softmax work log's ladder in numba-cuda: CPU loops (seed 000), four row kernels (seeds
000/003: thread per row three-pass and online, block per row with a shared-memory tree and with warp
shuffles) and seed 002's three-kernel 1-D softmax. Run them with ``onlinesoftmax bench ladder``.

Needs the ``ladder`` extra (``pip install 'onlinesoftmax[ladder]'``); ``import onlinesoftmax`` does
not import this package. Set ``NUMBA_ENABLE_CUDASIM=1`` before the first import of ``numba.cuda``
to run every step but the warp-shuffle one on CPU tensors in numba's CUDA simulator.
"""

import numpy as _np

if not hasattr(_np, "row_stack"):
    # numba-cuda 0.30 registers an implementation for np.row_stack when it compiles its first
    # kernel; NumPy 2.4 removed that alias of vstack, and the GPU machine's image pairs the two.
    # A stand-in function (not vstack itself, so nothing is registered twice) lets it load.
    def _row_stack(tup, *, dtype=None, casting="same_kind"):
        return _np.vstack(tup, dtype=dtype, casting=casting)

    _np.row_stack = _row_stack

try:
    import numba  # noqa: F401
    from numba import cuda  # noqa: F401
except ImportError as exc:
    raise ImportError("onlinesoftmax.ladder needs numba-cuda: pip install 'onlinesoftmax[ladder]' "
                      f"({exc})") from exc

from .cpu import softmax_three_loops, softmax_two_loops
from .kernels import (ROW_STEPS, SIMULATED, softmax_block_shared_tree, softmax_block_warp_shuffle,
                      softmax_online_per_thread, softmax_three_pass_per_thread, softmax_vector_three_kernels)

__all__ = ["ROW_STEPS", "SIMULATED", "softmax_three_loops", "softmax_two_loops", "softmax_three_pass_per_thread",
           "softmax_online_per_thread", "softmax_block_shared_tree", "softmax_block_warp_shuffle",
           "softmax_vector_three_kernels"]
