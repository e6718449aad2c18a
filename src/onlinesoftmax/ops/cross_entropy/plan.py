"""cross_entropy: launch decisions, as small tables with a reason each.

Ops (what a launch must produce) and the strategies that serve them:

``forward``: the loss and lse of every row, the gradient later from the lse.
    ``stream`` reads each row once: one program per row, or, when rows alone cannot fill the GPU,
    several programs per row, whose partial (m, d) the row's last program to finish merges.
``forward_grad``: the loss, the lse and the gradient written over the logits (inplace_backward,
linear_cross_entropy's chunks), or into a new tensor (a training step keeping its logits, where
gradient_in_forward says).
    ``on_chip``: one program holds the whole row in registers: one read, one write.
    ``split_on_chip``: a row too long for one program is held by several at once, which exchange
    their (m, d) through device memory (as the softmax's split_row_on_chip): one read, one write.
    Triton's interpreter runs programs one after another, so there a row is one chunk.
    ``two_pass``: one program streams its row twice (normalizer, then gradient): two reads, for
    rows longer than split_on_chip holds.
    ``separate``: the forward's ``stream`` launch, then the ``backward`` kernel writing the
    gradient over the logits: two reads, each spread over every tile of every row (few long rows).
``backward``: the gradient from the saved lse, an elementwise kernel (``backward``).
``stats``: a vocabulary shard's per-row (m, d, smoothing sum, target logit), ``stream``.
``torch`` (any op): CPU tensors without the interpreter, torch's own ops in float32.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from ... import _device
from ..._launch import RegisterCap
from ..._validate import KERNEL_DTYPES

OPS = ("forward", "forward_grad", "backward", "stats")
STRATEGIES = ("stream", "on_chip", "split_on_chip", "two_pass", "separate", "backward", "rows", "torch")
SERVES = {"forward": ("stream", "rows"), "stats": ("stream",), "backward": ("backward", "rows"),
          "forward_grad": ("on_chip", "split_on_chip", "two_pass", "separate", "rows")}

# Every kernel's tiles give a thread this many elements. ptxas for sm_90 (Triton 3.6), registers
# a thread at 16 / 32 elements: split_on_chip bf16 32 / 80 (8 / 3 programs an SM at 8192
# columns), stream bf16 32-40 / 48-56, backward bf16 ~32 / 48-62; one whole 32768-column bf16
# row at 64 spilled (128 registers and a 56-byte stack).
ELEMENTS_PER_THREAD = 16
# ... except the 2-byte streaming kernels (stream, backward), at 32: a training step with a
# separate backward (bf16, H100, scripts/tune/sweep_cross_entropy.py, docs/notes/2026-11/
# sweep_cross_entropy-h100.log) took 8192 x 128256 from 2.507 to 2.379 ms, 8192 x 50257 from 1.210
# to 1.095, 8192 x 32000 from 0.658 to 0.624; at 32 the on-chip kernels lost 20-37%. float32 was
# not swept: it keeps 16.
STREAM_ELEMENTS_PER_THREAD = {4: 16, 2: 32}
MAX_WARPS = 16

# Elements a program reads per tile, by element size: 16 KB (the softmax's looped kernels'
# measured setting on the H100, and its split_row_on_chip forward tile).
STREAM_BLOCK = {4: 4096, 2: 8192}
# stream: a row's tiles in as few chunks as give the grid STREAM_MIN_PROGRAMS_PER_SM programs an
# SM (rows x chunks), the row's last program to finish merging its partials; at most STREAM_MAX_CHUNKS
# (the merge loads a row's partials as one tile). H200, the forward, ms, one tile a program -> one
# chunk a row (docs/notes/2026-11/probe_cross_entropy_stream_chunks-h200.log): bf16 8192 x 128256 0.795 ->
# 0.582, 32768 x 32000 0.847 -> 0.623; fp32 8192 x 128256 1.131 -> 0.947. Few rows need the
# programs: bf16 132 x 128256 0.0229 at 16 chunks, 0.0220 at 4, 0.0346 at 1.
STREAM_MIN_PROGRAMS_PER_SM = 4
STREAM_MAX_CHUNKS = 256
# stream: its programs an SM at once (sm_90, Triton 3.6, 8 warps: 48 registers a thread in 2-byte
# dtypes, 32 in fp32; kernel_resources.py). Where the chunks above give 1 to STREAM_BALANCE_MAX_WAVES
# waves of programs, the last under STREAM_BALANCE_MAX_FILL full, a row takes the chunk count (up to
# STREAM_BALANCE_MAX_CHUNKS) of least (whole waves) x (tiles a chunk + STREAM_PROGRAM_COST_TILES): the
# programs left over past a wave run alone, at one program's rate (why: not profiled). H200, the forward under
# CUDA graphs, ms, unbalanced -> balanced (docs/notes/2026-11/probe_cross_entropy_stream_waves-h200.log;
# fitted on 14 shapes, checked on 22): bf16 333 x 256003 (666 programs, 660 at once) 0.0739 ->
# 0.0616, 354 x 200032 0.0605 -> 0.0534, 777 x 151937 0.0887 -> 0.0823; fp32 1172 x 200019 0.2880 ->
# 0.2257; none slower by over 0.2%. Up to 3 waves, rows of 4-8 tiles lost 2-5% at 2-2.5 waves.
STREAM_PROGRAMS_PER_SM = {2: 5, 4: 8}
STREAM_BALANCE_MAX_WAVES = 2
STREAM_BALANCE_MAX_FILL = 0.5
STREAM_BALANCE_MAX_CHUNKS = 16
STREAM_PROGRAM_COST_TILES = 0.5
# stream and backward: where a row's last tile would hold at most this share of a tile's columns,
# the row's last program takes them too, in one tile of their next power of two (no narrower than a
# vector a thread): a program costs about as much however few of its columns are live (a ninth
# program a row took bf16 8192 x 65600, aligned to 128 bytes, 10% over 65536). H200, a step keeping
# the logits under CUDA graphs (docs/notes/2026-11/sweep_cross_entropy-stream_tail-h200.log), ms,
# none -> the tail: bf16 8192 x 65544 1.083 -> 1.021 (65536: 0.956), 8192 x 50257 0.896 -> 0.801,
# 50304 0.810 -> 0.751, 16384 x 50257 1.787 -> 1.584, 8192 x 98312 1.567 -> 1.501; fp32 8192 x 16392
# 0.515 -> 0.461; fp32 4096 x 256000, a last part of half a tile, 3.273 -> 3.307 eager (hence 0.4).
# 0: a row's last part takes a program of its own.
STREAM_TAIL_MAX_SHARE = 0.4
# ... where the rows are at least this many an SM. Fewer, the grid is a wave or two and the row's
# last program, which reads its two tiles one after the other, is on the call's path. H200, CUDA
# graphs, ms a step keeping the logits, the part in the last program -> a program of its own
# (docs/notes/2026-11/sweep_cross_entropy-stream_tail_rows-h200.log): fp32 64 x 151937 0.0441 ->
# 0.0425, 100 x 128256 0.0544 -> 0.0525, 132 x 50257 0.0318 -> 0.0307; bf16 132 x 50257 0.0237 ->
# 0.0226; at 264 rows level or the last program ahead (fp32 264 x 16392 0.021 against 0.022).
STREAM_TAIL_MIN_ROWS_PER_SM = 2
# The stream kernel's last chunk reduces that part before its own tiles ("first"), after them
# ("last"), or between its first tile's load and that tile's reduction ("overlap": the two loads in
# flight together), by element size: fp32 keeps the fewest registers "first" (32 a thread against
# 39-40, ptxas for sm_90: scripts/probes/kernel_resources.py), bf16 48 "last" or "overlap" (56
# "first"). H200, CUDA graphs, ms a step keeping the logits
# (docs/notes/2026-11/sweep_cross_entropy-stream_tail-h200.log, runs 4, 9 and 10): fp32 first / last /
# overlap 4096 x 151936 1.961 / 2.040 / 2.035; bf16 overlap / last / first 8192 x 50257 0.783 / 0.801 /
# 0.849, 16384 x 50257 1.548 / 1.585 / 1.680. (The backward kernel's last program loading its own
# tile before that part: fp32 level, bf16 8-15% slower at 76-105 registers against 44-48.)
STREAM_TAIL_ORDER = {4: "first", 2: "overlap"}

# on_chip holds rows up to this many (padded) columns in one program, by element size: the split
# tile (16 KB); longer rows take split_on_chip (a 64 KB single-program tile spilled, above).
ON_CHIP_MAX_COLS = {4: 4096, 2: 8192}
# ... or two_pass where there are rows enough for this many programs an SM: reading a row twice
# (the second read mostly from L2) beat holding it across programs that wait for each other.
# Inplace training step, split_on_chip -> two_pass (scripts/tune/sweep_cross_entropy.py, H100;
# docs/notes/2026-11/sweep_cross_entropy-h100.log and sweep_cross_entropy-two_pass-h100.log):
# bf16 8192 x 128256 2.465 -> 2.369 ms, 8192 x 50257 1.091 -> 0.956, 8192 x 32000 0.668 -> 0.551;
# fp32 (with the two tables below) 8192 x 128256 4.547 -> 4.279, 8192 x 32000 1.125 -> 0.884.
# From one row an SM (4 before, when fewer rows took split_on_chip): on the H200, CUDA-graph replays
# of an inplace training step at 132-527 rows, split_on_chip -> two_pass, ms: bf16 132 x 128256
# 0.0643 -> 0.0381, 527 x 128256 0.2125 -> 0.1170, 333 x 256003 0.2742 -> 0.1783; fp32 333 x 32001
# 0.0585 -> 0.0449, 527 x 256003 0.6051 -> 0.4590 (scripts/probes/probe_cross_entropy_inplace_strategies.py,
# docs/notes/2026-11/probe_cross_entropy_inplace_strategies-h200.log). separate took 1.00-1.23x
# two_pass's time there, but 0.93x at bf16 527 x 32001 and 0.97x at 333 x 256003; fp32 1.03-1.19x,
# but 0.91x and 0.97x at 333 and 527 x 256003 (rows of 1 MB; two_pass is the plan from 528 rows
# too, where at 1024 x 256003 separate took 0.96x). The H100 was not measured.
TWO_PASS_MIN_ROWS_PER_SM = {4: 1, 2: 1}
# Fewer rows take separate (the forward's stream launch, then the backward kernel over the logits:
# every tile of every row a program) where their logits take at least this many bytes, split_on_chip
# below (one launch less, GPU times within 1.5 us). Same probe, split_on_chip -> separate, ms: bf16
# 64 x 128256 0.0378 -> 0.0263, 64 x 256003 0.0638 -> 0.0424, 16 x 256003 0.0212 -> 0.0185; fp32 64
# x 256003 0.0819 -> 0.0682, but 64 x 32001 (8 MB) 0.0154 -> 0.0164; below: bf16 16 x 128256 0.0142
# -> 0.0144, 16 x 50257 0.0134 -> 0.0140.
SEPARATE_MIN_BYTES = 4 * 2**20
# two_pass programs of this many warps run one an SM (63 registers a thread); where their rows fill
# a wave and under TWO_PASS_SEPARATE_MAX_FILL of the next, the rows left over run alone, a row read
# twice at one program's rate: separate (programs of tiles) is faster. H200, the in-place forward
# under graphs, ms, two_pass -> separate (docs/notes/2026-11/probe_cross_entropy_inplace_waves-h200.log):
# bf16 x 128256 at 133 rows 0.0480 -> 0.0372 (132: two_pass 0.0331), 140 0.0491 -> 0.0389, 170
# 0.0506 -> 0.0468; fp32 140 x 65537 0.0446 -> 0.0376. In a third wave: 12% faster at bf16 275 x
# 200019, 1.2-5.5% slower at fp32 270-285 x 65537 and 280 x 32000; not taken.
TWO_PASS_ONE_AN_SM_WARPS = 32
TWO_PASS_SEPARATE_MAX_WAVES = 2
TWO_PASS_SEPARATE_MAX_FILL = 0.4
# two_pass: the first read asks L2 to keep the row for the second, which, with the gradient's
# stores, asks it to drop the lines (eviction hints). Same sweep, bf16 8192 x 128256 2.373 ->
# 2.236 ms, 8192 x 50257 0.960 -> 0.926; fp32 8192 x 32000 1.095 -> 1.032.
TWO_PASS_HOLD_L2 = True
# two_pass launches by element size: rows (most bytes a row, warps a program (0: by the tile), tile columns (0:
# STREAM_BLOCK)), the first whose bytes hold the row applying: how many rows an SM has in flight and how many bytes
# each keeps loading (docs/perf-cross_entropy.md, "The two_pass launch tables": what each row measured).
TWO_PASS_LAUNCH = {4: ((98304, 32, 0), (131072, 32, 8192), (1 << 62, 32, 16384)),
                   2: ((32768, 8, 4096), (65536, 8, 0), (131072, 16, 0), (1 << 62, 32, 16384))}
# The general kernel's launches with label smoothing (without and with class weights) and with a
# softcap (with any other option), the same form of table; other options take TWO_PASS_LAUNCH. At 32
# warps these options take 42-64 registers a thread, one program an SM; smaller programs run several
# (docs/perf-cross_entropy.md, "The two_pass launch tables": what each row measured).
TWO_PASS_OPTIONS_LAUNCH = {
    "smoothing": {4: ((1 << 62, 16, 8192),), 2: ((65536, 8, 4096), (131072, 16, 0), (1 << 62, 8, 4096))},
    "weighted smoothing": {4: ((131072, 16, 8192), (1 << 62, 16, 4096)), 2: ((1 << 62, 4, 2048),)},
    "softcap": {4: ((1 << 62, 16, 4096),), 2: ((1 << 62, 8, 4096),)},
}
# two_pass over plain rows (no class weights, label smoothing, softcap or z-loss; see
# cross_entropy_two_pass_plain_kernel and, for rows of partial vectors, PLAIN_EDGES), the same form
# of table, measured on rows of whole vectors: bf16 over 32-64 KB tiles at 32 warps from 108 KB, 8
# warps over 16 KB below; fp32 at 16 warps over 32 KB tiles up to 112 KB, 32 warps above (more
# programs an SM where their rows do not crowd L2). Each row's measurements: docs/perf-cross_entropy.md,
# "The two_pass launch tables".
TWO_PASS_PLAIN_LAUNCH = {4: ((114688, 16, 8192), (204800, 32, 8192), (1 << 62, 32, 16384)),
                         2: ((110592, 8, 8192), (245760, 32, 16384), (1 << 62, 32, 32768))}
# The kernel for plain rows takes a row's last part, where it is at most this share of a tile, in
# tiles of the next power of two: each tile of a pass costs as much however few of its columns are
# live (bf16 8192 x 65544 at 16384 columns a tile ran 0.902 ms, 65536 0.756, 80000 0.945: five tiles
# against four). Under CUDA graphs (sweep_cross_entropy-plain_tail-h200.log), ms, none -> the tail:
# bf16 8192 x 65544 0.901 -> 0.823, 98312 1.505 -> 1.339, 131080 1.897 -> 1.752, 50304 0.671 ->
# 0.610; fp32 8192 x 16392 0.367 -> 0.326; no shape that took a tail slower by over 1%. 0: every
# tile the table's.
PLAIN_TAIL_MAX_SHARE = 0.5
# Plain rows that are not whole 16-byte vectors (50257, 128257 columns), by element size: (bytes a
# row from which they take that kernel, the general kernel's below; bytes of the runs its tiles
# cover, each from an absolute multiple of them, the row's partial first and last runs going
# element-wise). Measured in place against the general kernel, runs of 16 / 128 bytes
# (scripts/tune/sweep_cross_entropy.py, docs/notes/2026-11/sweep_cross_entropy-plain_edges-h100.log),
# ms: bf16 8192 x 128257 2.268 -> 1.844 / 1.881 (its aligned neighbour 128256: 1.796), 4096 x
# 100003 0.860 -> 0.840 / 0.877, but 8192 x 50257 0.766 -> 1.057 / 1.097 (60 registers a thread
# at 32 warps: one program an SM where 50304's kernel has two) and 0.788 at 16 warps over 16 KB
# tiles; fp32 8192 x 128257 4.414 -> 4.590 / 3.903 (128256: 3.792), 4096 x 100003 1.637 -> 1.704 /
# 1.512, but 8192 x 50257 1.344 -> 1.336 / 1.405 and 8192 x 32001 0.787 -> 0.805 / 0.853. fp32's
# boundary between 201 KB (50257, the general kernel) and 400 KB (100003) rows was not measured.
PLAIN_EDGES = {4: (262144, 128), 2: (196608 + 1, 16)}
# ... and rows of partial vectors of at most this many bytes, over the same runs: first those of the
# table's 8-warp (bf16) and 16-warp (fp32) programs. H200, in place, CUDA graphs, ms, the general kernel ->
# these (scripts/tune/sweep_cross_entropy.py --variants plain_before_band, docs/notes/2026-11/
# sweep_cross_entropy-plain_edges_band-h200.log, runs 3-4): bf16 8192 x 50257 0.687 -> 0.635 (50304:
# 0.570), 8192 x 32771 0.460 -> 0.355, 8192 x 24001 0.355 -> 0.275, 8192 x 16001 0.207 -> 0.194;
# fp32 8192 x 50257 1.381 -> 1.158 (50304: 1.095), 8192 x 40001 1.140 -> 0.844, 8192 x 32001 0.711 ->
# 0.648, 8192 x 16001 0.475 -> 0.347, 1024 x 50257 0.180 -> 0.157. Runs of 16 bytes took fp32 32001,
# 24001 and 16001 1-5% further and 50257, 40001 and 1024 x 50257 3-11% back.
# Then longer rows: fp32 up to PLAIN_EDGES' 256 KB on those programs (8192 x 51203 1.340 -> 1.171,
# 60001 1.459 -> 1.300); bf16 to 129 KB there, which lost from 156 KB (80001 1.043 -> 1.130; run 5).
# Since the target's term left the kernel's loops, bf16 rows with edges of 108-192 KB take the
# table's 32-warp programs under a cap of 32 registers (PLAIN_MAX_REGISTERS; two programs an SM, as
# aligned rows): 8192 x 65537 0.865 -> 0.737 (65536: 0.720), 98303 1.396 -> 1.192 (uncapped, 52
# registers and one program: 0.987 at 65537; docs/perf-h200.md, "bf16 rows of 108-192 KB").
PLAIN_EDGES_UP_TO = {4: 262143, 2: 196608}
# Rows with edges of at most (bytes): (warps, tile columns; 0 as there) in place of TWO_PASS_PLAIN_LAUNCH's.
PLAIN_EDGES_BAND_LAUNCH = {4: (262143, 16, 8192), 2: (110592, 8, 8192)}
# A cap on the kernel for plain rows' registers a thread (Triton's maxnreg), by (element size, warps
# a program, rows with edges): (the cap, most bytes a row it applies to); absent: the compiler's
# choice. bf16 rows with edges on 8 warps took 80 registers uncapped (three programs an SM where
# aligned rows ran four; Nsight Compute: docs/notes/2026-11/ncu_cross_entropy_edges-h200.txt) and
# ran 8192 x 50257 in 0.670 ms; at 64 four programs compile without spills (ptxas for sm_90,
# scripts/probes/kernel_resources.py): 0.629 (56: 0.637; 48 spills 24 bytes a thread: 0.685; run 2).
# Aligned bf16 rows on 8 warps take 64 uncapped, 48 without spills in the kernel's two loops: five
# programs an SM. H200, CUDA graphs, ms, uncapped -> 48: 8192 x 50304 0.607 -> 0.572, 8192 x 32768
# 0.378 -> 0.330, 8192 x 16384 0.201 -> 0.178, 8192 x 40000 0.466 -> 0.447, 32768 x 32000 1.441 ->
# 1.304; but 8192 x 53000 (106 KB rows, 80 registers uncapped: three programs an SM) 0.665 ->
# 0.705 (not explained; 55000 0.733 -> 0.748), and 1024 x 50304 0.0887 -> 0.0906-0.0921 (1024 rows
# are one and a half waves of five programs an SM, two of four). Since the target left the loops:
# edges 63-64 uncapped, 48 without spills but slower (50257 0.610 -> 0.639); 53000 at 48 still loses;
# bf16's 32-warp programs over 32 KB tiles take 59 where a row has a last part (32 before; 8192 x
# 57344: one program an SM, 0.673 -> 0.857 ms), capped at 32 to 240 KB (edges' 100003 1.527 -> 1.242).
PLAIN_MAX_REGISTERS = {(2, 8, False): (48, 102400), (2, 8, True): (64, 1 << 62),
                       (2, 32, False): (32, 245760), (2, 32, True): (32, 245760)}
# The kernel's one masked loop (rows without a tail, or whose last part is over PLAIN_TAIL_MAX_SHARE
# of a tile) spilled under caps below this (8 bytes at 48); there it takes its loop over whole tiles
# and one over half tiles for the rest, which did not (since the target left the loops: no spills).
PLAIN_ONE_LOOP_MIN_REGISTERS = 56
# split_on_chip: 16 KB tiles (bf16 8192 columns, fp32 4096: the softmax's tuned split_row_on_chip
# forward, 2.0-2.3 TB/s on the H100), larger tiles only where a row would
# otherwise take more than SPLIT_MAX_CHUNKS_PER_SM chunks an SM (a row's programs must be resident
# together; half the SMs leaves room for other streams' kernels), up to SPLIT_MAX_TILE columns.
SPLIT_TILE_BYTES = 16384
SPLIT_MAX_CHUNKS_PER_SM = 0.5
SPLIT_MAX_TILE = 16384

# gradient_in_forward=True: a training step that keeps its logits writes their gradient in the
# forward, into a new tensor, by the in-place forward's plan (on_chip, split_on_chip, two_pass),
# where that is faster than the stream forward and the backward kernel (reading the logits again).
# On the H200 (scripts/probes/probe_cross_entropy_gradient_in_forward.py, docs/notes/2026-11/
# probe_cross_entropy_gradient_in_forward-h200.log, before STREAM_MIN_PROGRAMS_PER_SM), bf16 steps
# for an upstream gradient of 1, eager, default -> gradient in forward, ms: 8192 x 128256 1.884 ->
# 1.486, 32768 x 32000 1.923 -> 1.236, 528 x 128256 (4 rows an SM) 0.192 -> 0.151; but 333 x
# 256003 (2.5 rows an SM) 0.209 -> 0.313, and rows of 4097 (on_chip, 16-64 MB) slower under CUDA
# graphs too (8192 x 4097 0.138 -> 0.148).
# Not "none" (a gradient a row to scale is a pass over it anyway).
GRADIENT_IN_FORWARD_MIN_ROWS_PER_SM = 4
GRADIENT_IN_FORWARD_MIN_BYTES = 128 * 2**20


def gradient_in_forward(chosen: Plan, reduction: str, device: torch.device) -> bool:
    """Whether a training step keeping its logits that asks for it (gradient_in_forward=True) writes
    the gradient in the forward, by ``chosen``, the forward_grad plan of its logits (see above)."""
    return (reduction != "none" and chosen.strategy in ("on_chip", "split_on_chip", "two_pass")
            and chosen.rows >= GRADIENT_IN_FORWARD_MIN_ROWS_PER_SM * _device.sm_count(device)
            and chosen.rows * chosen.cols * chosen.dtype.itemsize >= GRADIENT_IN_FORWARD_MIN_BYTES)


# Eager training steps of logits under this many bytes took longer than F.cross_entropy's on the
# H100 machine, their time our host's (bf16 512 x 65537, 67 MB: 0.71-0.76x torch; 8192 x 4097, 67
# MB: 0.75-1.03x; 512 x 128257, 131 MB: 1.41-1.45x; scripts/probes/probe_cross_entropy_off_grid.py,
# docs/notes/2026-11/probe_cross_entropy_off_grid-h100.log). `explain` says so; no call is routed.
EAGER_BEHIND_TORCH_BYTES = 100_000_000

# CPU logits (no Triton) of at most this many elements, by element size, with only torch's options
# (no z_loss, softcap, temperature or lse) run F.cross_entropy itself, half precision upcast to
# float32 first (the loss and the gradient rounded once, as the kernels round them). The torch path
# is a few dozen torch ops where torch's is one kernel. On this project's 2-core CPU machine, torch's
# time over ours, forward / training step, before -> after (scripts/probes/probe_cpu_torch_paths.py,
# docs/notes/2026-11/probe_cpu_torch_paths-small_calls-cpu.log): fp32 8 x 1024 0.03 / 0.09 -> 0.63 /
# 0.82, 64 x 32000 0.50 / 0.87 -> 0.98 / 0.97; bf16 16 x 32000 0.34 / 0.35 -> 0.84 / 0.75, where at
# 64 x 32000 the float32 copy of the logits made the step slower (0.43 -> 0.33). Larger calls keep
# the torch path, whose rows go in 4 MB chunks (docs/perf-cross_entropy.md, "CPU tensors").
CPU_TORCH_MAX_LOGITS = {8: 1 << 21, 4: 1 << 21, 2: 1 << 19}

# The forward that keeps the logits (stream) and the backward over rows that are not whole 16-byte
# vectors: their tiles cover the row's whole runs of this many bytes from absolute multiples of
# them (at least a vector; the partial first and last runs element-wise). Against runs of 16 bytes
# (sweep_cross_entropy-plain_edges-h100.log), a step keeping the logits, ms: bf16 8192 x 128257 2.531
# -> 2.497, 8192 x 50257 1.080 -> 1.071; fp32 8192 x 128257 4.697 -> 4.615 (64-byte runs: 2.507, 1.075, 4.635).
STREAM_RUN_BYTES = {4: 128, 2: 128}

# backward: elementwise tiles of 16 KB, one program a tile (bandwidth-bound; the per-program row
# values, lse, target and upstream gradient, are 3 loads from L2).
BACKWARD_BLOCK = {4: 4096, 2: 8192}

# Scaling a stored gradient by the upstream one: persistent programs (an early exit when the
# upstream gradient is 1 must cost a handful of programs, not one per tile).
SCALE_BLOCK = {4: 4096, 2: 8192}
SCALE_PROGRAMS_PER_SM = 4

# The denominators and the reduction: one program (rows in a fixed order, reproducible).
REDUCE_BLOCK = 1024
REDUCE_WARPS = 4
# ... in launches of their own (count, reduce): 16 warps over 4096 rows a step, one program up to
# REDUCE_LAUNCH_ONE_PROGRAM_STEPS steps, then programs of a step each (up to REDUCE_LAUNCH_MAX_PROGRAMS,
# then of several) that meet in the last to arrive (docs/perf-cross_entropy.md, "Short rows").
REDUCE_LAUNCH_BLOCK = 4096
REDUCE_LAUNCH_WARPS = 16
REDUCE_LAUNCH_ONE_PROGRAM_STEPS = 8
REDUCE_LAUNCH_MAX_PROGRAMS = 1024
# The stream kernel's last row to finish reduces the loss, over at most REDUCE_IN_ROWS_MAX_ROWS rows: a
# launch less a call (docs/perf-cross_entropy.md#host-time), 2% of a bf16 step at 8192 x 50257 (H200); over
# more, that program's loop was the tail (100000 x 1000: the kernel 353 µs, 76 without; 32768 x 4096 +15%).
REDUCE_IN_ROWS_LAUNCH = True
REDUCE_IN_ROWS_MAX_ROWS = 16384

# Under the interpreter: small tiles so that test rows span several tiles and chunks.
INTERPRETER_BLOCK = 32

# Short rows (rows_kernel.py; docs/perf-cross_entropy.md, "Short rows"): whole rows a program, where rows
# have at most ROWS_MAX_COLS columns and number at least ROWS_MIN_ROWS_PER_SM an SM; ROWS_TILE_ELEMENTS by
# width, the best of 1024, 2048 and 4096 over three runs. Under the interpreter only where ROWS_INTERPRETED
# (tests), keeping the other kernels' paths there.
ROWS_MAX_COLS = 512
ROWS_MIN_ROWS_PER_SM = 4
ROWS_TILE_ELEMENTS = {2: 1024, 4: 1024, 8: 1024, 16: 1024, 32: 1024, 64: 1024, 128: 1024, 256: 1024, 512: 2048}
ROWS_WARPS = 4
# Tiles as narrow as the rows (MIN_BLOCK is for aligned runs, which rows do not take), their columns in
# ROWS_COLUMN_GROUPS groups by width: a warp's lanes span several rows (bf16 524288 x 19, H200: 0.142 ms a
# step at one group, 0.058 at 8).
ROWS_MIN_BLOCK = 2
ROWS_COLUMN_GROUPS = {4: 2, 8: 4, 16: 8, 32: 8, 64: 8, 128: 8, 256: 8}
ROWS_INTERPRETED = False
# Rows of unit stride (torch's class dim 1 through a view at N = 1) load along the rows, a tile's column one run
# of its rows: tiles of their own by element size and width, of fewer rows where the grid would have under
# ROWS_UNIT_MIN_PROGRAMS_PER_SM programs an SM. A step under CUDA graphs, H200, ms, ROWS_TILE_ELEMENTS -> these
# (docs/notes/2026-11/probe_cross_entropy_class_dim_1-unit_tiles-h200.log): bf16 1x3x1024x1024 0.138 -> 0.027,
# 1x19x512x1024 0.144 -> 0.084, 1x150x128x128 0.034 -> 0.022; fp32 0.042 -> 0.029, 0.090 -> 0.075, 0.035 -> 0.023.
ROWS_UNIT_TILE_ELEMENTS = {2: {2: 2048, 4: 4096, 8: 8192, 16: 16384, 32: 16384, 64: 8192, 128: 8192, 256: 8192,
                               512: 8192},
                           4: {2: 1024, 4: 2048, 8: 4096, 16: 8192, 32: 8192, 64: 2048, 128: 2048, 256: 4096,
                               512: 4096}}
ROWS_UNIT_WARPS = 4
ROWS_UNIT_MIN_PROGRAMS_PER_SM = 2

# Tiles are at least this wide: a multiple of every ALIGN (16 bytes of any dtype).
MIN_BLOCK = 16


@dataclasses.dataclass(frozen=True)
class Plan(RegisterCap):
    """One launch decision. ``grid`` is the main kernel's."""

    op: str
    strategy: str
    rows: int
    cols: int
    dtype: torch.dtype
    block: int = 0  # columns a program holds (on_chip) or takes per step (streaming kernels)
    num_warps: int = 0
    num_chunks: int = 1  # programs a row is cut across
    tiles_per_chunk: int = 1  # stream: steps of ``block`` per chunk
    grid: tuple = ()
    align: int = 1  # the run (16 bytes, or wider for edges: STREAM_RUN_BYTES, PLAIN_EDGES) tiles align to
    edges: bool = False  # rows start or end inside a run: their partial first and last runs go element-wise
    contiguous: bool = True  # unit column stride
    hold_l2: bool = False  # two_pass: eviction hints keep the row in L2 between its two reads
    plain: bool = False  # two_pass by its kernel for plain rows (see choose's ``plain``)
    # stream, backward, two_pass for plain rows: columns a tile takes of a row's last part, which the
    # row's last program takes (STREAM_TAIL_MAX_SHARE, PLAIN_TAIL_MAX_SHARE); ``block``: no tail.
    tail: int = 0
    tail_order: str = ""  # stream: where the last chunk reduces the row's last part (STREAM_TAIL_ORDER)
    parts: tuple = ()  # separate: the plans of its two launches, the forward's stream and the backward
    max_registers: int = 0  # two_pass for plain rows: a cap on registers a thread (PLAIN_MAX_REGISTERS)
    rows_per_program: int = 1  # rows: whole rows a program holds
    column_groups: int = 1  # rows: the groups its tile's columns are in (ROWS_COLUMN_GROUPS)
    rows_unit: bool = False  # rows of unit stride, the classes strided (ROWS_UNIT_TILE_ELEMENTS)

    @property
    def reads(self) -> int:
        """Reads of the logits from device memory."""
        return 2 if self.strategy in ("two_pass", "separate") else 1

    def bytes_moved(self) -> int:
        """Fewest bytes any implementation moves: logits read once; the gradient, where made, written
        once; a few bytes per row."""
        elems, e = self.rows * self.cols, self.dtype.itemsize
        if self.op in ("forward", "stats"):
            return elems * e + self.rows * 8
        return 2 * elems * e + self.rows * 8

    def describe(self, bandwidth_gbs: float | None = None) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        lines = [
            f"op:          cross_entropy {self.op}  ({self.rows} rows x {self.cols} classes, {dtype})",
            f"strategy:    {self.strategy}, grid {self.grid}, {self.num_warps} warps a program"
            + (f", {self.rows_per_program} rows a program, its {self.block} columns in {self.column_groups} groups"
               + (", loads along the rows (rows of unit stride)" if self.rows_unit else "")
               if self.strategy == "rows" else "")
            + (f", at most {self.max_registers} registers a thread" if self.max_registers else ""),
            f"tiles:       {self.block} columns"
            + ((f" (a row's last part in a tile of {self.tail}, by its last program)" if self.strategy != "two_pass"
                else f" (a row's last part {self.tail} a tile)") if self.tail and self.tail != self.block else "")
            + (f"; {self.num_chunks} chunks a row" if self.num_chunks > 1 else "")
            + (f", {self.tiles_per_chunk} tiles a chunk" if self.strategy == "stream" else ""),
            ("alignment:   none: each row whole in its tile, masked" if self.strategy == "rows" else
             f"alignment:   tiles over runs of {self.align} elements from multiples of them"
             + ("; rows' partial first/last runs element-wise" if self.edges else "")),
            f"reads:       {self.reads} of the logits"
            + (", gradient written over them" if self.op == "forward_grad" else "")
            + ("; L2 asked to keep each row between its reads" if self.hold_l2 else "")
            + ("; the kernel for plain rows" if self.plain else ""),
        ]
        if self.strategy == "separate":
            lines.append(f"then:        the backward kernel, grid {self.parts[1].grid}")
        lines += [
            f"bytes moved: {self.bytes_moved() / 1e6:.2f} MB (floor)",
        ]
        if bandwidth_gbs:
            ms = self.bytes_moved() / bandwidth_gbs / 1e6
            lines.append(f"floor:       {ms:.3f} ms at {bandwidth_gbs:.0f} GB/s")
        return "\n".join(lines)


def layout(rows: int, cols: int, dtype: torch.dtype, row_stride: int, col_stride: int) -> tuple[int, bool, bool]:
    """(align, edges, contiguous) of (rows, cols) logits with these strides (in elements)."""
    contiguous = col_stride == 1 or cols <= 1
    align = 16 // dtype.itemsize if contiguous else 1
    misaligned_rows = rows > 1 and row_stride % align != 0
    return align, contiguous and (misaligned_rows or cols % align != 0), contiguous


def choose(op: str, rows: int, cols: int, dtype: torch.dtype, device: torch.device, strategy: str | None = None,
           row_stride: int | None = None, col_stride: int = 1, sms: int | None = None,
           interpreting: bool | None = None, plain: bool = False, smoothing: bool = False,
           softcap: bool = False, weighted: bool = False) -> Plan:
    """The plan for ``rows`` rows of ``cols`` classes (strides in elements; default contiguous).
    ``sms`` and ``interpreting`` plan for another machine (a GPU of that many SMs). ``plain``: the
    call has no class weights, label smoothing, softcap, z-loss or lse of ignored rows, so two_pass may
    take its kernel for plain rows (rows of partial vectors: see PLAIN_EDGES). ``smoothing``,
    ``softcap``, ``weighted``: the call has label smoothing, a softcap, class weights (two_pass's
    launches: TWO_PASS_OPTIONS_LAUNCH)."""
    device = torch.device(device)
    if interpreting is None:
        interpreting = _device.interpreter_active()
    row_stride = cols if row_stride is None else row_stride
    align, edges, contiguous = layout(rows, cols, dtype, row_stride, col_stride)
    # A row's start within 128 elements (every run a kernel aligns its tiles to divides 128).
    stride_mod = row_stride % 128 if contiguous and rows > 1 else 0
    rows_unit = not contiguous and rows > 1 and row_stride == 1
    return _choose(op, rows, cols, dtype, device.type, strategy, align, edges, contiguous, stride_mod,
                   sms or _device.sm_count(device), interpreting, plain, smoothing, softcap,
                   weighted, rows_unit)


@_device.plan_cache
def _clear():
    _choose.cache_clear()


def stream_chunks(rows: int, n_tiles: int, sms: int, elem: int, balance: bool = True) -> tuple:
    """(chunks a row, tiles a chunk) of the stream forward over ``rows`` rows of ``n_tiles`` tiles of
    ``elem``-byte elements on ``sms`` SMs (STREAM_MIN_PROGRAMS_PER_SM); ``balance``: its waves too
    (STREAM_PROGRAMS_PER_SM: not under the interpreter, which runs one program after another)."""
    def split(cap):
        per_chunk = _device.cdiv(n_tiles, max(1, min(n_tiles, STREAM_MAX_CHUNKS, cap)))
        return _device.cdiv(n_tiles, per_chunk), per_chunk

    chunks, per_chunk = split(_device.cdiv(STREAM_MIN_PROGRAMS_PER_SM * sms, max(rows, 1)))
    slots = STREAM_PROGRAMS_PER_SM[elem] * sms
    waves = rows * chunks / slots
    if balance and 1 < waves < STREAM_BALANCE_MAX_WAVES and waves % 1 < STREAM_BALANCE_MAX_FILL:
        def cost(c):
            n, per = split(c)
            return _device.cdiv(rows * n, slots) * (per + STREAM_PROGRAM_COST_TILES)
        best = min(range(chunks, max(chunks, STREAM_BALANCE_MAX_CHUNKS) + 1), key=lambda c: (cost(c), c))
        chunks, per_chunk = split(best)
    return chunks, per_chunk


@functools.lru_cache(maxsize=4096)  # on every call's path; a frozen result, so sharing it is safe
def _choose(op, rows, cols, dtype, device_type, strategy, align, edges, contiguous, stride_mod, sms, interpreting,
            plain=False, smoothing=False, softcap=False, weighted=False, rows_unit=False) -> Plan:
    if op not in OPS:
        raise ValueError(f"cross_entropy plan: op must be one of {OPS}, got {op!r}")
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"cross_entropy: strategy must be None or one of {STRATEGIES}, got {strategy!r}")
    triton_ok = device_type == "cuda" or interpreting
    if strategy is not None and strategy != "torch":
        if not triton_ok:
            raise ValueError(f"cross_entropy: strategy {strategy!r} runs Triton kernels, which need a CUDA tensor "
                             "(or TRITON_INTERPRET=1 for CPU tensors); use strategy=None or 'torch' on CPU")
        if strategy not in SERVES[op]:
            raise ValueError(f"cross_entropy: strategy {strategy!r} does not compute {op!r}; "
                             f"that takes one of {SERVES[op] + ('torch',)}")
    if dtype not in KERNEL_DTYPES:  # float64: torch's kernels, at torch's precision
        if strategy not in (None, "torch"):
            raise ValueError(f"cross_entropy: strategy {strategy!r} runs Triton kernels, which take "
                             f"{', '.join(str(d)[6:] for d in KERNEL_DTYPES)} logits, got {str(dtype)[6:]}; "
                             "use strategy=None or 'torch'")
        triton_ok = False
    elem = dtype.itemsize

    def cover(run):  # columns a row's tiles cover at most when aligned to absolute multiples of ``run``
        return max(cols, 1) + (run - 1 if stride_mod % run else 0)

    span = cover(align)
    shape = dict(rows=rows, cols=cols, dtype=dtype, align=align, edges=edges, contiguous=contiguous)
    if strategy == "torch" or not triton_ok:
        return Plan(op, "torch", **shape)

    def tile(limit, columns=None):  # a power of two, at least MIN_BLOCK, no wider than the row needs
        return max(MIN_BLOCK, min(limit, _device.next_power_of_2(span if columns is None else columns)))

    warps = _warps
    short_rows = cols <= ROWS_MAX_COLS and rows >= ROWS_MIN_ROWS_PER_SM * sms and (ROWS_INTERPRETED or not interpreting)
    if op != "stats" and (strategy == "rows" or (strategy is None and short_rows)):
        block = max(ROWS_MIN_BLOCK, _device.next_power_of_2(cols))
        if block > _device.next_power_of_2(ROWS_MAX_COLS):
            raise ValueError(f"cross_entropy: strategy 'rows' holds rows of at most {ROWS_MAX_COLS} columns, got "
                             f"{cols}; use strategy=None")
        per_program = max(1, (ROWS_UNIT_TILE_ELEMENTS[elem] if rows_unit else ROWS_TILE_ELEMENTS)[block] // block)
        while rows_unit and per_program > 1 and rows < per_program * ROWS_UNIT_MIN_PROGRAMS_PER_SM * sms:
            per_program //= 2
        warps = ROWS_UNIT_WARPS if rows_unit else ROWS_WARPS
        groups = min(block, ROWS_COLUMN_GROUPS.get(block, 1)) if contiguous else 1  # (strided classes: none)
        return Plan(op, "rows", block=block, num_warps=warps, grid=(_device.cdiv(rows, per_program),),
                    rows_per_program=per_program, column_groups=groups, rows_unit=rows_unit, **shape)

    run = STREAM_RUN_BYTES[elem] // elem
    if edges and op in ("forward", "backward") and run > align:
        # Tiles over runs of STREAM_RUN_BYTES (no wider than the tile: row_tile's masks hold one run a lane).
        limit = INTERPRETER_BLOCK if interpreting else (BACKWARD_BLOCK if op == "backward" else STREAM_BLOCK)[elem]
        if tile(limit, cover(run)) >= run:
            span, shape["align"] = cover(run), run

    def tail_width(block, left, num_warps, share):
        """The tile a row's last ``left`` columns take past its whole tiles: ``block`` (none) where they
        are none or over ``share`` of a tile. No narrower than a vector a thread (narrower, its lanes are
        replicated across threads: fp32 4096 x 65544 took 4.67 ms with a last part of 16384 columns
        in 16-column tiles) nor than a run of the layout's ``align``."""
        if not 0 < left <= share * block:
            return block
        narrowest = MIN_BLOCK if interpreting else 32 * num_warps * 16 // elem
        return min(block, max(tile(block, left), narrowest, shape["align"]))

    def streamed(block):  # (warps, tiles a row, the tail's width) of the stream and backward kernels
        num_warps = warps(block, STREAM_ELEMENTS_PER_THREAD[elem])
        whole, left = divmod(span, block)
        # The rows' heads (up to align - 1 columns before a row, with edges) must not move a tile
        # boundary: the kernels count each row's whole tiles as the grid does.
        tail = tail_width(block, left, num_warps, STREAM_TAIL_MAX_SHARE)
        if whole and tail < block and max(cols, 1) // block == whole and rows >= STREAM_TAIL_MIN_ROWS_PER_SM * sms:
            return num_warps, whole, tail
        return num_warps, _device.cdiv(span, block), block

    stream_block = tile(INTERPRETER_BLOCK if interpreting else STREAM_BLOCK[elem])
    if op == "backward":
        block = tile(INTERPRETER_BLOCK if interpreting else BACKWARD_BLOCK[elem])
        num_warps, n_tiles, tail = streamed(block)
        return Plan(op, "backward", block=block, num_warps=num_warps, grid=(rows, n_tiles), tail=tail, **shape)
    if op in ("forward", "stats"):
        num_warps, n_tiles, tail = streamed(stream_block)
        chunks, per_chunk = stream_chunks(rows, n_tiles, sms, elem, balance=not interpreting)
        return Plan(op, "stream", block=stream_block, num_warps=num_warps, num_chunks=chunks,
                    tiles_per_chunk=per_chunk, grid=(rows, chunks), tail=tail,
                    tail_order=STREAM_TAIL_ORDER[elem] if tail < stream_block else "", **shape)

    # forward_grad
    split_tile = max(SPLIT_TILE_BYTES // elem,
                     _device.next_power_of_2(_device.cdiv(span, max(1, int(sms * SPLIT_MAX_CHUNKS_PER_SM)))))
    chosen_here = strategy is None
    if strategy is None:
        if interpreting or span <= ON_CHIP_MAX_COLS[elem]:
            strategy = "on_chip"
        elif TWO_PASS_MIN_ROWS_PER_SM[elem] and rows >= TWO_PASS_MIN_ROWS_PER_SM[elem] * sms:
            strategy = "two_pass"
        elif rows * cols * elem >= SEPARATE_MIN_BYTES:
            strategy = "separate"
        elif split_tile <= SPLIT_MAX_TILE:
            strategy = "split_on_chip"
        else:
            strategy = "two_pass"
    if strategy == "separate":  # described by its first launch (the stream's plan); both in ``parts``
        layout_args = (dtype, device_type, None, align, edges, contiguous, stride_mod, sms, interpreting)
        parts = tuple(_choose(part, rows, cols, *layout_args) for part in ("forward", "backward"))
        return dataclasses.replace(parts[0], op=op, strategy=strategy, parts=parts)
    if strategy == "two_pass":
        row_bytes = cols * elem
        edges_from, run_bytes = PLAIN_EDGES[elem]
        run = max(run_bytes // elem, align)
        # Rows of whole vectors in the band keep those (fp32's need not be whole runs of 128 bytes there).
        edges_here = row_bytes >= edges_from or (edges and row_bytes <= PLAIN_EDGES_UP_TO[elem])
        plain = plain and contiguous and (not edges or edges_here)
        if plain and (stride_mod % run or cols % run) and edges_here:
            # Rows that are not whole runs: the kernel's edges path, tiles from each row's first whole run.
            shape.update(edges=True, align=run)
            span = cover(run)
        options = "softcap" if softcap else ("weighted smoothing" if weighted else "smoothing") if smoothing else ""
        table = (TWO_PASS_PLAIN_LAUNCH if plain else TWO_PASS_OPTIONS_LAUNCH.get(options, TWO_PASS_LAUNCH))[elem]
        _, num_warps, columns = next((r for r in table if row_bytes <= r[0]), table[-1])
        band_bytes, band_warps, band_columns = PLAIN_EDGES_BAND_LAUNCH[elem]
        if plain and shape["edges"] and row_bytes <= band_bytes:
            num_warps, columns = band_warps, band_columns
        block = stream_block if interpreting or not columns else tile(columns)
        num_warps = num_warps or warps(block)
        # The tail's width: the kernel's whole runs a row (with edges, from the row's first one) are
        # ``longest`` or fewer; rows whose whole tiles differ in number would loop over narrow tiles.
        run = shape["align"]
        longest = cols // run * run
        shortest = max(cols - run + 1, 0) // run * run if shape["edges"] else longest
        tail = block
        if plain and shortest // block == longest // block:
            tail = tail_width(block, longest % block, num_warps, PLAIN_TAIL_MAX_SHARE)
        cap, up_to = PLAIN_MAX_REGISTERS.get((elem, num_warps, shape["edges"]), (0, 0)) if plain else (0, 0)
        max_registers = cap if row_bytes <= up_to else 0
        if max_registers and max_registers < PLAIN_ONE_LOOP_MIN_REGISTERS and tail == block:
            tail = block // 2
        waves = rows / sms  # programs of TWO_PASS_ONE_AN_SM_WARPS, one an SM
        if (chosen_here and num_warps >= TWO_PASS_ONE_AN_SM_WARPS and 1 < waves < TWO_PASS_SEPARATE_MAX_WAVES
                and waves % 1 < TWO_PASS_SEPARATE_MAX_FILL and rows * cols * elem >= SEPARATE_MIN_BYTES):
            return _choose(op, rows, cols, dtype, device_type, "separate", align, edges, contiguous, stride_mod, sms,
                           interpreting, plain, smoothing, softcap, weighted)
        return Plan(op, strategy, block=block, num_warps=num_warps,
                    tiles_per_chunk=_device.cdiv(span, block), grid=(rows, 1), hold_l2=TWO_PASS_HOLD_L2,
                    plain=plain, tail=tail, max_registers=max_registers, **shape)
    if strategy == "on_chip" or interpreting:  # the interpreter holds a row in one program
        block = tile(_device.next_power_of_2(span))
        if not interpreting and block > ON_CHIP_MAX_COLS[elem]:
            raise ValueError(f"cross_entropy: strategy 'on_chip' holds rows of at most {ON_CHIP_MAX_COLS[elem]} "
                             f"columns of {dtype} in one program, got {cols}; use strategy=None")
        return Plan(op, strategy, block=block, num_warps=warps(block),
                    grid=(rows,), **shape)
    if split_tile > SPLIT_MAX_TILE:
        raise ValueError(f"cross_entropy: strategy 'split_on_chip' holds a row in at most "
                         f"{int(sms * SPLIT_MAX_CHUNKS_PER_SM)} programs of {SPLIT_MAX_TILE} columns on this GPU; "
                         f"a row of {cols} is longer. Use strategy=None (two_pass)")
    block = tile(split_tile)
    chunks = _device.cdiv(span, block)
    return Plan(op, strategy, block=block, num_warps=warps(block),
                num_chunks=chunks, grid=(rows * chunks,), **shape)


def _warps(block: int, elements_per_thread: int | None = None) -> int:
    return max(1, min(MAX_WARPS, block // (32 * (elements_per_thread or ELEMENTS_PER_THREAD))))


def scale_launch(rows: int, cols: int, dtype: torch.dtype, device: torch.device, interpreting: bool) -> tuple:
    """(block, num_warps, tiles a row, tiles, grid) of the persistent scale kernel."""
    span = max(cols, 1) + 16
    block = max(MIN_BLOCK, min(INTERPRETER_BLOCK if interpreting else SCALE_BLOCK[dtype.itemsize],
                               _device.next_power_of_2(span)))
    per_row = _device.cdiv(span, block)
    tiles = rows * per_row
    programs = max(1, min(tiles, SCALE_PROGRAMS_PER_SM * _device.sm_count(device)))
    return block, _warps(block), per_row, tiles, (programs,)


_recorded = _device.LastPlan()
# The plan of the most recent launch in this process (tests assert which path ran).
record = _recorded.record
last_plan = _recorded.last

