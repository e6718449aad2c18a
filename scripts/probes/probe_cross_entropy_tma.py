"""Does a persistent in-place cross-entropy fed by TMA reach the fused floor? (GPU)

The in-place kernel (`two_pass`) reads each row twice. Earlier probes (docs/perf-cross_entropy.md)
found that a persistent grid's second read does come from L2 (Nsight: 2.26 GB read of 2.10 GB
logits), but that one program an SM, loading with plain `tl.load`s, keeps too few bytes in flight:
device memory at 65% of its peak, no faster than the plan. Here the loads are the Hopper's tensor
memory accelerator (a TMA descriptor over the row seen as runs of 256 or 64 elements), pipelined
by Triton over STAGES tiles in shared memory, so a program keeps STAGES - 1 tiles of RUNS runs in
flight without registers. One loop walks every (row, pass, tile) of the program, flattened, so the
pipeline does not drain at a row's or a pass's end. The loop holds no barrier (a `debug_barrier`
in it stops Triton 3.6 from pipelining it): the loss reads the target's logit from the tile in
shared memory instead of from the row that the gradient overwrites.

A stripped-down loss (mean over all rows, no options; rows whose length is a multiple of 8
elements, a tail of under 256 loaded plainly); checked against torch before timing. The plan's
in-place forward and a device copy of the same bytes (read + write) run in the same process.

    python scripts/probes/probe_cross_entropy_tma.py [VARIANT ...]
    TRITON_INTERPRET=1 python scripts/probes/probe_cross_entropy_tma.py   # the check alone, on CPU

Variants are named r<runs a tile>_s<stages>_w<warps>_p<programs an SM> (run64_: runs of 64).
"""

import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench
from triton.tools.tensor_descriptor import TensorDescriptor

from onlinesoftmax._triton import known_multiple

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def tma_two_pass_kernel(desc, x_ptr, target_ptr, loss_ptr, n_rows, n_cols, n_runs, scale,
                        RUNS: tl.constexpr, RUN: tl.constexpr, TAIL: tl.constexpr, STAGES: tl.constexpr,
                        TMA_STORE: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    my_rows = tl.cdiv(n_rows - pid, programs)
    tiles = tl.cdiv(n_runs, RUNS)
    run_offs = tl.arange(0, RUNS)
    lane = tl.arange(0, RUN)
    tail_cols = n_runs * RUN + tl.arange(0, TAIL if TAIL > 0 else 1)
    m = tl.full((), NEG_INF, tl.float32)
    d = tl.zeros((), tl.float32)
    lse = tl.zeros((), tl.float32)
    target_col = tl.zeros((), tl.int32)
    for i in tl.range(0, my_rows * 2 * tiles, num_stages=STAGES):
        k = i // (2 * tiles)
        r = i - k * 2 * tiles
        row = pid + k * programs
        second = r >= tiles
        j = tl.where(second, r - tiles, r)
        y = desc.load([row, j * RUNS, 0]).reshape(RUNS, RUN).to(tl.float32)
        runs = j * RUNS + run_offs
        live = (runs < n_runs)[:, None]
        base = x_ptr + row.to(tl.int64) * known_multiple(n_cols, 8)  # rows of whole 16-byte vectors
        if not second:
            if j == 0:
                m = tl.full((), NEG_INF, tl.float32)
                d = tl.zeros((), tl.float32)
            y = tl.where(live, y, NEG_INF)
            m_new = tl.maximum(m, tl.max(tl.max(y, 1), 0))
            d = d * tl.exp(m - m_new) + tl.sum(tl.sum(tl.exp(y - m_new), 1), 0)
            m = m_new
            if j == tiles - 1:
                if TAIL > 0:
                    t = tl.load(base + tail_cols, mask=tail_cols < n_cols, other=NEG_INF).to(tl.float32)
                    m_new = tl.maximum(m, tl.max(t, 0))
                    d = d * tl.exp(m - m_new) + tl.sum(tl.exp(t - m_new), 0)
                    m = m_new
                lse = m + tl.log(d)
                target_col = tl.load(target_ptr + row).to(tl.int32)
        else:
            cols = runs[:, None] * RUN + lane[None, :]
            hit = cols == target_col
            g = scale * tl.exp(y - lse) - tl.where(hit, scale, 0.0)
            # The target's logit from the tile in shared memory, not from the row in global memory:
            # a load from there would need a barrier before the gradient's stores (another warp may
            # overwrite it first), and a barrier in the loop stops Triton from pipelining it.
            if (target_col < n_runs * RUN) & (target_col // (RUNS * RUN) == j):
                tl.store(loss_ptr + row, lse - tl.sum(tl.sum(tl.where(hit, y, 0.0), 1), 0))
            if TMA_STORE:
                desc.store([row, j * RUNS, 0], g.to(x_ptr.dtype.element_ty).reshape(1, RUNS, RUN))
            else:
                tl.store(base + cols, g.to(x_ptr.dtype.element_ty), mask=live)
            if TAIL > 0:
                if j == tiles - 1:
                    t = tl.load(base + tail_cols, mask=tail_cols < n_cols, other=0.0).to(tl.float32)
                    tail_hit = tail_cols == target_col
                    tail_g = scale * tl.exp(t - lse) - tl.where(tail_hit, scale, 0.0)
                    if target_col >= n_runs * RUN:
                        tl.store(loss_ptr + row, lse - tl.sum(tl.where(tail_hit, t, 0.0), 0))
                    tl.store(base + tail_cols, tail_g.to(x_ptr.dtype.element_ty), mask=tail_cols < n_cols)


class TmaTwoPass:
    def __init__(self, x, runs, stages, warps, per_sm, tma_store=False, run=256):
        # A TMA box holds at most 256 elements a dimension: the row is seen as [n_cols // run, run]
        # (128-byte runs let the shared tiles be swizzled).
        n_rows, n_cols = x.shape
        self.n_runs = n_cols // run
        rest = n_cols - self.n_runs * run
        self.tail = triton.next_power_of_2(rest) if rest else 0
        self.desc = TensorDescriptor(x, shape=[n_rows, self.n_runs, run], strides=[n_cols, run, 1],
                                     block_shape=[1, runs, run])
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
        self.grid = (min(n_rows, sms * per_sm),)
        self.loss = torch.empty(n_rows, device=x.device)
        self.meta = dict(RUNS=runs, RUN=run, TAIL=self.tail, STAGES=stages, TMA_STORE=tma_store, num_warps=warps)
        self.x = x

    def __call__(self, target):
        x = self.x
        tma_two_pass_kernel[self.grid](self.desc, x, target, self.loss, x.shape[0], x.shape[1], self.n_runs,
                                       1.0 / x.shape[0], **self.meta)
        return self.loss


VARIANTS = {  # name: (runs a tile, stages, warps, programs an SM, TMA store, elements a run)
    "r64_s3_w32_p1": (64, 3, 32, 1, False, 256),
    "r64_s4_w32_p1": (64, 4, 32, 1, False, 256),
    "r64_s5_w32_p1": (64, 5, 32, 1, False, 256),
    "r32_s4_w16_p1": (32, 4, 16, 1, False, 256),
    "r32_s6_w16_p1": (32, 6, 16, 1, False, 256),
    "r32_s8_w16_p1": (32, 8, 16, 1, False, 256),
    "r16_s6_w8_p2": (16, 6, 8, 2, False, 256),
    "r16_s4_w8_p3": (16, 4, 8, 3, False, 256),
    "r8_s6_w4_p4": (8, 6, 4, 4, False, 256),
    "r8_s4_w8_p4": (8, 4, 8, 4, False, 256),
    "r64_s4_w32_p1_tmastore": (64, 4, 32, 1, True, 256),
    "run64_r256_s3_w32_p1": (256, 3, 32, 1, False, 64),
    "run64_r64_s6_w8_p2": (64, 6, 8, 2, False, 64),
    "run64_r64_s4_w8_p3": (64, 4, 8, 3, False, 64),
    "run64_r32_s6_w4_p4": (32, 6, 4, 4, False, 64),
}


def check(device):
    seed = 0
    torch.manual_seed(seed)
    for n_rows, n_cols in ((37, 3000), (300, 32008)):
        x = (torch.randn(n_rows, n_cols, device=device) * 3).to(torch.bfloat16)
        target = torch.randint(0, n_cols, (n_rows,), device=device)
        ref = x.float().requires_grad_()
        loss_ref = torch.nn.functional.cross_entropy(ref, target, reduction="none")
        loss_ref.sum().div(n_rows).backward()
        for name, variant in VARIANTS.items():
            if device == "cpu" and name not in ("r16_s6_w8_p2", "run64_r64_s6_w8_p2"):
                continue
            y = x.clone()
            loss = TmaTwoPass(y, *variant)(target)
            loss_err = ((loss - loss_ref.detach()).abs().max() / loss_ref.abs().max()).item()
            grad_err = ((y.float() - ref.grad).abs().max() / ref.grad.abs().max()).item()
            print(f"check (seed {seed}) {n_rows}x{n_cols} {name}: loss rel err {loss_err:.2e}, "
                  f"gradient rel err {grad_err:.2e}", flush=True)
            assert loss_err < 1e-5 and grad_err < 1e-2, name


def main():
    if not torch.cuda.is_available():  # TRITON_INTERPRET=1: the check alone
        check("cpu")
        return
    from probe_cross_entropy_split_reread import baseline  # this folder: run as python scripts/probes/...
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; "
          "do_bench medians, ms (one input: each is larger than L2)")
    check("cuda")
    chosen = sys.argv[1:] or list(VARIANTS)
    for n_rows, n_cols in ((8192, 128256), (4096, 256000), (8192, 151936), (16384, 128256), (8192, 50264)):
        x, target, floor = baseline(n_rows, n_cols, torch.bfloat16)
        for name in chosen:
            run = TmaTwoPass(x, *VARIANTS[name])
            ms = do_bench(lambda: run(target))
            print(f"  {name}: {ms:.3f} ({floor / ms / 1e6:.0f} GB/s of read + write once)", flush=True)


if __name__ == "__main__":
    main()
