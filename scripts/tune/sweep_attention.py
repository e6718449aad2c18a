"""Sweep attention launch configs on the GPU and print ops/attention/plan.py's ATTENTION_CONFIGS rows, ready to paste.

For each benchmark shape (bf16, causal and not), every candidate (BLOCK_M, BLOCK_N, num_warps,
num_stages, loads) of the forward and of the backward (a dK/dV config paired with a
dQ config) is checked once against SDPA and then timed with triton.testing.do_bench. SDPA's FLASH and
CUDNN backends are timed on the same inputs for reference. TFLOP/s: 4*B*Hq*S^2*D per forward (half
for causal), 2.5x that per backward.

Budget: about 4 minutes on an H100, most of it compiling (each candidate compiles once per head dim
and causality); candidates past DEADLINE_S (or --deadline) are skipped and reported as such.

    python scripts/tune/sweep_attention.py [--quick] [--forward-only | --backward-only]
        [--shapes BxHQxHKVxSxD,...] [--short] [--mask causal|none] [--split-backward [--round NAME]]
        [--forward-round NAME]

--short times candidates for sequences of a few key blocks instead (the attention sweep's S128 and
S512 cells, docs/perf-attention.md "The sweep"). --split-backward times the backward's candidates
in two head-dim parts against the padded one (SPLIT_BACKWARD_CANDIDATES; --round NAME: that entry's
candidates at every head dim).

Forward loads: "pointer" (masked pointer loads), "descriptor" (3-D TMA descriptors per head), "rows"
(2-D TMA descriptors over every head's rows in the unmasked key loop) and "ws" (rows, one loop,
warp-specialized by Triton: num_warps counts one consumer warpgroup's warps).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

import onlinesoftmax
from onlinesoftmax.ops.attention import launch as attention_launch
from onlinesoftmax.ops.attention import plan
from onlinesoftmax.ops.attention.op import MAX_HEAD_DIM

SHAPES = [(8, 16, 16, 1024, 128), (4, 16, 16, 4096, 128), (1, 16, 16, 16384, 128), (4, 32, 32, 4096, 64),
          (2, 32, 8, 8192, 128)]
# (BLOCK_M, BLOCK_N, num_warps, num_stages, loads). The first of each head dim is the plan of
# 2026-11-23 (pointer loads); warp-specialized BLOCK_N = 64 at head dim 128 is here because it
# computed NaN (a Triton 3.6 bug: see scripts/probes/probe_warp_specialize.py), as did head dim 64
# specialized with 3 stages or BLOCK_N = 64 (docs/notes/2026-11/sweep_attention-forward-h100.log, runs 1-2).
FORWARD_CANDIDATES = {
    128: [(128, 128, 8, 3, "pointer"), (128, 128, 8, 3, "rows"), (128, 128, 8, 2, "rows"),
          (128, 128, 4, 2, "ws"), (128, 64, 4, 3, "ws")],
    64: [(64, 64, 4, 4, "pointer"), (64, 64, 4, 4, "rows"), (64, 64, 4, 3, "rows"), (64, 64, 4, 5, "rows"),
         (64, 128, 4, 3, "rows"), (128, 64, 8, 3, "rows"), (128, 64, 4, 3, "rows"), (64, 64, 8, 4, "rows")],
    # Head dim 256: the table's starting point first, then FlashAttention-2's Hopper-sized tile (128 x 64 on
    # 8 warps) and smaller ones; a 64 x 256 fp32 accumulator is 128 registers a thread on 4 warps.
    256: [(64, 64, 4, 2, "pointer"), (128, 64, 8, 2, "pointer"), (128, 64, 8, 2, "rows"), (64, 64, 8, 2, "pointer"),
          (128, 32, 8, 2, "pointer"), (64, 32, 4, 3, "pointer"), (64, 64, 4, 2, "rows"), (128, 64, 4, 2, "ws")],
    # Head dims computed in two parts (plan.ATTENTION_FORWARD_SPLIT_HEAD_DIMS): the padded plan first (a
    # sixth field "padded" turns the split off), then the split with the padded dim's config and
    # others that its smaller tiles (registers, shared memory) may fit.
    96: [(128, 128, 8, 3, "rows", "padded"), (128, 128, 8, 3, "rows"), (128, 128, 8, 2, "rows"),
         (128, 64, 8, 3, "rows"), (128, 64, 4, 3, "rows"), (64, 128, 4, 3, "rows"), (64, 64, 4, 3, "rows"),
         (128, 128, 8, 3, "pointer"), (64, 32, 4, 3, "pointer", "padded"), (64, 32, 4, 3, "pointer")],
}
FORWARD_CANDIDATES[80] = FORWARD_CANDIDATES[96]
# A second round at D96 S512 around the first's best (128 x 64 on 4 warps), and head dim 192 (128 + 64)
# with D256's config padded and split, then smaller tiles.
FORWARD_CANDIDATES[96] = FORWARD_CANDIDATES[96] + [
    (128, 64, 4, 2, "rows"), (128, 64, 4, 4, "rows"), (128, 32, 4, 3, "rows"), (128, 64, 4, 3, "pointer")]
FORWARD_CANDIDATES[192] = [(128, 64, 8, 2, "rows", "padded"), (128, 64, 8, 2, "rows"), (128, 64, 4, 2, "rows"),
                           (128, 64, 4, 3, "rows"), (128, 32, 4, 3, "rows"), (64, 64, 4, 3, "rows")]
# Head dims 144 and 160 (128 + 16, 128 + 32) at short sequences, where they run D256's untuned row
# split: that row first, then the smaller tiles that won at D64-D128's short rows and at D192.
FORWARD_CANDIDATES[144] = [(128, 64, 8, 2, "rows"), (128, 64, 4, 2, "rows"), (128, 64, 4, 3, "rows"),
                           (128, 32, 4, 3, "rows"), (64, 64, 4, 3, "rows"), (64, 32, 4, 3, "pointer"),
                           (64, 64, 4, 2, "pointer")]
FORWARD_CANDIDATES[160] = FORWARD_CANDIDATES[144]
for _head_dim in (136, 152):  # split where their rows are whole 16-byte vectors (128 + 16, 128 + 32)
    FORWARD_CANDIDATES[_head_dim] = FORWARD_CANDIDATES[144]
# Head dims 176 and 192 (128 + 64) at S512, behind FLASH causal on D256's row: smaller tiles and
# pointer loads, as the short rows of the head dims below.
FORWARD_CANDIDATES[192] = FORWARD_CANDIDATES[192] + [
    (64, 32, 4, 3, "pointer"), (64, 64, 4, 2, "pointer"), (64, 32, 4, 2, "pointer"), (64, 64, 8, 2, "rows"),
    (128, 32, 8, 2, "rows"), (128, 32, 8, 3, "rows"), (64, 32, 4, 2, "rows")]
FORWARD_CANDIDATES[176] = [c for c in FORWARD_CANDIDATES[192] if c[5:] != ("padded",)]
# Forward rounds for every head dim (--forward-round NAME). "ragged": keys that end mid-block at
# head dims padded to 128 (D112, D128 non-causal at 373-1000 keys, 0.84-1.05x FLASH in the attention
# sweep's random shapes), where the warp-specialized loop (whole key blocks only) gives way to the
# 128 row's config (first): that config's other loads and stages, then smaller tiles.
FORWARD_ROUNDS = {
    "ragged": [(128, 128, 8, 3, "rows"), (128, 128, 8, 3, "pointer"), (128, 128, 8, 2, "rows"),
               (128, 64, 4, 3, "rows"), (128, 64, 8, 3, "rows"), (128, 64, 4, 2, "rows"), (64, 64, 4, 3, "rows"),
               (64, 64, 4, 3, "pointer"), (64, 32, 4, 3, "pointer"), (64, 128, 4, 2, "rows")],
    # Sequences of up to 128 keys where memory is faster (the H200): the short rows' config first,
    # then more stages, wider key blocks, larger query blocks on 8 warps and smaller ones.
    "short": [(64, 32, 4, 3, "pointer"), (64, 32, 4, 4, "pointer"), (64, 64, 4, 2, "pointer"),
              (64, 64, 4, 3, "pointer"), (128, 32, 8, 3, "pointer"), (128, 64, 8, 2, "pointer"),
              (64, 128, 4, 1, "pointer"), (32, 32, 4, 3, "pointer"), (64, 32, 8, 3, "pointer"),
              # the tables' row for head dims 80 and 96 (computed in two parts), which takes their
              # non-causal rows of a few key blocks (D80 S135: 0.80x FLASH on the H200)
              (128, 64, 4, 3, "rows")],
    # Head dims 80 and 96 (two parts) non-causal at 135-512 keys: where the short rows' config gives
    # way to the tables' (the first three, from "short", won at D80 S135 on the H200, where (64,
    # 128, 4, 1) made an illegal memory access: docs/notes/2026-11/sweep_attention-short_split-h200.log).
    "short_split": [(64, 32, 4, 3, "pointer"), (64, 32, 4, 4, "pointer"), (64, 64, 4, 3, "pointer"),
                    (128, 64, 4, 3, "rows")],
    # Head dim 96 at 256-512 keys, behind FLASH on the H200 after short_split (S256 0.94x, S512 the
    # tables' row 0.99x): the short rows' config, the same and larger tiles padded whole to 128, more
    # query rows on 8 warps, key blocks of 16 and 128, and the tables' row.
    "d96_short": [(64, 32, 4, 3, "pointer"), (64, 32, 4, 3, "pointer", "padded"),
                  (64, 64, 4, 3, "pointer", "padded"), (128, 64, 8, 3, "pointer", "padded"),
                  (128, 32, 8, 3, "pointer"), (64, 16, 4, 4, "pointer"), (64, 128, 4, 2, "pointer"),
                  (128, 64, 4, 3, "rows")],
    # Its second round, after 128 x 32 on 8 warps led at S256-S512 (218.6 against FLASH's 219.4 at
    # S256): where it overtakes 64 x 32 from S135 up, its stages and key blocks, through row
    # descriptors, and the same at D80 (64 x 64 there up to S512).
    # Head dim 256 over 150-512 keys, MHA, behind FLASH on the H200 (B43 H25 S206: 0.92x, causal 0.82x):
    # the tables' row first (128 x 64 on 8 warps, row descriptors), then its pointer loads and the
    # smaller tiles that won the short rows of head dims 176-192 (64 x 32 on 4 warps, 3 stages).
    "d256_short": [(128, 64, 8, 2, "rows"), (128, 64, 8, 2, "pointer"), (64, 64, 4, 2, "pointer"),
                   (64, 64, 4, 3, "pointer"), (64, 32, 4, 3, "pointer"), (64, 32, 4, 4, "pointer"),
                   (128, 32, 8, 3, "pointer"), (64, 64, 8, 2, "pointer"), (64, 128, 4, 1, "pointer"),
                   (128, 128, 8, 1, "rows")],
    # Head dim 192 (128 + 64) causal at 513-2048 keys, past its short rows (B23 H25 S848: 0.98x FLASH
    # on the H200, seed 3404): the tables' row, its pointer loads, and the short rows' tiles.
    "d192_mid": [(128, 64, 8, 2, "rows"), (128, 64, 8, 2, "pointer"), (64, 32, 4, 3, "pointer"),
                 (64, 64, 4, 3, "pointer"), (128, 32, 8, 3, "pointer"), (64, 64, 4, 2, "pointer")],
    # Its second round, after 64 x 32 on 4 warps led at every shape of the first (S848 215.7 -> 258.5
    # TFLOP/s, FLASH 215.9): longer sequences, non-causal, and head dims 144-176 (two parts as well).
    "d192_mid_2": [(128, 64, 8, 2, "rows"), (64, 32, 4, 3, "pointer"), (64, 32, 4, 4, "pointer"),
                   (128, 32, 8, 3, "pointer"), (128, 64, 8, 2, "pointer")],
    "d96_short_2": [(64, 32, 4, 3, "pointer"), (128, 32, 8, 3, "pointer"), (128, 32, 8, 4, "pointer"),
                    (128, 64, 8, 3, "pointer"), (128, 32, 8, 3, "rows"), (64, 64, 4, 3, "pointer")],
}
# Short sequences. plan.ATTENTION_SHORT_CONFIGS came from three rounds (docs/notes/2026-11/
# sweep_attention-short-h100.log): the tables' configs, smaller tiles that fit more programs an SM
# and larger query blocks; variations of the best (2 stages at BLOCK_N = 64 won); then more stages
# over smaller key blocks (3 stages at BLOCK_N = 32 won, listed here, the third round's, with the
# shapes S1000 D64 and S512 D128 added).
SHORT_FORWARD_CANDIDATES = {
    128: [(64, 128, 4, 1, "pointer"), (64, 64, 4, 2, "pointer"), (64, 32, 4, 3, "pointer"), (64, 64, 4, 3, "pointer"),
          (64, 128, 4, 2, "pointer"), (128, 128, 4, 2, "ws"), (128, 128, 8, 3, "pointer")],
    64: [(64, 64, 4, 2, "pointer"), (64, 32, 4, 3, "pointer"), (64, 32, 4, 4, "pointer"), (64, 64, 4, 3, "pointer"),
         (64, 64, 4, 2, "rows"), (128, 64, 4, 2, "pointer"), (64, 128, 4, 3, "rows")],
    # Head dim 256 at S128 (two key blocks): the table's warp-specialized config first, then
    # smaller query blocks (more programs an SM) and one stage over whole 128-key rows.
    256: [(128, 64, 4, 2, "ws"), (128, 64, 8, 2, "rows"), (64, 64, 4, 2, "rows"), (64, 64, 4, 2, "pointer"),
          (64, 32, 4, 3, "pointer"), (128, 128, 8, 1, "rows"), (64, 128, 4, 1, "rows"), (64, 64, 4, 2, "ws")],
}
# ... and for the backward, the tables' configs first, then larger key blocks (dK/dV) and query blocks
# (dQ): one or two programs a head. The tables' were best at every shape of the first round.
SHORT_BACKWARD_CANDIDATES = {
    128: [((32, 64, 4, 3), (128, 32, 8, 2), True), ((64, 64, 8, 2), (128, 64, 8, 2), True),
          ((32, 128, 8, 2), (128, 64, 8, 2), True), ((64, 128, 8, 1), (128, 128, 8, 1), True)],
    64: [((32, 64, 4, 2), (64, 64, 4, 3), True), ((64, 128, 8, 2), (128, 64, 8, 2), True),
         ((32, 128, 4, 2), (128, 128, 8, 2), True), ((64, 128, 4, 2), (128, 64, 4, 2), True),
         ((64, 64, 4, 2), (64, 64, 4, 2), True)],
}
SHORT_SHAPES = [(256, 16, 16, 128, 64), (256, 32, 8, 128, 64), (64, 16, 16, 512, 64), (32, 16, 16, 1000, 64),
                (256, 16, 16, 128, 128), (64, 16, 16, 512, 128)]
# ((dK/dV config), (dQ config), use_descriptor), configs as (BLOCK_M, BLOCK_N, num_warps, num_stages).
# The first of each head dim is the plan's, the second the plan before it. The plan's register caps
# (ATTENTION_MAX_REGISTERS) apply to every candidate of their head dim and causality;
# scripts/probes/probe_occupancy.py times configs with and without them. Two variants measured slower
# at every shape on the H100 (docs/notes/2026-11/sweep_attention-backward-h100.log) and were removed: the dQ kernel with the
# forward's row descriptors and warp specialization, and a dK/dV kernel that also adds dQ with
# float32 atomics (five matrix products per block pair instead of seven; 246 against 289 TFLOP/s
# at head dim 128, its registers full).
BACKWARD_CANDIDATES = {
    128: [((32, 64, 4, 3), (128, 32, 8, 2), True), ((32, 128, 8, 3), (128, 64, 8, 2), True),
          ((32, 128, 8, 2), (128, 32, 8, 3), True), ((64, 64, 8, 2), (64, 64, 4, 3), True),
          ((32, 64, 4, 3), (128, 32, 8, 2), False)],
    64: [((32, 64, 4, 2), (64, 64, 4, 3), True), ((32, 64, 4, 3), (64, 64, 4, 3), True),
         ((32, 128, 8, 3), (128, 64, 4, 3), True), ((64, 128, 8, 3), (128, 64, 8, 3), True)],
    # Head dim 256, a second round around the first's best (the plan's now, then the plan before it;
    # docs/notes/2026-11/sweep_attention-d256-h100.log has both rounds): 8 warps, 1-2 stages.
    256: [((64, 64, 8, 2), (64, 64, 8, 2), True), ((32, 64, 8, 2), (64, 32, 4, 2), True),
          ((32, 64, 8, 1), (64, 32, 4, 1), True), ((64, 64, 8, 1), (64, 64, 8, 1), True),
          ((64, 32, 8, 2), (64, 64, 8, 2), True), ((64, 64, 8, 2), (128, 32, 8, 2), True),
          ((32, 64, 8, 2), (64, 64, 8, 2), True), ((32, 64, 8, 1), (64, 64, 8, 2), True),
          ((64, 64, 8, 1), (128, 32, 8, 2), True)],
}
# Head dim 256 causal, a third round (--mask causal): the dQ kernel of the second round's best with each
# dK/dV config that came near it causal, fewer stages, and a dQ kernel over 64-key blocks.
CAUSAL_BACKWARD_CANDIDATES = {
    256: [((64, 64, 8, 2), (128, 32, 8, 2), True), ((32, 64, 8, 1), (128, 32, 8, 2), True),
          ((32, 64, 8, 2), (128, 32, 8, 2), True), ((64, 64, 8, 1), (128, 32, 8, 2), True),
          ((64, 64, 8, 2), (128, 32, 8, 1), True), ((32, 64, 8, 1), (128, 32, 8, 1), True),
          ((64, 64, 8, 2), (128, 64, 8, 2), True), ((64, 64, 8, 2), (128, 64, 8, 1), True)],
}
# Head dim 96 (padded to 128 in the backward): D128's candidates, then two with the tiles' other sides.
BACKWARD_CANDIDATES[96] = BACKWARD_CANDIDATES[128][:4] + [((64, 64, 4, 2), (64, 64, 4, 3), True),
                                                          ((32, 64, 4, 2), (128, 64, 8, 2), True)]
# The backward in two head-dim parts (a fourth field "split": plan.ATTENTION_BACKWARD_SPLIT_HEAD_DIMS),
# against the padded table's config first: at 80 and 96 (64 + 16, 64 + 32) D128's config split, then
# larger tiles that the smaller K, V, dK, dV (dK/dV kernel) and Q, dO, dQ (dQ kernel) may fit; at 160
# and 192 (128 + 32, 128 + 64) D256's, then D128's and tiles between.
SPLIT_BACKWARD_CANDIDATES = {
    96: [((32, 64, 4, 3), (128, 32, 8, 2), True), ((32, 64, 4, 3), (128, 32, 8, 3), True),
         ((32, 64, 4, 3), (128, 32, 8, 3), True, "split-dq"), ((32, 64, 4, 3), (128, 32, 8, 2), True, "split-dq"),
         ((32, 64, 4, 3), (64, 32, 4, 3), True, "split-dq")],
    128: [((32, 64, 4, 3), (128, 32, 8, 2), True), ((32, 64, 4, 3), (128, 32, 8, 3), True),
          ((32, 64, 4, 3), (128, 32, 8, 4), True)],
    160: [((64, 64, 8, 2), (128, 32, 8, 2), True), ((32, 64, 4, 3), (128, 32, 8, 2), True, "split"),
          ((32, 64, 4, 3), (128, 32, 8, 3), True, "split"), ((32, 64, 4, 2), (128, 32, 8, 3), True, "split"),
          ((64, 64, 4, 2), (128, 32, 8, 3), True, "split"), ((32, 128, 8, 2), (128, 32, 8, 3), True, "split"),
          ((32, 64, 4, 3), (128, 32, 8, 3), True, "split-dkdv")],
    # A second round at 192 causal, where the split's first config (D128's tiles at 2 stages) spills most.
    192: [((64, 64, 8, 1), (128, 32, 8, 2), True), ((32, 64, 4, 2), (128, 32, 8, 3), True, "split"),
          ((32, 64, 8, 2), (128, 32, 8, 3), True, "split"), ((16, 64, 4, 2), (128, 32, 8, 3), True, "split"),
          ((32, 32, 4, 2), (128, 32, 8, 3), True, "split"), ((64, 32, 4, 2), (128, 32, 8, 3), True, "split"),
          ((32, 64, 4, 2), (64, 32, 4, 2), True, "split")],
    # A third round over every split head dim: the dK/dV kernel's query blocks of 16 (192 causal's best).
    "16-query": [((32, 64, 4, 2), (128, 32, 8, 3), True, "split"), ((16, 64, 4, 2), (128, 32, 8, 3), True, "split"),
                 ((16, 64, 4, 3), (128, 32, 8, 3), True, "split"), ((16, 128, 4, 2), (128, 32, 8, 3), True, "split"),
                 ((16, 128, 8, 2), (128, 32, 8, 3), True, "split")],
}
# A fourth round, causal at S128-S512 (--mask causal), where D176 and D192 trail FLASH: the dK/dV
# kernel's 16-query config with dQ kernels of smaller query and key blocks, then the dK/dV kernel
# at 3 stages and over 32-key blocks.
SPLIT_BACKWARD_CANDIDATES["short-causal"] = [
    ((16, 64, 4, 2), (128, 32, 8, 3), True, "split"), ((16, 64, 4, 2), (64, 32, 4, 3), True, "split"),
    ((16, 64, 4, 2), (64, 64, 4, 2), True, "split"), ((16, 64, 4, 2), (64, 16, 4, 3), True, "split"),
    ((16, 64, 4, 2), (128, 64, 8, 2), True, "split"), ((16, 64, 4, 2), (32, 32, 4, 3), True, "split"),
    ((16, 64, 4, 3), (128, 32, 8, 3), True, "split"), ((16, 32, 4, 3), (128, 32, 8, 3), True, "split"),
    ((16, 64, 4, 2), (128, 32, 8, 3), False, "split")]
# A fifth round over the split head dims and lengths, after the fourth found pointer loads ahead:
# each dK/dV row's config (136's at 3 stages, 144-192's non-causal and causal) through TMA
# descriptors and through pointers.
SPLIT_BACKWARD_CANDIDATES["loads"] = [
    (dkdv, (128, 32, 8, 3), use_descriptor, "split")
    for dkdv in ((32, 64, 4, 3), (32, 64, 4, 2), (16, 64, 4, 2)) for use_descriptor in (True, False)]
# ... and at head dim 256 (padded, no parts), where causal forward + backward trailed FLASH at
# S512-S2048: its tables' configs through descriptors and pointers, then smaller query blocks.
SPLIT_BACKWARD_CANDIDATES["d256-loads"] = [
    ((64, 64, 8, 2), (128, 32, 8, 2), True), ((64, 64, 8, 2), (128, 32, 8, 2), False),
    ((64, 64, 8, 1), (128, 32, 8, 2), True), ((64, 64, 8, 1), (128, 32, 8, 2), False),
    ((32, 64, 8, 1), (128, 32, 8, 2), False), ((16, 64, 4, 2), (128, 32, 8, 2), False),
    ((32, 64, 4, 2), (128, 32, 8, 2), False), ((64, 64, 8, 1), (64, 32, 4, 2), False)]
# Head dim 32 causal (--round d32-causal --mask causal), whose forward + backward trailed FLASH in the
# sweep's random shapes (0.81-0.85x; non-causal 1.07-1.14x): the plan's (D64's row) first, then
# larger tiles that a 32-wide head leaves room for, and pointer loads.
SPLIT_BACKWARD_CANDIDATES["d32-causal"] = [
    ((32, 64, 4, 2), (64, 64, 4, 3), True), ((64, 64, 4, 2), (64, 64, 4, 3), True),
    ((64, 128, 4, 2), (128, 64, 4, 2), True), ((32, 128, 4, 2), (128, 32, 4, 2), True),
    ((64, 64, 4, 3), (128, 64, 4, 3), True), ((32, 64, 4, 2), (128, 64, 4, 2), True),
    ((64, 128, 8, 2), (128, 64, 8, 2), True), ((32, 64, 4, 2), (64, 64, 4, 3), False)]
# A second round at head dim 32 causal, over more shapes (MHA, GQA, S512-S8936), around the first
# round's best (32-query dK/dV blocks over 128 keys, 128 x 32 dQ blocks): the plan's first.
SPLIT_BACKWARD_CANDIDATES["d32-causal-2"] = [
    ((32, 64, 4, 2), (64, 64, 4, 3), True), ((32, 128, 4, 2), (128, 32, 4, 2), True),
    ((32, 128, 4, 3), (128, 32, 4, 2), True), ((32, 128, 4, 2), (128, 32, 4, 3), True),
    ((16, 128, 4, 2), (128, 32, 4, 2), True), ((32, 128, 8, 2), (128, 32, 8, 2), True),
    ((64, 128, 4, 2), (128, 32, 4, 2), True)]
# Head dim 32 at S128-S1024 (--round d32-short), where the second round's tables left forward +
# backward at 0.93-0.97x FLASH: the tables' pair first, then each kernel's blocks and loads in turn.
# (Its first run, sweep_attention-d32_short-h100.log, ran every candidate on head dim 32's own rows,
# which forced() did not yet clear: only the loads differed there.)
SPLIT_BACKWARD_CANDIDATES["d32-short"] = [
    ((32, 128, 4, 2), (128, 32, 4, 3), True), ((32, 128, 4, 2), (128, 32, 4, 3), False),
    ((32, 64, 4, 3), (128, 32, 4, 3), True), ((16, 64, 4, 3), (128, 32, 4, 3), True),
    ((64, 64, 4, 3), (128, 32, 4, 3), True), ((64, 128, 4, 3), (128, 32, 4, 3), True),
    ((32, 128, 4, 2), (64, 32, 4, 3), True), ((32, 128, 4, 2), (64, 64, 4, 3), True),
    ((32, 128, 4, 2), (128, 64, 4, 3), True), ((32, 128, 4, 2), (64, 32, 2, 3), True)]
SPLIT_BACKWARD_CANDIDATES[80] = SPLIT_BACKWARD_CANDIDATES[96]
SPLIT_BACKWARD_CANDIDATES[144] = SPLIT_BACKWARD_CANDIDATES[160]
# Head dims whose second part runs past them (136 = 128 + 16, 176 = 128 + 64), behind FLASH at S512
# causal forward + backward: their split dim's candidates, the padded config first.
SPLIT_BACKWARD_CANDIDATES[136] = SPLIT_BACKWARD_CANDIDATES[160]
SPLIT_BACKWARD_CANDIDATES[176] = SPLIT_BACKWARD_CANDIDATES[192]
DEADLINE_S = 170
TOLERANCE = 2e-2  # relative error against SDPA in bf16


def flops(shape, causal):
    batch, heads_q, _, seq, head_dim = shape
    f = 4 * batch * heads_q * seq * seq * head_dim
    return f // 2 if causal else f


def label(shape, causal):
    batch, hq, hkv, seq, d = shape
    return f"B{batch}-H{hq if hq == hkv else f'{hq}/{hkv}'}-S{seq}-D{d}" + ("-causal" if causal else "")


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def forced(**configs):
    """override_plan's tables for one candidate: each named kernel's table replaced by one row that
    covers every head dim, no rows of its own for any head dim (for the forward, none for pointer
    loads either: ATTENTION_FORWARD_POINTER_CONFIGS), and no short-sequence rows."""
    return dict(ATTENTION_CONFIGS=dict(plan.ATTENTION_CONFIGS, **{
        kernel: ((1 << 30, config, config),) for kernel, config in configs.items()}),
        ATTENTION_HEAD_DIM_CONFIGS={kernel: rows for kernel, rows in plan.ATTENTION_HEAD_DIM_CONFIGS.items()
                                    if kernel not in configs},
        ATTENTION_SHORT_CONFIGS=dict.fromkeys(plan.ATTENTION_SHORT_CONFIGS, ()),
        **({"ATTENTION_FORWARD_POINTER_CONFIGS": {}} if "forward" in configs else {}))


def padding(variant):
    """override_plan's tables for a candidate's last field: "padded" turns the head-dim split off."""
    return ({"ATTENTION_FORWARD_SPLIT_HEAD_DIMS": (), "ATTENTION_FORWARD_SPLIT_VECTORS_FROM": MAX_HEAD_DIM + 1}
            if variant == "padded" else {})


def backward_split(variant=None):
    """override_plan's tables for a backward candidate's last field: "split" computes the head dim in
    two parts in the dK/dV and dQ kernels (every head dim that has them), "split-dq" / "split-dkdv"
    in that kernel alone; none: the padded backward."""
    kernels = {"split": ("backward_dkdv", "backward_dq"), "split-dq": ("backward_dq",),
               "split-dkdv": ("backward_dkdv",)}.get(variant, ())
    return {"ATTENTION_BACKWARD_SPLIT_HEAD_DIMS": {k: tuple(range(8, MAX_HEAD_DIM + 1)) if k in kernels else ()
                                                   for k in ("backward_dkdv", "backward_dq")},
            "ATTENTION_BACKWARD_SPLIT_VECTORS_FROM": {k: 65 if k in kernels else MAX_HEAD_DIM + 1
                                                      for k in ("backward_dkdv", "backward_dq")}}


def forced_forward(config, loads, variant=None):
    return dict(forced(forward=config),
                ATTENTION_USE_DESCRIPTOR=dict(plan.ATTENTION_USE_DESCRIPTOR, forward=loads == "descriptor"),
                ATTENTION_FORWARD_ROW_DESCRIPTORS=(64, 128, 256) if loads in ("rows", "ws") else (),
                ATTENTION_FORWARD_WARP_SPECIALIZED={d: (config, config) for d in (64, 128, 256)} if loads == "ws" else {},
                ATTENTION_FORWARD_KV_STATIONARY=(), **padding(variant))


def sdpa(q, k, v, causal, backend):
    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                enable_gqa=q.shape[1] != k.shape[1])


def time_ms(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="first two shapes only")
    parser.add_argument("--forward-only", action="store_true", help="skip the backward candidates")
    parser.add_argument("--backward-only", action="store_true", help="skip the forward candidates")
    parser.add_argument("--shapes", default="", help="comma-separated BxHQxHKVxSxD instead of the grid")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S,
                        help="seconds after which the remaining candidates are skipped")
    parser.add_argument("--short", action="store_true",
                        help="the short-sequence candidates (and shapes, without --shapes)")
    parser.add_argument("--split-backward", action="store_true",
                        help="the backward's split-head-dim candidates (SPLIT_BACKWARD_CANDIDATES)")
    parser.add_argument("--round", default="", help="with --split-backward: the SPLIT_BACKWARD_CANDIDATES "
                        "entry of this name for every head dim (e.g. 16-query)")
    parser.add_argument("--forward-round", default="", help="the FORWARD_ROUNDS entry of this name for every "
                        "head dim (e.g. ragged)")
    parser.add_argument("--mask", choices=("both", "causal", "none"), default="both",
                        help="the masks timed; causal alone takes the causal backward candidates where a head "
                             "dim has them")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in text.split("x")) for text in args.shapes.split(",") if text]
    shapes = shapes or (SHORT_SHAPES if args.short else SHAPES[:2] if args.quick else SHAPES)
    forward_candidates = SHORT_FORWARD_CANDIDATES if args.short else FORWARD_CANDIDATES
    backward_candidates = SHORT_BACKWARD_CANDIDATES if args.short else BACKWARD_CANDIDATES
    if args.mask == "causal":
        backward_candidates = {**backward_candidates, **CAUSAL_BACKWARD_CANDIDATES}
    if args.split_backward:
        backward_candidates = SPLIT_BACKWARD_CANDIDATES
    if args.round:
        backward_candidates = dict.fromkeys(range(8, MAX_HEAD_DIM + 1), SPLIT_BACKWARD_CANDIDATES[args.round])
    if args.forward_round:
        forward_candidates = dict.fromkeys(range(8, MAX_HEAD_DIM + 1), FORWARD_ROUNDS[args.forward_round])
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    start = time.time()
    saved = dict(plan.ATTENTION_CONFIGS)
    best_rows = {}  # (kernel, head_dim, causal) -> {candidate: [tflops per shape]}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape in shapes:
        batch, heads_q, heads_kv, seq, head_dim = shape
        q = torch.randn(batch, heads_q, seq, head_dim, device="cuda", generator=gen).bfloat16()
        k = torch.randn(batch, heads_kv, seq, head_dim, device="cuda", generator=gen).bfloat16()
        v = torch.randn(batch, heads_kv, seq, head_dim, device="cuda", generator=gen).bfloat16()
        d_out = torch.randn(batch, heads_q, seq, head_dim, device="cuda", generator=gen).bfloat16()
        for causal in {"both": (False, True), "causal": (True,), "none": (False,)}[args.mask]:
            mode = "top_left" if causal else "none"
            scale = head_dim ** -0.5
            f = flops(shape, causal)
            name = label(shape, causal)
            print(f"\n== {name}")
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            # The reference: whichever fused SDPA backend takes this shape (GQA included).
            ref_out = sdpa(qg, kg, vg, causal, [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                                SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH])
            ref_grads = torch.autograd.grad(ref_out, (qg, kg, vg), d_out)
            for backend_name, backend in (("sdpa FLASH", SDPBackend.FLASH_ATTENTION), ("sdpa CUDNN", SDPBackend.CUDNN_ATTENTION)):
                try:
                    fwd_ms = time_ms(lambda: sdpa(q, k, v, causal, backend))
                    out = sdpa(qg, kg, vg, causal, backend)
                    bwd_ms = time_ms(lambda: torch.autograd.grad(out, (qg, kg, vg), d_out, retain_graph=True))
                    print(f"  {backend_name:12s} fwd {f / fwd_ms / 1e9:6.1f} TFLOP/s   bwd {2.5 * f / bwd_ms / 1e9:6.1f} TFLOP/s")
                except RuntimeError as exc:
                    print(f"  {backend_name:12s} unavailable: {str(exc).splitlines()[0][:100]}")
            for candidate in [] if args.backward_only else forward_candidates[head_dim]:
                if time.time() - start > args.deadline:
                    print(f"  fwd {candidate}: skipped (past the {args.deadline:.0f} s budget)")
                    continue
                try:
                    with onlinesoftmax.override_plan("attention", **forced_forward(candidate[:4], *candidate[4:])):
                        out, lse = attention_launch.launch_forward(q, k, v, mode, scale)
                        chosen = plan.last_attention_plan()
                        assert chosen.warp_specialize == (candidate[4] == "ws"), chosen
                        if head_dim in plan.ATTENTION_FORWARD_SPLIT_HEAD_DIMS:  # (others split by their alignment)
                            assert (chosen.block_d2 > 0) == (candidate[5:] != ("padded",))
                        err = rel(out, ref_out)
                        ms = time_ms(lambda: attention_launch.launch_forward(q, k, v, mode, scale))
                    tflops = f / ms / 1e9
                    status = "ok" if err <= TOLERANCE else f"WRONG ({err:.1e})"
                    print(f"  fwd {candidate}: {tflops:6.1f} TFLOP/s  rel err {err:.1e}  {status}")
                    if status == "ok":
                        best_rows.setdefault(("forward", head_dim, causal), {}).setdefault(candidate, []).append(tflops)
                except Exception as exc:  # a config that does not compile (shared memory, registers)
                    print(f"  fwd {candidate}: error {type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}")
            out, lse = attention_launch.launch_forward(q, k, v, mode, scale)
            for candidate in [] if args.forward_only else backward_candidates[head_dim]:
                dkdv, dq_config, use_descriptor = candidate[:3]
                if time.time() - start > args.deadline:
                    print(f"  bwd {candidate}: skipped (past the {args.deadline:.0f} s budget)")
                    continue
                def backward():
                    return attention_launch.launch_backward(d_out, q, k, v, out, lse, mode, scale,
                                                            use_descriptor=use_descriptor)
                try:
                    with onlinesoftmax.override_plan("attention", **forced(backward_dkdv=dkdv, backward_dq=dq_config),
                                                     **backward_split(*candidate[3:])):
                        grads = backward()
                        split = plan.last_attention_plan().block_d2 > 0  # the dK/dV kernel's plan
                        assert split == (candidate[3:] in (("split",), ("split-dkdv",))
                                         and plan.head_dim_parts(head_dim)[1] > 0)
                        err = max(rel(g, r) for g, r in zip(grads, ref_grads))
                        ms = time_ms(backward)
                    tflops = 2.5 * f / ms / 1e9
                    status = "ok" if err <= TOLERANCE else f"WRONG ({err:.1e})"
                    print(f"  bwd {candidate}: {tflops:6.1f} TFLOP/s  max rel err {err:.1e}  {status}")
                    if status == "ok":
                        best_rows.setdefault(("backward", head_dim, causal), {}).setdefault(candidate, []).append(tflops)
                except Exception as exc:
                    print(f"  bwd {candidate}: error {type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}")
    print(f"\nbest per (kernel, head dim, causal), geometric mean over the shapes ({time.time() - start:.0f} s):")
    table = {}
    for (kernel, head_dim, causal), results in sorted(best_rows.items()):
        best = max(results, key=lambda c: statistics.geometric_mean(results[c]))
        print(f"  {kernel:8s} D={head_dim:3d} {'causal    ' if causal else 'non-causal'} {best}: "
              f"{statistics.geometric_mean(results[best]):.1f} TFLOP/s over {len(results[best])} shape(s)")
        table[(kernel, head_dim, causal)] = best
    print("\n# ops/attention/plan.py ATTENTION_CONFIGS (rows not measured keep their current values; the loads of the best\n"
          "# candidates above go to ATTENTION_USE_DESCRIPTOR, ATTENTION_FORWARD_ROW_DESCRIPTORS and\n"
          "# ATTENTION_FORWARD_WARP_SPECIALIZED):")
    for kernel, parts in (("forward", (0,)), ("backward_dkdv", (0,)), ("backward_dq", (1,))):
        rows = []
        for limit, non_causal, causal in saved[kernel]:
            picked = []
            for is_causal, current in ((False, non_causal), (True, causal)):
                best = table.get(("forward" if kernel == "forward" else "backward", limit, is_causal))
                if best is None:
                    picked.append(current)
                else:
                    picked.append(tuple(best[:4]) if kernel == "forward" else tuple(best[parts[0]]))
            rows.append(f"({limit}, {picked[0]}, {picked[1]})")
        print(f'    "{kernel}": (' + ",\n                 ".join(rows) + "),")
    if not table:
        print("nothing measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
