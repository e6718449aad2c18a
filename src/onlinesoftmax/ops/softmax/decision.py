"""A softmax-family launch decision (``Plan``): what ``plan.choose`` returns, what the launchers
launch, what ``explain`` prints. The rules that make one are ``plan.py``'s."""

from __future__ import annotations

import dataclasses

import torch

from ..._launch import RegisterCap

FORWARD_OPS = ("softmax", "log_softmax", "logsumexp")
BACKWARD_OPS = ("softmax_backward", "log_softmax_backward")


@dataclasses.dataclass(frozen=True)
class Plan(RegisterCap):
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
    hold_input: bool = False  # row_on_chip forward: the tile waits in the input dtype
    tail_cols: int = 0  # a second tile after the block_cols head (row_on_chip, split_row_on_chip's one chunk)
    unit_rows: bool = False  # row_on_chip: a program's rows are consecutive elements, read along the rows
    max_registers: int = 0  # a cap on registers a thread (Triton's maxnreg); 0: the compiler's choice
    reason: str = ""  # why a non-kernel strategy was taken

    @property
    def passes(self) -> int:
        """Passes over the input in device memory (reads of x, or of y and dy for backward)."""
        if self.strategy in ("row_on_chip", "split_row_on_chip", "torch") or (
                self.op == "logsumexp" and self.algorithm == "online"):
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
        head = f"op:          {self.op}  ({self.rows} rows x {self.cols} cols, {str(self.dtype).replace('torch.', '')})"
        if self.strategy in ("torch", "vectorized"):
            lines = [head, f"strategy:    {self.strategy}  ({self.reason})"]
        else:
            lines = [
                head,
                f"strategy:    {self.strategy}  (algorithm {self.algorithm})",
                f"launches:    {self.launches}, first grid {self.grid}, {self.num_warps} warps/program"
                + (f", at most {self.max_registers} registers a thread" if self.max_registers else ""),
                f"blocks:      {self.block_cols} cols x {self.rows_per_program} rows per tile"
                + (f", then a tail tile of {self.tail_cols} cols" if self.tail_cols else "")
                + (", read along the rows (rows of unit stride)" if self.unit_rows else "")
                + (f"; {self.num_chunks} chunks of {self.chunk_size} per row"
                   if self.strategy.startswith("split_row") else ""),
                f"passes:      {self.passes} read(s) of the input from device memory",
            ]
            narrow_backward = self.op in BACKWARD_OPS and self.strategy == "row_on_chip"
            if self.hold_input or (self.dtype.itemsize == 2 and (self.strategy == "split_row_on_chip" or narrow_backward)):
                lines.append(f"registers:   the tile waits in {str(self.dtype).replace('torch.', '')} (half the "
                             "registers of float32), widened again for each use")
        lines.append(f"bytes moved: {self.bytes_moved() / 1e6:.2f} MB (each input read once, each output written once)")
        if bandwidth_gbs:
            lines.append(f"floor:       {self.bytes_moved() / bandwidth_gbs / 1e6 * 1e3:.2f} us at {bandwidth_gbs:.0f} GB/s")
        return "\n".join(lines)
