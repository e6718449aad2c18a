"""Can the in-place cross-entropy's second read come from L2 if fewer bytes are in flight? (GPU)

The in-place kernel (`two_pass`) reads each row twice: once for its lse, once to write the gradient.
With one program a row, the rows in flight between a row's two reads (hundreds of 256 KB rows)
overflow the H100's 50 MB L2, so the second read goes to device memory (docs/perf-cross_entropy.md).
Here a persistent grid (PER_SM programs an SM) splits every row between SPLIT programs that run
side by side: each reads its part of the row, publishes its (m, d), waits for its partners, and
re-reads its part to write the gradient. The bytes between a part's two reads are then about
(programs x row / SPLIT): 17 MB for 132 programs over halves of 256 KB rows, against 34 MB for a
persistent grid over whole rows (measured before: no faster than the plan).

A stripped-down loss (mean over all rows, no options); checked against torch on a small case
before timing. The plan's in-place forward and a device copy of the same bytes (read + write) run
in the same process.

    python scripts/probes/probe_cross_entropy_split_reread.py [--lanes | --deeper]

``--lanes``: the variants with per-lane accumulators alone (no cross-warp reduction a tile in the
first pass); ``--deeper``: more bytes in flight a program (64 KB tiles, or the loop software-
pipelined over 3 stages); each on the first three shapes.
"""

import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from onlinesoftmax.ops.cross_entropy import launch


@triton.jit
def split_reread_kernel(x_ptr, target_ptr, loss_ptr, parts_ptr, flags_ptr, n_rows, n_cols, x_stride, inv_rows,
                        epoch, tiles_per_part, SPLIT: tl.constexpr, BLOCK: tl.constexpr,
                        FIRST_EVICTION: tl.constexpr, SECOND_EVICTION: tl.constexpr, LANES: tl.constexpr,
                        STAGES: tl.constexpr):
    pid = tl.program_id(0)
    part = pid % SPLIT
    groups = tl.num_programs(0) // SPLIT
    n_tiles = tl.cdiv(n_cols, BLOCK)
    k_start = part * tiles_per_part
    k_stop = tl.minimum(k_start + tiles_per_part, n_tiles)
    offs = tl.arange(0, BLOCK)
    for row in range(pid // SPLIT, n_rows, groups):
        base = x_ptr + row * x_stride
        target = tl.load(target_ptr + row)
        if LANES:
            # Per-lane (m, d), one exp an element (exp(-|y - m|) serves both cases), reduced across
            # the program once a row: no cross-warp reduction (barriers) in the loop.
            m_lane = tl.full((BLOCK,), float("-inf"), tl.float32)
            d_lane = tl.zeros((BLOCK,), tl.float32)
            for k in tl.range(k_start, k_stop, num_stages=STAGES):
                cols = k * BLOCK + offs
                y = tl.load(base + cols, mask=cols < n_cols, other=float("-inf"),
                            eviction_policy=FIRST_EVICTION).to(tl.float32)
                t = tl.where(y == float("-inf"), 0.0, tl.exp(-tl.abs(y - m_lane)))
                d_lane = tl.where(y > m_lane, d_lane * t + 1.0, d_lane + t)
                m_lane = tl.maximum(m_lane, y)
            m = tl.max(m_lane, 0)
            d = tl.sum(tl.where(m_lane == float("-inf"), 0.0, d_lane * tl.exp(m_lane - m)), 0)
        else:
            m = tl.full((), float("-inf"), tl.float32)
            d = tl.zeros((), tl.float32)
            for k in tl.range(k_start, k_stop, num_stages=STAGES):
                cols = k * BLOCK + offs
                y = tl.load(base + cols, mask=cols < n_cols, other=float("-inf"),
                            eviction_policy=FIRST_EVICTION).to(tl.float32)
                tile_m = tl.max(y, 0)
                m_new = tl.maximum(m, tile_m)
                d = d * tl.exp(m - m_new) + tl.sum(tl.exp(y - m_new), 0)
                m = m_new
        owns_target = (target >= k_start * BLOCK) & (target < k_stop * BLOCK)
        y_t = tl.load(base + target, mask=owns_target, other=0.0).to(tl.float32)
        if SPLIT > 1:
            slot = row * SPLIT + part
            tl.store(parts_ptr + 2 * slot, m)
            tl.store(parts_ptr + 2 * slot + 1, d)
            tl.debug_barrier()
            flag = flags_ptr + row
            arrived = tl.atomic_add(flag, 1, sem="acq_rel") + 1
            while arrived < SPLIT * epoch:
                arrived = tl.atomic_add(flag, 0, sem="acquire")
            tl.debug_barrier()
            idx = tl.arange(0, SPLIT)
            ms = tl.load(parts_ptr + 2 * (row * SPLIT + idx), volatile=True)
            ds = tl.load(parts_ptr + 2 * (row * SPLIT + idx) + 1, volatile=True)
            m = tl.max(ms, 0)
            d = tl.sum(ds * tl.exp(ms - m), 0)
        lse = m + tl.log(d)
        tl.store(loss_ptr + row, lse - y_t, mask=owns_target)
        for k in tl.range(k_start, k_stop, num_stages=STAGES):
            cols = k * BLOCK + offs
            live = cols < n_cols
            y = tl.load(base + cols, mask=live, other=0.0, eviction_policy=SECOND_EVICTION).to(tl.float32)
            g = tl.exp(y - lse) * inv_rows
            g = tl.where(cols == target, g - inv_rows, g)
            tl.store(base + cols, g.to(x_ptr.dtype.element_ty), mask=live, eviction_policy=SECOND_EVICTION)


class SplitReread:
    """The kernel over (n_rows, n_cols) logits: rows split between ``split`` programs, ``per_sm``
    programs an SM in a persistent grid (0: one program a row, whole rows only), ``lanes``: per-lane
    accumulators."""

    def __init__(self, n_rows, n_cols, split, per_sm, block, warps, lanes=False, stages=1, first="evict_last",
                 second="evict_first"):
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        assert per_sm or split == 1, "a row's parts must run side by side: a persistent grid"
        self.grid = (sms * per_sm // split * split if per_sm else n_rows,)
        self.lanes, self.stages = lanes, stages
        n_tiles = triton.cdiv(n_cols, block)
        self.tiles_per_part = triton.cdiv(n_tiles, split)
        self.split, self.block, self.warps, self.first, self.second = split, block, warps, first, second
        self.parts = torch.empty(2 * n_rows * split, device="cuda")
        self.flags = torch.zeros(n_rows, dtype=torch.int32, device="cuda")
        self.loss = torch.empty(n_rows, device="cuda")
        self.epoch = 0

    def __call__(self, x, target):
        self.epoch += 1
        split_reread_kernel[self.grid](x, target, self.loss, self.parts, self.flags, x.shape[0], x.shape[1],
                                       x.stride(0), 1.0 / x.shape[0], self.epoch, self.tiles_per_part,
                                       SPLIT=self.split, BLOCK=self.block, FIRST_EVICTION=self.first,
                                       SECOND_EVICTION=self.second, LANES=self.lanes, STAGES=self.stages,
                                       num_warps=self.warps)
        return self.loss


VARIANTS = {  # name: (split, programs an SM (0: one a row), block, warps, per-lane accumulators, stages)
    "halves, 1 an SM, 32 warps, 16K": (2, 1, 16384, 32, False, 1),
    "halves, 2 an SM, 16 warps, 8K": (2, 2, 8192, 16, False, 1),
    "quarters, 1 an SM, 32 warps, 16K": (4, 1, 16384, 32, False, 1),
    "quarters, 2 an SM, 16 warps, 8K": (4, 2, 8192, 16, False, 1),
    "whole rows, 1 an SM, 32 warps, 16K": (1, 1, 16384, 32, False, 1),
    "halves, 1 an SM, 16 warps, 8K": (2, 1, 8192, 16, False, 1),
    "lanes, whole rows, 1 an SM, 32 warps, 8K": (1, 1, 8192, 32, True, 1),
    "lanes, whole rows, 1 an SM, 32 warps, 16K": (1, 1, 16384, 32, True, 1),
    "lanes, whole rows, 2 an SM, 16 warps, 4K": (1, 2, 4096, 16, True, 1),
    "lanes, halves, 1 an SM, 32 warps, 8K": (2, 1, 8192, 32, True, 1),
    "lanes, halves, 2 an SM, 16 warps, 4K": (2, 2, 4096, 16, True, 1),
    "lanes, one program a row, 16 warps, 8K": (1, 0, 8192, 16, True, 1),
    "lanes, one program a row, 32 warps, 8K": (1, 0, 8192, 32, True, 1),
    "deeper, whole rows, 1 an SM, 32 warps, 32K": (1, 1, 32768, 32, False, 1),
    "deeper, whole rows, 1 an SM, 32 warps, 16K, 3 stages": (1, 1, 16384, 32, False, 3),
    "deeper, lanes, whole rows, 1 an SM, 32 warps, 16K, 3 stages": (1, 1, 16384, 32, True, 3),
    "deeper, one program a row, 32 warps, 32K": (1, 0, 32768, 32, False, 1),
    "deeper, one program a row, 32 warps, 16K, 3 stages": (1, 0, 16384, 32, False, 3),
}
# --lanes / --deeper: only the variants named so (and the plan, the copy), on the first three shapes.
ONLY = next((flag[2:] for flag in ("--lanes", "--deeper") if flag in sys.argv), None)


def selected(name: str) -> bool:
    return ONLY is None or name.startswith(ONLY)


def check_case():
    """(logits, targets, float32 torch's per-row loss, the gradient of its mean): 300 bf16 rows of 50257."""
    torch.manual_seed(0)
    x = torch.randn(300, 50257, device="cuda").to(torch.bfloat16) * 3
    target = torch.randint(0, 50257, (300,), device="cuda")
    ref = x.float().requires_grad_()
    loss_ref = torch.nn.functional.cross_entropy(ref, target, reduction="none")
    loss_ref.mean().backward()
    return x, target, loss_ref.detach(), ref.grad


def check():
    x, target, loss_ref, grad_ref = check_case()
    for name, (split, per_sm, block, warps, lanes, stages) in VARIANTS.items():
        if not selected(name):
            continue
        y = x.clone()
        loss = SplitReread(*x.shape, split, per_sm, block, warps, lanes, stages)(y, target)
        loss_err = ((loss - loss_ref).abs().max() / loss_ref.abs().max()).item()
        grad_err = ((y.float() - grad_ref).abs().max() / grad_ref.abs().max()).item()
        print(f"check {name}: loss rel err {loss_err:.2e}, gradient rel err {grad_err:.2e}", flush=True)
        assert loss_err < 1e-5 and grad_err < 1e-2, name


def baseline(n_rows, n_cols, dtype):
    """Random logits and targets, with a device copy of the same bytes and the plan's in-place
    forward timed on them and printed; returns (logits, targets, the floor's bytes)."""
    x = torch.randn(n_rows, n_cols, device="cuda").to(dtype)
    target = torch.randint(0, n_cols, (n_rows,), device="cuda")
    copy_out = torch.empty_like(x)
    floor = 2 * x.numel() * x.element_size()
    copy_ms = do_bench(lambda: copy_out.copy_(x))
    plan_ms = do_bench(lambda: launch.launch_forward(x, target, None, -100, "mean", 0.0, 0.0, 0.0, 1.0, False,
                                                     None, inplace=True))
    print(f"{n_rows}x{n_cols} {str(dtype)[6:]}: copy {copy_ms:.3f} ({floor / copy_ms / 1e6:.0f} GB/s), "
          f"the plan in place {plan_ms:.3f}", flush=True)
    return x, target, floor


def main():
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; "
          "do_bench medians, ms (one input: each is larger than L2)")
    check()
    shapes = ((8192, 128256), (4096, 256000), (8192, 151936), (8192, 50257))
    for n_rows, n_cols in shapes[:3] if ONLY else shapes:
        x, target, floor = baseline(n_rows, n_cols, torch.bfloat16)
        for name, (split, per_sm, block, warps, lanes, stages) in VARIANTS.items():
            if not selected(name):
                continue
            run = SplitReread(n_rows, n_cols, split, per_sm, block, warps, lanes, stages)
            ms = do_bench(lambda: run(x, target))
            print(f"  {name}: {ms:.3f} ({floor / ms / 1e6:.0f} GB/s of read + write once)", flush=True)


if __name__ == "__main__":
    main()
