"""What separates the lean in-place probe kernel (1.728 ms) from the plan's two_pass (1.985 ms)? (GPU)

probe_cross_entropy_split_reread.py's "one program a row, 32 warps, 32K" kernel reads each row
twice and writes the gradient over it, as two_pass does, but ran 13% faster at 8192 x 128256 bf16.
It leaves out what the library's kernel must do. Here one kernel carries each of those duties
behind a switch, and the variants add them one at a time, so that the cost of each is measured
in one process beside the plan and a copy of the same bytes:

    WIDE     64-bit row offsets (tensors past 2**31 elements), not 32-bit
    TARGETS  ignore_index and out-of-range targets (int64, masked loads, NaN rows)
    DENOM    the gradient's scale loaded from the "mean" denominator, not a constant
    LOW      the lse's rounding error (split_lse) in the gradient and the loss
    STATS    the row's lse and its rounding error stored for the backward
    BARRIER  a barrier between the target logit's load and the gradient's stores (the race
             fixed in the plan's kernels: without it another warp may overwrite the target first)

    python scripts/probes/probe_cross_entropy_lean.py
"""

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from onlinesoftmax._triton import split_lse
from probe_cross_entropy_split_reread import baseline  # this folder: run as python scripts/probes/...

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def lean_kernel(x_ptr, target_ptr, denom_ptr, loss_ptr, lse_ptr, low_ptr, n_cols, x_stride, ignore_index,
                inv_rows, BLOCK: tl.constexpr, WIDE: tl.constexpr, TARGETS: tl.constexpr, DENOM: tl.constexpr,
                LOW: tl.constexpr, STATS: tl.constexpr, BARRIER: tl.constexpr):
    row = tl.program_id(0)
    if WIDE:
        base = x_ptr + row.to(tl.int64) * x_stride
    else:
        base = x_ptr + row * x_stride
    if TARGETS:
        target = tl.load(target_ptr + row).to(tl.int64)
        valid = target != ignore_index
        bad = valid & ((target < 0) | (target >= n_cols))
        in_row = valid & ~bad
        n_tiles = tl.where(valid, tl.cdiv(n_cols, BLOCK), 0)
        # Compared with int32 columns: an int64 target widens every lane's column to 64 bits
        # (ptxas for sm_90, bf16 at 32 elements a thread: an 88-byte stack of spills).
        target_col = tl.where(in_row, target, -1).to(tl.int32)
    else:
        target = tl.load(target_ptr + row)
        target_col = target
        n_tiles = tl.cdiv(n_cols, BLOCK)
    offs = tl.arange(0, BLOCK)
    m = tl.full((), NEG_INF, tl.float32)
    d = tl.zeros((), tl.float32)
    for k in range(0, n_tiles):
        cols = k * BLOCK + offs
        y = tl.load(base + cols, mask=cols < n_cols, other=NEG_INF, eviction_policy="evict_last").to(tl.float32)
        tile_m = tl.max(y, 0)
        m_new = tl.maximum(m, tile_m)
        ref = tl.where(m_new == NEG_INF, 0.0, m_new)
        d = d * tl.exp(m - ref) + tl.sum(tl.exp(y - ref), 0)
        m = m_new
    if TARGETS:
        y_t = tl.load(base + target, mask=in_row, other=0.0).to(tl.float32)
    else:
        y_t = tl.load(base + target).to(tl.float32)
    if BARRIER:
        tl.debug_barrier()
    if LOW:
        lse, low = split_lse(m, d)
    else:
        lse = m + tl.log(d)
        low = 0.0
    if DENOM:
        scale = 1.0 / tl.load(denom_ptr)
    else:
        scale = inv_rows
    loss = (lse - y_t) + low
    if TARGETS:
        scale = tl.where(bad, float("nan"), scale)  # a bad target's gradient row is NaN, from the scale
        loss = tl.where(valid, loss, 0.0)
        loss = tl.where(bad, float("nan"), loss)
    tl.store(loss_ptr + row, loss)
    if STATS:
        tl.store(lse_ptr + row, lse)
        tl.store(low_ptr + row, low)
    for k in range(0, n_tiles):
        cols = k * BLOCK + offs
        live = cols < n_cols
        y = tl.load(base + cols, mask=live, other=0.0, eviction_policy="evict_first").to(tl.float32)
        g = scale * tl.exp((y - lse) - low) - tl.where(cols == target_col, scale, 0.0)
        tl.store(base + cols, g.to(x_ptr.dtype.element_ty), mask=live, eviction_policy="evict_first")
    if TARGETS:
        if n_tiles == 0:  # an ignored row: its gradient is 0
            for k in range(0, tl.cdiv(n_cols, BLOCK)):
                cols = k * BLOCK + offs
                tl.store(base + cols, tl.zeros((BLOCK,), x_ptr.dtype.element_ty), mask=cols < n_cols)


SWITCHES = ("WIDE", "TARGETS", "DENOM", "LOW", "STATS", "BARRIER")
# Each variant adds one duty to the one before; the last is every duty the library's kernel has.
VARIANTS = [dict.fromkeys(SWITCHES[:i], True) | dict.fromkeys(SWITCHES[i:], False) for i in range(len(SWITCHES) + 1)]


def name(switches: dict) -> str:
    on = [k for k, v in switches.items() if v]
    return "probe" + ("+" + "+".join(on) if on else " (none)")


def run(x, target, switches, block, warps, out):
    denom, loss, lse, low = out
    lean_kernel[(x.shape[0],)](x, target, denom, loss, lse, low, x.shape[1], x.stride(0), -100,
                               1.0 / x.shape[0], BLOCK=block, num_warps=warps, **switches)
    return loss


def buffers(x):
    n = x.shape[0]
    denom = torch.full((1,), float(n), device=x.device)
    return denom, torch.empty(n, device=x.device), torch.empty(n, device=x.device), torch.empty(n, device=x.device)


def check():
    seed = 0
    torch.manual_seed(seed)
    x = (torch.randn(300, 32000, device="cuda") * 3).to(torch.bfloat16)
    target = torch.randint(0, 32000, (300,), device="cuda")
    target[::7] = -100
    ref = x.float().requires_grad_()
    loss_ref = torch.nn.functional.cross_entropy(ref, target, reduction="none")
    loss_ref.sum().div(300).backward()
    for switches in VARIANTS:
        if not switches["TARGETS"]:
            continue
        y = x.clone()
        loss = run(y, target, switches, 8192, 16, buffers(y))
        loss_err = ((loss - loss_ref.detach()).abs().max() / loss_ref.abs().max()).item()
        grad_err = ((y.float() - ref.grad).abs().max() / ref.grad.abs().max()).item()
        print(f"check (seed {seed}) {name(switches)}: loss rel err {loss_err:.2e}, gradient rel err {grad_err:.2e}")
        assert loss_err < 1e-5 and grad_err < 1e-2, name(switches)


def main():
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; "
          "do_bench medians, ms (one input: each is larger than L2)")
    check()
    for n_rows, n_cols, dtype in ((8192, 128256, torch.bfloat16), (4096, 256000, torch.bfloat16),
                                  (8192, 32000, torch.bfloat16), (8192, 128256, torch.float32)):
        x, target, floor = baseline(n_rows, n_cols, dtype)
        out = buffers(x)
        block = 65536 // x.element_size()
        for switches in VARIANTS:
            ms = do_bench(lambda: run(x, target, switches, block, 32, out))
            print(f"  {name(switches)}, {block} a tile, 32 warps: {ms:.3f} ({floor / ms / 1e6:.0f} GB/s)", flush=True)
        for block, warps in ((block // 2, 16), (block // 4, 16), (block // 4, 8)):
            ms = do_bench(lambda: run(x, target, VARIANTS[-1], block, warps, out))
            print(f"  {name(VARIANTS[-1])}, {block} a tile, {warps} warps: {ms:.3f}", flush=True)


if __name__ == "__main__":
    main()
