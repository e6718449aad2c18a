"""Launch heuristics: shape, dtype and device -> memory strategy and launch parameters.

Every decision the launchers make lives here, as small data tables, so that it can be printed
(``onlinesoftmax explain``), tested (each strategy forced and asserted) and tuned in one place.
Nothing here touches CUDA at import time: device properties are read lazily and cached.

Strategies
----------
``row_on_chip``
    The whole row is loaded into registers once: max, sum and the normalized write happen on
    chip, so memory sees one read and one write. Short rows are packed several to a program,
    and the grid is persistent (at most ``SMs * programs_per_sm`` programs loop over row blocks).
``looped``
    One program per row, looping over it in blocks: the online pass computes (m, d) per lane and
    merges the lanes at the end, the second pass writes. ``algorithm="safe"`` adds a third pass
    (max, then sum, then write) as in the seeds.
``split_row``
    Few long rows (decode-time logits) cannot fill the GPU with one program per row, so each row
    is cut into chunks: one launch writes a partial (m, d) per chunk, a second launch merges a
    row's partials with the (m, d) operator in every program and writes its chunk.
``torch``
    The same split-and-merge algorithm in vectorized PyTorch (:mod:`onlinesoftmax.cpu`): the path
    for CPU tensors when Triton's interpreter is not active.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import torch

STRATEGIES = ("row_on_chip", "looped", "split_row", "torch")
TRITON_STRATEGIES = ("row_on_chip", "looped", "split_row")
ALGORITHMS = ("auto", "online", "safe")
FORWARD_OPS = ("softmax", "log_softmax", "logsumexp")
BACKWARD_OPS = ("softmax_backward", "log_softmax_backward")

# Largest row (a power of two, in elements) that row_on_chip keeps in registers, by element size.
# Measured on the H100 (scripts/sweep_strategies.py): at 32768 columns fp32 one pass runs at
# 2236 GB/s against 1880 for the looped two-pass; bf16 rows of 32768 go the other way (1664 vs 2059).
ROW_ON_CHIP_MAX_COLS = {4: 32768, 2: 16384}
# Backward holds two tiles (y and dy) on chip, so it stops a factor of two earlier.
BACKWARD_ROW_ON_CHIP_MAX_COLS = {4: 32768, 2: 32768}
# row_on_chip packs short rows until a program's tile has about this many elements.
ROW_TILE_ELEMENTS = 4096
# (tile elements up to, num_warps): about 16 elements per thread, 4 16-byte loads of fp32.
WARPS_BY_TILE_ELEMENTS = ((512, 1), (1024, 2), (2048, 4), (4096, 8), (8192, 16), (65536, 32))
# Resident programs per SM aimed at by the persistent grid (bounded by 64 warps per SM).
MAX_PROGRAMS_PER_SM = 8

# looped and split_row stream blocks of this many elements per iteration (16 KB in flight).
STREAM_BLOCK = {4: 4096, 2: 8192}
STREAM_WARPS = 8
# split_row: programs aimed at per SM, the most chunks a row is cut into (the merge loads all of
# a row's partials in one tile), and the row count under which rows alone cannot fill the GPU.
SPLIT_PROGRAMS_PER_SM = 4
SPLIT_MAX_CHUNKS = 1024
SPLIT_BELOW_ROWS_PER_SM = 2

# The interpreter runs on a CPU with no SMs; a small count keeps persistent loops and split rows
# exercised at test sizes.
INTERPRETER_SM_COUNT = 4


def interpreter_active() -> bool:
    """True when Triton kernels run through ``TRITON_INTERPRET=1`` (read at call time)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


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


def _warps_for_tile(elements: int) -> int:
    for limit, warps in WARPS_BY_TILE_ELEMENTS:
        if elements <= limit:
            return warps
    return WARPS_BY_TILE_ELEMENTS[-1][1]


@dataclasses.dataclass(frozen=True)
class Plan:
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

    @property
    def passes(self) -> int:
        """Passes over the input in device memory (reads of x, or of y and dy for backward)."""
        if self.strategy == "row_on_chip" or self.op == "logsumexp" and self.algorithm == "online":
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
            f"launches:    {self.launches}, first grid {self.grid}, {self.num_warps} warps/program",
            f"blocks:      {self.block_cols} cols x {self.rows_per_program} rows per tile"
            + (f"; {self.num_chunks} chunks of {self.chunk_size} per row" if self.strategy == "split_row" else ""),
            f"passes:      {self.passes} read(s) of the input from device memory",
            f"bytes moved: {self.bytes_moved() / 1e6:.2f} MB (each input read once, each output written once)",
        ]
        if bandwidth_gbs:
            lines.append(f"floor:       {self.bytes_moved() / bandwidth_gbs / 1e6 * 1e3:.2f} us at {bandwidth_gbs:.0f} GB/s")
        return "\n".join(lines)


def choose(op: str, rows: int, cols: int, dtype: torch.dtype, device: torch.device,
           algorithm: str = "auto", strategy: str | None = None, sms: int | None = None) -> Plan:
    """Pick the strategy and launch parameters for ``rows`` independent rows of ``cols`` elements.

    ``sms`` overrides the device's multiprocessor count (to plan for a GPU this machine lacks).
    Decisions are cached: planning is on every call's path, ahead of a kernel of a few microseconds.
    """
    device = torch.device(device)
    return _choose(op, rows, cols, dtype, device, algorithm, strategy, sms or sm_count(device), interpreter_active())


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
        elif rows < SPLIT_BELOW_ROWS_PER_SM * sms and cols > STREAM_BLOCK[elem]:
            strategy = "split_row"
        else:
            strategy = "looped"
    elif strategy != "torch" and not triton_ok:
        raise ValueError(
            f"strategy {strategy!r} runs Triton kernels, which need a CUDA tensor "
            "(or TRITON_INTERPRET=1 for CPU tensors); use strategy=None or 'torch' on CPU")

    if strategy == "row_on_chip":
        if algorithm not in ("auto",) and not backward:
            raise ValueError(
                f"algorithm={algorithm!r} asks for {algorithm} passes over memory, but strategy "
                "'row_on_chip' reads the row once; use algorithm='auto'")
        block = next_power_of_2(cols)
        rows_per_program = min(max(1, ROW_TILE_ELEMENTS // block), next_power_of_2(rows))
        warps = _warps_for_tile(block * rows_per_program)
        row_blocks = _cdiv(rows, rows_per_program)
        programs = row_blocks
        if rows_per_program > 1:
            # Persistent only for packed short rows: on the H100 a persistent grid over whole
            # 32768-column rows ran at 2237 GB/s against 2722 for one program per row.
            programs = min(row_blocks, sms * max(1, min(MAX_PROGRAMS_PER_SM, 64 // warps)))
        return Plan(op, strategy, "one_pass", rows, cols, dtype, block, rows_per_program, warps,
                    (max(programs, 1),))

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
    return Plan(op, strategy, resolved, rows, cols, dtype, block, 1, STREAM_WARPS, (rows, num_chunks),
                chunk_size=chunk, num_chunks=num_chunks, launches=launches)


_last_plan: Plan | None = None


def record(plan: Plan) -> None:
    global _last_plan
    _last_plan = plan


def last_plan() -> Plan | None:
    """The plan of the most recent launch in this process (tests assert which path ran)."""
    return _last_plan
