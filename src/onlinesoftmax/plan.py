"""Launch heuristics: shape, dtype and device -> memory strategy and launch parameters.

Every decision the launchers make lives here, as small data tables, so that it can be printed
(``onlinesoftmax explain``), tested (each strategy forced and asserted) and tuned in one place.
Nothing here touches CUDA at import time: device properties are read lazily and cached.

Strategies
----------
``row_on_chip``
    The whole row is loaded into registers once: max, sum and the normalized write happen on
    chip, so memory sees one read and one write. Short rows are packed several to a program.
``looped``
    One program per row, looping over it in blocks: the online pass computes (m, d) per lane and
    merges the lanes at the end, the second pass writes. ``algorithm="safe"`` adds a third pass
    (max, then sum, then write) as in the seeds.
``split_row``
    Few long rows (decode-time logits) cannot fill the GPU with one program per row, so each row
    is cut into chunks: one launch writes a partial (m, d) per chunk, a second launch merges a
    row's partials with the (m, d) operator in every program and writes its chunk.
``split_row_on_chip``
    A row longer than ``row_on_chip`` holds is held by several programs at once, each keeping a
    chunk in registers: a program publishes its chunk's (m, d), waits at a counter in device memory
    until the rest of its row has, merges the row's partials and writes from registers. One read
    and one write per element, where ``split_row`` reads twice. The wait needs a row's programs
    resident together: programs take work by arrival order (a ticket counter), and a row has at
    most a fraction of the SMs' worth of chunks (``SPLIT_ON_CHIP_MAX_CHUNKS_PER_SM``), which leaves
    room for kernels of other streams (a NCCL kernel holds SMs while it waits for its peers).
    The SM count is the device's: a process confined to fewer than half of them (an MPS active
    thread percentage below 50, a green context) should pass ``strategy="split_row"`` for rows
    over 32768, as a row of up to 64 chunks of 16384 may then not fit side by side.
    Triton's interpreter runs programs one after another, so there every row is one chunk.
``torch``
    The same split-and-merge algorithm in vectorized PyTorch (:mod:`onlinesoftmax.cpu`): the path
    for CPU tensors when Triton's interpreter is not active.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import torch

STRATEGIES = ("row_on_chip", "looped", "split_row", "split_row_on_chip", "torch")
TRITON_STRATEGIES = ("row_on_chip", "looped", "split_row", "split_row_on_chip")
ALGORITHMS = ("auto", "online", "safe")
FORWARD_OPS = ("softmax", "log_softmax", "logsumexp")
BACKWARD_OPS = ("softmax_backward", "log_softmax_backward")

# Largest row (a power of two, in elements) that row_on_chip keeps in registers, by element size.
# Measured on the H100 (scripts/tune_softmax.py, CUDA-graph replays over rotated inputs): bf16
# 1024x32768 runs at 2415 GB/s in one pass against 2177 for the looped two-pass.
ROW_ON_CHIP_MAX_COLS = {4: 32768, 2: 32768}
# Backward holds two tiles (y and dy) on chip, so it stops a factor of two earlier.
BACKWARD_ROW_ON_CHIP_MAX_COLS = {4: 32768, 2: 32768}
# row_on_chip keeps rows of at least this many columns in their own dtype between the maximum, the
# sum and the write, widening the tile for each use (the exponentials are computed twice): where
# that halves the registers, more programs fit on an SM and one's loads overlap another's writes.
# ptxas for sm_90 (scripts/kernel_resources.py), bf16 forward, 32 warps: 1024x32768 63 -> 32
# registers (1 -> 2 programs an SM), and on the H100 58.3 -> 51.3 us under CUDA graphs (2302 ->
# 2619 GB/s; 16 warps: 64.4, scripts/sweep_held_tiles.py); 4096x16384 32 registers either way.
# float16 gains nothing (54 registers: ptxas merges its two conversions), float32 has nothing to
# narrow.
ROW_ON_CHIP_HOLD_INPUT_MIN_COLS = {torch.bfloat16: 32768}
# A held row takes at most this many warps: at 16 warps bf16 1024x32768 needs 64 registers a thread
# (63 for log_softmax), still 2 programs an SM, with half the warps in each cross-warp reduction,
# where at 32 warps the log_softmax's 36 registers left 1 program an SM. H100, CUDA graphs, us, 32
# -> 16 warps (scripts/sweep_held_tiles.py --cols 32768, 2026-11-25 ~11:44 UTC, run 4 of
# sweep_held_tiles-h100.log): softmax 52.5 -> 51.9 (runs 2 and 3: 52.8 -> 51.3, 53.0 -> 51.2),
# log_softmax 55.4 -> 50.8. fp32 and fp16 rows (not held) stay at 32 warps: 97.4 / 55.4 there
# against 99.2 / 55.6 at 16.
ROW_ON_CHIP_HOLD_INPUT_MAX_WARPS = 16
# row_on_chip packs short rows until a program's tile has about this many elements.
ROW_TILE_ELEMENTS = 4096
# (tile elements up to, num_warps): about 16 elements per thread, 4 16-byte loads of fp32.
WARPS_BY_TILE_ELEMENTS = ((512, 1), (1024, 2), (2048, 4), (4096, 8), (8192, 16), (65536, 32))
# One program per block of rows: a persistent grid (at most 8 programs an SM looping over the row
# blocks, as this planner had until 2026-11-25) measured slower on the H100 in both directions.
# CUDA graphs, GB/s, persistent / one program per row block at the same tile and warps
# (scripts/tune_softmax.py --strategy row_on_chip [--backward], 2026-11-25 ~09:40-09:50 UTC,
# benchmarks/results/tune_row_on_chip-h100.json and tune_row_on_chip_backward-h100.json): forward
# fp32 32768x1024 2654 / 2846, 65536x256 2651 / 2755, bf16 32768x1024 2560 / 2747, 65536x256 2512 /
# 2550; backward fp32 32768x1024 2856 / 2952, 65536x256 2789 / 2864, bf16 32768x1024 2729 / 2682
# (2869 at 2048-element tiles), 65536x256 2674 / 2732.

# looped and split_row stream blocks of this many elements per iteration (16 KB in flight).
STREAM_BLOCK = {4: 4096, 2: 8192}
STREAM_WARPS = 8
# split_row: programs aimed at per SM and their warps, the most chunks a row is cut into (the
# merge loads all of a row's partials in one tile), and the row count under which rows alone
# cannot fill the GPU. Fewer, wider programs won on the H100 (scripts/tune_softmax.py): 2 per SM
# with 16 warps against 4 with 8 took bf16 64x128256 from 1515 to 1771 GB/s, bf16 16x262144 from
# 1211 to 1279 and fp32 256x151936 from 1696 to 1767.
SPLIT_PROGRAMS_PER_SM = 2
SPLIT_WARPS = 16
SPLIT_MAX_CHUNKS = 1024
SPLIT_BELOW_ROWS_PER_SM = 2

# split_row_on_chip: a row is cut into chunks of at most SPLIT_ON_CHIP_TILE_BYTES of input each
# (forward / backward, which holds y and dy: per tensor) while that gives at most
# SPLIT_ON_CHIP_MAX_CHUNKS_PER_SM chunks per SM; longer rows take larger tiles, up to
# SPLIT_ON_CHIP_MAX_TILE elements, beyond which split_row takes over. A program has one warp per
# SPLIT_ON_CHIP_WARP_BYTES of its tile. H100, CUDA-graph replays (scripts/tune_softmax.py,
# benchmarks/results/tune_split_on_chip-h100.json): many small programs beat few large ones.
# Forward fp32 256x151936: 4096 elements with 4 warps 2165 GB/s, 16384 with 16 1908; bf16: 8192
# with 8 warps 1632, 4096 with 4 1368, 16384 with 16 1204. Backward, 8192 fp32 / 16384 bf16 with
# 4 warps: fp32 256x151936 2770 GB/s (8192 with 16: 2710), bf16 64x128256 1826 (16384 with 16:
# 1665). (Before the counters were padded apart, which added 5-20%: see _triton.take_ticket.)
# 2-byte backward, after y and dy waited at 16 bits (widen_opaque; 168 registers instead of 255 and
# a stack): tune (scripts/tune_softmax.py --strategy split_row_on_chip --backward, 2026-11-25 01:45
# UTC, benchmarks/results/tune_split_on_chip_backward-h100.json), CUDA graphs, us, tile bytes / warp
# bytes: bf16 256x151936 32768/8192 (16384 elements, 4 warps) 101.9, 16384/1024 (8192, 16 warps)
# 91.6; 64x128256 26.2, 24.7; 16x262144 13.4, 13.7. The bench with 8192 x 16 (02:17 UTC,
# trial_bf16_backward_8192x16-h100.md) confirmed the graph time of 256x151936 (0.0973 ms against
# 0.1076) but took 0.1765 ms eager against 0.1039. Timed again both ways in one process
# (scripts/probe_backward_eager.py, 2026-11-25 ~10:13 UTC, probe_backward_eager-h100.log), us,
# 16384 x 4 / 8192 x 16: graph 101.9 / 92.6, eager with L2 flushes 103.5 / 96.4, eager over rotated
# inputs 100.1 / 92.0: the slow eager time did not come back, so 2-byte backward takes 8192 x 16.
# A value is bytes, or {element size: bytes} where the dtypes differ.
SPLIT_ON_CHIP_TILE_BYTES = {"forward": 16384, "backward": {4: 32768, 2: 16384}}
SPLIT_ON_CHIP_WARP_BYTES = {"forward": 2048, "backward": {4: 8192, 2: 1024}}
SPLIT_ON_CHIP_MAX_TILE = 16384
SPLIT_ON_CHIP_MAX_CHUNKS_PER_SM = 0.5
# A cap on registers a thread for split_row_on_chip (Triton's maxnreg option), by op (and element
# size), 0 for ptxas's own choice. More programs an SM hold more of a row's chunks at once. ptxas
# for sm_90 (scripts/kernel_resources.py machinery on the CPU machine): the forward at the plan's
# tiles (fp32 4096 x 8 warps, 2-byte 8192 x 8) goes from 40 registers to 32 under a cap of 32 with
# no spill, 6 -> 8 programs an SM (bf16 64x128256's 1024 programs then fit in one wave of 1056);
# the 2-byte log_softmax (48 uncapped) spills 136 bytes under 32 and 56 under 40, so it has no cap,
# and the fp32 backward (168 at 8192 x 4) spills under 128. H100, softmax, us, CUDA graphs / eager
# with L2 flushes, uncapped -> 32 (scripts/sweep_held_tiles.py, 2026-11-25 ~10:56 and ~11:00 UTC,
# benchmarks/results/sweep_held_tiles-h100.log runs 2 and 3; run 3's figures): bf16 256x151936
# 71.3 -> 68.6 / 73.3 -> 68.7, 64x128256 18.7 -> 17.8 / 23.5 -> 20.6, 16x262144 11.8 -> 12.2 /
# 15.0 -> 14.7 (graph 11.8 -> 12.2 in run 2 too: the one shape the cap does not help); fp32
# 256x151936 129.3 -> 125.3 / 131.4 -> 125.4, 64x128256 33.1 -> 31.5 / 36.5 -> 33.1, 16x262144
# 19.5 -> 17.7 / 24.1 -> 20.3; fp32 log_softmax 256x151936 129.1 -> 124.8 / 129.2 -> 124.1.
# The cap buys programs an SM, which only counts where a launch has more programs than the GPU
# holds uncapped (6 an SM at the plan's forward tiles); below that it cost bf16 16x262144 (512
# programs) 11.8 -> 12.2 us in both sweep runs and 11.9 -> 12.3 (graph) in the bench of 11:12 UTC,
# so launches of at most SPLIT_ON_CHIP_UNCAPPED_PROGRAMS_PER_SM x SMs programs run uncapped.
# The cap assumes SPLIT_ON_CHIP_WARP_BYTES' 64 bytes of chunk a thread: tiles that give a thread
# more spill under it (benchmarks/results/probe_split_rows_of_32768-h100.log, forced tiles of 128
# bytes a thread: 2-3x slower).
SPLIT_ON_CHIP_MAX_REGISTERS = {"softmax": 32, "log_softmax": {4: 32, 2: 0}, "logsumexp": 0,
                               "softmax_backward": 0, "log_softmax_backward": 0}
SPLIT_ON_CHIP_UNCAPPED_PROGRAMS_PER_SM = 6
# 2-byte forward inputs stayed on split_row while split_row_on_chip's kernel kept each chunk twice
# in registers (scaled and unscaled: 80 registers a thread, 3 programs an SM, bf16 8192 x 8 warps).
# With the maximum taken before scaling (60 registers, 4 programs), H100 CUDA-graph replays
# (scripts/tune_softmax.py --strategy split_row_on_chip, 19:24 UTC, split_row in the same call:
# benchmarks/results/tune_split_on_chip_max_before_scale-h100.json), us, on chip / split_row:
# bf16 256x151936 82.2 / 94.7, 64x128256 21.6 / 19.7, 16x262144 12.2 / 12.5; fp32 256x151936 went
# from 149.7 to 129.2 (40 registers instead of 57). Every forward now takes it where it applies.
# The 2-byte chunk now also waits for its row at 16 bits (widen_opaque: 40 registers instead of 60
# at 8192 x 8 warps, 6 programs an SM instead of 4). H100, CUDA-graph replays, us, 16-bit / fp32
# wait (scripts/sweep_held_tiles.py, benchmarks/results/sweep_held_tiles-h100.log): bf16 256x151936
# 70.6 / 82.8, 64x128256 18.0 / 20.4, 16x262144 11.9 / 12.0; the tile stays at 8192 x 8 warps
# (16384 x 16: 74.7, 20.1, 12.1; 4096 x 8: 81.8, 19.6, 12.1).

# The interpreter runs on a CPU with no SMs; a small count keeps split rows
# exercised at test sizes.
INTERPRETER_SM_COUNT = 4


def interpreter_active() -> bool:
    """True when Triton kernels run through ``TRITON_INTERPRET=1`` (read at call time)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def inline_ptx_allowed() -> bool:
    """False under the interpreter, which runs no inline PTX (kernels take plain Triton there)."""
    return not interpreter_active()


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return INTERPRETER_SM_COUNT


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
    return max(smallest, next_power_of_2(_cdiv(cols, _split_on_chip_max_chunks(sms))))


def _warps_for_tile(elements: int) -> int:
    for limit, warps in WARPS_BY_TILE_ELEMENTS:
        if elements <= limit:
            return warps
    return WARPS_BY_TILE_ELEMENTS[-1][1]


class _RegisterCap:
    """``compile_options`` from a plan's ``max_registers`` (a cap on registers a thread, Triton's
    maxnreg; 0: the compiler's choice), built once per plan since every launch reads it."""

    @functools.cached_property
    def compile_options(self) -> dict:
        """Options for Triton's compiler beyond num_warps and num_stages (the interpreter ignores them)."""
        return {"maxnreg": self.max_registers} if self.max_registers else {}


@dataclasses.dataclass(frozen=True)
class Plan(_RegisterCap):
    """One launch decision. ``grid`` is what the first (or only) kernel is launched with."""

    op: str
    strategy: str
    algorithm: str
    rows: int
    cols: int
    dtype: torch.dtype
    block_cols: int = 0
    rows_per_program: int = 1
    num_warps: int = 0
    grid: tuple = ()
    chunk_size: int = 0
    num_chunks: int = 1
    launches: int = 1
    hold_input: bool = False  # row_on_chip forward: the tile waits in the input dtype (ROW_ON_CHIP_HOLD_INPUT_MIN_COLS)
    max_registers: int = 0  # a cap on registers a thread (Triton's maxnreg); 0: the compiler's choice

    @property
    def passes(self) -> int:
        """Passes over the input in device memory (reads of x, or of y and dy for backward)."""
        if self.strategy in ("row_on_chip", "split_row_on_chip") or self.op == "logsumexp" and self.algorithm == "online":
            return 1
        if self.op in BACKWARD_OPS:
            return 2
        reads = {"online": 2, "safe": 3, "one_pass": 1}[self.algorithm]
        return reads - 1 if self.op == "logsumexp" else reads

    def bytes_moved(self, out_dtype: torch.dtype | None = None) -> int:
        """Fewest bytes any implementation must move: each input read once, each output written once."""
        elems = self.rows * self.cols
        in_size = self.dtype.itemsize
        out_size = (out_dtype or self.dtype).itemsize
        if self.op in BACKWARD_OPS:
            return elems * (2 * in_size + out_size)
        if self.op == "logsumexp":
            return elems * in_size + self.rows * out_size
        return elems * (in_size + out_size)

    def describe(self, bandwidth_gbs: float | None = None) -> str:
        lines = [
            f"op:          {self.op}  ({self.rows} rows x {self.cols} cols, {str(self.dtype).replace('torch.', '')})",
            f"strategy:    {self.strategy}  (algorithm {self.algorithm})",
            f"launches:    {self.launches}, first grid {self.grid}, {self.num_warps} warps/program"
            + (f", at most {self.max_registers} registers a thread" if self.max_registers else ""),
            f"blocks:      {self.block_cols} cols x {self.rows_per_program} rows per tile"
            + (f"; {self.num_chunks} chunks of {self.chunk_size} per row" if self.strategy.startswith("split_row") else ""),
            f"passes:      {self.passes} read(s) of the input from device memory",
        ]
        # Which kernels keep a 2-byte tile at 16 bits while it waits (see _triton.widen_opaque).
        narrow_backward = self.op in BACKWARD_OPS and self.strategy == "row_on_chip"
        if self.hold_input or (self.dtype.itemsize == 2 and (self.strategy == "split_row_on_chip" or narrow_backward)):
            lines.append(f"registers:   the tile waits in {str(self.dtype).replace('torch.', '')} (half the registers "
                         "of float32), widened again for each use")
        lines += [
            f"bytes moved: {self.bytes_moved() / 1e6:.2f} MB (each input read once, each output written once)",
        ]
        if bandwidth_gbs:
            lines.append(f"floor:       {self.bytes_moved() / bandwidth_gbs / 1e6 * 1e3:.2f} us at {bandwidth_gbs:.0f} GB/s")
        return "\n".join(lines)


def choose(op: str, rows: int, cols: int, dtype: torch.dtype, device: torch.device,
           algorithm: str = "auto", strategy: str | None = None, sms: int | None = None,
           interpreting: bool | None = None) -> Plan:
    """Pick the strategy and launch parameters for ``rows`` independent rows of ``cols`` elements.

    ``sms`` overrides the device's multiprocessor count (to plan for a GPU this machine lacks);
    ``interpreting`` whether the kernels run in Triton's interpreter (default: TRITON_INTERPRET).
    Decisions are cached: planning is on every call's path, ahead of a kernel of a few microseconds.
    """
    device = torch.device(device)
    if interpreting is None:
        interpreting = interpreter_active()
    return _choose(op, rows, cols, dtype, device, algorithm, strategy, sms or sm_count(device), interpreting)


@functools.lru_cache(maxsize=4096)
def _choose(op, rows, cols, dtype, device, algorithm, strategy, sms, interpreting) -> Plan:
    if op not in FORWARD_OPS + BACKWARD_OPS:
        raise ValueError(f"unknown op {op!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"strategy must be None or one of {STRATEGIES}, got {strategy!r}")
    rows, cols = max(rows, 1), max(cols, 1)  # empty tensors launch nothing; plan as for one element
    triton_ok = device.type == "cuda" or interpreting
    backward = op in BACKWARD_OPS
    elem = dtype.itemsize
    on_chip_max = (BACKWARD_ROW_ON_CHIP_MAX_COLS if backward else ROW_ON_CHIP_MAX_COLS)[elem]

    if strategy is None:
        if not triton_ok:
            strategy = "torch"
        elif algorithm == "auto" and next_power_of_2(cols) <= on_chip_max:
            strategy = "row_on_chip"
        elif (algorithm == "auto" and op != "logsumexp" and not interpreting
              and _split_on_chip_tile(backward, cols, elem, sms) <= SPLIT_ON_CHIP_MAX_TILE):
            strategy = "split_row_on_chip"
        elif rows < SPLIT_BELOW_ROWS_PER_SM * sms and cols > STREAM_BLOCK[elem]:
            strategy = "split_row"
        else:
            strategy = "looped"
    elif strategy != "torch" and not triton_ok:
        raise ValueError(
            f"strategy {strategy!r} runs Triton kernels, which need a CUDA tensor "
            "(or TRITON_INTERPRET=1 for CPU tensors); use strategy=None or 'torch' on CPU")

    if strategy == "row_on_chip":
        if algorithm != "auto" and not backward:
            raise ValueError(
                f"algorithm={algorithm!r} asks for {algorithm} passes over memory, but strategy "
                "'row_on_chip' reads the row once; use algorithm='auto'")
        block = next_power_of_2(cols)
        rows_per_program = min(max(1, ROW_TILE_ELEMENTS // block), next_power_of_2(rows))
        warps = _warps_for_tile(block * rows_per_program)
        hold_input = not backward and block >= ROW_ON_CHIP_HOLD_INPUT_MIN_COLS.get(dtype, block + 1)
        if hold_input:
            warps = min(warps, ROW_ON_CHIP_HOLD_INPUT_MAX_WARPS)
        return Plan(op, strategy, "one_pass", rows, cols, dtype, block, rows_per_program, warps,
                    (_cdiv(rows, rows_per_program),), hold_input=hold_input)

    if strategy == "split_row_on_chip":
        if algorithm != "auto" and not backward:
            raise ValueError(
                f"algorithm={algorithm!r} asks for {algorithm} passes over memory, but strategy "
                "'split_row_on_chip' reads the row once; use algorithm='auto'")
        tile = _split_on_chip_tile(backward, cols, elem, sms)
        if tile > SPLIT_ON_CHIP_MAX_TILE:
            raise ValueError(
                f"strategy 'split_row_on_chip' holds a row in at most {_split_on_chip_max_chunks(sms)} programs "
                f"side by side on this GPU, {SPLIT_ON_CHIP_MAX_TILE} elements each; a row of {cols} is longer. "
                "Use strategy=None (split_row reads such rows twice)")
        warps = min(32, max(1, tile * elem // _split_on_chip_bytes(SPLIT_ON_CHIP_WARP_BYTES, backward, elem)))
        # The interpreter cannot run a row's programs side by side: one chunk per row there.
        num_chunks = 1 if interpreting else _cdiv(cols, tile)
        # Equal chunks, each a multiple of 16 elements (aligned vector loads).
        chunk = _cdiv(_cdiv(cols, num_chunks), 16) * 16
        num_chunks = _cdiv(cols, chunk)
        programs = rows * num_chunks
        cap = _for_element_size(SPLIT_ON_CHIP_MAX_REGISTERS[op], elem)
        if programs <= SPLIT_ON_CHIP_UNCAPPED_PROGRAMS_PER_SM * sms:
            cap = 0  # one wave without the cap: it would buy nothing
        return Plan(op, strategy, "one_pass", rows, cols, dtype, next_power_of_2(chunk), 1, warps,
                    (programs,), chunk_size=chunk, num_chunks=num_chunks, max_registers=cap)

    resolved = "online" if algorithm == "auto" else algorithm
    if strategy == "torch":
        return Plan(op, strategy, resolved, rows, cols, dtype)

    block = min(STREAM_BLOCK[elem], next_power_of_2(cols))
    if strategy == "looped":
        return Plan(op, strategy, resolved, rows, cols, dtype, block, 1, STREAM_WARPS, (rows,))

    # split_row: enough chunks per row to give every SM a few programs, never fewer than one block
    # of work per chunk, never more chunks than one merge tile holds.
    wanted_chunks = max(1, _cdiv(SPLIT_PROGRAMS_PER_SM * sms, rows))
    chunk = max(block, _cdiv(_cdiv(cols, wanted_chunks), block) * block)
    chunk = max(chunk, _cdiv(_cdiv(cols, SPLIT_MAX_CHUNKS), block) * block)
    num_chunks = _cdiv(cols, chunk)
    launches = 3 if (resolved == "safe" and not backward) else 2
    return Plan(op, strategy, resolved, rows, cols, dtype, block, 1, SPLIT_WARPS, (rows, num_chunks),
                chunk_size=chunk, num_chunks=num_chunks, launches=launches)


_last_plan: Plan | None = None


def record(plan: Plan) -> None:
    global _last_plan
    _last_plan = plan


def last_plan() -> Plan | None:
    """The plan of the most recent launch in this process (tests assert which path ran)."""
    return _last_plan


# ============================================================================================
# Attention (attention.py): launch configurations by kernel, head dim and causality
# ============================================================================================
#
# A config is (BLOCK_M queries, BLOCK_N keys, num_warps, num_stages). Rows are (largest head dim,
# non-causal config, causal config); the first row whose head dim is >= D applies, D being padded
# to a power of two inside the kernels (80 -> 128, 96 -> 128, 192 -> 256).
#
# Forward: BLOCK_M = 128 with 8 warps gives each warpgroup 64 query rows for Hopper's wgmma;
# num_stages = 3 keeps two K/V tiles in flight behind the one being multiplied (TMA loads). Causal
# programs cross the diagonal (a BLOCK_N of 64 would halve the masked work, but 128 measured
# faster: 395 TFLOP/s causal at D = 128). Head dim 256 halves
# BLOCK_M: a 128 x 256 fp32 accumulator alone would take 128 registers per thread at 8 warps.
# Backward dK/dV: one program holds a key block's K, V, dK and dV ([BLOCK_N, D] each, two in fp32)
# and streams query blocks, so BLOCK_N is the large side. Backward dQ: the mirror image.
# Every row compiles for sm_90 (Triton 3.6, checked ahead of time with ptxas -v) to wgmma and TMA
# loads without register spills, except the causal dK/dV at head dims 128 (112 bytes) and 256 (96
# bytes) and the launches capped in ATTENTION_MAX_REGISTERS below; BLOCK_M = 64 in dK/dV spilled
# 140-870 bytes at D = 128 (8 warps). The backward rows at head dims 64 and 128 are session 10's
# (ATTENTION_MAX_REGISTERS says why).
# Head dims 64 and 128 are the best of scripts/sweep_attention.py on the H100 (2026-11-23; D = 64
# from one shape, D = 128 the geometric mean of four); head dim 256 was not swept and keeps the
# starting point above. The forward at head dim 64, non-causal, with row descriptors: (64, 128, 4, 3)
# 433 TFLOP/s against 410 for (64, 64, 4, 4) (2026-11-25, attention-sweep-forward-h100.log run 3;
# causal 359 against 371, so it keeps its row); head dim 128 forwards are warp-specialized below.
ATTENTION_CONFIGS = {
    "forward": ((64, (64, 128, 4, 3), (64, 64, 4, 4)),
                (128, (128, 128, 8, 3), (128, 128, 8, 3)),
                (256, (64, 64, 4, 2), (64, 64, 4, 2))),
    "backward_dkdv": ((64, (32, 64, 4, 2), (32, 64, 4, 2)),
                      (128, (32, 64, 4, 3), (32, 64, 4, 3)),
                      (256, (32, 64, 8, 2), (32, 64, 8, 1))),
    "backward_dq": ((64, (64, 64, 4, 3), (64, 64, 4, 3)),
                    (128, (128, 32, 8, 2), (128, 32, 8, 2)),
                    (256, (64, 32, 4, 2), (64, 32, 4, 2))),
}
# Whether a kernel loads through TMA descriptors when the layout allows it. The same sweep: the
# forward at head dim 128 ran at 460 TFLOP/s (geometric mean of 4 shapes) with pointer loads
# against 446 at best with descriptors; both backward kernels were fastest with descriptors.
ATTENTION_USE_DESCRIPTOR = {"forward": False, "backward_dkdv": True, "backward_dq": True}
# Padded head dims whose forward reads K and V in its unmasked key loop through 2-D descriptors
# over the rows of every head (batch * heads * keys, head_dim), where the layout allows it (heads
# one after another, as in a contiguous (B, H, S, D) tensor): TMA with no 3-D tile reshaped into
# 2-D. H100, scripts/sweep_attention.py (2026-11-25, attention-sweep-forward-h100.log): head dim 64
# 380 -> 418 TFLOP/s non-causal, 345 -> 367 causal (4x32x4096); head dim 128 level (479 / 481).
ATTENTION_FORWARD_ROW_DESCRIPTORS = (64, 128)
# Forward launches that Triton warp-specializes (one producer warpgroup loading, the query block
# split over two consumer warpgroups; num_warps is per consumer group, 12 warps run), by padded
# head dim: (non-causal config, causal config). Taken only where the layout allows row
# descriptors, the head dim needs no padding and the keys fill whole blocks. The same sweep, head
# dim 128, TFLOP/s against the pointer loads: 424 / 368 (8x16x1024), 572 / 479 (4x16x4096), 583 /
# 513 (1x16x16384), 606 / 502 (GQA 2x32/8x8192); causal 272 / 251, 458 / 396, 563 / 504, 482 /
# 477. Head dim 64 ran slower so (401 against 418 with row descriptors; 294 against 367 causal).
# Triton 3.6 computes NaN with BLOCK_N = 64 at either head dim and with 3 stages at head dim 64
# (same sweep): those configs are not to be used.
ATTENTION_FORWARD_WARP_SPECIALIZED = {128: ((128, 128, 4, 2), (128, 128, 4, 2))}
# Backward launches that hold one more program an SM with fewer registers a thread, by (kernel,
# padded head dim, causal): a register cap (Triton's maxnreg) where ptxas would otherwise take more.
# Each kernel runs one CTA after another with no overlap inside it, so a second program an SM is
# what overlaps one's exp2 and elementwise work with the other's matrix products (Nsight Compute,
# benchmarks/results/ncu_attention_peers-h100.txt: the old dK/dV kernel kept the tensor pipe
# active 40% of its time, one program of 8 warps an SM). H100, bf16, backward TFLOP/s, old plan ->
# new, same process (scripts/probe_occupancy.py, 2026-11-25, session 10:
# probe_backward_occupancy-h100.log and probe_backward_occupancy_dkdv128-h100.log; the plan timed
# first and last moves by up to 3%):
# * head dim 64, dK/dV: 2 stages instead of 3 take 153 registers instead of 197 non-causal, 3
#   programs an SM instead of 2: 4x32x4096 254 -> 300; causal 232 -> 204 registers still holds 2,
#   capped at 168 (56 bytes of stack) 3: 221 -> 248-252 (uncapped 2 stages: 216).
# * head dim 128, dK/dV: 64-key blocks on one warpgroup (243 registers, 112 bytes of stack causal)
#   run 2 programs of 4 warps an SM where 128-key blocks on 8 warps ran 1: 4x16x4096 306-313 ->
#   334, causal 246-250 -> 277; 8x16x1024 240 -> 256, causal 141 -> 163; 1x16x16384 331-335 ->
#   354, causal 295-306 -> 330; GQA 2x32/8x8192 327-334 -> 343, causal 285-287 -> 308.
# * head dim 128, dQ: 32-key blocks capped at 128 registers (no spill non-causal, 32 bytes of
#   stack causal; 136-141 uncapped) hold 2 programs of 8 warps an SM where 64-key blocks at 174
#   held 1: 8x16x1024 221 -> 243, causal 133 -> 140; 4x16x4096 304 -> 313, causal 234 -> 248;
#   level at 1x16x16384 (327 -> 333, causal 300 -> 299) and GQA (335 -> 331, causal 279 -> 282).
#   Uncapped, the 32-key blocks ran slower (260 at S4096); 64-key blocks capped at 128 spill 248
#   bytes (273).
ATTENTION_MAX_REGISTERS = {("backward_dkdv", 64, True): 168, ("backward_dq", 128, False): 128,
                           ("backward_dq", 128, True): 128}
# The interpreter runs at test sizes: small, unequal blocks so that every loop runs several
# iterations and the causal diagonal falls inside and across blocks.
ATTENTION_INTERPRETER_CONFIGS = {
    "forward": (16, 32, 4, 1),
    "backward_dkdv": (16, 32, 4, 1),
    "backward_dq": (32, 16, 4, 1),
}
ATTENTION_KERNELS = tuple(ATTENTION_CONFIGS)


@dataclasses.dataclass(frozen=True)
class AttentionPlan(_RegisterCap):
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
    block_d: int = 0
    num_warps: int = 0
    num_stages: int = 0
    max_registers: int = 0  # a cap on registers a thread (Triton's maxnreg); 0: the compiler's choice

    def describe(self) -> str:
        if self.path == "torch":
            return f"attention {self.kernel}: torch (blockwise online, CPU), head dim {self.head_dim}"
        loads = "TMA tensor descriptors" if self.use_descriptor else "masked pointer loads"
        if self.warp_specialize:
            loads = "warp-specialized, TMA row descriptors (12 warps: a producer and two consumer warpgroups)"
        elif self.row_descriptors:
            loads = f"TMA row descriptors for whole key blocks, {loads} on the diagonal and past the last key"
        cap = f", at most {self.max_registers} registers a thread" if self.max_registers else ""
        return (f"attention {self.kernel}: BLOCK_M {self.block_m}, BLOCK_N {self.block_n}, head dim "
                f"{self.head_dim} padded to {self.block_d}, {self.num_warps} warps, {self.num_stages} stages{cap}, "
                f"{'causal' if self.causal else 'non-causal'}, {loads}")


def attention_plan(kernel: str, head_dim: int, dtype: torch.dtype, causal: bool, device: torch.device,
                   n_queries: int = 0, n_keys: int = 0, descriptor_ok: bool = True,
                   rows_ok: bool = False) -> AttentionPlan:
    """Block sizes, warps and stages for one attention kernel; ``descriptor_ok`` says whether the
    tensors' layout allows TMA, ``rows_ok`` whether it allows the forward's row descriptors (the
    launcher checks strides and alignment)."""
    if kernel not in ATTENTION_CONFIGS:
        raise ValueError(f"unknown attention kernel {kernel!r}; expected one of {ATTENTION_KERNELS}")
    device = torch.device(device)
    interpreting = interpreter_active()
    if device.type != "cuda" and not interpreting:
        return AttentionPlan(kernel, "torch", head_dim, dtype, causal)
    block_d = next_power_of_2(head_dim)
    if interpreting:
        config = ATTENTION_INTERPRETER_CONFIGS[kernel]
    else:
        row = next((r for r in ATTENTION_CONFIGS[kernel] if block_d <= r[0]), ATTENTION_CONFIGS[kernel][-1])
        config = row[2] if causal else row[1]
    use_descriptor = bool(descriptor_ok) and (interpreting or ATTENTION_USE_DESCRIPTOR[kernel])
    rows = kernel == "forward" and bool(rows_ok) and (interpreting or block_d in ATTENTION_FORWARD_ROW_DESCRIPTORS)
    specialized = (ATTENTION_FORWARD_WARP_SPECIALIZED.get(block_d, (None, None))[causal]
                   if rows and head_dim == block_d else None)
    # The interpreter keeps its small blocks (and ignores the specialization, running the same code).
    if specialized is not None and n_keys % (config if interpreting else specialized)[1] == 0:
        return AttentionPlan(kernel, "triton", head_dim, dtype, causal, False, True, True, block_d=block_d,
                             **dict(zip(_CONFIG_FIELDS, config if interpreting else specialized)))
    cap = 0 if interpreting else ATTENTION_MAX_REGISTERS.get((kernel, block_d, causal), 0)
    return AttentionPlan(kernel, "triton", head_dim, dtype, causal, use_descriptor, rows, False, block_d=block_d,
                         max_registers=cap, **dict(zip(_CONFIG_FIELDS, config)))


_CONFIG_FIELDS = ("block_m", "block_n", "num_warps", "num_stages")


_last_attention_plan: AttentionPlan | None = None


def record_attention(chosen: AttentionPlan) -> None:
    global _last_attention_plan
    _last_attention_plan = chosen


def last_attention_plan() -> AttentionPlan | None:
    """The plan of the most recent attention launch (forward, or backward's dK/dV kernel)."""
    return _last_attention_plan


# ============================================================================================
# Fused softmax + top-k (onlinesoftmax.topk)
# ============================================================================================

TOPK_STRATEGIES = ("single", "split")
# Largest K the Triton kernels keep on chip (a power-of-two candidate list in registers);
# larger K goes through the vectorized torch path.
TOPK_MAX_K = 256
# Elements per streamed block by element size. Smaller than the softmax stream on purpose: a
# block pays for a merge only when it holds an element above the K-th best so far, and with more,
# smaller blocks a larger share of them is filtered out (about K ln(blocks / K) blocks merge).
# A block is never smaller than the candidate list: the block's own top-K is taken with tl.topk.
TOPK_BLOCK = {4: 1024, 2: 1024, 1: 1024}
TOPK_WARPS = 4
# How a block's survivors (its elements above the list's k-th best) reach the list. Plans with
# k <= TOPK_COMPACT_ABOVE_K insert the best min(survivors, k) one by one (a max reduction and a
# log2(K_POW2) merge each); TOPK_FEW_SURVIVORS caps that count, above it the block goes through
# tl.topk (a sorting network over the whole block of 64-bit keys: the costly step). With both at
# 16 the cap only binds when a sweep forces one-by-one for larger k. Plans with larger k
# "compact": a block with at most K_POW2 survivors packs them by a prefix sum into K_POW2 slots of
# scratch, sorts those and merges once; more survivors take the block's tl.topk.
# H100, fp32, kernel time (scripts/sweep_topk.py, block 1024, 4 warps), one-by-one vs compact:
# 1024x25000 k5 101 vs 116 us; 4096x4096 k8 168 vs 175; 64x128256 k50 230 vs 136;
# 256x151936 k64 505 vs 450; 128x262144 k256 1604 vs 711. The sweep also put block 1024 with
# 4 warps ahead of 2048 with 8 at every k: 1024x25000 k5 135 -> 101 us, 4096x4096 k8 234 -> 168.
TOPK_FEW_SURVIVORS = 16
TOPK_COMPACT_ABOVE_K = 16
# Lane selections (the default at every k): the stream does elementwise work only (per lane,
# column mod block, the online (m, d), the lane's best one or two elements and the best of the
# rest; no block-wide reduction or branch per block), then takes the top k of what the lanes kept.
# That is exact unless one lane holds more of the top k than it kept, which the runner-ups reveal;
# such a chunk is streamed again (a second read) with the running list above. For random rows
# that happens to about k^2 / (2 lanes) of chunks keeping one (NumPy, 400 rows: 3.3% at 25000
# columns, k = 5, 512 lanes; 5.8% at 4096 columns, k = 8) and about k^3 / (6 lanes^2) keeping two
# (none of the same rows). The second read is rare but slow (a block-wide reduction per block)
# and lands in the launch's tail: keeping two pays off on long chunks, keeping one on short ones,
# where the final selection (k block-wide reductions against two sorting networks) dominates.
# H100, kernel time from CUDA graphs over rotated inputs (scripts/sweep_topk.py, 17:32 UTC run,
# benchmarks/results/sweep_topk_lanes-h100.log), one kept / two kept, us:
#   block 512, 4 warps: fp32 1024x25000 k5 78.7 / 58.4, 256x151936 k5 133.9 / 76.4, 4096x4096 k8
#   57.5 / 74.9, 64x128256 k50 - / 80.8, 256x151936 k64 - / 206.6; bf16 65.4 / 61.5,
#   108.4 / 73.4, 56.2 / 74.8, - / 76.0, - / 185.6.
#   block 1024, 4 warps: fp32 70.5 / 77.2, 100.5 / 103.2, 67.1 / 125.9, - / 89.9, - / 195.1;
#   bf16 58.8 / 68.0, 80.3 / 75.9, 63.8 / 124.9, - / 84.0, - / 167.9.
#   block 2048, 8 warps: fp32 63.4 / 117.3, 89.6 / 108.8, 108.8 / 246.1, - / 119.8, - / 223.0;
#   bf16 58.1 / 107.7, 69.5 / 99.3, 107.7 / 237.5, - / 98.2, - / 196.4.
# (The running list, kernel time in a CUDA graph in the 13:47 bench: 64x128256 k50 137 us,
# 256x151936 k64 447.)
# So: lanes of TOPK_LANE_BLOCK with TOPK_WARPS warps keep one when k <= TOPK_LANE_BEST_MAX_K and a
# chunk spans at most TOPK_LANE_KEEP1_MAX_BLOCKS blocks, else two; k above TOPK_LANE_WIDE_ABOVE_K
# takes TOPK_LANE_WIDE_BLOCK lanes (three of the top k in one lane: 15% of chunks at k = 64 with
# 512 lanes, 4% with 1024). Where the rule is not the fastest measured: bf16 1024x25000 k5 61.5 us
# against 58.1 (one kept, 2048 lanes, 8 warps), bf16 256x151936 k5 73.4 against 69.5 (same).
TOPK_LANE_BEST_MAX_K = 16
TOPK_LANE_KEEP2_MAX_K = 64
# What a lane selection reads again when some lane held more of the top k than it kept: "chunk",
# the whole chunk into the running list (every element at or above the kept k-th value, about k
# of them, inserted one by one), or "lanes", only the suspect lanes' other elements (the rest of
# every other lane is below the kept k-th value), inserted into the kept list: a few masked loads
# and one reduction per block, and a handful of insertions. "lanes" costs registers (the kept
# columns stay live through the selection; ptxas for sm_90, fp32: 64 -> 80 per thread keeping two
# at 1024x25000 k5, 64 -> 72 at k = 50, 96 -> 122 at k = 64; keeping one at 4096x4096 k8 stays at
# 48), which only pays where second reads are common. H100, scripts/sweep_topk.py (19:15 UTC run,
# benchmarks/results/sweep_topk_second_read-h100.log), kernel time in CUDA graphs, chunk / lanes,
# us, the plan's lanes: keeping one, 4096x4096 k8 fp32 57.8 / 53.6, bf16 56.2 / 52.1; keeping two,
# k = 5: 1024x25000 fp32 54.8 / 68.8, bf16 55.4 / 58.0, 256x151936 fp32 75.9 / 84.7, bf16 73.6 /
# 69.1; k = 50 (512 lanes): 64x128256 fp32 80.1 / 43.9, bf16 77.1 / 40.9; k = 64 (1024 lanes):
# 256x151936 fp32 196.8 / 131.1, bf16 168.8 / 108.0. So: "lanes" keeping one, and keeping two
# with k > TOPK_CHUNK_READ_MAX_K; "chunk" keeping two up to it.
TOPK_SECOND_READS = ("chunk", "lanes")
TOPK_CHUNK_READ_MAX_K = 16
TOPK_LANE_BLOCK = 512
TOPK_LANE_KEEP1_MAX_BLOCKS = 8
TOPK_LANE_WIDE_ABOVE_K = 50
TOPK_LANE_WIDE_BLOCK = 1024
# Above TOPK_LANE_KEEP2_MAX_K the lanes keep one: their list is one sorting network (tl.topk) over
# the lanes' best, and the suspect lanes (about k^2 / (2 lanes) a chunk) are read again. H100,
# 128x262144 k256, kernel time in CUDA graphs (benchmarks/results/sweep_topk_k256_lanes-h100.log),
# lanes x warps: fp32 1024x4 244 us, 2048x4 253, 2048x8 282, 4096x8 362; bf16 244, 223, 273, 258;
# the running list 710 fp32 / 694 bf16 (and torch's softmax then topk 721 / 456).
TOPK_LANE_LONG_BLOCK = {4: 1024, 2: 2048, 1: 2048}
# Split a row across programs when the rows alone give fewer than this many programs per SM.
TOPK_SPLIT_BELOW_ROWS_PER_SM = 2
# Programs aimed at per SM when splitting, the fewest blocks a chunk streams (below that the
# per-chunk fixed cost, one merge and the partial's store, dominates), and a cap on chunks per
# row (the merge launch folds a row's chunks one sorted list at a time).
TOPK_SPLIT_PROGRAMS_PER_SM = 4
TOPK_MIN_BLOCKS_PER_CHUNK = 2
TOPK_MAX_CHUNKS = 128
# The merge launch takes one tl.topk over all of a row's chunk lists at once: at most this many
# 64-bit keys (64 KB) per program, which caps the chunks at TOPK_MERGE_MAX_KEYS / K_POW2.
TOPK_MERGE_MAX_KEYS = 8192
TOPK_MERGE_WARPS = 8
# Interpreter runs: blocks small enough that test rows span several blocks and chunks.
TOPK_INTERPRETER_BLOCK = 64


@dataclasses.dataclass(frozen=True)
class TopkPlan:
    """One softmax_topk launch decision."""

    strategy: str  # "single": one program per row, one launch; "split": chunks + a merge launch
    rows: int
    cols: int
    k: int
    k_pow2: int
    dtype: torch.dtype
    block: int
    num_warps: int
    chunk_size: int
    num_chunks: int
    compact: bool  # survivors packed by a prefix sum (long lists), else inserted one by one
    lane_keep: int  # 0: a running list; 1 or 2: elements each lane keeps in one elementwise pass
    second_read: str  # lane selections: "chunk" or "lanes" (see TOPK_SECOND_READS)

    @property
    def launches(self) -> int:
        return 1 if self.strategy == "single" else 2

    def bytes_moved(self) -> int:
        """x read once; values, int64 indices and the fp32 lse written once."""
        return self.rows * (self.cols * self.dtype.itemsize + self.k * (self.dtype.itemsize + 8) + 4)

    def describe(self, bandwidth_gbs: float | None = None) -> str:
        lines = [
            f"op:          softmax_topk  ({self.rows} rows x {self.cols} cols, k={self.k} "
            f"(list of {self.k_pow2}), {str(self.dtype).replace('torch.', '')})",
            f"strategy:    {self.strategy}  ({self.launches} launch(es), {self.num_warps} warps/program)",
            f"blocks:      {self.block} cols per block; {self.num_chunks} chunk(s) of {self.chunk_size} per row",
            "selection:   " + (f"the top k of the {self.lane_keep} best element(s) of each lane (exactness checked; "
                               f"when not, a second read of the {self.second_read})" if self.lane_keep else
                               f"a running list; survivors {'compacted' if self.compact else 'inserted one by one'}"),
            f"bytes moved: {self.bytes_moved() / 1e6:.2f} MB (x read once, outputs written once)",
        ]
        if bandwidth_gbs:
            lines.append(f"floor:       {self.bytes_moved() / bandwidth_gbs / 1e6 * 1e3:.2f} us at {bandwidth_gbs:.0f} GB/s")
        return "\n".join(lines)


@functools.lru_cache(maxsize=4096)  # on every call's path; a frozen result, so sharing it is safe
def topk_plan(rows: int, cols: int, k: int, dtype: torch.dtype, device: torch.device,
              strategy: str | None = None, block: int | None = None, num_chunks: int | None = None,
              sms: int | None = None, lane_keep: int | None = None, second_read: str | None = None) -> TopkPlan:
    """Choose single (one program per row) or split (chunks of each row, then a merge) for softmax_topk.

    ``strategy``, ``block``, ``num_chunks``, ``lane_keep`` and ``second_read`` force a choice (tests
    and sweeps)."""
    if strategy is not None and strategy not in TOPK_STRATEGIES:
        raise ValueError(f"softmax_topk: strategy must be None or one of {TOPK_STRATEGIES}, got {strategy!r}")
    k_pow2 = max(2, next_power_of_2(k))
    if lane_keep is not None and (lane_keep not in (0, 1, 2) or (lane_keep == 2 and k > TOPK_LANE_KEEP2_MAX_K)):
        raise ValueError(f"softmax_topk: lane_keep must be 0, 1 or 2 (2 for k <= {TOPK_LANE_KEEP2_MAX_K}), "
                         f"got {lane_keep} for k={k}")
    if second_read is not None and second_read not in TOPK_SECOND_READS:
        raise ValueError(f"softmax_topk: second_read must be None or one of {TOPK_SECOND_READS}, got {second_read!r}")
    # A lane selection (which one: below) unless the running list is forced.
    lanes = lane_keep != 0
    sms = sms or sm_count(device)
    one_chunk = num_chunks == 1 or (num_chunks is None and (
        strategy == "single" or (strategy is None and rows >= TOPK_SPLIT_BELOW_ROWS_PER_SM * sms)))
    if block is None:
        if device.type != "cuda":
            block = TOPK_INTERPRETER_BLOCK
        elif lanes and k > TOPK_LANE_KEEP2_MAX_K:
            block = TOPK_LANE_LONG_BLOCK[dtype.itemsize]
        elif lanes:
            block = TOPK_LANE_WIDE_BLOCK if k > TOPK_LANE_WIDE_ABOVE_K else TOPK_LANE_BLOCK
        else:
            block = TOPK_BLOCK[dtype.itemsize]
    block = max(next_power_of_2(block), k_pow2)
    if num_chunks is None:
        if one_chunk:
            num_chunks = 1
        else:
            wanted = _cdiv(TOPK_SPLIT_PROGRAMS_PER_SM * sms, max(rows, 1))
            fit = _cdiv(cols, block * TOPK_MIN_BLOCKS_PER_CHUNK)
            num_chunks = max(1, min(wanted, fit, TOPK_MAX_CHUNKS, TOPK_MERGE_MAX_KEYS // k_pow2))
    if num_chunks * k_pow2 > TOPK_MERGE_MAX_KEYS:
        raise ValueError(f"softmax_topk: {num_chunks} chunks of a {k_pow2}-entry list exceed the merge's "
                         f"{TOPK_MERGE_MAX_KEYS} keys")
    chunk_blocks = _cdiv(_cdiv(max(cols, 1), num_chunks), block)
    chunk_size = chunk_blocks * block
    num_chunks = _cdiv(max(cols, 1), chunk_size)  # every chunk holds at least one column
    if strategy is None:
        strategy = "single" if num_chunks == 1 else "split"
    if lane_keep is None:
        lane_keep = 0 if not lanes else 1 if k > TOPK_LANE_KEEP2_MAX_K or (
            k <= TOPK_LANE_BEST_MAX_K and chunk_blocks <= TOPK_LANE_KEEP1_MAX_BLOCKS) else 2
    if second_read is None:
        # (No second read without lanes: "chunk", which leaves the running list's code as it was.)
        second_read = "lanes" if lane_keep == 1 or lane_keep == 2 and k > TOPK_CHUNK_READ_MAX_K else "chunk"
    return TopkPlan(strategy, rows, cols, k, k_pow2, dtype, block, TOPK_WARPS, chunk_size, num_chunks,
                    k > TOPK_COMPACT_ABOVE_K, lane_keep, second_read)


_last_topk_plan: TopkPlan | None = None


def record_topk(chosen: TopkPlan) -> None:
    global _last_topk_plan
    _last_topk_plan = chosen


def last_topk_plan() -> TopkPlan | None:
    """The plan of the most recent softmax_topk launch in this process (tests assert which path ran)."""
    return _last_topk_plan
