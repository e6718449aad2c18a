"""softmax / log_softmax / logsumexp launch decisions: shape, dtype and device -> strategy and parameters.

Every decision the launchers make lives here as small tables, so that it can be printed
(``onlinesoftmax explain``), tested (each strategy forced and asserted) and tuned in one place
(:func:`onlinesoftmax.override_plan`). The measurements behind each value are in
``docs/perf-softmax.md``.

Strategies (``STRATEGIES``, each described in ``docs/design.md``): ``row_on_chip``, ``looped``,
``split_row``, ``split_row_on_chip``, ``torch`` (torch's own kernel: CPU tensors, float64, eager
calls the host decides: ``EAGER_HOST_US``) and ``vectorized`` (torch ops, on request). Chunk and
block boundaries sit at absolute 16-byte addresses (``_triton.aligned_row``).
"""

from __future__ import annotations

import functools

import torch

from ..._device import LastPlan, cdiv, interpreter_active, next_power_of_2, plan_cache, sm_count
from .decision import BACKWARD_OPS, FORWARD_OPS, Plan

STRATEGIES = ("row_on_chip", "looped", "split_row", "split_row_on_chip", "torch", "vectorized")
TRITON_STRATEGIES = ("row_on_chip", "looped", "split_row", "split_row_on_chip")
ALGORITHMS = ("auto", "online", "safe")
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Largest row (a power of two, in elements) row_on_chip keeps in registers, by element size:
# beyond it the row's registers leave too few programs an SM (bf16 1024x32768: 2415 GB/s on chip, 2177 looped).
ROW_ON_CHIP_MAX_COLS = {4: 32768, 2: 32768}
# The backward holds y and dy; the same limit measured best.
BACKWARD_ROW_ON_CHIP_MAX_COLS = {4: 32768, 2: 32768}
# 2-byte rows longer than one stream block that fill less than this share of row_on_chip's
# power-of-two tile are not held whole: the idle lanes cut what an SM has in flight. The backward
# takes looped; the forward split_row_on_chip where rows start off 16-byte boundaries (aligned rows'
# chunks compile to 106 registers, not 32), up to a tile of ROW_ON_CHIP_PADDED_SPLIT_MAX_COLS or from
# ROW_ON_CHIP_HALF_EMPTY_SPLIT_MIN_ROWS_PER_SM rows an SM. GB/s: H100 bf16 9682 x 8604 forward
# 1264-1300 -> 1715-1924, backward 1663-1758 -> 2498-2538, aligned 1024 x 17000 split 179-870; H200
# log_softmax 982 x 18038 1691 -> 2318 (torch 1882), 264 x 18038 1718 -> 1551; fp32 lost: never
# (notes/2026-11/sweep_strategies-padded-h100.log, tune_softmax-vector_rows-h200.log).
ROW_ON_CHIP_MIN_FILL = {4: 0.0, 2: 0.6}
ROW_ON_CHIP_HALF_EMPTY_SPLIT_MIN_ROWS_PER_SM = 3
ROW_ON_CHIP_PADDED_SPLIT_MAX_COLS = 16384
# Rows off 16-byte boundaries whose row_on_chip tile is larger than ROW_ON_CHIP_PADDED_SPLIT_MAX_COLS
# and at least this full (by element size; None: never) take split_row_on_chip, forward and
# backward (logsumexp stays on chip): a whole misaligned row on 16 warps, two programs an SM, left
# too little in flight. H100, GB/s, forward / backward: bf16 log_softmax 262x32076 1420 -> 1626 /
# 1522 -> 1751 (torch 1404 / 1528), 131x32076 1030 -> 1110 / 1285 -> 1467; aligned rows stay
# (262x20000: 1548 on chip, 1114 split) (docs/notes/2026-11/sweep_strategies-misaligned-h100.log).
ROW_ON_CHIP_MISALIGNED_SPLIT_MIN_FILL = {4: None, 2: 0.7}
# ... but rows whose starts and lengths are multiples of ROW_ON_CHIP_WHOLE_MIN_ROW_BYTES (read a
# vector a load: ROW_ALIGN, which the H100's runs predate) are held whole below this many rows an SM,
# by op and dtype (None: any count). H200, graphs, GB/s, split -> whole: fp16 log_softmax 43 x 26020
# 591 -> 832, backward 2048 x 26020 3095 -> 3728 (torch 3142); bf16 softmax 4096 x 26020 2835 -> 3567,
# but fp16 softmax 2048 x 26020 2661 -> 2580 (notes/2026-11/tune_softmax-few_long_rows-, -vector_rows-h200.log).
ROW_ON_CHIP_MISALIGNED_SPLIT_MIN_ROWS_PER_SM = {
    "softmax": {torch.bfloat16: None, torch.float16: 2}, "log_softmax": {torch.bfloat16: 2, torch.float16: 2},
    "softmax_backward": {torch.bfloat16: 8, torch.float16: None},
    "log_softmax_backward": {torch.bfloat16: None, torch.float16: None}}
ROW_ON_CHIP_WHOLE_MIN_ROW_BYTES = 8
# Such rows that MISALIGNED_ONE_CHUNK_* would take as one chunk of these tiles are held whole too, by
# op and dtype (one chunk -> whole: softmax fp16 1056 x 6004 2272 -> 2846, backward 16384 x 6004 3777
# -> 4263; bf16 backward 4096 x 7004 3893 -> 3889, log_softmax fp16 16384 x 6004 3909 -> 3691).
ROW_ON_CHIP_VECTOR_ROWS_WHOLE_TILES = {"softmax": {torch.bfloat16: (8192,), torch.float16: (8192,)},
                                       "softmax_backward": {torch.float16: (8192,)}}
# Backward rows off 16-byte boundaries whose row_on_chip tile is at least MIN_TILE elements (by
# element size; None: never) take looped where the rows' tiles hold MIN_ELEMENTS_PER_SM an SM, but
# for the full tiles that _full_large_tile splits: held whole, such a row takes 50 registers a
# thread at 32 warps (bf16 3077 x 12867; 12800: 32). H200, CUDA graphs, GB/s, whole -> looped
# (torch): bf16 log_softmax 3077 x 12867 2303 -> 3459 (3436); 64 x 12867 1101 -> 763; fp32 and rows
# on boundaries stay (docs/perf-h200.md, notes/2026-11/tune_softmax-misaligned_backward-h200.log).
BACKWARD_MISALIGNED_LOOPED_MIN_TILE = {4: None, 2: 8192}
BACKWARD_MISALIGNED_LOOPED_MIN_ELEMENTS_PER_SM = 32768
# softmax and log_softmax rows off 16-byte boundaries, from MISALIGNED_MIN_ROWS_PER_SM rows an SM (by
# element size), that a tile of MISALIGNED_ONE_CHUNK_TILES holds with a chunk's margin, at least
# MISALIGNED_ONE_CHUNK_MIN_FILL full, take split_row_on_chip as one chunk of it (no exchange; a warp
# per MISALIGNED_ONE_CHUNK_WARP_BYTES of the tile, by op and dtype), ahead of looped and the tail.
# Else the forward, held whole, reads element by element (46-48 registers at 12867 on 32 warps: one
# program an SM): tiles of MISALIGNED_FORWARD_SPLIT_MIN_TILE and up take split_row_on_chip, tiles of
# 8192 the warps of ROW_ON_CHIP_MISALIGNED_FORWARD_WARPS. H200, GB/s (aligned neighbour): forward
# bf16 3077 x 12867 1734 -> 3174 (2939), fp32 2825 -> 3786 (3881); backward bf16 3403 -> 3840, fp32
# softmax 3393 -> 4124, fp16 2989 -> 3966 (16 warps: 75 registers, one program an SM) (perf-h200.md).
MISALIGNED_MIN_ROWS_PER_SM = {4: 8, 2: 4}
MISALIGNED_ONE_CHUNK_TILES = {"forward": {4: (16384,), 2: (8192, 16384)}, "backward": {4: (16384,), 2: (8192, 16384)}}
MISALIGNED_ONE_CHUNK_MIN_FILL = {"forward": 0.0, "backward": 0.6}
MISALIGNED_ONE_CHUNK_WARP_BYTES = {
    "forward": {torch.float32: 4096, torch.bfloat16: 4096, torch.float16: 4096},
    "softmax_backward": {torch.float32: 8192, torch.bfloat16: 2048, torch.float16: 4096},
    "log_softmax_backward": {torch.float32: 2048, torch.bfloat16: 2048, torch.float16: 4096}}
# One-chunk backward rows under MISALIGNED_ONE_CHUNK_TAIL_BELOW_FILL of their tile (a chunk's margin
# included) are held as a head of half the tile and a tail, a warp per ..._TAIL_WARP_BYTES of the head.
# H200, GB/s: fp32 softmax 4096 x 10007 3799 -> 4144; rows filling 79% lost (perf-h200.md).
MISALIGNED_ONE_CHUNK_TAIL_BELOW_FILL = {4: 0.75, 2: 0.75}
MISALIGNED_ONE_CHUNK_TAIL_WARP_BYTES = {"softmax_backward": {4: 4096, 2: 2048}, "log_softmax_backward": {4: 2048, 2: 2048}}
MISALIGNED_FORWARD_SPLIT_MIN_TILE = 16384
ROW_ON_CHIP_MISALIGNED_FORWARD_WARPS = {8192: 8}
# float32 log_softmax rows longer than ROW_ON_CHIP_LOG_SPLIT_MIN_COLS that fill less than this share
# of row_on_chip's tile take split_row_on_chip, forward. H100, ms: 9682 x 8604 0.3048 -> 0.2567 (torch
# 0.3336); softmax stays (0.2271 on chip, 0.2591 split) (notes/2026-11/probe_mid_rows_forward-h100.log).
ROW_ON_CHIP_LOG_MIN_FILL = {4: 0.6, 2: 0.0}
ROW_ON_CHIP_LOG_SPLIT_MIN_COLS = 8192
# Rows longer than ROW_ON_CHIP_TAIL_MIN_COLS that fill less than this share of row_on_chip's
# power-of-two tile are held as the power of two below (the head, full, at most
# ROW_ON_CHIP_TAIL_MAX_HEAD) and a tail tile after it (the next power of two of the rest, at least
# ROW_ON_CHIP_MIN_TAIL), on ROW_ON_CHIP_TAIL_WARPS warps; by direction and element size (0: never).
# Rows that start off 16-byte boundaries only up to a head of ROW_ON_CHIP_TAIL_MISALIGNED_MAX_HEAD
# (2-byte backward: bf16 16384 x 4097 log_softmax 0.2116 -> 0.1511 ms at a head of 4096). H100, ms,
# plan before -> tail at 8 warps: bf16 softmax 2048 x 8200 0.0379 -> 0.0296, but 8192 x 5000 (61%
# full) 0.0643 -> 0.0702 (notes/2026-11/probe_tailed_rows-h100.log, probe_tailed_rows-misaligned-h100.log).
ROW_ON_CHIP_TAIL_BELOW_FILL = {"forward": {4: 0.55, 2: 0.55}, "backward": {4: 0.8, 2: 0.6}}
ROW_ON_CHIP_TAIL_MAX_HEAD = {"forward": {4: 16384, 2: 8192}, "backward": {4: 16384, 2: 16384}}
ROW_ON_CHIP_TAIL_MISALIGNED_MAX_HEAD = {"forward": {4: 16384, 2: 8192}, "backward": {4: 16384, 2: 4096}}
ROW_ON_CHIP_TAIL_MIN_COLS = 4096
ROW_ON_CHIP_MIN_TAIL = 16
ROW_ON_CHIP_TAIL_WARPS = 8
# ... and 2-byte forward rows off 16-byte boundaries, at most one an SM, up to 60% of their tile, heads
# up to 16384 (H200, graphs, log_softmax GB/s: 15 x 18419 154 -> 186, torch 178; but 528 x 18419 1789
# -> 1580, and rows on boundaries lost: docs/perf-h200.md, "Few rows of 4K-32K elements").
ROW_ON_CHIP_TAIL_FEW_ROWS_PER_SM = 1
ROW_ON_CHIP_TAIL_FEW_ROWS_BELOW_FILL = {4: 0.0, 2: 0.6}
ROW_ON_CHIP_TAIL_FEW_ROWS_MAX_HEAD = {4: 0, 2: 16384}
# ... up to ROW_ON_CHIP_TAIL_WORD_STARTS_ROWS_PER_SM an SM where rows start on 4-byte boundaries
# (lengths 2 mod 4) with a tail of at most ROW_ON_CHIP_TAIL_WORD_STARTS_MAX_TAIL (rows of up to
# 18432 elements). H200, graphs, GB/s, plan before -> tail (torch): bf16 log_softmax 150 x 18038 1088
# -> 1269 (1204), 264 x 18038 1722 -> 1975 (1915), 264 x 17502 1688 -> 1930 (1918), 500 x 17502
# 1954 -> 2053 (2022); softmax 264 x 18038 1587 -> 1965 (1496); but rows of 19002 (a tail of 4096)
# and odd lengths lost (200 x 19002 log_softmax 1461 -> 1273: perf-h200.md, "Few rows of about 18K").
ROW_ON_CHIP_TAIL_WORD_STARTS_ROWS_PER_SM = 4
ROW_ON_CHIP_TAIL_WORD_STARTS_MAX_TAIL = 2048
# logsumexp's rows too, by the forward's table (its kernel is the forward's without the write). H100,
# ms, plan without tails -> tail at 8 warps: bf16 16384 x 4097 0.1811 -> 0.1148; rows fuller than the
# table's 55% were mixed (docs/notes/2026-11/probe_tailed_rows-logsumexp-h100.log).
ROW_ON_CHIP_TAIL_LOGSUMEXP = True
# Shorter rows, softmax and log_softmax forward: rows of ROW_ON_CHIP_SHORT_TAIL_MIN_COLS to
# ROW_ON_CHIP_TAIL_MIN_COLS elements under ROW_ON_CHIP_SHORT_TAIL_BELOW_FILL of their power-of-two
# tile (the width) take a head and a tail too, within the MAX_HEAD / MAX_TAIL caps, packed as the
# width would be but one row a program below SPREAD_ROWS_PER_SM rows an SM (a tail of at most
# FEW_ROWS_MAX_TAIL_SHARE of the head) and, from ROW_TILE_MANY_ROWS_PER_SM, ROW_TILE_MANY_ROWS_ELEMENTS
# // width rows on MANY_ROWS_WARPS warps. H200, graphs, 70 shapes of 70-350 elements: softmax 1.08x ->
# 1.24x torch, log_softmax 0.94x -> 1.08x (notes/2026-11/tune_softmax-short_tail_off-h200.json); not
# logsumexp, whose results it put on other rows (notes/2026-11/check_short_tail-h200.log).
ROW_ON_CHIP_SHORT_TAIL_BELOW_FILL = {4: 0.76, 2: 0.76}
ROW_ON_CHIP_SHORT_TAIL_MIN_COLS = 64
ROW_ON_CHIP_SHORT_TAIL_MAX_HEAD = {4: 128, 2: 256}
ROW_ON_CHIP_SHORT_TAIL_MAX_TAIL = {4: 32, 2: 64}
ROW_ON_CHIP_SHORT_TAIL_FEW_ROWS_MAX_TAIL_SHARE = 0.25
ROW_ON_CHIP_SHORT_TAIL_SPREAD_ROWS_PER_SM = 16
ROW_ON_CHIP_SHORT_TAIL_MANY_ROWS_WARPS = 1
# bf16 rows at least this long wait in registers at 16 bits (widened for each use): half the registers,
# 2 programs an SM; fp16's log_softmax too (by op), from ROW_ON_CHIP_HOLD_INPUT_MIN_ROWS_PER_SM rows an SM,
# rows read in granules only where ..._GRANULE_ROWS says. H200, graphs, GB/s: fp16 log_softmax 1024 x
# 20000 2011 -> 2839 (torch 2334), 8192 x 30000 3064 -> 4034; but 64 x 32768 1385 -> 1305, 8-byte rows
# 2048 x 26020 2520 -> 2481, and fp16 softmax held takes 110 registers: 1024 x 32768 2762 -> 2431
# (notes/2026-11/tune_softmax-held_fp16-h200.log).
ROW_ON_CHIP_HOLD_INPUT_MIN_COLS = {torch.bfloat16: 32768, torch.float16: {"log_softmax": 32768}}
ROW_ON_CHIP_HOLD_INPUT_MIN_ROWS_PER_SM = {torch.float16: 1}
ROW_ON_CHIP_HOLD_INPUT_GRANULE_ROWS = {torch.bfloat16: True, torch.float16: False}
# A held row takes at most 16 warps: 64 registers a thread, 2 programs an SM, half the warps in each cross-warp reduction.
ROW_ON_CHIP_HOLD_INPUT_MAX_WARPS = 16
# row_on_chip packs short rows until a program's tile has about this many elements, by direction.
# The forward's 4096 -> 1024 (rows of 1024 elements and more one a program): H100, CUDA graphs, GB/s,
# softmax / log_softmax (torch): fp32 2048 x 1000 2272 -> 2696 / 2255 -> 2761 (2073 / 2554); then
# 1024 -> 512 (rows of up to 256 elements two or more a program on one warp): bf16 1536 x 101 201 ->
# 273 / 187 -> 265 (229 / 263), fp32 1024 x 256 775 -> 871; lost: bf16 16384 x 128 2123 -> 1973
# (torch 1395) (docs/notes/2026-11/tune_softmax-row_on_chip_tile-h100.json, -short_rows-, -forward_tile_512-).
ROW_TILE_ELEMENTS = {"forward": 512, "backward": 4096}
# Rows of unit stride (launch._unit_rows), ROW_UNIT_MIN_ROWS or more a program and ROW_UNIT_MIN_PROGRAMS_PER_SM programs
# an SM, read along the rows (kernels._tile_ptrs): tiles by element size and the widths measured ahead, the forward's
# from ROW_UNIT_FORWARD_MIN_WIDTH (perf-softmax, "Over a dim that is not the last").
ROW_UNIT_TILE_ELEMENTS = {2: {32: 16384, 128: 8192, 256: 8192, 1024: 16384}, 4: {32: 4096, 128: 4096, 256: 4096}}
ROW_UNIT_WARPS, ROW_UNIT_MIN_ROWS, ROW_UNIT_MIN_PROGRAMS_PER_SM, ROW_UNIT_FORWARD_MIN_WIDTH = 4, 16, 2, 64
# ... and, in the forward, no more rows a program than leave every SM one (a power of two at most
# rows / SMs). Under CUDA graphs, µs a call, packed -> spread (torch): bf16 softmax 10 x 221 4.70 ->
# 3.00 (3.59); faster in 30 of the 36 cells it changes, the largest loss 0.15 µs (bf16 softmax 16 x
# 710); the backward not measured (docs/notes/2026-11/probe_small_rows_graph-h100.log).
ROW_TILE_SPREAD_OVER_SMS = True
# The cap leaves each SM at least this many programs. More made rows of 143 elements one a program
# (1207 x 143 on the H200: 220 -> 287 GB/s, fp32 429 -> 571; torch 280, 556) and others slower
# (bf16 4096 x 64 500 -> 386, 2048 x 200 700 -> 578 at 8; tune_softmax-spread-h200.json).
ROW_TILE_SPREAD_PROGRAMS_PER_SM = 1
# ... and rows the forward's tile holds one a program (257-512 elements) go two a program on two
# warps from this many rows an SM: more than one wave of one-warp programs (Hopper runs at most 32
# an SM). H200, graphs, GB/s: bf16 softmax 16384 x 384 2127 -> 2986 (torch 1869); at 16 rows an SM
# fp32 lost (4096 x 500 3143 -> 3024) (docs/notes/2026-11/tune_softmax-mid_rows-h200.json, -many_rows-).
ROW_TILE_MANY_ROWS_PER_SM = 32
ROW_TILE_MANY_ROWS_ELEMENTS = 1024
# (tile elements up to, num_warps): about 16 elements a thread, four 16-byte loads of fp32.
WARPS_BY_TILE_ELEMENTS = ((512, 1), (1024, 2), (2048, 4), (4096, 8), (8192, 16), (65536, 32))

# looped and split_row stream blocks of this many elements an iteration (16 KB in flight).
STREAM_BLOCK = {4: 4096, 2: 8192}
STREAM_WARPS = 8
# ... except looped's log_softmax backward, (block, warps) by element size: its first pass reads dy
# alone, and the second re-reads dy from L2 beside y; more warps over smaller blocks keep more of
# both in flight. H100, scripts/probes/probe_log_backward_configs.py (docs/notes/2026-11/
# probe_log_backward_configs-h100.log), ms, (8192, 8) -> (4096, 16): bf16 2048 x 8200 0.0480 ->
# 0.0430 (torch 0.0415), 1024 x 17000 0.0502 -> 0.0470 (torch 0.0433), 9682 x 8604 0.2002 ->
# 0.1793 (torch 0.2220); fp32 (4096, 8) -> (2048, 16): 4096 x 4100 0.0821 -> 0.0747.
LOG_BACKWARD_STREAM = {2: (4096, 16), 4: (2048, 16)}
# ... and its softmax backward of 2-byte rows up to SOFTMAX_BACKWARD_STREAM_MAX_COLS elements, which
# reads y and dy in both passes. H100, probe_log_backward_configs.py --softmax (docs/notes/2026-11/
# probe_log_backward_configs-softmax-h100.log), ms, (8192, 8) -> (4096, 16): bf16 9682 x 8604 0.1970
# -> 0.1770 (torch.compile 0.1751 in another run), 4096 x 9500 0.0971 -> 0.0900, 2048 x 8604 0.0519
# -> 0.0466, fp16 9682 x 8604 0.1879 -> 0.1772; but 1024 x 17004 0.0519 -> 0.0541.
SOFTMAX_BACKWARD_STREAM = {2: (4096, 16)}
SOFTMAX_BACKWARD_STREAM_MAX_COLS = 16384
# split_row: programs an SM to aim for, by rows (the first entry whose row count is >= the rows
# applies). One row: 2 wide programs an SM beat 4 narrower ones (bf16 64x128256: 1771 against 1515
# GB/s). More rows: 8, so that a few hundred long rows balance over the SMs (H100, 198 x 615032 bf16
# 1131 -> 1288 GB/s, torch 1280: docs/notes/2026-11/tune_softmax-split_row_rows-h100.log).
SPLIT_PROGRAMS_PER_SM = ((1, 2), (1 << 62, 8))
SPLIT_WARPS = 16
SPLIT_MAX_CHUNKS = 1024  # the merge loads all of a row's partials in one tile
SPLIT_BELOW_ROWS_PER_SM = 2  # below this many rows an SM, rows alone cannot fill the GPU: split them

# split_row_on_chip: chunks of at most this much input each (forward / backward, which holds y and dy: per tensor);
# many small programs beat few large ones. A value is bytes, or {element size: bytes}.
SPLIT_ON_CHIP_TILE_BYTES = {"forward": 16384, "backward": {4: 32768, 2: 16384}}
# One warp per this many bytes of a program's tile ...
SPLIT_ON_CHIP_WARP_BYTES = {"forward": 2048, "backward": {4: 8192, 2: 1024}}
# ... except the 2-byte backward of rows read in granules (the kernel then reads the row's partial
# granules on their own): 4 warps an 8192-element tile instead of 16. H100, GB/s, bf16 2048 x 50257
# log_softmax 1896 -> 2568 (torch 2189); aligned rows lost (256 x 151936 2564 -> 2345); granule rows
# on 16-byte starts gained (1742 x 95704 0.491 -> 0.373 ms) (docs/notes/2026-11/
# tune_softmax-split_on_chip_backward_misaligned-h100.log, probe_whole_granule_rows-{granules-,}h100.log).
SPLIT_ON_CHIP_MISALIGNED_BACKWARD_WARP_BYTES = {4: 8192, 2: 4096}
# ... and the 2-byte softmax backward (not log_softmax's) of other rows from this many rows an SM: bf16
# a warp per 2048 bytes (8 warps an 8192-element tile), fp16 a warp per 4096 (4 warps). H200, CUDA
# graphs, GB/s, 16 -> 8 warps (scripts/tune/tune_softmax.py --backward --variants
# aligned_backward_warps, docs/notes/2026-11/tune_softmax-aligned_backward_warps-h200.log): bf16
# 8192 x 65536 3385 -> 3840, 8192 x 50304 3149 -> 3670, 1024 x 128256 3177 -> 3567, 528 x 65536
# 2988 -> 3157; fp16 8192 x 65536 3390 -> 3818; but 256 x 151936 3277 -> 3163 (two rows an SM);
# log_softmax's lost at most of them (8192 x 65536 3555 -> 3332).
# By dtype: fp16 ran 2-6% faster on 4 warps (a warp per 4096 bytes) at each of six shapes (8192 x 50304
# 3642 -> 3846, 8192 x 131072 3770 -> 3960, 1024 x 128256 3497 -> 3655), where bf16 lost up to 11% on 4
# (1024 x 128256 3553 -> 3168). 0: the chunks' warps as SPLIT_ON_CHIP_WARP_BYTES gives them.
SPLIT_ON_CHIP_SOFTMAX_BACKWARD_WARP_BYTES = {torch.float32: 0, torch.bfloat16: 2048, torch.float16: 4096}
SPLIT_ON_CHIP_SOFTMAX_BACKWARD_MIN_ROWS_PER_SM = 4
# Uncapped forward launches past one wave take a warp per this many bytes (bf16 2048 x 50257 2636 -> 2939 GB/s);
# rows in fewer programs than SMs take chunks of FEW_PROGRAMS_TILE_BYTES, the same bytes a warp (forward bf16
# 1 x 262147 136 -> 161, backward 1 x 100003 88 -> 108; docs/notes/2026-11/tune_softmax-split_on_chip_*-h200.log).
SPLIT_ON_CHIP_UNCAPPED_WARP_BYTES = 4096
SPLIT_ON_CHIP_FEW_PROGRAMS_TILE_BYTES = {"forward": 8192, "backward": {4: 8192, 2: 4096}}
# Rows that need larger tiles than this cannot be held (the strategy refuses them when asked for).
SPLIT_ON_CHIP_MAX_TILE = 16384
# The largest tile the plan picks the strategy for by itself; longer rows go to split_row. With
# 16384-element tiles (rows of 540K-1.08M on 132 SMs) bf16 198x615032 took 1.93 ms against torch's
# 0.38 (a random shape of the sweep; the floor is 0.16 ms).
SPLIT_ON_CHIP_AUTO_MAX_TILE = 8192
SPLIT_ON_CHIP_MAX_CHUNKS_PER_SM = 0.5  # a row's programs must be resident together: at most half the SMs' worth
# Register cap a thread (Triton's maxnreg) by op (and element size), 0 for the compiler's choice:
# 32 lets 8 bf16 softmax programs share an SM instead of 6 with no spill; the 2-byte log_softmax and the
# backward spill under it; fp32 ran 1.01-1.12x faster uncapped on half the warps (16 x 262144 2214 -> 2374
# GB/s: docs/notes/2026-11/tune_softmax-split_on_chip_forward_fp32_uncapped-h200.log).
SPLIT_ON_CHIP_MAX_REGISTERS = {"softmax": {4: 0, 2: 32}, "log_softmax": 0, "logsumexp": 0,
                               "softmax_backward": 0, "log_softmax_backward": 0}
# ... and only where a chunk fills at least this share of its power-of-two tile: below it the capped
# kernels spill (scripts/probes/kernel_resources.py: bf16 softmax chunks of 4512-5680 in 8192-element
# tiles, a 456-byte stack), and bf16 1024 x 17000 so capped ran at 179 GB/s on the H100.
SPLIT_ON_CHIP_CAP_MIN_FILL = 0.75
# ... and up to this many bytes of the tile a thread (bf16 tiles of 4096 on 2 warps spilled under it).
SPLIT_ON_CHIP_CAP_MAX_THREAD_BYTES = 64
# The cap buys programs an SM, which only counts beyond one uncapped wave (bf16 16x262144 lost 11.8 -> 12.2 us under it).
SPLIT_ON_CHIP_UNCAPPED_PROGRAMS_PER_SM = 6

# The eager torch route (its model: eager_route.py). An eager call back to back costs the longer of
# its host time and its GPU time, and our host time (Python, the allocation, a Triton launch; an
# autograd node each direction) exceeds torch's C++ dispatch: where torch's kernel would finish
# within it, an eager call runs torch's kernel (torch's result, at torch's speed). CUDA-graph capture,
# torch.compile and calls naming a strategy or algorithm run the kernels. H100 values (perf-softmax,
# "The eager torch route"); a model that errs short sends what it misjudges to torch's kernel.
# Our host time an eager call, µs: "forward" by the plan's launches; "train", a forward and backward
# through autograd (bench host, bf16 64 x 4096: forward 16.0, step 168.4; the step's line at 180
# from the sweeps' training steps: perf-softmax, "The eager route's model of few long rows").
EAGER_HOST_US = {"forward": {1: 16.0, 2: 26.0, 3: 34.0}, "train": 180.0}
# Ops whose eager forward never takes the route: torch.logsumexp is a composite of about seven
# kernels (amax, the infinity mask, subtract, exp, sum, log, add), whose host time, 67.8 µs a call in
# bench host, is above our one launch's (77.2 µs through the route, our lookup on top).
EAGER_ROUTE_FORWARD_OFF = ("logsumexp",)
# EAGER_HOST_US with the route turned off (override_plan("softmax", EAGER_HOST_US=EAGER_ROUTE_OFF)):
# every eager call runs the kernels (the GPU tests, the host bench's kernel rows, the crossover probe).
EAGER_ROUTE_OFF = {"forward": {1: 0.0, 2: 0.0, 3: 0.0}, "train": 0.0}
# torch's softmax kernel on the GPU: rows up to TORCH_SHORT_ROW_COLS elements stream at
# TORCH_STREAM_GBS; longer rows take one block each, TORCH_ROW_US + TORCH_ROW_NS_PER_ELEMENT a row
# alone, TORCH_ROWS_PER_SM blocks an SM, and stream no faster than TORCH_LONG_ROW_GBS.
TORCH_SHORT_ROW_COLS = 1024
TORCH_STREAM_GBS = 2800.0
TORCH_LONG_ROW_GBS = 2000.0
TORCH_ROW_US = 2.0
TORCH_ROW_NS_PER_ELEMENT = 0.2
TORCH_ROWS_PER_SM = 4
# ... except softmax's backward, whose long rows stream at 1224-1233 GB/s at every long-row cell of
# the sweeps (log_softmax's at 2017-2102): docs/perf-softmax.md, "The eager route's model".
TORCH_SOFTMAX_BACKWARD_LONG_ROW_GBS = 1230.0
# torch over a dim that is not the last (inner elements after it: its spatial kernels; eager_route.torch_spatial_us):
# lower bounds, below every measured call (H200, graph replays, 1-17M elements: up to 2950 GB/s over short dims
# of many inner elements, a walk along long dims at 0.23-0.33 µs a step; bf16 4096 x 1000 over dim 0 2.8 ms, 34x
# ours: perf-softmax, "Over a dim that is not the last").
TORCH_SPATIAL_GBS = 4000.0
TORCH_SPATIAL_STEP_NS = 100.0
# A training step's kernels, fitted to torch's alone (graph replays, 1-1056 rows of 4097-1048577
# elements, fp32 and bf16; perf-softmax, "The eager route's model of few long rows"): rows side by
# side slow one another, so a long row costs TORCH_ROW_US + TORCH_STEP_NS_PER_ELEMENT an element, the
# bytes adding at the rates above (fp32 32 x 262147: 294 µs, where the forward's model said 136). The
# forward keeps its shorter model: its 16 µs line is where our eager forwards measured 14-23 µs.
TORCH_STEP_NS_PER_ELEMENT = {"softmax": {4: 0.25, 2: 0.23}, "log_softmax": {4: 0.22, 2: 0.15},
                             "softmax_backward": {4: 0.27, 2: 0.18}, "log_softmax_backward": {4: 0.34, 2: 0.24}}


def _split_on_chip_max_chunks(sms: int) -> int:
    return max(1, int(sms * SPLIT_ON_CHIP_MAX_CHUNKS_PER_SM))


def _for_element_size(value, elem: int) -> int:
    """A plan table's entry: a number, or {element size: number} where the dtypes differ."""
    return value[elem] if isinstance(value, dict) else value


def _split_on_chip_bytes(table: dict, backward: bool, elem: int) -> int:
    return _for_element_size(table["backward" if backward else "forward"], elem)


def _split_on_chip_tile(backward: bool, cols: int, elem: int, sms: int) -> int:
    """The chunk tile for rows of ``cols``: the smallest that keeps the chunks within bounds
    (above SPLIT_ON_CHIP_MAX_TILE when no tile does; the caller checks)."""
    smallest = _split_on_chip_bytes(SPLIT_ON_CHIP_TILE_BYTES, backward, elem) // elem
    return max(smallest, next_power_of_2(cdiv(cols, _split_on_chip_max_chunks(sms))))


def _full_large_tile(cols: int, elem: int) -> bool:
    """Rows whose row_on_chip tile is above ROW_ON_CHIP_PADDED_SPLIT_MAX_COLS and at least
    ROW_ON_CHIP_MISALIGNED_SPLIT_MIN_FILL full."""
    fill = ROW_ON_CHIP_MISALIGNED_SPLIT_MIN_FILL[elem]
    tile = next_power_of_2(cols)
    return fill is not None and tile > ROW_ON_CHIP_PADDED_SPLIT_MAX_COLS and cols >= fill * tile


def _vector_rows_whole(op: str, rows: int, cols: int, dtype: torch.dtype, sms: int, row_multiple: int) -> bool:
    """Rows of vectors that a split rule for rows off 16-byte boundaries takes, held whole instead."""
    if row_multiple * dtype.itemsize < ROW_ON_CHIP_WHOLE_MIN_ROW_BYTES:
        return False
    if _full_large_tile(cols, dtype.itemsize):
        per_sm = ROW_ON_CHIP_MISALIGNED_SPLIT_MIN_ROWS_PER_SM.get(op, {}).get(dtype, 0)
        return per_sm is None or rows < per_sm * sms
    return next_power_of_2(cols) in ROW_ON_CHIP_VECTOR_ROWS_WHOLE_TILES.get(op, {}).get(dtype, ())


def _holds_input(op: str, dtype: torch.dtype, block: int, rows: int, sms: int, granule_rows: bool) -> bool:
    """Whether row_on_chip's forward holds a tile of ``block`` in the input dtype (ROW_ON_CHIP_HOLD_INPUT_*)."""
    min_cols = ROW_ON_CHIP_HOLD_INPUT_MIN_COLS.get(dtype, 0)
    if isinstance(min_cols, dict):  # by op
        min_cols = min_cols.get(op, 0)
    return (0 < min_cols <= block and rows >= ROW_ON_CHIP_HOLD_INPUT_MIN_ROWS_PER_SM.get(dtype, 0) * sms
            and (not granule_rows or ROW_ON_CHIP_HOLD_INPUT_GRANULE_ROWS.get(dtype, True)))


def _misaligned_backward_looped(rows: int, cols: int, elem: int, sms: int) -> bool:
    """Backward rows off 16-byte boundaries that BACKWARD_MISALIGNED_LOOPED_* give to looped."""
    min_tile, tile = BACKWARD_MISALIGNED_LOOPED_MIN_TILE[elem], next_power_of_2(cols)
    return min_tile is not None and tile >= min_tile and rows * tile >= BACKWARD_MISALIGNED_LOOPED_MIN_ELEMENTS_PER_SM * sms


def _many_misaligned_rows(op: str, rows: int, elem: int, sms: int, misaligned_rows: bool) -> bool:
    """Rows off 16-byte boundaries, as many as MISALIGNED_MIN_ROWS_PER_SM, that the MISALIGNED_* rules
    plan (logsumexp's were not measured)."""
    return misaligned_rows and op != "logsumexp" and rows >= MISALIGNED_MIN_ROWS_PER_SM[elem] * sms


def _one_chunk_tile(op: str, rows: int, cols: int, elem: int, sms: int, misaligned_rows: bool) -> int:
    """The tile that holds rows off 16-byte boundaries as one split_row_on_chip chunk (its 15 elements
    of margin included) where MISALIGNED_ONE_CHUNK_* ask for one, else 0."""
    direction = "backward" if op in BACKWARD_OPS else "forward"
    tile = next_power_of_2(cols)
    wanted = (_many_misaligned_rows(op, rows, elem, sms, misaligned_rows)
              and tile in MISALIGNED_ONE_CHUNK_TILES[direction][elem]
              and cols >= MISALIGNED_ONE_CHUNK_MIN_FILL[direction] * tile)
    return tile if wanted and cdiv(cols + 15, 16) * 16 <= tile else 0


def _one_chunk_tail(cols: int, elem: int, tile: int) -> int:
    """The tail tile after a head of half ``tile`` for a one-chunk backward row (0: the whole tile)."""
    span = cdiv(cols + 15, 16) * 16
    if not tile // 2 < span < MISALIGNED_ONE_CHUNK_TAIL_BELOW_FILL[elem] * tile:
        return 0
    return next_power_of_2(span - tile // 2)


def _half_empty_tile(cols: int, longer_than: int, min_fill: float) -> bool:
    """Rows longer than ``longer_than`` that fill less than ``min_fill`` of row_on_chip's power-of-two tile."""
    return cols > longer_than and cols < min_fill * next_power_of_2(cols)


def _tailed_tile(op: str, cols: int, elem: int, misaligned_rows: bool, few_rows: bool = False) -> tuple[int, int]:
    """(head, tail) of a row row_on_chip holds as a power-of-two head and a tail tile, else (0, 0);
    ``few_rows``: at most ROW_ON_CHIP_TAIL_FEW_ROWS_PER_SM an SM."""
    backward = op in BACKWARD_OPS
    direction = "backward" if backward else "forward"
    head = next_power_of_2(cols) // 2
    if op == "logsumexp" and not ROW_ON_CHIP_TAIL_LOGSUMEXP:
        return 0, 0
    if cols <= ROW_ON_CHIP_TAIL_MIN_COLS:
        if (backward or op == "logsumexp" or head > ROW_ON_CHIP_SHORT_TAIL_MAX_HEAD[elem]
                or not _half_empty_tile(cols, ROW_ON_CHIP_SHORT_TAIL_MIN_COLS, ROW_ON_CHIP_SHORT_TAIL_BELOW_FILL[elem])):
            return 0, 0
        tail = max(ROW_ON_CHIP_MIN_TAIL, next_power_of_2(cols - head))
        return (head, tail) if tail < head and tail <= ROW_ON_CHIP_SHORT_TAIL_MAX_TAIL[elem] else (0, 0)
    few = (few_rows and misaligned_rows and not backward and op != "logsumexp"
           and head <= ROW_ON_CHIP_TAIL_FEW_ROWS_MAX_HEAD[elem]
           and _half_empty_tile(cols, ROW_ON_CHIP_TAIL_MIN_COLS, ROW_ON_CHIP_TAIL_FEW_ROWS_BELOW_FILL[elem]))
    if not few and (not _half_empty_tile(cols, ROW_ON_CHIP_TAIL_MIN_COLS, ROW_ON_CHIP_TAIL_BELOW_FILL[direction][elem])
                    or head > ROW_ON_CHIP_TAIL_MAX_HEAD[direction][elem]
                    or (misaligned_rows and head > ROW_ON_CHIP_TAIL_MISALIGNED_MAX_HEAD[direction][elem])):
        return 0, 0
    return head, max(ROW_ON_CHIP_MIN_TAIL, next_power_of_2(cols - head))


def _warps_for_tile(elements: int) -> int:
    for limit, warps in WARPS_BY_TILE_ELEMENTS:
        if elements <= limit:
            return warps
    return WARPS_BY_TILE_ELEMENTS[-1][1]


def choose(op: str, rows: int, cols: int, dtype: torch.dtype, device: torch.device,
           algorithm: str = "auto", strategy: str | None = None, sms: int | None = None,
           interpreting: bool | None = None, misaligned_rows: bool = False, granule_rows: bool = False,
           row_multiple: int = 1, unit_rows: int = 0) -> Plan:
    """Pick the strategy and launch parameters for ``rows`` independent rows of ``cols`` elements.

    ``sms`` overrides the device's multiprocessor count (to plan for a GPU this machine lacks);
    ``interpreting`` whether the kernels run in Triton's interpreter (default: TRITON_INTERPRET);
    ``misaligned_rows`` whether rows start off 16-byte boundaries and are cut at 16-byte boundaries
    of memory (split_row_on_chip then covers up to 15 more elements a row); ``granule_rows``
    whether the kernels read rows in 16-byte granules (misaligned rows, and rows whose length or
    stride is no multiple of 16 elements: see ops/softmax/launch.py's _row_granule); ``row_multiple``
    there, the most elements up to a granule that every row's start and length are multiples of;
    ``unit_rows`` the most consecutive rows, from any multiple of it, that are consecutive elements (0:
    none). Decisions are cached: planning is on every call's path, ahead of a kernel of a few microseconds.
    """
    device = torch.device(device)
    if interpreting is None:
        interpreting = interpreter_active()
    return _choose(op, rows, cols, dtype, device, algorithm, strategy, sms or sm_count(device), interpreting,
                   misaligned_rows, granule_rows, row_multiple, unit_rows)


@plan_cache
def _clear():
    _choose.cache_clear()


@functools.lru_cache(maxsize=4096)
def _choose(op, rows, cols, dtype, device, algorithm, strategy, sms, interpreting, misaligned_rows=False,
            granule_rows=False, row_multiple=1, unit_rows=0) -> Plan:
    granule_rows = granule_rows or misaligned_rows  # misaligned rows are read in granules
    if op not in FORWARD_OPS + BACKWARD_OPS:
        raise ValueError(f"unknown op {op!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"strategy must be None or one of {STRATEGIES}, got {strategy!r}")
    triton_ok = device.type == "cuda" or interpreting
    if strategy is None:
        reason = ""
        if not triton_ok:
            reason = "a CPU tensor: torch's own kernel"
        elif dtype not in KERNEL_DTYPES:
            reason = f"{str(dtype).replace('torch.', '')}: torch's own kernel (the Triton kernels take fp32, fp16, bf16)"
        if reason:
            return Plan(op, "torch", "auto", rows, cols, dtype, reason=reason)
    elif strategy in TRITON_STRATEGIES and not triton_ok:
        raise ValueError(
            f"strategy {strategy!r} runs Triton kernels, which need a CUDA tensor "
            "(or TRITON_INTERPRET=1 for CPU tensors); use strategy=None, 'torch' or 'vectorized' on CPU")
    elif strategy in TRITON_STRATEGIES and dtype not in KERNEL_DTYPES:
        raise ValueError(f"strategy {strategy!r} runs Triton kernels, which take float32, float16 and bfloat16; "
                         f"got {dtype}: use strategy=None or 'torch'")
    if strategy == "torch":
        return Plan(op, "torch", "auto", rows, cols, dtype, reason="asked for")
    if strategy == "vectorized":
        return Plan(op, "vectorized", "online" if algorithm == "auto" else algorithm, rows, cols, dtype,
                    reason="the online split-and-merge algorithm in vectorized torch ops, as asked")

    rows, cols = max(rows, 1), max(cols, 1)  # empty tensors launch nothing; plan as for one element
    backward = op in BACKWARD_OPS
    elem = dtype.itemsize
    on_chip_max = (BACKWARD_ROW_ON_CHIP_MAX_COLS if backward else ROW_ON_CHIP_MAX_COLS)[elem]
    few_tailed_rows = rows <= ROW_ON_CHIP_TAIL_FEW_ROWS_PER_SM * sms or (
        row_multiple == 2 and rows <= ROW_ON_CHIP_TAIL_WORD_STARTS_ROWS_PER_SM * sms
        and cols - next_power_of_2(cols) // 2 <= ROW_ON_CHIP_TAIL_WORD_STARTS_MAX_TAIL)
    if strategy is None:
        on_chip = algorithm == "auto" and next_power_of_2(cols) <= on_chip_max
        # What split_row_on_chip's rules for rows off 16-byte boundaries take (rows of vectors: whole).
        split_or_whole = "row_on_chip" if _vector_rows_whole(op, rows, cols, dtype, sms, row_multiple) \
            else "split_row_on_chip"
        if on_chip and backward and _one_chunk_tile(op, rows, cols, elem, sms, misaligned_rows):
            strategy = split_or_whole
        elif on_chip and _tailed_tile(op, cols, elem, misaligned_rows, few_tailed_rows)[0]:
            strategy = "row_on_chip"
        elif on_chip and op != "logsumexp" and _half_empty_tile(cols, STREAM_BLOCK[elem], ROW_ON_CHIP_MIN_FILL[elem]):
            if backward:
                strategy = "looped"
            elif misaligned_rows and (next_power_of_2(cols) <= ROW_ON_CHIP_PADDED_SPLIT_MAX_COLS
                                      or rows >= ROW_ON_CHIP_HALF_EMPTY_SPLIT_MIN_ROWS_PER_SM * sms):
                strategy = "split_row_on_chip"
            else:
                strategy = "row_on_chip"
        elif on_chip and misaligned_rows and op != "logsumexp" and _full_large_tile(cols, elem):
            strategy = split_or_whole
        elif on_chip and backward and misaligned_rows and _misaligned_backward_looped(rows, cols, elem, sms):
            strategy = "looped"
        elif (on_chip and not backward and _many_misaligned_rows(op, rows, elem, sms, misaligned_rows)
              and (next_power_of_2(cols) >= MISALIGNED_FORWARD_SPLIT_MIN_TILE
                   or _one_chunk_tile(op, rows, cols, elem, sms, misaligned_rows))):
            strategy = split_or_whole
        elif (on_chip and op == "log_softmax"
              and _half_empty_tile(cols, ROW_ON_CHIP_LOG_SPLIT_MIN_COLS, ROW_ON_CHIP_LOG_MIN_FILL[elem])):
            strategy = "split_row_on_chip"
        elif on_chip:
            strategy = "row_on_chip"
        elif (algorithm == "auto" and op != "logsumexp" and not interpreting
              and _split_on_chip_tile(backward, cols, elem, sms) <= min(SPLIT_ON_CHIP_AUTO_MAX_TILE,
                                                                         SPLIT_ON_CHIP_MAX_TILE)):
            strategy = "split_row_on_chip"
        elif rows < SPLIT_BELOW_ROWS_PER_SM * sms and cols > STREAM_BLOCK[elem]:
            strategy = "split_row"
        else:
            strategy = "looped"

    if strategy in ("row_on_chip", "split_row_on_chip") and algorithm != "auto" and not backward:
        raise ValueError(f"algorithm={algorithm!r} asks for {algorithm} passes over memory, but strategy "
                         f"{strategy!r} reads the row once; use algorithm='auto'")
    if strategy == "row_on_chip":
        # At least 2: 16-bit tiles are widened two values a register (_triton.widen_opaque).
        block, tail = _tailed_tile(op, cols, elem, misaligned_rows, few_tailed_rows)
        block = block or max(2, next_power_of_2(cols))
        # A short row's head and tail pack as its power-of-two tile would (ROW_ON_CHIP_SHORT_TAIL_BELOW_FILL).
        short_tail = tail and cols <= ROW_ON_CHIP_TAIL_MIN_COLS
        few_rows = rows < ROW_ON_CHIP_SHORT_TAIL_SPREAD_ROWS_PER_SM * sms
        if short_tail and few_rows and tail > block * ROW_ON_CHIP_SHORT_TAIL_FEW_ROWS_MAX_TAIL_SHARE:
            block, tail, short_tail = 2 * block, 0, False
        width = 2 * block if short_tail else block
        tile = ROW_TILE_ELEMENTS["backward" if backward else "forward"]
        rows_per_program = min(max(1, tile // width), next_power_of_2(rows))
        many_rows = not backward and rows >= ROW_TILE_MANY_ROWS_PER_SM * sms and width < ROW_TILE_MANY_ROWS_ELEMENTS
        warps = 0
        if short_tail and few_rows:
            rows_per_program = 1
        elif short_tail and many_rows and width < tile:
            rows_per_program, warps = ROW_TILE_MANY_ROWS_ELEMENTS // width, ROW_ON_CHIP_SHORT_TAIL_MANY_ROWS_WARPS
        elif many_rows and rows_per_program == 1:
            rows_per_program = ROW_TILE_MANY_ROWS_ELEMENTS // width
        if ROW_TILE_SPREAD_OVER_SMS and not backward:
            rows_per_program = min(rows_per_program,
                                   1 << max(0, (rows // (ROW_TILE_SPREAD_PROGRAMS_PER_SM * sms)).bit_length() - 1))
        if tail and not short_tail:
            warps = ROW_ON_CHIP_TAIL_WARPS
        unit_tile = ROW_UNIT_TILE_ELEMENTS[elem].get(width, 0) if backward or width >= ROW_UNIT_FORWARD_MIN_WIDTH else 0
        unit = min(unit_rows, unit_tile // width, next_power_of_2(rows))
        while unit >= ROW_UNIT_MIN_ROWS and rows < unit * ROW_UNIT_MIN_PROGRAMS_PER_SM * sms:
            unit //= 2
        if unit >= ROW_UNIT_MIN_ROWS:
            rows_per_program, warps = unit, ROW_UNIT_WARPS
        warps = warps or _warps_for_tile(width * rows_per_program)
        if not backward and not tail and _many_misaligned_rows(op, rows, elem, sms, misaligned_rows):
            warps = ROW_ON_CHIP_MISALIGNED_FORWARD_WARPS.get(width * rows_per_program, warps)
        hold_input = not (tail or backward) and _holds_input(op, dtype, block, rows, sms, granule_rows)
        if hold_input:
            warps = min(warps, ROW_ON_CHIP_HOLD_INPUT_MAX_WARPS)
        return Plan(op, strategy, "one_pass", rows, cols, dtype, block, rows_per_program, warps,
                    (cdiv(rows, rows_per_program),), hold_input=hold_input, tail_cols=tail,
                    unit_rows=unit >= ROW_UNIT_MIN_ROWS)

    if strategy == "split_row_on_chip":
        tile = _split_on_chip_tile(backward, cols, elem, sms)
        one_chunk = _one_chunk_tile(op, rows, cols, elem, sms, misaligned_rows)
        if tile > SPLIT_ON_CHIP_MAX_TILE:
            raise ValueError(
                f"strategy 'split_row_on_chip' holds a row in at most {_split_on_chip_max_chunks(sms)} programs "
                f"side by side on this GPU, {SPLIT_ON_CHIP_MAX_TILE} elements each; a row of {cols} is longer. "
                "Use strategy=None (split_row reads such rows twice)")
        if backward and granule_rows:
            warp_bytes = SPLIT_ON_CHIP_MISALIGNED_BACKWARD_WARP_BYTES[elem]
        elif (op == "softmax_backward" and SPLIT_ON_CHIP_SOFTMAX_BACKWARD_WARP_BYTES[dtype]
              and rows >= SPLIT_ON_CHIP_SOFTMAX_BACKWARD_MIN_ROWS_PER_SM * sms):
            warp_bytes = SPLIT_ON_CHIP_SOFTMAX_BACKWARD_WARP_BYTES[dtype]
        else:
            warp_bytes = _split_on_chip_bytes(SPLIT_ON_CHIP_WARP_BYTES, backward, elem)
        tail = _one_chunk_tail(cols, elem, one_chunk) if one_chunk and backward else 0
        if one_chunk:
            tile, warp_bytes = one_chunk, (MISALIGNED_ONE_CHUNK_TAIL_WARP_BYTES[op][elem] if tail else
                                           MISALIGNED_ONE_CHUNK_WARP_BYTES[op if backward else "forward"][dtype])
        # Chunks start at 16-byte boundaries of memory: a row that starts off one spans up to 15
        # elements more.
        span = cols + (15 if misaligned_rows else 0)
        # The interpreter cannot run a row's programs side by side: one chunk per row there.
        num_chunks = 1 if interpreting else cdiv(span, tile)
        few_programs_tile = max(_split_on_chip_bytes(SPLIT_ON_CHIP_FEW_PROGRAMS_TILE_BYTES, backward, elem) // elem,
                                next_power_of_2(cdiv(cols, _split_on_chip_max_chunks(sms))))
        if not (one_chunk or interpreting) and rows * num_chunks < sms and few_programs_tile < tile:
            # Fewer programs than SMs: smaller chunks put the row on more of them.
            tile, num_chunks = few_programs_tile, cdiv(span, few_programs_tile)
        held = tile // 2 if tail else tile  # a warp per warp_bytes of what is held (the head, with a tail)
        warps = min(32, max(1, held * elem // warp_bytes))
        # Equal chunks, each a multiple of 16 elements.
        chunk = cdiv(cdiv(span, num_chunks), 16) * 16
        num_chunks = cdiv(span, chunk)
        programs = rows * num_chunks
        cap = _for_element_size(SPLIT_ON_CHIP_MAX_REGISTERS[op], elem)
        if (programs <= SPLIT_ON_CHIP_UNCAPPED_PROGRAMS_PER_SM * sms or granule_rows or cols % 16
                or chunk < SPLIT_ON_CHIP_CAP_MIN_FILL * next_power_of_2(chunk)
                or held * elem > SPLIT_ON_CHIP_CAP_MAX_THREAD_BYTES * 32 * warps):
            # One wave without the cap: it would buy nothing. Rows read in granules hold more state
            # (the row's edges) and spill under the cap (bf16 softmax 1742 x 95704: 2.63 ms capped,
            # 0.57 without: docs/notes/2026-11/probe_split_on_chip_cap-h100.log); callers that do
            # not say whether rows are read in granules have them judged by their length.
            cap = 0
        if not (cap or backward or one_chunk) and programs > SPLIT_ON_CHIP_UNCAPPED_PROGRAMS_PER_SM * sms:
            warps = max(1, held * elem // SPLIT_ON_CHIP_UNCAPPED_WARP_BYTES)
        return Plan(op, strategy, "one_pass", rows, cols, dtype, held if tail else next_power_of_2(chunk), 1,
                    warps, (programs,), chunk_size=chunk, num_chunks=num_chunks, max_registers=cap, tail_cols=tail)

    resolved = "online" if algorithm == "auto" else algorithm
    block = min(STREAM_BLOCK[elem], next_power_of_2(cols))
    if strategy == "looped":
        warps = STREAM_WARPS
        own = (LOG_BACKWARD_STREAM.get(elem) if op == "log_softmax_backward" else
               SOFTMAX_BACKWARD_STREAM.get(elem) if op == "softmax_backward" and cols <= SOFTMAX_BACKWARD_STREAM_MAX_COLS
               else None)
        if own:
            block, warps = min(own[0], next_power_of_2(cols)), own[1]
        return Plan(op, strategy, resolved, rows, cols, dtype, block, 1, warps, (rows,))

    # split_row: enough chunks per row to give every SM a few programs, never fewer than one block
    # of work per chunk, never more chunks than one merge tile holds.
    programs_per_sm = next(programs for most_rows, programs in SPLIT_PROGRAMS_PER_SM if rows <= most_rows)
    wanted_chunks = max(1, cdiv(programs_per_sm * sms, rows))
    chunk = max(block, cdiv(cdiv(cols, wanted_chunks), block) * block)
    chunk = max(chunk, cdiv(cdiv(cols, SPLIT_MAX_CHUNKS), block) * block)
    num_chunks = cdiv(cols, chunk)
    launches = 3 if (resolved == "safe" and not backward) else 2
    return Plan(op, strategy, resolved, rows, cols, dtype, block, 1, SPLIT_WARPS, (rows, num_chunks),
                chunk_size=chunk, num_chunks=num_chunks, launches=launches)


_recorded = LastPlan()
# The plan of the most recent launch in this process (tests assert which path ran).
record = _recorded.record
last_plan = _recorded.last
