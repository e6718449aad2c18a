"""Tuning data for ops/softmax/plan.py's tables (GPU): time the softmax on the shapes where a setting
is in doubt, under alternative values of the tables (onlinesoftmax.override_plan), in one process.

    python scripts/tune/tune_softmax.py [--out tune.json] [--strategy split_row_on_chip] [--backward] [--log]
        [--shapes 4096x4096] [--variants short_tail]

Each line is one shape and one constant set; GB/s counts x read once and y written once (backward:
y and dy read, dx written). Times are
CUDA-graph replays (the kernels' own cost, without host launch overhead) over rotated inputs.
Each case also times torch's own kernel on the same inputs (the line "torch"), the mark to beat.
"""

import argparse
import itertools
import json

import torch

import onlinesoftmax
from onlinesoftmax.bench.harness import copy_bandwidth_gbs, graph_time_ms, rotation_count
from onlinesoftmax.ops.softmax import launch as softmax_launch
from onlinesoftmax.ops.softmax import plan


def split_variants():
    for programs, warps, block_scale in itertools.product((2, 4, 8), (4, 8, 16), (1, 2)):
        yield dict(SPLIT_PROGRAMS_PER_SM=((1 << 62, programs),), SPLIT_WARPS=warps,
                   STREAM_BLOCK={4: 4096 * block_scale, 2: 8192 * block_scale})


def looped_variants():
    for warps, block_scale in itertools.product((4, 8, 16), (1, 2)):
        yield dict(STREAM_WARPS=warps, STREAM_BLOCK={4: 4096 * block_scale, 2: 8192 * block_scale})


def scaled_warps(scale):
    """plan.WARPS_BY_TILE_ELEMENTS with every entry times ``scale`` (1-32 warps)."""
    return tuple((limit, max(1, min(32, int(w * scale)))) for limit, w in plan.WARPS_BY_TILE_ELEMENTS)


def on_chip_variants(max_cols):
    # Rows long enough for a program each: the row length held on chip and the warps per tile.
    for warps_scale in (0.5, 1, 2):
        yield dict(WARPS_BY_TILE_ELEMENTS=scaled_warps(warps_scale), ROW_ON_CHIP_MAX_COLS=max_cols)


def tile_variants(tiles, warps_scales):
    """Short rows: rows packed per program (the tile, both directions) and warps per tile."""
    def variants():
        for tile, warps_scale in itertools.product(tiles, warps_scales):
            yield dict(ROW_TILE_ELEMENTS={"forward": tile, "backward": tile}, ROW_TILE_MANY_ROWS_PER_SM=1 << 62,
                       WARPS_BY_TILE_ELEMENTS=scaled_warps(warps_scale))
    return variants


# (The 2026-11-25 runs also crossed these tiles with a persistent grid, since removed:
# docs/notes/2026-11/tune_softmax-row_on_chip-h100.json.)
on_chip_grid_variants = tile_variants((1024, 2048, 4096), (0.5, 1))
# Rows of about a hundred elements.
short_row_variants = tile_variants((256, 512, 1024), (0.5, 1, 2))
# Rows of 257-512 elements (one a program on one warp at the forward's tile of 512).
mid_row_variants = tile_variants((512, 1024, 2048), (1, 2, 4))


def forward_tile_variants():
    # The forward's tile alone, at the warps table: the plan's and the one before it.
    for tile in (512, 1024):
        yield dict(ROW_TILE_ELEMENTS={"forward": tile, "backward": plan.ROW_TILE_ELEMENTS["backward"]},
                   ROW_TILE_MANY_ROWS_PER_SM=1 << 62)


def spread_variants():
    # The forward's rows a program capped to leave each SM this many programs (the plan: 1).
    for programs in (2, 4, 8, 16):
        yield dict(ROW_TILE_SPREAD_PROGRAMS_PER_SM=programs)


def many_rows_threshold_variants():
    # Rows of 257-512 elements two a program from this many rows an SM (2**62: never).
    for per_sm in (16, 32, 1 << 62):
        yield dict(ROW_TILE_MANY_ROWS_PER_SM=per_sm)


def many_rows_variants():
    # The forward's larger tile from many rows an SM off (the tile of 512 at every row count).
    yield dict(ROW_TILE_MANY_ROWS_PER_SM=1 << 62)


def short_tail_variants():
    # Forward rows of up to 4096 elements under 76% of their power-of-two tile held as a head and a
    # tail (the plan: never), at the table's warps and at twice them.
    for warps_scale in (1, 2):
        yield dict(ROW_ON_CHIP_SHORT_TAIL_BELOW_FILL={4: 0.76, 2: 0.76},
                   WARPS_BY_TILE_ELEMENTS=scaled_warps(warps_scale))


def short_row_grid_variants():
    # Rows of 129-255 elements: rows a program (the tile over 256), warps a program (one count for
    # every tile) and the head and tail, crossed.
    for tile, warps, fill in itertools.product((256, 512, 1024, 2048), (1, 2, 4), (0.0, 0.76)):
        yield dict(ROW_TILE_ELEMENTS={"forward": tile, "backward": plan.ROW_TILE_ELEMENTS["backward"]},
                   WARPS_BY_TILE_ELEMENTS=((1 << 20, warps),), ROW_ON_CHIP_SHORT_TAIL_BELOW_FILL={4: fill, 2: fill})


def short_tail_off_variants():
    # The plan before short rows took a head and a tail (ROW_ON_CHIP_SHORT_TAIL_*).
    yield dict(ROW_ON_CHIP_SHORT_TAIL_BELOW_FILL={4: 0.0, 2: 0.0})


def split_on_chip_variants():
    for tile_bytes, warp_bytes in itertools.product((8192, 16384, 32768), (1024, 2048, 4096)):
        yield dict(SPLIT_ON_CHIP_TILE_BYTES={"forward": tile_bytes, "backward": tile_bytes},
                   SPLIT_ON_CHIP_WARP_BYTES={"forward": warp_bytes, "backward": warp_bytes},
                   SPLIT_ON_CHIP_MISALIGNED_BACKWARD_WARP_BYTES={4: warp_bytes, 2: warp_bytes},
                   SPLIT_ON_CHIP_MAX_CHUNKS_PER_SM=1.0)


def split_on_chip_forward_variants():
    # split_row_on_chip's forward chunks, one tile and one warp count for every row (the first run's
    # "current" was 16384 bytes, a warp per 2048): tiles of 8192 or 16384 bytes, a warp per 2048 or
    # 4096 bytes of each.
    for tile_bytes, warp_bytes in ((8192, 2048), (8192, 4096), (16384, 4096)):
        yield dict(SPLIT_ON_CHIP_TILE_BYTES=dict(plan.SPLIT_ON_CHIP_TILE_BYTES, forward=tile_bytes),
                   SPLIT_ON_CHIP_WARP_BYTES=dict(plan.SPLIT_ON_CHIP_WARP_BYTES, forward=warp_bytes),
                   SPLIT_ON_CHIP_UNCAPPED_WARP_BYTES=warp_bytes,
                   SPLIT_ON_CHIP_FEW_PROGRAMS_TILE_BYTES=dict(plan.SPLIT_ON_CHIP_FEW_PROGRAMS_TILE_BYTES, forward=tile_bytes))


def split_on_chip_forward_rule_off_variants():
    # The forward's plan before its uncapped warps and few-programs tiles (SPLIT_ON_CHIP_UNCAPPED_WARP_BYTES,
    # SPLIT_ON_CHIP_FEW_PROGRAMS_TILE_BYTES).
    yield dict(SPLIT_ON_CHIP_UNCAPPED_WARP_BYTES=plan.SPLIT_ON_CHIP_WARP_BYTES["forward"],
               SPLIT_ON_CHIP_FEW_PROGRAMS_TILE_BYTES=dict(plan.SPLIT_ON_CHIP_FEW_PROGRAMS_TILE_BYTES,
                                                          forward=plan.SPLIT_ON_CHIP_TILE_BYTES["forward"]))


def split_on_chip_forward_fp32_capped_variants():
    # fp32 forward chunks under the register cap of 32 (8 warps a tile), the plan before fp32 ran
    # uncapped on half the warps. (The recorded run, tune_softmax-split_on_chip_forward_fp32_uncapped-h200.log,
    # had the capped plan as "current" and this variant the other way round, uncapped.)
    caps = plan.SPLIT_ON_CHIP_MAX_REGISTERS
    yield dict(SPLIT_ON_CHIP_MAX_REGISTERS={**caps, "softmax": {4: 32, 2: caps["softmax"][2]},
                                            "log_softmax": {4: 32, 2: 0}})


def split_on_chip_backward_few_programs_variants():
    # The backward's chunks where rows x chunks < SMs (the plan: a quarter of the tile) against the
    # whole tile (the plan before) and half of it, a warp per the same bytes. (The recorded run,
    # tune_softmax-split_on_chip_backward_few_programs-h200.log, had the whole tile as "current" and
    # timed the half and the quarter.)
    tiles = plan.SPLIT_ON_CHIP_TILE_BYTES["backward"]
    for share in (1, 2):
        yield dict(SPLIT_ON_CHIP_FEW_PROGRAMS_TILE_BYTES=dict(plan.SPLIT_ON_CHIP_FEW_PROGRAMS_TILE_BYTES, backward={
            size: tile_bytes // share for size, tile_bytes in tiles.items()}))


def aligned_backward_warps_variants():
    # split_row_on_chip's backward chunks of rows on 16-byte starts: the softmax's many rows as before
    # SPLIT_ON_CHIP_SOFTMAX_BACKWARD_* (a warp per 1024 bytes of a 2-byte tile) and at a warp per 2048
    # and 4096 in both 2-byte dtypes; then every backward's at a warp per 2048 or 4096 bytes of a
    # 2-byte tile (the rows off 16-byte starts take 4096), 4096 or 16384 of a 4-byte one (the
    # log_softmax backward's choices).
    def by_dtype(two_byte):
        return {torch.float32: 0, torch.bfloat16: two_byte, torch.float16: two_byte}

    rule_off = dict(SPLIT_ON_CHIP_SOFTMAX_BACKWARD_WARP_BYTES=by_dtype(0))
    yield rule_off
    for warp_bytes in (2048, 4096):
        yield dict(SPLIT_ON_CHIP_SOFTMAX_BACKWARD_WARP_BYTES=by_dtype(warp_bytes))
    for warp_bytes in ({4: 8192, 2: 2048}, {4: 8192, 2: 4096}, {4: 4096, 2: 1024}, {4: 16384, 2: 1024}):
        yield dict(rule_off, SPLIT_ON_CHIP_WARP_BYTES=dict(plan.SPLIT_ON_CHIP_WARP_BYTES, backward=warp_bytes))


def current_only_variants():
    # The strategy's plan as the tables give it, nothing else.
    return iter(())


def misaligned_forward_variants():
    # The plan without its rule for these rows (MISALIGNED_FORWARD_*), then held whole on fewer
    # warps (looped and split_row_on_chip take their warps from tables of their own: their lines
    # for these repeat their plan's).
    rule_off = dict(MISALIGNED_MIN_ROWS_PER_SM={4: 1 << 62, 2: 1 << 62})
    for warps_scale in (1, 0.5, 0.25):
        yield dict(rule_off, WARPS_BY_TILE_ELEMENTS=scaled_warps(warps_scale))


def one_chunk_variants():
    # split_row_on_chip's forward tile and warps: tiles the row fits in run it as one chunk (no
    # exchange between programs), smaller ones as several.
    for tile_bytes, warp_bytes in itertools.product((8192, 16384, 32768, 65536), (1024, 2048)):
        yield dict(SPLIT_ON_CHIP_TILE_BYTES=dict(plan.SPLIT_ON_CHIP_TILE_BYTES, forward=tile_bytes),
                   SPLIT_ON_CHIP_WARP_BYTES=dict(plan.SPLIT_ON_CHIP_WARP_BYTES, forward=warp_bytes))


def one_chunk_backward_variants():
    # split_row_on_chip's backward tile and warps (rows off 16-byte boundaries): tiles the row fits
    # in run it as one chunk (no exchange), smaller ones as several.
    for tile_bytes, warp_bytes in itertools.product((16384, 32768, 65536), (1024, 2048, 4096)):
        yield dict(SPLIT_ON_CHIP_TILE_BYTES=dict(plan.SPLIT_ON_CHIP_TILE_BYTES, backward={4: tile_bytes, 2: tile_bytes}),
                   SPLIT_ON_CHIP_MISALIGNED_BACKWARD_WARP_BYTES={4: warp_bytes, 2: warp_bytes})


def one_chunk_warps_variants():
    # Rows off 16-byte boundaries as one chunk (MISALIGNED_ONE_CHUNK_*), forward and backward: the
    # plan's warps against a warp per 2048-8192 bytes of the tile, one direction and dtype (fp32,
    # or both 2-byte ones) at a time; first the plan before fp32's forward took one chunk (chunks of 4096). (Runs before
    # the table was by op and element size swept one value for both directions, 16384 bytes (fp32
    # backward at 4 warps: 577-3002 GB/s), and a forward cap of 32 registers: fp32 on 16 warps
    # capped spilled, 1970 against 3863 GB/s uncapped.)
    tiles, warp_bytes = plan.MISALIGNED_ONE_CHUNK_TILES, plan.MISALIGNED_ONE_CHUNK_WARP_BYTES
    yield dict(MISALIGNED_ONE_CHUNK_TILES={**tiles, "forward": {**tiles["forward"], 4: ()}})
    f32, half = torch.float32, (torch.bfloat16, torch.float16)
    for ops, dtypes, value in ((("forward",), (f32,), 2048), (("forward",), (f32,), 8192), (("forward",), half, 2048),
                               (plan.BACKWARD_OPS, (f32,), 2048), (plan.BACKWARD_OPS, (f32,), 4096),
                               (plan.BACKWARD_OPS, (f32,), 8192), (plan.BACKWARD_OPS, half, 2048),
                               (plan.BACKWARD_OPS, half, 4096)):
        changed = {op: {**warp_bytes[op], **dict.fromkeys(dtypes, value)} for op in ops
                   if any(warp_bytes[op][dtype] != value for dtype in dtypes)}
        if changed:
            yield dict(MISALIGNED_ONE_CHUNK_WARP_BYTES={**warp_bytes, **changed})


def one_chunk_tail_variants():
    # Backward rows off 16-byte boundaries as one chunk: the whole tile (no tail), then a head of
    # half the tile and a tail for every row here, a warp per 1024-8192 bytes of the head.
    yield dict(MISALIGNED_ONE_CHUNK_TAIL_BELOW_FILL={4: 0.0, 2: 0.0})
    for warp_bytes in (1024, 2048, 4096, 8192):
        yield dict(MISALIGNED_ONE_CHUNK_TAIL_BELOW_FILL={4: 0.9, 2: 0.9}, MISALIGNED_ONE_CHUNK_TAIL_WARP_BYTES=dict.fromkeys(
            plan.BACKWARD_OPS, {4: warp_bytes, 2: warp_bytes}))


def wide_head_variants():
    # 2-byte forward rows of 16385-24576 elements held as a head of 16384 and a tail (the table
    # stops at a head of 8192: H100, many rows), the tail on 8 or 16 warps.
    # Rows filling up to 60% of their tile too (18419 elements fill 56% of 32768; the table: 55%).
    for warps, fill in itertools.product((8, 16), (0.55, 0.6)):
        yield dict(ROW_ON_CHIP_TAIL_MAX_HEAD={**plan.ROW_ON_CHIP_TAIL_MAX_HEAD, "forward": {4: 16384, 2: 16384}},
                   ROW_ON_CHIP_TAIL_MISALIGNED_MAX_HEAD={**plan.ROW_ON_CHIP_TAIL_MISALIGNED_MAX_HEAD,
                                                         "forward": {4: 16384, 2: 16384}},
                   ROW_ON_CHIP_TAIL_BELOW_FILL={**plan.ROW_ON_CHIP_TAIL_BELOW_FILL, "forward": {4: 0.55, 2: fill}},
                   ROW_ON_CHIP_TAIL_WARPS=warps)


def few_rows_tail_off_variants():
    # The head and tail for few rows off 16-byte boundaries (ROW_ON_CHIP_TAIL_FEW_ROWS_*) off: the whole tile.
    yield dict(ROW_ON_CHIP_TAIL_FEW_ROWS_MAX_HEAD={4: 0, 2: 0})


def few_rows_tail_reach_variants():
    # The head and tail for 2-byte forward rows off 16-byte boundaries (ROW_ON_CHIP_TAIL_FEW_ROWS_*)
    # up to this many rows an SM (the table: 1).
    for per_sm in (2, 3, 4):
        yield dict(ROW_ON_CHIP_TAIL_FEW_ROWS_PER_SM=per_sm)


def few_mid_rows_variants():
    # A strategy's plan, then the tables that set its programs' work: warps held whole (a quarter,
    # half), looped's tiles and warps, split_row_on_chip's tiles and warps a chunk.
    yield from mid_long_row_variants()
    yield from looped_variants()
    yield from split_on_chip_variants()


def few_long_rows_on_chip_variants():
    # 2-byte rows of 20K-32K elements held whole: the tile of 32768 on a quarter and half the warps,
    # or as a head of 16384 and a tail for few rows filling up to all of it, the tail on 8 or 16 warps.
    yield from mid_long_row_variants()
    for warps in (8, 16):
        yield dict(ROW_ON_CHIP_TAIL_FEW_ROWS_BELOW_FILL={4: 0.0, 2: 1.0}, ROW_ON_CHIP_TAIL_WARPS=warps)


def mid_long_row_variants():
    # Rows of 8193-16384 elements held whole: the tile of 16384 on fewer warps than the table's 32
    # (two or four programs an SM in place of one).
    for warps_scale in (0.25, 0.5):
        yield dict(WARPS_BY_TILE_ELEMENTS=scaled_warps(warps_scale))


def held_fp16_variants():
    # fp16 rows of a tile of 32768 held in their own dtype, as bf16's are (ROW_ON_CHIP_HOLD_INPUT_*),
    # on 16 warps (the held rows' cap) and on 32.
    held = dict(ROW_ON_CHIP_HOLD_INPUT_MIN_COLS={**plan.ROW_ON_CHIP_HOLD_INPUT_MIN_COLS, torch.float16: 32768})
    yield held
    yield dict(held, ROW_ON_CHIP_HOLD_INPUT_MAX_WARPS=32)


def crossed(shapes, strategies):
    """CASES rows: each (dtype, rows, cols) of ``shapes`` under each (strategy, variants) of ``strategies``."""
    return [(dtype, rows, cols, strategy, variants) for dtype, rows, cols in shapes for strategy, variants in strategies]


def plans_of(*strategies):
    """(strategy, current_only_variants) pairs: each strategy's plan as its tables give it."""
    return [(strategy, current_only_variants) for strategy in strategies]


CASES = [
    # (dtype, rows, cols, strategy, variants)
    (torch.float32, 64, 128256, "split_row_on_chip", split_on_chip_variants),
    (torch.bfloat16, 64, 128256, "split_row_on_chip", split_on_chip_variants),
    (torch.float32, 16, 262144, "split_row_on_chip", split_on_chip_variants),
    (torch.bfloat16, 16, 262144, "split_row_on_chip", split_on_chip_variants),
    (torch.float32, 256, 151936, "split_row_on_chip", split_on_chip_variants),
    (torch.bfloat16, 256, 151936, "split_row_on_chip", split_on_chip_variants),
    # Few long rows of a random-shape sweep: fp32 softmax backward 70 x 145537 0.63x torch eager
    # (log_softmax 0.88x), and 14 x 256008 0.95x in an earlier sweep.
    (torch.float32, 70, 145537, "split_row_on_chip", split_on_chip_variants),
    (torch.float32, 14, 256008, "split_row_on_chip", split_on_chip_variants),
    (torch.bfloat16, 70, 145537, "split_row_on_chip", split_on_chip_variants),
    (torch.float32, 64, 128256, "split_row", split_variants),
    (torch.bfloat16, 64, 128256, "split_row", split_variants),
    (torch.float32, 16, 262144, "split_row", split_variants),
    (torch.bfloat16, 16, 262144, "split_row", split_variants),
    (torch.float32, 256, 151936, "split_row", split_variants),
    # The rows that still take split_row on the bench grid (its partials pass reads at 62-76% of
    # copy there: docs/notes/2026-11/probe_split_row_passes-h100.log).
    # Off the grid: shapes where the sweep (bench sweep) measured ours behind torch.
    (torch.bfloat16, 2048, 50257, "split_row_on_chip", split_on_chip_variants),
    # A few rows of a vocabulary (the H200's full sweep: bf16 log_softmax 256 x 50257 at 0.97x torch
    # under CUDA graphs), beside the two-pass strategies.
    (torch.bfloat16, 256, 50257, "split_row_on_chip", split_on_chip_variants),
    (torch.bfloat16, 256, 50257, "split_row", current_only_variants),
    (torch.bfloat16, 256, 50257, "looped", current_only_variants),
    (torch.bfloat16, 2048, 50257, "looped", looped_variants),
    (torch.bfloat16, 198, 615032, "split_row", split_variants),
    (torch.bfloat16, 198, 615032, "looped", looped_variants),
    (torch.float32, 198, 615032, "split_row", split_variants),
    (torch.float32, 1, 16777216, "split_row", split_variants),
    (torch.bfloat16, 1, 16777216, "split_row", split_variants),
    (torch.float32, 256, 151936, "looped", looped_variants),
    (torch.bfloat16, 1024, 32768, "looped", looped_variants),
    (torch.bfloat16, 1024, 32768, "row_on_chip", lambda: on_chip_variants({4: 32768, 2: 32768})),
    # fp32 log_softmax 2048x1000 ran at 0.89x torch under CUDA graphs in the sweep.
    (torch.float32, 2048, 1000, "row_on_chip", on_chip_grid_variants),
    (torch.bfloat16, 2048, 1000, "row_on_chip", on_chip_grid_variants),
    (torch.float32, 8192, 1000, "row_on_chip", on_chip_grid_variants),
    (torch.bfloat16, 8192, 1000, "row_on_chip", on_chip_grid_variants),
    (torch.float32, 4096, 4096, "row_on_chip", on_chip_grid_variants),
    (torch.bfloat16, 4096, 4096, "row_on_chip", on_chip_grid_variants),
    (torch.float32, 32768, 1024, "row_on_chip", on_chip_grid_variants),
    (torch.bfloat16, 32768, 1024, "row_on_chip", on_chip_grid_variants),
    (torch.float32, 65536, 256, "row_on_chip", on_chip_grid_variants),
    (torch.bfloat16, 65536, 256, "row_on_chip", on_chip_grid_variants),
    # Rows of 101 and 125 elements (the random-shape sweep of seed 1128): 0.74-0.92x torch under CUDA graphs.
    (torch.bfloat16, 1536, 101, "row_on_chip", short_row_variants),
    (torch.float32, 1536, 101, "row_on_chip", short_row_variants),
    (torch.bfloat16, 138, 125, "row_on_chip", short_row_variants),
    (torch.bfloat16, 8192, 101, "row_on_chip", short_row_variants),
    # Rows of 257-512 elements: bf16 log_softmax 8583 x 288 and 43 x 147 ran at 0.87x and 0.93x torch under
    # CUDA graphs in the H200's random-shape sweep (docs/perf-h200.md).
    *((dtype, rows, cols, "row_on_chip", mid_row_variants) for dtype in (torch.bfloat16, torch.float32)
      for rows, cols in ((8583, 288), (43, 147), (2048, 300), (16384, 384), (4096, 500), (600, 400))),
    # The H200's random-shape sweeps (seeds 2811-2813): fp16 1207 x 143 at 0.75-0.83x torch and fp32
    # 7230 x 273 at 0.92x under CUDA graphs.
    *((dtype, 1207, 143, "row_on_chip", short_row_variants) for dtype in (torch.float16, torch.bfloat16, torch.float32)),
    *((dtype, rows, cols, "row_on_chip", mid_row_variants) for dtype in (torch.float32, torch.bfloat16)
      for rows, cols in ((7230, 273), (6000, 400), (5000, 300))),
    *((dtype, rows, cols, "row_on_chip", spread_variants) for dtype in (torch.bfloat16, torch.float32)
      for rows, cols in ((1207, 143), (1536, 101), (1024, 256), (2048, 200), (4096, 64), (3000, 150), (8192, 101),
                         (600, 200), (2500, 120))),
    *((dtype, rows, cols, "row_on_chip", many_rows_threshold_variants) for dtype in (torch.bfloat16, torch.float32)
      for rows, cols in ((7230, 273), (5000, 300), (4096, 500), (6000, 400), (2048, 300), (3000, 450))),
    # A first form of the rule for many rows (a tile of 1024 from 64 rows an SM at every row length),
    # against the tile of 512, where it changes the rows a program.
    *((dtype, rows, cols, "row_on_chip", many_rows_variants) for dtype in (torch.bfloat16, torch.float32)
      for rows, cols in ((65536, 256), (16384, 128), (65536, 64), (16384, 101), (32768, 200), (8448, 300),
                         (100000, 480))),
    # The forward's tile 1024 -> 512 checked where it changes the rows a program (up to 256 elements).
    *((dtype, rows, cols, "row_on_chip", forward_tile_variants) for dtype in (torch.bfloat16, torch.float32)
      for rows, cols in ((65536, 256), (16384, 128), (1024, 256), (4096, 64), (2048, 300), (1536, 101),
                         (8192, 101), (256, 200))),
    # Rows just past a power of two (a quarter of the tile or more idle): fp16 1207 x 143 at
    # 0.75-0.83x torch under CUDA graphs in the H200's fp16 sweep (seed 2811), bf16 3000 x 150 0.78x
    # in tuning, log_softmax 7230 x 273 0.96x.
    *((dtype, rows, cols, "row_on_chip", short_tail_variants)
      for dtype in (torch.float16, torch.bfloat16, torch.float32)
      for rows, cols in ((1207, 143), (3000, 150), (43, 147), (2500, 130), (8192, 160), (600, 150), (16384, 136),
                         (4096, 70), (20000, 180), (7230, 273), (5000, 300), (8583, 288), (2048, 1100), (4096, 600),
                         (1024, 2100), (512, 3000))),
    # log_softmax over rows of 136-180 elements at 8192-20000 rows: 0.87-0.92x torch under CUDA graphs
    # (tune_softmax-short_tail-h200.json); the rows of a program, its warps and the tail crossed.
    *((dtype, rows, cols, "row_on_chip", short_row_grid_variants) for dtype, rows, cols in (
        (torch.float16, 8192, 160), (torch.float32, 8192, 160), (torch.bfloat16, 16384, 136),
        (torch.float32, 20000, 180), (torch.bfloat16, 3000, 150), (torch.float32, 1207, 143),
        (torch.bfloat16, 600, 150), (torch.float16, 5000, 140))),
    # Rows of 8193-16384 elements, backward: bf16 log_softmax 3077 x 12867 at 0.66x torch eager in the
    # H200's random-shape sweep (seed 3008; softmax 1.13x), held whole on 32 warps; the other strategies beside.
    *crossed(((torch.bfloat16, rows, cols) for rows, cols in (
        (3077, 12867), (4096, 10007), (2048, 12800), (8192, 13001), (1024, 12867), (3077, 16384))),
        (("row_on_chip", mid_long_row_variants), ("looped", looped_variants),
         ("split_row_on_chip", split_on_chip_variants))),
    # Then the strategies' plans alone around it: misaligned tiles of 8192 and 32768, a row on 16-byte
    # boundaries read in granules (12872), fp16 and fp32.
    *crossed((
        (torch.bfloat16, 4096, 7001), (torch.bfloat16, 2048, 6007), (torch.bfloat16, 1024, 21001),
        (torch.bfloat16, 512, 20011), (torch.bfloat16, 3077, 12872), (torch.float16, 3077, 12867),
        (torch.float32, 3077, 12867), (torch.float32, 4096, 10007), (torch.bfloat16, 262, 32076),
        (torch.bfloat16, 1000, 32076), (torch.bfloat16, 8143, 8187), (torch.bfloat16, 64, 12867),
        (torch.float16, 2, 16364), (torch.float16, 5, 10421), (torch.bfloat16, 132, 12867),
        (torch.bfloat16, 264, 12867), (torch.bfloat16, 396, 12867), (torch.bfloat16, 264, 21001),
        (torch.bfloat16, 264, 7001)), plans_of("row_on_chip", "looped", "split_row_on_chip")),
    # The forward's rows that start off 16-byte boundaries, held whole (46-48 registers a thread at
    # 12867 on 32 warps: one program an SM) against the other strategies, with their aligned
    # neighbours (5008, 12872); bf16 and fp32, tiles of 8192-32768 (run with --variants
    # misaligned_forward; the shapes above add their own cases).
    *((dtype, rows, cols, strategy, variants) for dtype, rows, cols in (
        (torch.bfloat16, 3077, 12867), (torch.bfloat16, 8192, 5001), (torch.bfloat16, 8192, 5008),
        (torch.bfloat16, 2048, 30011), (torch.bfloat16, 4096, 10007), (torch.bfloat16, 264, 12867),
        (torch.float32, 3077, 12867), (torch.float32, 8192, 5001), (torch.float32, 1024, 21001),
        (torch.float32, 4096, 7001), (torch.float32, 3077, 12872), (torch.float16, 1024, 21001),
        # how many rows split_row_on_chip needs to lead (264 x 12867 ran faster held whole)
        *((torch.bfloat16, rows, 12867) for rows in (132, 396, 528, 792, 1056)),
        *((torch.bfloat16, rows, 21001) for rows in (132, 264, 528)),
        *((torch.float32, rows, 12867) for rows in (264, 528, 1056)), (torch.float32, 264, 21001),
        # tiles of 2048-8192, fewer warps held whole (5004: fp32 on boundaries)
        *((dtype, rows, cols) for dtype in (torch.bfloat16, torch.float32)
          for rows, cols in ((264, 5001), (1056, 5001), (2048, 6007), (8192, 3001), (16384, 2001), (8192, 4095))),
        (torch.bfloat16, 4096, 7001), (torch.float32, 8192, 5004),
        # the committed sweeps' cells the rule replans: a full tile of 8192, one 60% full, 4096
        *((dtype, 5576, 4941) for dtype in (torch.bfloat16, torch.float16, torch.float32)),
        (torch.bfloat16, 8143, 8187), (torch.bfloat16, 607, 3809), (torch.float32, 3000, 32003),
        (torch.float32, 2443, 12143), (torch.bfloat16, 4096, 9500), (torch.bfloat16, 1024, 12867))
      for strategy, variants in (("row_on_chip", misaligned_forward_variants),
                                 ("looped", misaligned_forward_variants),
                                 ("split_row_on_chip", misaligned_forward_variants))),
    # Forward rows off 16-byte boundaries held whole in granules: split_row_on_chip with one chunk
    # (run with --variants one_chunk,current_only: row_on_chip's plan beside).
    *((dtype, rows, cols, strategy, variants) for dtype, rows, cols in (
        (torch.bfloat16, 8192, 5001), (torch.bfloat16, 5576, 4941), (torch.bfloat16, 8143, 8187),
        (torch.bfloat16, 3077, 12867), (torch.float32, 3077, 12867), (torch.float32, 8192, 5001),
        (torch.bfloat16, 264, 12867), (torch.float32, 528, 12867), (torch.bfloat16, 264, 5001),
        (torch.bfloat16, 607, 3809))
      for strategy, variants in (("split_row_on_chip", one_chunk_variants), ("row_on_chip", current_only_variants))),
    # Backward rows off 16-byte boundaries held whole in granules: split_row_on_chip with one chunk
    # (run with --backward --variants one_chunk_backward,current_only: looped's plan beside).
    *((dtype, rows, cols, strategy, variants) for dtype, rows, cols in (
        (torch.bfloat16, 3077, 12867), (torch.bfloat16, 4096, 10007), (torch.bfloat16, 8192, 5001),
        (torch.bfloat16, 1024, 21001), (torch.bfloat16, 528, 12867), (torch.float32, 3077, 12867),
        (torch.float32, 2443, 12143), (torch.float32, 4096, 10007))
      for strategy, variants in (("split_row_on_chip", one_chunk_backward_variants),
                                 ("looped", current_only_variants), ("row_on_chip", current_only_variants))),
    # Rows off 16-byte boundaries as one chunk, forward and backward: the warps (run with
    # [--backward] --variants one_chunk_warps,current_only: the aligned neighbours below).
    *((dtype, rows, cols, "split_row_on_chip", one_chunk_warps_variants) for dtype, rows, cols in (
        (torch.bfloat16, 8192, 5001), (torch.bfloat16, 5576, 4941), (torch.bfloat16, 3077, 12867),
        (torch.bfloat16, 4096, 10007), (torch.float16, 3077, 12867), (torch.bfloat16, 1024, 12867),
        (torch.bfloat16, 528, 12867), (torch.float32, 3077, 12867), (torch.float32, 2443, 12143),
        (torch.float32, 1056, 12867), (torch.float32, 4096, 10007), (torch.float32, 8192, 16369),
        (torch.float32, 2048, 14001), (torch.float32, 20000, 12001), (torch.float16, 6000, 13001),
        (torch.float16, 8192, 5001))),
    # The same rows, backward: a head and a tail in the one chunk (run with --backward [--log]
    # --variants one_chunk_tail,current_only: the aligned neighbours below).
    *((dtype, rows, cols, "split_row_on_chip", one_chunk_tail_variants) for dtype, rows, cols in (
        (torch.float32, 4096, 10007), (torch.float32, 2443, 12143), (torch.float32, 20000, 12001),
        (torch.float32, 3077, 12867), (torch.float32, 2048, 14001), (torch.bfloat16, 4096, 10007),
        (torch.bfloat16, 3077, 12867), (torch.bfloat16, 8192, 5001), (torch.bfloat16, 5576, 4941),
        (torch.float16, 6000, 13001), (torch.float16, 8192, 5001))),
    *((dtype, rows, cols, "row_on_chip", current_only_variants) for dtype, rows, cols in (
        (torch.bfloat16, 8192, 5008), (torch.bfloat16, 5576, 4944), (torch.bfloat16, 3077, 12872),
        (torch.bfloat16, 4096, 10008), (torch.bfloat16, 8143, 8192), (torch.float32, 3077, 12872),
        (torch.float32, 2443, 12144), (torch.float32, 1056, 12872), (torch.float32, 4096, 10008),
        (torch.float32, 8192, 16368), (torch.float32, 2048, 14000), (torch.float32, 20000, 12000),
        (torch.float16, 6000, 13008), (torch.float16, 3077, 12872))),
    # split_row_on_chip's forward on smaller chunks (run with --variants split_on_chip_forward): the
    # committed sweeps' cells of the strategy nearest torch (bf16 log_softmax 256 x 50257 0.97x
    # under CUDA graphs on the H200, 11 x 27783 1.03x, fp32 8192 x 50257 1.05x), the bench grid's rows.
    *((dtype, rows, cols, "split_row_on_chip", split_on_chip_forward_variants) for dtype, shapes in (
        (torch.bfloat16, ((256, 50257), (2048, 50257), (8192, 50257), (11, 27783), (49, 24083), (256, 32001),
                          (256, 65537), (2777, 27342), (167, 75507), (256, 262147), (4, 128257), (1, 262147),
                          (64, 128256), (256, 151936), (16, 262144))),
        (torch.float32, ((8192, 50257), (83, 35642), (32, 128257), (64, 128256), (256, 151936), (16, 262144))))
      for rows, cols in shapes),
    # ... and the plan those runs gave, against the plan before it, at the committed sweeps' cells it changes.
    *((dtype, rows, cols, "split_row_on_chip", split_on_chip_forward_rule_off_variants) for dtype, rows, cols in (
        *((torch.bfloat16, rows, cols) for rows, cols in (
            (1, 50257), (1, 128257), (1, 262147), (2, 227360), (4, 32001), (4, 128257), (6, 60744), (11, 27783),
            (15, 52555), (24, 270991), (32, 32001), (32, 262147), (60, 352794), (155, 476342), (167, 75507),
            (221, 396882), (256, 32001), (256, 50257), (256, 100003), (256, 151937), (256, 262147), (262, 32076),
            (474, 23612), (1017, 72117), (1536, 151937), (1742, 95704), (2048, 32001), (2048, 50257),
            (2498, 128261), (8192, 50257))),
        *((torch.float32, rows, cols) for rows, cols in (
            (1, 50257), (1, 128257), (1, 262147), (5, 73849), (11, 33462), (14, 256008), (32, 128257),
            (70, 145537), (157, 375219), (256, 50257), (262, 32076), (1082, 116860), (2048, 50257),
            (8192, 50257))))),
    # fp32 rows of a multiple of 16 elements (capped kernels before), with and without the cap.
    *((torch.float32, rows, cols, "split_row_on_chip", split_on_chip_forward_fp32_capped_variants)
      for rows, cols in ((64, 128256), (256, 151936), (16, 262144), (32, 262144), (128, 65536), (512, 50304),
                         (2048, 128000), (8192, 50304), (4096, 65536), (100, 200000), (256, 100000))),
    # Few long rows, backward (run with --backward --variants split_on_chip_backward_few_programs).
    *((dtype, rows, cols, "split_row_on_chip", split_on_chip_backward_few_programs_variants)
      for dtype in (torch.bfloat16, torch.float32)
      for rows, cols in ((1, 262147), (1, 100003), (2, 227360), (4, 128257), (8, 65537), (16, 50257), (4, 32001),
                         (1, 50257), (1, 131072))),
    # The plan's short heads and tails against the plan before them, across row counts and lengths.
    *((dtype, rows, cols, "row_on_chip", short_tail_off_variants)
      for dtype in (torch.bfloat16, torch.float32, torch.float16)
      for rows in (600, 1207, 3000, 6000, 16384, 50000) for cols in (70, 143, 180, 273, 350)
      if dtype != torch.float16 or rows in (1207, 16384)),
    # Few rows of 4K-32K elements (the H200's random-shape sweep of seed 3013: bf16 log_softmax
    # 15 x 18419 at 0.81x torch under CUDA graphs, softmax 0.97x): held whole (fewer warps too),
    # looped, split across programs (run with --variants few_mid_rows).
    *((torch.bfloat16, rows, cols, strategy, variants) for rows, cols in (
        (15, 18419), (4, 28637), (12, 4324), (64, 18419), (15, 16384), (32, 12001), (8, 30011))
      for strategy, variants in (("row_on_chip", few_mid_rows_variants), ("looped", few_mid_rows_variants),
                                 ("split_row_on_chip", few_mid_rows_variants))),
    # The same rows as a head of 16384 and a tail, from few rows to many (run with --variants wide_head).
    *((torch.bfloat16, rows, cols, "row_on_chip", wide_head_variants) for rows, cols in (
        (15, 18419), (64, 18419), (16, 17000), (64, 20011), (132, 18419), (264, 18419), (528, 18419),
        (2048, 18419), (1024, 17000))),
    # The rule that took them (run with --variants few_rows_tail_off), on rows of 17001-19001 elements.
    *((torch.bfloat16, rows, cols, "row_on_chip", few_rows_tail_off_variants) for rows, cols in (
        (15, 18419), (64, 18419), (132, 18419), (15, 17001), (64, 17001), (132, 17001), (32, 19001),
        (100, 19001))),
    # Few 2-byte rows of 20K-32K elements filling 60-98% of their tile (the H200's fp16 sweep of seed
    # 3201: log_softmax 43 x 26020 at 0.88x torch under CUDA graphs, split_row_on_chip's four
    # chunks a row): held whole or as a head and a tail, looped, split (run with --variants
    # few_long_rows_on_chip,looped,split_on_chip).
    *crossed((
        (torch.float16, 8, 26020), (torch.float16, 43, 26020), (torch.float16, 132, 26020),
        (torch.float16, 43, 22001), (torch.float16, 43, 30011), (torch.bfloat16, 43, 26020)),
        (("row_on_chip", few_long_rows_on_chip_variants), ("looped", looped_variants),
         ("split_row_on_chip", split_on_chip_variants))),
    # ... held whole against split, from few rows to a few an SM, forward and backward (run with
    # [--backward] [--log] --variants current_only).
    *crossed((
        (torch.float16, 16, 32076), (torch.float16, 43, 32076), (torch.float16, 66, 26020),
        (torch.float16, 99, 26020), (torch.float16, 131, 32076), (torch.float16, 262, 26020),
        (torch.bfloat16, 66, 32076), (torch.bfloat16, 262, 32076), (torch.bfloat16, 528, 32076),
        (torch.bfloat16, 1024, 32076), (torch.bfloat16, 4096, 30011), (torch.bfloat16, 8192, 26020),
        (torch.bfloat16, 16384, 23001), (torch.float16, 2048, 32001), (torch.float16, 8192, 28001),
        (torch.bfloat16, 2, 30011), (torch.bfloat16, 4, 28637), (torch.bfloat16, 4, 32001),
        (torch.bfloat16, 11, 27783), (torch.bfloat16, 32, 32001), (torch.bfloat16, 49, 24083),
        (torch.bfloat16, 100, 30011), (torch.bfloat16, 474, 23612), (torch.float16, 474, 23612),
        (torch.bfloat16, 1000, 23612)), plans_of("row_on_chip", "split_row_on_chip")),
    # 2-byte rows of 8-byte starts (lengths 4 mod 8) where the other rules for rows off 16-byte
    # boundaries decide, many rows an SM: one chunk (tiles of 8192 and 16384), the forward's split
    # (tiles from 16384), the backward's looped; the plan (None) against each strategy held to its
    # tables (run with [--backward] [--log] --variants current_only).
    *crossed((
        (torch.float16, 1056, 6004), (torch.bfloat16, 4096, 7004), (torch.float16, 1056, 12004),
        (torch.bfloat16, 4096, 12004), (torch.float16, 528, 14004), (torch.bfloat16, 528, 26020),
        (torch.float16, 2048, 26020), (torch.bfloat16, 2048, 20004), (torch.bfloat16, 4096, 26020),
        (torch.float16, 4096, 32004), (torch.bfloat16, 8192, 32004), (torch.float16, 16384, 26020),
        (torch.float16, 1056, 20004), (torch.bfloat16, 1056, 26020), (torch.float16, 264, 6004),
        (torch.float16, 16384, 6004), (torch.bfloat16, 4096, 4404), (torch.bfloat16, 8192, 8188),
        (torch.float16, 2048, 5004), (torch.bfloat16, 1056, 7604), (torch.float16, 2048, 16380),
        (torch.bfloat16, 264, 12004), (torch.bfloat16, 16384, 12004), (torch.float16, 1056, 9004)),
        plans_of(None, "row_on_chip", "split_row_on_chip", "looped")),
    # 2-byte rows of 16385-19000 elements on 4- or 8-byte boundaries, a few an SM (a random sweep's
    # bf16 log_softmax 982 x 18038 at 0.89x torch under CUDA graphs, whole at 55% of its tile): held
    # whole, as a head of 16384 and a tail, split, looped, the plan (run with --variants
    # wide_head,current_only).
    *crossed((
        (torch.bfloat16, 982, 18038), (torch.bfloat16, 500, 18038), (torch.bfloat16, 2000, 18038),
        (torch.bfloat16, 4000, 18038), (torch.float16, 982, 18038), (torch.bfloat16, 982, 17502),
        (torch.bfloat16, 982, 19002), (torch.bfloat16, 982, 18040)),
        (("row_on_chip", wide_head_variants), *plans_of(None, "split_row_on_chip", "looped"))),
    # ... and from one row an SM to four, held whole against split (--variants current_only).
    *crossed((
        (torch.bfloat16, 150, 18038), (torch.bfloat16, 264, 18038), (torch.bfloat16, 396, 18038),
        (torch.float16, 264, 17502), (torch.bfloat16, 1024, 17002)), plans_of(None, "row_on_chip", "split_row_on_chip")),
    # ... and the head and tail of a few rows an SM against those (--variants few_rows_tail_reach,current_only).
    *crossed(((dtype, rows, cols) for dtype, rows, cols in (
        *((torch.bfloat16, rows, cols) for rows in (150, 264, 396, 500) for cols in (18038, 18419, 17502)),
        (torch.bfloat16, 200, 19002), (torch.float16, 264, 18038), (torch.float16, 396, 18038))),
        (("row_on_chip", few_rows_tail_reach_variants), *plans_of(None, "split_row_on_chip"))),
    # Long rows' backward where the bf16 sweep of seed 3302 had a step behind torch eager (log_softmax
    # 254 x 121650 0.75x, 1 x 305684 0.83x): the plan against split and looped (--backward --log
    # --variants current_only).
    *crossed((
        (torch.bfloat16, 254, 121650), (torch.bfloat16, 254, 121648), (torch.bfloat16, 1, 305684)),
        plans_of(None, "split_row_on_chip", "looped")),
    # fp16 rows of a tile of 32768 held at 16 bits (run with --variants held_fp16, forward): aligned,
    # on 8-byte starts, odd lengths; held whole and the plan (which splits some of them).
    *crossed((
        (torch.float16, 1024, 32768), (torch.float16, 64, 32768), (torch.float16, 8192, 30000),
        (torch.float16, 2048, 26020), (torch.float16, 16384, 26020), (torch.float16, 4096, 32004),
        (torch.float16, 528, 32001), (torch.float16, 1024, 20000)),
        (("row_on_chip", held_fp16_variants), (None, held_fp16_variants))),
    # Long rows on 16-byte starts, backward (run with --backward [--log] --variants aligned_backward_warps):
    # bf16 8192 x 65536 ran at 79% of copy where 8192 x 65544, off 16-byte starts on 4 warps a chunk, ran at 90%.
    *((dtype, rows, cols, "split_row_on_chip", aligned_backward_warps_variants) for dtype, rows, cols in (
        (torch.bfloat16, 8192, 50304), (torch.bfloat16, 8192, 65536), (torch.bfloat16, 8192, 98304),
        (torch.bfloat16, 8192, 131072), (torch.bfloat16, 2048, 65536), (torch.bfloat16, 1024, 128256),
        (torch.bfloat16, 528, 65536), (torch.bfloat16, 256, 151936), (torch.bfloat16, 132, 131072),
        (torch.float16, 8192, 65536), (torch.float32, 8192, 65536), (torch.float32, 1024, 128256),
        (torch.float16, 8192, 50304), (torch.float16, 8192, 131072), (torch.float16, 2048, 65536),
        (torch.float16, 1024, 128256), (torch.float16, 528, 65536))),
]


def describe(values):
    parts = []
    for name, value in values.items():
        if name == "MISALIGNED_ONE_CHUNK_TILES":
            value = f"fwd fp32 {value['forward'][4]}"
        elif name == "ROW_ON_CHIP_HOLD_INPUT_MIN_COLS":  # the dtypes held
            value = "/".join(str(dtype)[6:] for dtype in value)
        elif name == "MISALIGNED_ONE_CHUNK_WARP_BYTES":  # by op, then dtype: fp32/fp16/bf16
            value = " ".join(f"{key.replace('_backward', ' bwd')} " + "/".join(str(v[dtype]) for dtype in plan.KERNEL_DTYPES)
                             for key, v in value.items())
        elif name == "MISALIGNED_ONE_CHUNK_TAIL_BELOW_FILL":
            value = value[4]
        elif name == "MISALIGNED_ONE_CHUNK_TAIL_WARP_BYTES":  # one value for every op and element size here
            value = value["softmax_backward"][4]
        elif name == "WARPS_BY_TILE_ELEMENTS":
            value = "/".join(str(w) for _, w in value)
        elif name == "SPLIT_PROGRAMS_PER_SM":
            value = value[-1][1]
        elif isinstance(value, dict) and "backward" in value:  # forward/backward, by element size fp32:2-byte
            value = "/".join(f"{v.get(4)}:{v.get(2)}" if isinstance(v, dict) else str(v)
                             for v in (value["forward"], value["backward"]))
        elif name == "SPLIT_ON_CHIP_SOFTMAX_BACKWARD_WARP_BYTES":  # by dtype: fp32/fp16/bf16
            value = "/".join(str(value[dtype]) for dtype in plan.KERNEL_DTYPES)
        elif isinstance(value, dict) and set(value) == {2, 4}:  # by element size: fp32/2-byte
            value = f"{value[4]}/{value[2]}"
        elif isinstance(value, dict):
            value = value.get(2, value.get("forward"))
        parts.append(f"{name}={int(value) if isinstance(value, bool) else value}")
    return " ".join(parts)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--strategy", default=None, help="only the cases of this strategy")
    parser.add_argument("--backward", action="store_true", help="time softmax backward instead")
    parser.add_argument("--log", action="store_true", help="log_softmax (forward or backward) instead of softmax")
    parser.add_argument("--shapes", default=None, help="only these ROWSxCOLS, comma-separated")
    parser.add_argument("--variants", default=None,
                        help="only the cases of these variants functions, comma-separated (short_tail)")
    args = parser.parse_args()
    copy = copy_bandwidth_gbs()
    print(f"copy bandwidth: {copy:.0f} GB/s", flush=True)
    results = []
    for dtype, rows, cols, strategy, variants in CASES:
        if args.strategy and strategy != args.strategy:
            continue
        if args.shapes and f"{rows}x{cols}" not in args.shapes.split(","):
            continue
        if args.variants and getattr(variants, "__name__", "") not in [f"{name}_variants"
                                                                     for name in args.variants.split(",")]:
            continue
        nbytes = (3 if args.backward else 2) * rows * cols * dtype.itemsize
        count = rotation_count(nbytes)
        log = args.log
        if args.backward:  # y, dy -> dx
            forward = torch.log_softmax if log else torch.softmax
            xs = [(forward(torch.randn(rows, cols, device="cuda"), -1).to(dtype),
                   torch.randn(rows, cols, device="cuda", dtype=dtype)) for _ in range(count)]
            call = lambda y, dy: softmax_launch.launch_backward(y, dy, 1, log, strategy=strategy)  # noqa: E731
            aten = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
            torch_call = lambda y, dy: aten(dy, y, 1, dtype)  # noqa: E731
        else:
            xs = [(torch.randn(rows, cols, device="cuda", dtype=dtype),) for _ in range(count)]
            ours = onlinesoftmax.log_softmax if log else onlinesoftmax.softmax
            call = lambda x: ours(x, strategy=strategy)  # noqa: E731
            torch_call = (lambda x: torch.log_softmax(x, -1)) if log else (lambda x: torch.softmax(x, -1))
        # The first replays after allocating the inputs ran slow on the H100 (row_on_chip "current"
        # 5-25% below the same configuration timed later): one untimed pass first.
        graph_time_ms(call, xs)
        torch_ms = graph_time_ms(torch_call, xs)
        print(f"{str(dtype)[6:]} {rows}x{cols} torch: {nbytes / torch_ms / 1e6:.0f} GB/s", flush=True)
        results.append(dict(dtype=str(dtype), rows=rows, cols=cols, strategy="torch", constants="torch's kernel",
                            ms=torch_ms, gbs=nbytes / torch_ms / 1e6, copy_gbs=copy))
        best = None
        for values in [{}] + list(variants()):
            with onlinesoftmax.override_plan("softmax", **values):
                try:
                    ms = graph_time_ms(call, xs)
                except Exception as exc:  # too many registers for a tile, say: report and go on
                    print(f"  {describe(values)}: {type(exc).__name__}", flush=True)
                    continue
            if ms is None:
                continue
            gbs = nbytes / ms / 1e6
            results.append(dict(dtype=str(dtype), rows=rows, cols=cols, strategy=strategy,
                                constants=describe(values) or "current", ms=ms, gbs=gbs, copy_gbs=copy))
            if best is None or gbs > best[0]:
                best = (gbs, describe(values) or "current")
            if not values:
                print(f"{str(dtype)[6:]} {rows}x{cols} {strategy}: current {gbs:.0f} GB/s", flush=True)
            else:
                print(f"  {describe(values)}: {gbs:.0f} GB/s", flush=True)
        print(f"  best {best[0]:.0f} GB/s with {best[1]}", flush=True)
        del xs
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
