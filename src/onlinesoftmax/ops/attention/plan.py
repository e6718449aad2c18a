"""Flash attention launch decisions: block sizes, warps, stages, load path and register caps by
kernel, head dim and causality. The measurements behind each value are in ``docs/perf-attention.md``.

A config is (BLOCK_M queries, BLOCK_N keys, num_warps, num_stages). Rows are (largest head dim,
non-causal config, causal config); the first row whose head dim is >= D applies (a padded head
dim: its padded dim's row, or its own in ATTENTION_HEAD_DIM_CONFIGS). Any head dim from 8 to 256
runs: inside the kernels D is padded to a power of two of at least 16 (the tensor cores' depth;
80 -> 128, 96 -> 128), except where a kernel computes a head dim that is two powers of two as
those two parts (80 = 64 + 16, 96 = 64 + 32, 160 = 128 + 32, 192 = 128 + 64; the forward:
ATTENTION_FORWARD_SPLIT_HEAD_DIMS, the backward above 128: ATTENTION_BACKWARD_SPLIT_HEAD_DIMS),
and one the parts overrun (72 = 64 + 16 with 8 columns padded) where its rows are whole 16-byte
vectors (the forward from 65 up, the backward from 129). Forward: BLOCK_M = 128 on 8
warps gives each warpgroup 64 query rows for wgmma (at head dim 256 their 64 x 256 fp32 accumulator
takes 128 registers a thread, with 64-key blocks to leave room for the scores). Backward dK/dV holds a key block's K, V, dK
and dV and streams query blocks, so BLOCK_N is its large side; dQ is the mirror image.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import torch

from ..._device import LastPlan, interpreter_active, next_power_of_2, plan_cache, sm_count
from .decision import AttentionPlan


def padded_head_dim(head_dim: int) -> int:
    """The block a head dim takes inside the kernels: its power of two, at least 16 (tl.dot's depth)."""
    return max(16, next_power_of_2(head_dim))


def head_dim_parts(head_dim: int) -> tuple[int, int]:
    """(first, second): two powers of two covering ``head_dim`` with less padding than one (second 0
    where none saves any): half the padded head dim, then the rest padded (at least 16, the tensor
    cores' depth for 16-bit inputs)."""
    padded = padded_head_dim(head_dim)
    first = padded // 2
    second = max(next_power_of_2(head_dim - first), 16) if head_dim > first else 0
    return (first, second) if 0 < second and first + second < padded else (padded, 0)


# The best of sweeps on the H100 (scripts/tune/sweep_attention.py; the numbers are in
# docs/perf-attention.md and the logs named here). Head dim 256: 128 x 64 blocks on 8 warps, where
# 64 x 64 on 4 had run the forward at 0.63-0.92x FLASH (sweep_attention-d256-h100.log); its causal
# dK/dV kernel at one stage (S512 94.8 -> 100.9 TFLOP/s: sweep_attention-d256_causal-h100.log). The
# forward's 160 row serves the head dims computed in two parts up to 160 (136 past it, 144, 152),
# which had read the 256 row: 1.1-1.9x faster (sweep_attention-head_dims_136_192-h100.log); causal
# rows up to 512 keys take pointer loads instead (ATTENTION_SHORT_CONFIGS). The forward's 128 row,
# non-causal: keys that end mid-block and head dims 112 and 128 read by row descriptors, 128 x 64
# on 4 warps at 2 stages (D128 B16 H16 S1000 329.1 -> 397.8: sweep_attention-ragged-h100.log). The
# dK/dV kernel's 136 row: 128 + 16 at 3 stages (sweep_attention-backward_head_dims_136_192-h100.log).
ATTENTION_CONFIGS = {
    "forward": ((64, (64, 128, 4, 3), (64, 64, 4, 4)),
                (96, (128, 64, 4, 3), (128, 64, 4, 3)),
                (128, (128, 64, 4, 2), (128, 128, 8, 3)),
                (160, (128, 32, 4, 3), (128, 32, 4, 3)),
                (256, (128, 64, 8, 2), (128, 64, 8, 2))),
    "backward_dkdv": ((64, (32, 64, 4, 2), (32, 64, 4, 2)),
                      (128, (32, 64, 4, 3), (32, 64, 4, 3)),
                      (136, (32, 64, 4, 3), (32, 64, 4, 3)),
                      (160, (32, 64, 4, 2), (32, 64, 4, 2)),
                      (192, (32, 64, 4, 2), (16, 64, 4, 2)),
                      (256, (64, 64, 8, 2), (64, 64, 8, 1))),
    "backward_dq": ((64, (64, 64, 4, 3), (64, 64, 4, 3)),
                    (128, (128, 32, 8, 2), (128, 32, 8, 2)),
                    (192, (128, 32, 8, 3), (128, 32, 8, 3)),
                    (256, (128, 32, 8, 2), (128, 32, 8, 2))),
}
# Padded head dims measured on their own, by kernel: {head dim: (non-causal config, causal config)},
# taken before the rows above (which a padded head dim reads by its padded dim): head dim 96's dQ
# kernel at three stages (B64 H32/8 S512 197.6 -> 213.8 TFLOP/s: sweep_attention-split_backward-h100.log);
# 136's padded to 256 where its rows are not whole 16-byte vectors (the split dK/dV kernel's
# partner: sweep_attention-backward_head_dims_136_192-h100.log); head dim 32 causal over 128-key
# dK/dV and 128-query dQ blocks, which a 32-wide head leaves registers for (B5 H28/4 S8936 135.2 ->
# 195.3, FLASH 186.5: sweep_attention-d32_causal_2-h100.log). docs/perf-attention.md has the rest.
ATTENTION_HEAD_DIM_CONFIGS = {"backward_dkdv": {32: ((32, 64, 4, 2), (32, 128, 4, 2))},
                              "backward_dq": {32: ((64, 64, 4, 3), (128, 32, 4, 3)),
                                              96: ((128, 32, 8, 3), (128, 32, 8, 3)),
                                              136: ((128, 32, 8, 3), (128, 32, 8, 3))}}
# The backward reads through TMA descriptors (ATTENTION_USE_DESCRIPTOR) only where its work (batch x
# query heads x queries x keys x head dim) is above this, about 100 µs of GPU time: device-side
# descriptors launch through Triton's Python launcher, and an eager step of a tiny attention took
# 393.6 µs of host time with them, 287.2 with pointers (SDPA 228.3; notes/2026-11/host_attention_descriptors-h100.log).
ATTENTION_BACKWARD_POINTER_MAX_WORK = 1 << 31
# TMA descriptors where the layout allows: both backward kernels ran fastest with them, the generic forward with pointers.
ATTENTION_USE_DESCRIPTOR = {"forward": False, "backward_dkdv": True, "backward_dq": True}
# Padded head dims whose forward reads whole key blocks through 2-D descriptors over every head's
# rows (D64: 380 -> 418 TFLOP/s; D256 at 128 x 64 blocks, 8 warps: 424 -> 495 at S2048).
ATTENTION_FORWARD_ROW_DESCRIPTORS = (64, 128, 256)
# ... and whose head dim is a multiple of this: the others' rows (80 bytes at head dim 40, 144 at
# 72) ran faster through pointer loads of whole 16-byte vectors (kernels.on_vectors), B16 H16 S2048
# bf16 forward, ms, row descriptors -> pointers: D40 1.121 -> 0.865 (causal 0.597 -> 0.470), D72
# 1.254 -> 1.199 (0.801 -> 0.746), D88 1.279 -> 1.286 (0.828 -> 0.789)
# (docs/notes/2026-11/probe_split_head_dims-h100.log).
ATTENTION_FORWARD_ROW_DESCRIPTORS_DIVISOR = 16
# Forwards Triton warp-specializes (a producer warpgroup loading, two consumers), by padded head dim:
# (non-causal, causal) config; head dim 128 gained 8-20%, head dim 256 (BLOCK_N = 64) 1.2-1.3x over
# the row descriptors alone (S2048 495 -> 624 TFLOP/s, causal 411 -> 514); at head dims 64 and 128,
# BLOCK_N = 64 and D64 with 3 stages computed NaN in Triton 3.6 (D256's was checked at every swept shape).
ATTENTION_FORWARD_WARP_SPECIALIZED = {128: ((128, 128, 4, 2), (128, 128, 4, 2)),
                                      256: ((128, 64, 4, 2), (128, 64, 4, 2))}
# Grouped-query forwards of few keys: one program a KV head holds its keys and values in one block
# and loops over its query heads' query blocks (kernels.attention_forward_kv_stationary_kernel), where
# the forward above reads them again for each query block; where KV heads are few, each one's tiles
# go to several programs (kv_stationary_split). Rows: (most keys and queries, fewest keys, {head
# dim: programs an SM}, smallest GQA group (non-causal, causal), fewest KV heads (batch x heads) an
# SM, non-causal and causal (BLOCK_M, warps, stages, keys in two halves), whether it yields to the
# warp-specialized forward). H200, bf16 TFLOP/s, tables -> this (FLASH): B256 H32/8 S128 D128
# 201.7 -> 264.8 (215.8); B16 H32/8 170.7 -> 237.9 (174.3, CUDA graphs); key halves, causal D64
# 112.2 -> 121.1; D256 B308 H64/8 S126 167.3 -> 231.7 (207.9), at S128 (warp-specialized) 206.3 ->
# 201.0 (docs/perf-h200.md, notes/2026-11/probe_kv_stationary-h200.log).
ATTENTION_FORWARD_KV_STATIONARY = (
    (128, 65, {64: 3, 128: 2}, (2, 4), 0.9, (64, 4, 2, False), (64, 4, 2, True), False),
    (128, 65, {256: 1}, (4, 4), 0.9, (128, 8, 1, False), (128, 8, 1, False), True))
# A program's K and V load in tiles (one query block of one head): kv_stationary_split's measurements.
KV_STATIONARY_LOAD_TILES = 1.0
# Forwards that read through pointers (the layout allows no row descriptors: heads that do not
# merge, such as BSHD views at batch > 1), by padded head dim: (non-causal, causal) config, None
# for the table's. The 128 row's non-causal config was measured with row descriptors only
# (sweep_attention-ragged-h100.log); through pointers the one before it stays.
ATTENTION_FORWARD_POINTER_CONFIGS = {128: ((128, 128, 8, 3), None)}
# Short sequences, by kernel: rows (most keys, head dim, non-causal config, causal config),
# the first whose length and head dim fit applying before the tables above. The length is the keys
# for the forward (a program's work) and the longer of queries and keys for the backward. A
# forward config carries its loads as a fifth field: "pointer", "rows" (TMA row descriptors where
# the layout allows) or "ws" (warp-specialized, where the key blocks are whole); a backward config
# may carry "pointer" (no TMA descriptors though the layout allows them). None: the tables above.
# Measured (scripts/tune/sweep_attention.py --short, three rounds, docs/notes/2026-11/
# sweep_attention-short-h100.log; TFLOP/s, the tables' config -> this one): small query blocks and
# key blocks of 32 with 3 stages, which keep several programs an SM and their next key blocks in
# flight. D64 S128 83 -> 160 (causal 40 -> 84), GQA 89 -> 188 (42 -> 101), S512 233 -> 288 (127 ->
# 206), S1000 289 -> 313 (193 -> 248); D128 S128 132 -> 171 (65 -> 90), S512 causal 208 -> 237 (the
# warp-specialized forward stays at S512 non-causal: 348 against 323). Causal D144-D160 at S512
# (the forward's 160 row's config -> the short row's): D144 167.0 -> 191.8 (GQA H32/8 183.3 ->
# 209.4), D152 163.1 -> 184.2, D160 171.8 -> 210.4 (FLASH 139.8, 144.5, 143.7, 157.1; the log of
# the 160 row). D192 (128 + 64) at S512, D256's row -> this: 271.0 -> 305.1, causal 172.7 -> 231.6
# (FLASH 280.5, 202.6); at S2048 D256's row stays ahead (424.4 against 356.1, causal 334.3 against
# 307.9; sweep_attention-head_dims_136_192-h100.log). D176 (128 + 64, split since the launcher
# counts Triton's own specialization of multiples of 16 as whole vectors) takes the 192 row's short
# config: B64 H16 S512 247.1 -> 258.9, causal 156.2 -> 205.7 TFLOP/s (FLASH 234.6 / 169.8); at S2048
# D256's row stays (382.0 against 313.7 or less; causal 288.5 against 292.9)
# (sweep_attention-head_dim_176-h100.log). The dK/dV tables were best
# over the short shapes swept (geometric mean). D128's dQ kernel at three stages instead of two, the
# sweep's D128 cells, bf16 backward TFLOP/s, two -> three stages, MHA / GQA H32/8 (scripts/tune/
# sweep_attention.py --backward-only --split-backward, docs/notes/2026-11/sweep_attention-dq_stages-h100.log):
# S512 212.7 -> 225.0 / 258.2 -> 273.5 (causal 123.6 -> 128.5 / 154.8 -> 161.3), S1000 260.0 ->
# 275.1 / 298.3 -> 298.2 (175.7 -> 187.8 / 206.6 -> 215.0), S2048 306.4 -> 326.9 / 345.7 -> 329.5
# (242.6 -> 257.5 / 271.8 -> 279.8); from S3000 up it went both ways (-6.5% to +6.9%), so two stages stay there.
# Head dim 32 reads through pointers at short lengths, with its own configs (ATTENTION_HEAD_DIM_CONFIGS):
# causal up to 1024, both masks at 128; backward TFLOP/s, TMA descriptors -> pointers (FLASH), bf16
# (scripts/tune/sweep_attention.py --round d32-short, docs/notes/2026-11/sweep_attention-d32_short-h100.log):
# causal B64 H16 S512 67.6 -> 102.2 (79.7), B64 H32/8 S512 85.2 -> 110.6 (75.8), B16 H16 S1024 95.2
# -> 124.8 (111.2), B256 H16 S128 22.4 -> 39.3 (26.0), non-causal 46.9 -> 67.8 (52.3); non-causal
# from S512 descriptors stay ahead (S512 118.4 against 111.5, S1024 152.5 against 120.1).
# The backward of the split head dims 136-192 reads through pointers, not TMA descriptors, up to
# 2048 keys at 136-160, and at 176-192 up to 512 (causal 8192), its dK/dV kernel over 16-query
# blocks (causal, and 176-192) or at 3 stages: B64 H16 S512 D136 138.2 -> 178.2 TFLOP/s, causal
# 80.8 -> 115.0 (FLASH 114.9 / 80.4); descriptors kept their lead at D144 S8191 and non-causal
# D176-D192 from S2048 (every shape: docs/notes/2026-11/sweep_attention-split_loads-h100.log).
# Non-causal D80, D96 (two parts): short rows, H200 only, TFLOP/s tables -> this (FLASH): D80 S135 56.0 -> 102.0
# (69.9); D96 S256 184.4 -> 218.1 (218.8) at 128 x 32, 8 warps (notes: sweep_attention-{short_split,d96_short}-h200).
# D256 at 129-320 keys (to 128 the WS / KV-stationary forwards stay), H200 only, TFLOP/s tables -> this: B43 H25
# S206 161.9 -> 182.7, causal 93.6 -> 105.6; S512 lost 3.5% (perf-h200.md "Head dim 256 over 129-320 keys").
# D176 and D192 causal keep the short rows' tiles to 1024 keys, H200 only, TFLOP/s tables -> this (FLASH): D192
# S700 166.7 -> 219.3 (167.3), S848 215.7 -> 258.5 (215.9), S1024 265.7 -> 294.1 (251.5), D176 S1024 206.8 -> 231.5
# (185.6); from S1535 the tables lead (339.0 against 325.0; notes: sweep_attention-d192_mid*-h200).
ATTENTION_SHORT_CONFIGS = {
    "forward": ((512, 64, (64, 32, 4, 3, "pointer"), (64, 32, 4, 3, "pointer")),
                (1024, 64, (64, 64, 4, 3, "pointer"), (64, 32, 4, 3, "pointer")),
                (128, 128, (64, 32, 4, 3, "pointer"), (64, 32, 4, 3, "pointer")),
                (512, 128, None, (64, 32, 4, 3, "pointer")),
                (256, 80, (64, 32, 4, 3, "pointer"), (64, 32, 4, 3, "pointer")),
                (512, 80, (64, 64, 4, 3, "pointer"), (64, 32, 4, 3, "pointer")),
                (160, 96, (64, 32, 4, 3, "pointer"), (64, 32, 4, 3, "pointer")),
                (512, 96, (128, 32, 8, 3, "pointer"), (64, 32, 4, 3, "pointer")),
                (512, 144, None, (64, 64, 4, 2, "pointer")),
                (512, 152, None, (64, 32, 4, 3, "pointer")),
                (512, 160, None, (64, 32, 4, 3, "pointer")),
                (512, 176, (64, 32, 4, 3, "pointer"), (64, 32, 4, 3, "pointer")),
                (1024, 176, None, (64, 32, 4, 3, "pointer")),
                (512, 192, (64, 32, 4, 3, "pointer"), (64, 32, 4, 3, "pointer")),
                (1024, 192, None, (64, 32, 4, 3, "pointer")),
                (128, 256, None, None),
                (320, 256, (128, 32, 8, 3, "pointer"), (128, 32, 8, 3, "pointer"))),
    "backward_dkdv": ((128, 32, (32, 64, 4, 2, "pointer"), (32, 128, 4, 2, "pointer")),
                      (1024, 32, None, (32, 128, 4, 2, "pointer")))
    + tuple((2048, head_dim, (32, 64, 4, 3, "pointer"), (16, 64, 4, 2, "pointer"))
            for head_dim in (136, 144, 152, 160))
    + tuple(row for head_dim in (176, 192) for row in (
        (512, head_dim, (16, 64, 4, 2, "pointer"), (16, 64, 4, 2, "pointer")),
        (8192, head_dim, None, (16, 64, 4, 2, "pointer")))),
    "backward_dq": ((128, 32, (64, 64, 4, 3, "pointer"), (128, 32, 4, 3, "pointer")),
                    (1024, 32, None, (128, 32, 4, 3, "pointer")),
                    (2048, 128, (128, 32, 8, 3), (128, 32, 8, 3)))
    + tuple((2048, head_dim, (128, 32, 8, 3, "pointer"), (128, 32, 8, 3, "pointer"))
            for head_dim in (136, 144, 152, 160))
    + tuple(row for head_dim in (176, 192) for row in (
        (512, head_dim, (128, 32, 8, 3, "pointer"), (128, 32, 8, 3, "pointer")),
        (8192, head_dim, None, (128, 32, 8, 3, "pointer")))),
}
# Head dims padded whole to a power of two (24 to 32, 40 and 48 to 64, 112 to 128; 80 in the
# backward: no rows of their own, not split in two parts) read their padded dim's short rows, their
# tiles being that dim's. Before, they took the long tables' configs: B16 H32 S233 D40's forward
# ran at 0.88x FLASH on 64 x 128 blocks where D64 runs 64 x 32 (the random-shape attention sweep of
# seed 1128). bf16, ms, long tables -> padded dim's rows (FLASH), forward / forward + backward
# (scripts/probes/probe_padded_short_rows.py, docs/notes/2026-11/probe_padded_short_rows-h100.log):
# B16 H32 S233 D40 forward 0.0591 -> 0.0444 (0.0549); B256 H16 S128 D48 0.2042 -> 0.0995 (0.1330),
# causal 0.1564 -> 0.0936 (0.1332); B64 H16 S512 D48 0.3076 -> 0.2388 (0.3137); B121 H16 S373 D112
# causal 0.5338 -> 0.3477 (0.5947); D24 causal forward + backward B64 H32/8 S300 0.8647 -> 0.5186
# (1.0230), B16 H16 S1000 0.7157 -> 0.4354 (0.5822); D80's backward (dQ at three stages to 2048
# keys) B64 H16 S512 1.8594 -> 1.7869, B16 H16 S2048 5.2605 -> 5.0497; the other cells level
# within two runs' spread (D40 S233 causal forward 0.0417 -> 0.0373 in one, 0.0422 -> 0.0528 in the
# other, whose host was slower: a 40 µs call is the host's there).
ATTENTION_SHORT_CONFIGS_PADDED = True
# Head dims the forward computes in two power-of-two parts (80 = 64 + 16, 96 = 64 + 32, 192 = 128 + 64:
# head_dim_parts) instead of padding them to the next power of two, whose zero columns cost a
# quarter to three eighths of the products at 80 and 96. The forward's row for 96 serves 80 and 96
# (the short rows name them).
# Measured (scripts/tune/sweep_attention.py, docs/notes/2026-11/sweep_attention-split-h100.log,
# TFLOP/s, padded -> split): D96 S2048 333 -> 436 (FLASH 341), causal 256 -> 339 (FLASH 299); D80
# S2048 281 -> 388 (FLASH 266); D96 S512 218 -> 289 (FLASH 294), causal 184 -> 201 (FLASH 203),
# with 128 x 64 blocks on 4 warps where the padded dims took 128 x 128 on 8 (and the short rows'
# 64 x 32 pointer config for short causal rows). The backward pads 80 and 96 (its split measured
# slower there: ATTENTION_BACKWARD_SPLIT_HEAD_DIMS).
# 160 (128 + 32) is split the same way: 1.55x FLASH at S2048 (causal 1.33x), its tests passed on
# the GPU (docs/notes/2026-11/attention_head_dims-h100.log); so is 144 (128 + 16), B16 H16 S2048
# bf16 forward 2.097 -> 1.807 ms padded -> split (causal 1.309 -> 1.152). 48 (32 + 16) is not:
# 0.756 -> 0.844 ms (0.453 -> 0.460) (docs/notes/2026-11/probe_split_head_dims-h100.log).
ATTENTION_FORWARD_SPLIT_HEAD_DIMS = (80, 96, 144, 160, 192)
# Head dims from this one up whose second part runs past them (72 as 64 + 16, 88 as 64 + 32, 136 as
# 128 + 16, 176 as 128 + 64) split too, where their rows are whole 16-byte vectors and the compiler
# sees it: told by VEC (_launch.vector_width, kernels.on_vectors) or, for a multiple of 16 such as
# 176, from Triton's specialization of the head dim and strides (_launch.rows_of_whole_vectors,
# ``whole_vectors``). Told nothing of their alignment,
# such splits computed wrong outputs and faulted on the H100 (Triton 3.6) while the interpreter
# passed them, at every config tried; told, they pass, and ran faster than padded, B16 H16 S2048
# bf16, ms (padded -> split, causal): D72 1.199 -> 0.952 (0.749 -> 0.573), D88 1.280 -> 1.213 (0.788
# -> 0.718), D136 2.524 -> 2.126 (1.505 -> 1.225), D176 2.164 -> 1.969 (1.354 -> 1.259). D40 (32 +
# 16): 0.861 -> 0.866 (0.470 -> 0.460), so 33-47 stay padded
# (scripts/probes/probe_split_head_dims.py, docs/notes/2026-11/probe_split_head_dims-h100.log).
ATTENTION_FORWARD_SPLIT_VECTORS_FROM = 65
# Kernels of few programs (one sequence or a few at few heads), whose 128-query blocks leave SMs idle
# while the longest programs run. By kernel, rows (causal, head dims, most programs an SM at 128-query
# blocks): the first that fits takes the config's 64-query blocks on 4 warps (key block and stages
# kept) where its BLOCK_M is 128 and no short row applies; the forward's only at head dims it splits.
# H200, bf16, CUDA-graph ms, 128 -> 64 queries (FLASH): forward, causal B1 H4 S2195 D72 0.0510 ->
# 0.0335 (0.0395), B1 H8 S15748 D80 (992 programs) 0.8990 -> 0.7938, but D96 B4 H16 S2048 (1024)
# 0.1793 -> 0.2043; forward + backward, dQ: causal B1 H8 S2195 D128 0.2394 -> 0.2219 (0.2937), but
# non-causal B1 H16 S4096 D80 (512) 1.2835 -> 1.3392 (docs/perf-h200.md, "Attention kernels of few
# programs: 64-query blocks").
ATTENTION_FEW_PROGRAMS = {"forward": ((True, (72, 80), 8), (True, (88, 96), 3), (False, (72, 80), 3)),
                          "backward_dq": ((True, range(65, 129), 4), (False, range(65, 129), 2))}
# The backward's dK/dV and dQ kernels compute these head dims in two parts as the forward does
# (head_dim_parts: 144 = 128 + 16, 160 = 128 + 32, 192 = 128 + 64), and from
# ATTENTION_BACKWARD_SPLIT_VECTORS_FROM up those whose second part runs past them (136, 152, 176),
# where their rows are whole 16-byte vectors; the others pad (the fused backward always). Padded to
# 256, their dK/dV kernel holds four 64 x 256 tiles and spills; split, they take the rows of 160
# and 192 above (D128's dK/dV tiles at two stages; query blocks of 16 at 168-192 causal, 142.4 ->
# 197.5 below). Measured (scripts/tune/sweep_attention.py
# --split-backward, docs/notes/2026-11/sweep_attention-split_backward-h100.log; B16 H16 S2048 bf16,
# backward TFLOP/s of the head dim's own FLOPs, padded -> split, causal in brackets): D144 135.0 ->
# 244.4 (98.4 -> 189.2), D160 150.0 -> 264.5 (106.8 -> 194.0), D192 180.6 -> 264.5 (129.6 ->
# 197.5); FLASH 165.3 (148.4), 183.7 (161.6), 235.6 (199.6). Below 128 the split lost: D96 S2048
# 232.3 padded, 232.6 split, 237.3 with the dQ kernel alone split (B64 S512 163.7, 137.1, 156.3).
# Triton 3.6 compiles a split dK/dV loop without software pipelining (one stage) to a wgmma that
# reads shared memory out of bounds (compute-sanitizer: an invalid __shared__ read of 1024 bytes;
# D96 causal, D160 at one stage): such loops run at least two stages (dkdv_query_blocks, and the plan).
ATTENTION_BACKWARD_SPLIT_HEAD_DIMS = {"backward_dkdv": (144, 160, 192), "backward_dq": (144, 160, 192)}
ATTENTION_BACKWARD_SPLIT_VECTORS_FROM = {"backward_dkdv": 129, "backward_dq": 129}
# The fused backward (one kernel, one program per KV head, its keys in one block: delta, dK, dV and
# dQ together, one launch for three; BLOCK_N is the keys' power of two, at least 16). A program
# holds K, V, dK and dV of its keys and loops over the query blocks of its query heads. Rows
# (largest head dim, most keys and queries, most programs or 0 for any, BLOCK_M, num_warps,
# num_stages): among the rows of the first head-dim bound >= D, the first whose length (the longer
# of queries and keys) and program count (batch x KV heads) fit; none fitting, the split backward.
# Measured (scripts/probes/probe_fused_backward.py; CUDA-graph ms, split -> fused, non-causal /
# causal; docs/notes/2026-11/probe_fused_backward-first-h100.log chose the configs,
# probe_fused_backward-h100.log checked the table): D64 S128 B1 H2 0.0174 / 0.0191 -> 0.0139 /
# 0.0143 (64 x 8 warps), B32 H16 0.0815 / 0.0934 -> 0.0606 / 0.0597, B256 H32/8 1.082 / 1.126 ->
# 0.980 / 1.011, but B256 H16 (4096 programs) 0.733 / 0.762 -> 0.796 / 0.808 (16 x 4 warps 0.743 /
# 0.738), hence the split there; D64 S64 B512 H16 (8192 programs) 0.447 / 0.562 -> 0.324 / 0.323
# on 16-query blocks and 4 warps; D128 S64 B512 H16 1.155 / 1.320 -> 1.077 / 1.080 (16 x 4), B512
# H32/8 1.659 / 1.975 -> 1.456 / 1.479; D128 S128 B256 H16 1.127 / 1.247 -> 1.116 / 1.110 (64 x 8),
# H32/8 1.654 / 1.835 -> 1.507 / 1.462; D80 S128 1.041 / 1.087 -> 1.031 / 0.984; D96 S128 H32/8
# 1.606 / 1.696 -> 1.492 / 1.395.
ATTENTION_BACKWARD_FUSED = ((64, 64, 0, 16, 4, 2),
                            (64, 128, 2048, 64, 8, 2),
                            (128, 64, 0, 16, 4, 2),
                            (128, 128, 0, 64, 8, 2))
# The dK/dV kernel's programs (key blocks x batch x KV heads) each sum over their group's query
# heads. Fewer of them than ATTENTION_BACKWARD_GROUP_SPLIT_BELOW an SM leave SMs idle (MQA and GQA
# at small batches and short sequences: B11 H16/1 S388 has 77 programs of 16 heads each), and the
# group is then shared by more programs (dkdv_group_split), up to ATTENTION_BACKWARD_GROUP_SPLIT_PROGRAMS
# an SM (non-causal, causal). Measured (scripts/probes/probe_group_split.py, docs/notes/2026-11/
# probe_group_split-h100.log; bf16 forward + backward, CUDA-graph ms, one program a group -> split
# under these tables, FLASH): B11 H16/1 S388 D80 0.391 -> 0.289 (x8; 0.342), causal 0.398 -> 0.242
# (x16; 0.281); B1 H16/1 S4096 D128 2.548 -> 1.372 (x16; 1.626), causal 2.541 -> 0.972 (1.124).
# Splitting more widely lost: B4 H40/8 S541 D128 (288 programs) 0.463 -> 0.511 split five ways,
# B8 H32/4 S1024 D128 (512) 1.415 -> 1.531 in two (the float32 partials written and summed, for
# programs that already filled the GPU); head dim 32 at 704 programs gained 5-11% split seven ways.
ATTENTION_BACKWARD_GROUP_SPLIT_BELOW = 1
ATTENTION_BACKWARD_GROUP_SPLIT_PROGRAMS = (4, 8)
# Past that, a dK/dV kernel over at least ATTENTION_BACKWARD_WAVE_SPLIT_QUERIES queries (its partials
# then cost a few % of its work) splits the group where a model of its time gives at most
# ATTENTION_BACKWARD_WAVE_SPLIT_COST (non-causal, causal) of one program a group's, with programs an
# SM from ATTENTION_BACKWARD_DKDV_PER_SM (by padded head dim: sm_90 compiles of the long tables'
# configs, scripts/probes/kernel_resources.py). Non-causal, over at most
# ATTENTION_BACKWARD_WAVE_SPLIT_WAVES waves: waves / split at the divisor with the fewest (within one
# wave, rounds of programs an SM). Causal, every head its own program: the longer of the heaviest
# program (a head's first key block, over every query) and the work spread over the slots. H200,
# CUDA-graph ms, whole -> split (FLASH): B1 H28/4 S6432 D48 4.357 -> 3.366 (4.244), causal 2.424 ->
# 1.890 (2.372); B1 H16/2 S10000 D128 9.729 -> 7.830 (9.228), causal 5.163 -> 4.249 (5.121); B1 H28/4
# S2276 D72 0.989 -> 0.784 (0.842). Left whole: B1 H64/8 S5000 D64 causal (2.669; 2.706 split), B1
# H32/8 S8192 D128 (10.05; 10.24), B6 H64/8 S3708 D40 (18.10; 20.45)
# (docs/notes/2026-11/probe_group_split-h200.log).
ATTENTION_BACKWARD_WAVE_SPLIT_QUERIES = 2048
ATTENTION_BACKWARD_WAVE_SPLIT_COST = (0.92, 0.66)
ATTENTION_BACKWARD_WAVE_SPLIT_WAVES = 3  # non-causal: at most this many waves of whole programs
ATTENTION_BACKWARD_DKDV_PER_SM = {32: 2, 64: 3, 128: 2, 256: 1}
# Causal backward kernels whose grid launches the heaviest block of every head before any head's
# next one (the dK/dV kernel's first key block, the dQ kernel's last query block): the grid's axes
# swapped, so that its last wave holds the lightest programs. By kernel, the smallest GQA group that
# takes it (0: none). Measured (scripts/probes/probe_heavy_first.py, docs/notes/2026-11/
# probe_heavy_first-h100.log; bf16 causal forward + backward, do_bench ms, by head -> dK/dV first):
# GQA, whose dK/dV programs each run their group's heads, B4 H28/4 S2770 D32 1.641 -> 1.422 (FLASH
# 1.329), B4 H32/8 S4096 D64 3.666 -> 3.452, B4 H32/8 S4096 D128 6.011 -> 5.907, B4 H40/8 S541 D128
# 0.360 -> 0.338 (CUDA graphs), B5 H28/4 S8936 D32 15.61 -> 15.72; MHA lost where the heads' order
# had kept their queries in L2 (B8 H16 S2048 D256 4.550 -> 5.205, B8 H16 S4096 D32 3.363 -> 3.568).
# The dQ kernel's order gained nowhere beyond the spread.
ATTENTION_BACKWARD_HEAVY_FIRST = {"backward_dkdv": 2, "backward_dq": 0}
# Register caps (Triton's maxnreg) that fit one more backward program an SM, by (kernel, padded head dim, causal).
ATTENTION_MAX_REGISTERS = {("backward_dkdv", 64, True): 168, ("backward_dq", 128, False): 128,
                           ("backward_dq", 128, True): 128}
# The interpreter runs at test sizes: small, unequal blocks so that every loop runs several
# iterations and the causal diagonal falls inside and across blocks.
ATTENTION_INTERPRETER_CONFIGS = {
    "forward": (16, 32, 4, 1),
    "backward_dkdv": (16, 32, 4, 1),
    "backward_dq": (32, 16, 4, 1),
    "backward_fused": (64, 0, 16, 4, 1),  # as ATTENTION_BACKWARD_FUSED's rows, without the head dim
}
ATTENTION_KERNELS = tuple(ATTENTION_CONFIGS)


def attention_plan(kernel: str, head_dim: int, dtype: torch.dtype, causal: bool, device: torch.device,
                   n_queries: int = 0, n_keys: int = 0, descriptor_ok: bool = True,
                   rows_ok: bool = False, batch_heads: Optional[int] = None,
                   whole_vectors: bool = False, interpreting: Optional[bool] = None,
                   query_heads: Optional[int] = None, sms: Optional[int] = None) -> AttentionPlan:
    """Block sizes, warps and stages for one attention kernel; ``descriptor_ok`` says whether the
    tensors' layout allows TMA, ``rows_ok`` whether it allows the forward's row descriptors (the
    launcher checks strides and alignment). ``batch_heads`` (batch x query heads) lets a backward
    kernel weigh its work against ATTENTION_BACKWARD_POINTER_MAX_WORK; None leaves
    ``descriptor_ok`` as given (a caller that forces the load path; the short rows' "pointer" then
    yields to it). ``whole_vectors``: the compiler sees the rows as whole 16-byte vectors
    (_launch.rows_of_whole_vectors). ``interpreting``: plan for Triton's interpreter (None: whether
    it is on). ``query_heads`` (batch x query heads) weighs the forward's and the dQ kernel's
    programs against ATTENTION_FEW_PROGRAMS (``sms``: the device's SMs unless given; None: not
    weighed). Cached: planning is on every call's path."""
    if kernel not in ATTENTION_CONFIGS:
        raise ValueError(f"unknown attention kernel {kernel!r}; expected one of {ATTENTION_KERNELS}")
    interpreting = interpreter_active() if interpreting is None else interpreting
    if kernel != "forward":
        descriptor_ok = _backward_descriptor_ok(descriptor_ok, batch_heads, n_queries, n_keys, head_dim, interpreting)
    length = n_keys if kernel == "forward" else max(n_queries, n_keys)
    # A backward whose caller forced the load path keeps it over a short row's pointer loads.
    forced_loads = kernel != "forward" and batch_heads is None
    device = torch.device(device)

    def programs_per_sm() -> int:  # at 128-query blocks, rounded up: ATTENTION_FEW_PROGRAMS's measure
        return -(-query_heads * -(-n_queries // 128) // (sms or sm_count(device)))
    few_programs = (query_heads is not None and device.type == "cuda" and not interpreting
                    and any(mask == causal and head_dim in dims and programs_per_sm() <= most
                            for mask, dims, most in ATTENTION_FEW_PROGRAMS.get(kernel, ())))
    return _attention_plan(kernel, head_dim, dtype, causal, device.type, n_keys, length, bool(descriptor_ok),
                           bool(rows_ok), interpreting, bool(whole_vectors), forced_loads, few_programs)


@plan_cache
def _clear():
    _attention_plan.cache_clear()
    _fused_backward_plan.cache_clear()


@functools.lru_cache(maxsize=4096)
def _attention_plan(kernel, head_dim, dtype, causal, device_type, n_keys, length, descriptor_ok, rows_ok,
                    interpreting, whole_vectors=False, forced_loads=False, few_programs=False) -> AttentionPlan:
    if device_type != "cuda" and not interpreting:
        return AttentionPlan(kernel, "torch", head_dim, dtype, causal)
    block_d = padded_head_dim(head_dim)
    split = _splits(kernel, head_dim, whole_vectors)
    # Rows are read by the head dim itself: a padded dim takes its power of two's row unless a row
    # of its own comes first (the forward's 96, which its split dims 80 and 96 measured with).
    short = None if interpreting else short_config(kernel, head_dim, causal, length, split)
    own = None if split else ATTENTION_HEAD_DIM_CONFIGS.get(kernel, {}).get(head_dim)
    if interpreting:
        config = ATTENTION_INTERPRETER_CONFIGS[kernel]
    elif short is not None:
        config = short[:4]
    elif own is not None:
        config = own[causal]
    else:
        # A head dim padded whole takes its padded dim's row (72 padded to 128 on the 96 row, tuned
        # for 64 + 32 tiles, spilled: 255 registers and a 96-byte stack).
        bound = head_dim if split else block_d
        row = next((r for r in ATTENTION_CONFIGS[kernel] if bound <= r[0]), ATTENTION_CONFIGS[kernel][-1])
        config = row[2] if causal else row[1]
    if few_programs and short is None and config[0] == 128 and (split or kernel != "forward"):
        config = (64, config[1], 4, config[3])
    use_descriptor = descriptor_ok and (interpreting or ATTENTION_USE_DESCRIPTOR[kernel]) and (
        forced_loads or short is None or short[4:] != ("pointer",))
    if kernel == "forward" and short is not None:
        rows = rows_ok and short[4] in ("rows", "ws") and head_dim % ATTENTION_FORWARD_ROW_DESCRIPTORS_DIVISOR == 0
        specialized = short[:4] if rows and short[4] == "ws" and head_dim == block_d else None
    else:
        rows = kernel == "forward" and rows_ok and (interpreting or (
            block_d in ATTENTION_FORWARD_ROW_DESCRIPTORS and head_dim % ATTENTION_FORWARD_ROW_DESCRIPTORS_DIVISOR == 0))
        specialized = (ATTENTION_FORWARD_WARP_SPECIALIZED.get(block_d, (None, None))[causal]
                       if rows and head_dim == block_d else None)
        pointer_config = ATTENTION_FORWARD_POINTER_CONFIGS.get(block_d, (None, None))[causal]
        if (kernel == "forward" and not rows and not interpreting and not split and own is None
                and pointer_config is not None):
            config = pointer_config
    # The interpreter keeps its small blocks (and ignores the specialization, running the same code).
    if specialized is not None and n_keys % (config if interpreting else specialized)[1] == 0:
        return AttentionPlan(kernel, "triton", head_dim, dtype, causal, False, True, True, block_d=block_d,
                             **dict(zip(_CONFIG_FIELDS, config if interpreting else specialized)))
    cap = 0 if interpreting else ATTENTION_MAX_REGISTERS.get((kernel, block_d, causal), 0)
    first, second = head_dim_parts(head_dim) if split else (block_d, 0)
    if second and not interpreting and config[3] < 2:
        # A one-stage loop over a split head dim faults (the dK/dV kernel, above
        # ATTENTION_BACKWARD_SPLIT_HEAD_DIMS) or computes wrong outputs (the forward at D80 and D96,
        # 64 x 128 blocks on the H200: docs/notes/2026-11/probe_split_head_dims-one_stage-h200.log).
        config = (*config[:3], 2)
    return AttentionPlan(kernel, "triton", head_dim, dtype, causal, use_descriptor, rows, False, block_d=first,
                         block_d2=second, max_registers=cap, **dict(zip(_CONFIG_FIELDS, config)))


def kv_stationary_split(kv_heads: int, tiles: int, slots: int) -> int:
    """Programs a KV head for the KV-stationary forward, each loading K and V once and taking every
    split-th of the head's ``tiles``, ``slots`` programs at once: the fewest waves x (tiles a
    program + its load), the smallest split on a tie. B x H32/8 S128 D128 (8 tiles, 264 slots):
    B16 and B48 take 2 (measured 237.9 against 186.7 TFLOP/s at 1, 211.9 against 196.6), B32 and
    B256 1; at D64 (396 slots) B256 takes 1 (238.3 against 219.9 at 2) and B16 3."""
    def cost(split: int) -> float:
        return -(-kv_heads * split // slots) * (-(-tiles // split) + KV_STATIONARY_LOAD_TILES)
    return min(range(1, tiles + 1), key=cost)


def kv_stationary_plan(head_dim: int, dtype: torch.dtype, causal: bool, device: torch.device, n_queries: int,
                       n_keys: int, group: int, kv_heads: int, sms: Optional[int] = None,
                       tables_specialized: bool = False) -> Optional[AttentionPlan]:
    """The forward's plan with one program a KV head, or a few (group_split), holding K and V
    (ATTENTION_FORWARD_KV_STATIONARY), where a row takes the call's keys, queries (longer query
    sequences were not timed), head dim, group and KV heads (batch x KV heads), unless it yields to
    the tables' plan being warp-specialized (``tables_specialized``); else None."""
    sms = sms or sm_count(torch.device(device))
    for most, fewest, head_dims, smallest_group, per_sm, *configs, yields in ATTENTION_FORWARD_KV_STATIONARY:
        if (fewest <= n_keys <= most and n_queries <= most and head_dim in head_dims
                and group >= smallest_group[causal] and kv_heads >= per_sm * sms
                and not (yields and tables_specialized)):
            block_m, warps, stages, halves = configs[causal]
            tiles, block_n = group * -(-n_queries // block_m), max(16, next_power_of_2(n_keys))
            # (halves are for causal tiles; under 16 keys, narrower than tl.dot takes, they failed the GPU tests)
            return AttentionPlan("forward", "triton", head_dim, dtype, causal, block_m=block_m,
                                 block_n=block_n, block_d=next_power_of_2(head_dim), num_warps=warps, num_stages=stages,
                                 kv_stationary=True, key_halves=halves and causal and block_n >= 32,
                                 group_split=kv_stationary_split(kv_heads, tiles, head_dims[head_dim] * sms))
    return None


def short_config(kernel: str, head_dim: int, causal: bool, length: int, split: bool = False) -> Optional[tuple]:
    """The ATTENTION_SHORT_CONFIGS config (with its loads field, if any) for this kernel, head dim,
    mask and length (the forward's keys, the backward's longer of queries and keys), or None: the
    tables. A head dim padded whole (not ``split`` in two parts) without rows of its own takes its
    padded dim's (ATTENTION_SHORT_CONFIGS_PADDED). The GPU's plan; the interpreter keeps its own
    small blocks."""
    dims = (head_dim,)
    if ATTENTION_SHORT_CONFIGS_PADDED and not split and padded_head_dim(head_dim) != head_dim:
        dims = (head_dim, padded_head_dim(head_dim))
    for dim in dims:
        rows = [r for r in ATTENTION_SHORT_CONFIGS[kernel] if r[1] == dim]
        if rows:
            return next((r[3] if causal else r[2] for r in rows if length <= r[0]), None)
    return None


def backward_heavy_first(kernel: str, causal: bool, group: int, blocks: int) -> bool:
    """Whether a causal backward kernel's grid launches every head's heaviest block first
    (ATTENTION_BACKWARD_HEAVY_FIRST: GQA groups of at least its entry), its ``blocks`` then on the
    grid's second axis, which holds at most 65535."""
    smallest = ATTENTION_BACKWARD_HEAVY_FIRST.get(kernel, 0)
    return causal and 0 < smallest <= group and blocks <= 65535


def dkdv_group_split(group: int, programs: int, causal: bool, device: torch.device, sms: Optional[int] = None,
                     n_queries: int = 0, block_d: int = 0, blocks: int = 1) -> int:
    """How many programs share each key block's GQA group in the dK/dV kernel: 1 where ``programs``
    (``blocks`` key blocks x batch x KV heads) reach ATTENTION_BACKWARD_GROUP_SPLIT_BELOW an SM, else
    the smallest divisor of ``group`` that brings them to ATTENTION_BACKWARD_GROUP_SPLIT_PROGRAMS an
    SM (the whole group where none does); past that, calls of ``n_queries`` at the padded head dim
    ``block_d`` split where the model of ATTENTION_BACKWARD_WAVE_SPLIT_COST gains.
    ``sms``: the device's SMs (None: asked of ``device``)."""
    sms = sms or sm_count(torch.device(device))
    per_sm = ATTENTION_BACKWARD_GROUP_SPLIT_PROGRAMS[causal]
    target = per_sm * sms
    if group <= 1:
        return 1
    if per_sm and programs < ATTENTION_BACKWARD_GROUP_SPLIT_BELOW * sms and programs < target:
        return next((split for split in range(2, group) if group % split == 0 and programs * split >= target), group)
    slots = ATTENTION_BACKWARD_DKDV_PER_SM.get(block_d, 0) * sms
    if not slots or n_queries < ATTENTION_BACKWARD_WAVE_SPLIT_QUERIES:
        return 1
    if causal:  # key block i of n runs n - i query blocks' worth (units below: one key block's of one head)
        spread = programs * (blocks + 1) / 2 * group / slots
        whole, split = max(blocks * group, spread), max(blocks, spread)
        return group if split <= ATTENTION_BACKWARD_WAVE_SPLIT_COST[causal] * whole else 1

    # Within one wave, programs sharing an SM share its throughput: the SMs count, not the slots
    # (B2 H16/2 S4096 D128, 256 programs for 264 slots, two an SM, lost 2% split 8 ways). Past a
    # few waves the last one's gaps were not what the model says (B6 H64/8 S3708, 7.03 waves: D64
    # level split 8 ways, D40 13% slower).
    if programs > ATTENTION_BACKWARD_WAVE_SPLIT_WAVES * slots:
        return 1
    units = slots if programs > slots else sms

    def waves(split: int) -> float:
        return -(-programs * split // units) / split
    best = min((split for split in range(1, group + 1) if group % split == 0), key=waves)
    return best if waves(best) <= ATTENTION_BACKWARD_WAVE_SPLIT_COST[causal] * waves(1) else 1


def backward_plans(head_dim: int, dtype: torch.dtype, causal: bool, device: torch.device, batch: int,
                   heads_q: int, heads_kv: int, n_queries: int, n_keys: int, descriptor_ok: bool,
                   batch_heads: Optional[int], whole_vectors: bool, sms: Optional[int] = None,
                   interpreting: Optional[bool] = None) -> tuple[AttentionPlan, Optional[AttentionPlan]]:
    """The backward's plans for one call: (the fused kernel's, None) where an
    ATTENTION_BACKWARD_FUSED row takes the shape; else (dK/dV, dQ), the dK/dV plan with its GQA
    group split and both with their launch order decided; (the torch plan, None) on the torch path.
    Arguments as attention_plan's; ``sms`` as dkdv_group_split's."""
    fused = fused_backward_plan(head_dim, dtype, causal, device, n_queries, n_keys, descriptor_ok,
                                batch_heads=batch_heads, programs=batch * heads_kv, interpreting=interpreting)
    if fused is not None:
        return fused, None
    loads = dict(batch_heads=batch_heads, whole_vectors=whole_vectors, interpreting=interpreting)
    dkdv = attention_plan("backward_dkdv", head_dim, dtype, causal, device, n_queries, n_keys, descriptor_ok, **loads)
    if dkdv.path == "torch":
        return dkdv, None
    dq = attention_plan("backward_dq", head_dim, dtype, causal, device, n_queries, n_keys, descriptor_ok, **loads,
                        query_heads=batch * heads_q, sms=sms)
    group = heads_q // heads_kv
    key_blocks = -(-n_keys // dkdv.block_n)
    query_blocks = -(-n_queries // dq.block_m)
    split = dkdv_group_split(group, key_blocks * batch * heads_kv, causal, device, sms, n_queries, dkdv.block_d,
                             key_blocks)
    return (dataclasses.replace(dkdv, group_split=split, blocks=key_blocks,
                                heavy_first=backward_heavy_first("backward_dkdv", causal, group, key_blocks)),
            dataclasses.replace(dq, blocks=query_blocks,
                                heavy_first=backward_heavy_first("backward_dq", causal, group, query_blocks)))


def _splits(kernel: str, head_dim: int, whole_vectors: bool) -> bool:
    """Whether ``kernel`` computes ``head_dim`` in two parts (the forward's or the backward's split tables)."""
    if kernel == "forward":
        dims, vectors_from = ATTENTION_FORWARD_SPLIT_HEAD_DIMS, ATTENTION_FORWARD_SPLIT_VECTORS_FROM
    else:
        dims, vectors_from = ATTENTION_BACKWARD_SPLIT_HEAD_DIMS[kernel], ATTENTION_BACKWARD_SPLIT_VECTORS_FROM[kernel]
    return head_dim in dims or (whole_vectors and head_dim >= vectors_from and head_dim_parts(head_dim)[1] > 0)


def fused_backward_plan(head_dim: int, dtype: torch.dtype, causal: bool, device: torch.device, n_queries: int,
                        n_keys: int, descriptor_ok: bool = True, batch_heads: Optional[int] = None,
                        programs: int = 1, interpreting: Optional[bool] = None) -> Optional[AttentionPlan]:
    """The fused backward's plan (kernel "backward_fused") where an ATTENTION_BACKWARD_FUSED row
    covers the head dim, the length and ``programs`` (batch x KV heads), else None (the split
    backward runs). Other arguments as attention_plan's."""
    interpreting = interpreter_active() if interpreting is None else interpreting
    if torch.device(device).type != "cuda" and not interpreting:
        return None
    descriptor_ok = _backward_descriptor_ok(descriptor_ok, batch_heads, n_queries, n_keys, head_dim, interpreting)
    return _fused_backward_plan(head_dim, dtype, causal, max(n_queries, n_keys), n_keys, programs,
                                bool(descriptor_ok), interpreting)


@functools.lru_cache(maxsize=1024)
def _fused_backward_plan(head_dim, dtype, causal, length, n_keys, programs, descriptor_ok, interpreting):
    bound = min((r[0] for r in ATTENTION_BACKWARD_FUSED if head_dim <= r[0]), default=None)
    if bound is None:
        return None
    rows = [r[1:] for r in ATTENTION_BACKWARD_FUSED if r[0] == bound]
    if interpreting:
        rows = [ATTENTION_INTERPRETER_CONFIGS["backward_fused"]]
    row = next((r for r in rows if length <= r[0] and (not r[1] or programs <= r[1])), None)
    if row is None:
        return None
    block_m, num_warps, num_stages = row[2:]
    # Loads as the dK/dV kernel's, whose work (K and V held, query blocks streamed) it repeats.
    use_descriptor = descriptor_ok and (interpreting or ATTENTION_USE_DESCRIPTOR["backward_dkdv"])
    return AttentionPlan("backward_fused", "triton", head_dim, dtype, causal, use_descriptor, block_m=block_m,
                         block_n=max(16, next_power_of_2(n_keys)), block_d=padded_head_dim(head_dim),
                         num_warps=num_warps, num_stages=num_stages)


def _backward_descriptor_ok(descriptor_ok: bool, batch_heads: Optional[int], n_queries: int, n_keys: int,
                            head_dim: int, interpreting: bool) -> bool:
    """The layout's answer, turned off on the GPU where a backward's work is within
    ATTENTION_BACKWARD_POINTER_MAX_WORK (``batch_heads`` None: a forced load path, kept)."""
    small = (batch_heads is not None and not interpreting
             and batch_heads * n_queries * n_keys * head_dim <= ATTENTION_BACKWARD_POINTER_MAX_WORK)
    return descriptor_ok and not small


_CONFIG_FIELDS = ("block_m", "block_n", "num_warps", "num_stages")


def forward_flops(batch: int, heads_q: int, n_queries: int, n_keys: int, head_dim: int, causal: bool) -> int:
    """The forward's matrix-product FLOPs as FlashAttention counts them (QK^T and PV, 2 each a
    multiply-add), halved under a causal mask; a backward counts 2.5 times these."""
    flops = 4 * batch * heads_q * n_queries * n_keys * head_dim
    return flops // 2 if causal else flops


_recorded = LastPlan()
# The plan of the most recent launch in this process (tests assert which path ran).
record_attention = _recorded.record
last_attention_plan = _recorded.last
