"""Output and scratch allocation for every op's launcher.

Every buffer a kernel is expected to fill comes from :func:`empty`, so the tests can replace it with
a NaN-filled allocation: an element that no kernel wrote then fails the comparison instead of
passing on whatever memory happened to hold.
"""

from __future__ import annotations

import torch


def empty(shape, dtype, device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)
