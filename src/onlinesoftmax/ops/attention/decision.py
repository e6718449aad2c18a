"""An attention launch decision (``AttentionPlan``): what ``plan.attention_plan`` and
``plan.backward_plans`` return, what the launchers launch, what ``explain`` prints. The tables and
rules that make one are ``plan.py``'s."""

from __future__ import annotations

import dataclasses

import torch

from ..._launch import RegisterCap


@dataclasses.dataclass(frozen=True)
class AttentionPlan(RegisterCap):
    """One attention launch decision. ``path`` is "triton" or "torch" (CPU tensors, no interpreter)."""

    kernel: str
    path: str
    head_dim: int
    dtype: torch.dtype
    causal: bool
    use_descriptor: bool = False
    row_descriptors: bool = False
    warp_specialize: bool = False
    block_m: int = 0
    block_n: int = 0
    block_d: int = 0  # the head dim padded to a power of two, or its first part where it is split
    block_d2: int = 0  # the split head dim's second part (0: not split)
    num_warps: int = 0
    num_stages: int = 0
    max_registers: int = 0  # a cap on registers a thread (Triton's maxnreg); 0: the compiler's choice
    group_split: int = 1  # dK/dV, KV-stationary forward: programs sharing a KV head's GQA group
    heavy_first: bool = False  # causal backward: the grid (programs, blocks), heaviest blocks first
    blocks: int = 0  # split backward: the grid's key blocks (dK/dV) or query blocks (dQ); 0 where not planned
    kv_stationary: bool = False  # forward: one program a KV head (ATTENTION_FORWARD_KV_STATIONARY)
    key_halves: bool = False  # KV-stationary causal: a tile whose rows end before the keys' second half skips it

    def describe(self) -> str:
        if self.path == "torch":
            return f"attention {self.kernel}: torch (blockwise online, CPU), head dim {self.head_dim}"
        loads = "TMA tensor descriptors" if self.use_descriptor else "masked pointer loads"
        if self.warp_specialize:
            loads = "warp-specialized, TMA row descriptors (12 warps: a producer and two consumer warpgroups)"
        elif self.row_descriptors:
            loads = f"TMA row descriptors for whole key blocks, {loads} on the diagonal and past the last key"
        cap = f", at most {self.max_registers} registers a thread" if self.max_registers else ""
        if self.group_split > 1 and not self.kv_stationary:
            cap += f", each GQA group over {self.group_split} programs (float32 partials, summed after)"
        if self.heavy_first:
            cap += ", every head's heaviest block launched first"
        if self.kv_stationary:
            each = "one program" if self.group_split == 1 else f"{self.group_split} programs"
            loads = f"{loads}, {each} a KV head holding its keys and values, over its query heads' blocks"
            if self.key_halves:
                loads += ", keys in two halves (a block whose rows end before the second skips it)"
        dims = (f"computed as {self.block_d} + {self.block_d2}" if self.block_d2
                else f"padded to {self.block_d}" if self.block_d != self.head_dim else "unpadded")
        return (f"attention {self.kernel}: BLOCK_M {self.block_m}, BLOCK_N {self.block_n}, head dim "
                f"{self.head_dim} {dims}, {self.num_warps} warps, {self.num_stages} stages{cap}, "
                f"{'causal' if self.causal else 'non-causal'}, {loads}")
