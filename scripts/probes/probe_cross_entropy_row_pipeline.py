"""Does the in-place cross-entropy's second read pay if it overlaps the next row's first? (GPU)

The in-place kernel (`two_pass`) reads each row twice: once for its lse, once to write the gradient.
Persistent grids that keep a program's rows apart got the second read from L2 and still ran no
faster, with device memory at 57-65% of its peak: while a program re-reads its row from L2, it
has no read of device memory in flight (docs/perf-cross_entropy.md, "L2 does serve ...").

Here each program of a persistent grid runs its rows as a pipeline: one loop over a row's tiles
reads tile k of its next row (first read: the running (m, d), from device memory) and tile k of
the row before (second read, L2's if it kept the row) and writes that row's gradient. Device
memory then always has a program's reads and writes in flight together, and a row's two reads are
one row's time apart (programs x row bytes, 34 MB for 132 programs over 256 KB rows).

A stripped-down loss (mean over all rows, no options), checked against float32 torch on a small case
before timing; the plan's in-place forward and a device copy of the same bytes (read + write) in
the same process (probe_cross_entropy_split_reread's baseline).

    python scripts/probes/probe_cross_entropy_row_pipeline.py
"""

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from probe_cross_entropy_split_reread import baseline, check_case


@triton.jit
def row_pipeline_kernel(x_ptr, target_ptr, loss_ptr, n_rows, n_cols, x_stride, inv_rows,
                        BLOCK: tl.constexpr, LANES: tl.constexpr, FIRST_EVICTION: tl.constexpr,
                        SECOND_EVICTION: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    n_tiles = tl.cdiv(n_cols, BLOCK)
    offs = tl.arange(0, BLOCK)
    lse_prev = tl.zeros((), tl.float32)
    target_prev = tl.zeros((), tl.int32)
    # Iteration j: the first read of row pid + j * programs and the second of the row before it.
    for row in range(pid, n_rows + programs, programs):
        has_row = row < n_rows
        has_prev = row >= pid + programs
        prev = row - programs
        wide = tl.zeros((), tl.int64)  # 64-bit offsets (and tensors, where the interpreter's range gives ints)
        base = x_ptr + (wide + row) * x_stride
        prev_base = x_ptr + (wide + prev) * x_stride
        if LANES:
            m_lane = tl.full((BLOCK,), float("-inf"), tl.float32)
            d_lane = tl.zeros((BLOCK,), tl.float32)
        else:
            m = tl.full((), float("-inf"), tl.float32)
            d = tl.zeros((), tl.float32)
        for k in tl.range(0, n_tiles, num_stages=STAGES):
            cols = k * BLOCK + offs
            live = cols < n_cols
            y = tl.load(base + cols, mask=live & has_row, other=float("-inf"),
                        eviction_policy=FIRST_EVICTION).to(tl.float32)
            yp = tl.load(prev_base + cols, mask=live & has_prev, other=0.0,
                         eviction_policy=SECOND_EVICTION).to(tl.float32)
            g = tl.exp(yp - lse_prev) * inv_rows
            g = tl.where(cols == target_prev, g - inv_rows, g)
            tl.store(prev_base + cols, g.to(x_ptr.dtype.element_ty), mask=live & has_prev,
                     eviction_policy=SECOND_EVICTION)
            if LANES:
                t = tl.where(y == float("-inf"), 0.0, tl.exp(-tl.abs(y - m_lane)))
                d_lane = tl.where(y > m_lane, d_lane * t + 1.0, d_lane + t)
                m_lane = tl.maximum(m_lane, y)
            else:
                m_new = tl.maximum(m, tl.max(y, 0))
                d = d * tl.exp(m - m_new) + tl.sum(tl.exp(y - m_new), 0)
                m = m_new
        if LANES:
            m = tl.max(m_lane, 0)
            d = tl.sum(tl.where(m_lane == float("-inf"), 0.0, d_lane * tl.exp(m_lane - m)), 0)
        target = tl.load(target_ptr + row, mask=has_row, other=0).to(tl.int32)
        # The target's logit before this row's gradient overwrites it (next iteration).
        y_t = tl.load(base + target, mask=has_row, other=0.0).to(tl.float32)
        lse_prev = m + tl.log(d)
        tl.store(loss_ptr + row, lse_prev - y_t, mask=has_row)
        target_prev = target


class RowPipeline:
    def __init__(self, n_rows, per_sm, block, warps, lanes, stages=1, first="evict_last", second="evict_first"):
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.grid = (min(sms * per_sm, n_rows),)
        self.meta = dict(BLOCK=block, LANES=lanes, FIRST_EVICTION=first, SECOND_EVICTION=second, STAGES=stages,
                         num_warps=warps)
        self.loss = torch.empty(n_rows, device="cuda")

    def __call__(self, x, target):
        row_pipeline_kernel[self.grid](x, target, self.loss, x.shape[0], x.shape[1], x.stride(0), 1.0 / x.shape[0],
                                       **self.meta)
        return self.loss


VARIANTS = {  # name: (programs an SM, block, warps, per-lane accumulators, stages[, first, second eviction])
    "1 an SM, 32 warps, 16K": (1, 16384, 32, False, 1),
    "1 an SM, 32 warps, 8K": (1, 8192, 32, False, 1),
    "lanes, 1 an SM, 32 warps, 8K": (1, 8192, 32, True, 1),
    "lanes, 1 an SM, 32 warps, 16K": (1, 16384, 32, True, 1),
    "2 an SM, 16 warps, 8K": (2, 8192, 16, False, 1),
    "lanes, 2 an SM, 16 warps, 4K": (2, 4096, 16, True, 1),
    "2 an SM, 16 warps, 4K": (2, 4096, 16, False, 1),
    "4 an SM, 8 warps, 4K": (4, 4096, 8, False, 1),
    "1 an SM, 32 warps, 8K, 2 stages": (1, 8192, 32, False, 2),
    "1 an SM, 32 warps, 16K, no eviction hints": (1, 16384, 32, False, 1, "", ""),
}


def check():
    x, target, loss_ref, grad_ref = check_case()
    for name, (per_sm, block, warps, lanes, stages, *evictions) in VARIANTS.items():
        for n_rows in (300, 7):  # more rows than programs, and fewer
            y = x[:n_rows].clone()
            loss = RowPipeline(n_rows, per_sm, block, warps, lanes, stages, *evictions)(y, target[:n_rows])
            loss_err = ((loss - loss_ref[:n_rows]).abs().max() / loss_ref.abs().max()).item()
            grad_err = ((y.float() * n_rows / 300 - grad_ref[:n_rows]).abs().max() / grad_ref.abs().max()).item()
            print(f"check {name}, {n_rows} rows: loss rel err {loss_err:.2e}, gradient rel err {grad_err:.2e}",
                  flush=True)
            assert loss_err < 1e-5 and grad_err < 1e-2, name


def main():
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; "
          "do_bench medians, ms (one input: each is larger than L2)")
    check()
    for n_rows, n_cols in ((8192, 128256), (4096, 256000), (8192, 151936), (8192, 50257), (16384, 128256)):
        x, target, floor = baseline(n_rows, n_cols, torch.bfloat16)
        for name, (per_sm, block, warps, lanes, stages, *evictions) in VARIANTS.items():
            run = RowPipeline(n_rows, per_sm, block, warps, lanes, stages, *evictions)
            ms = do_bench(lambda: run(x, target))
            print(f"  {name}: {ms:.3f} ({floor / ms / 1e6:.0f} GB/s of read + write once)", flush=True)


if __name__ == "__main__":
    main()
