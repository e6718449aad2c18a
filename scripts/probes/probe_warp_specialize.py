"""Does Triton 3.6's automatic warp specialization on Hopper compute a plain loop of dots right?

    python scripts/probes/probe_warp_specialize.py        (on a Hopper GPU)

The attention forward takes ``tl.range(..., warp_specialize=True)`` on the H100
(ops/attention/plan.py, ATTENTION_FORWARD_WARP_SPECIALIZED) for the one configuration that its tests and the sweep found
right; other configurations computed NaN (BLOCK_N = 64; 3 stages at head dim 64). This probe
reduces the pattern to its core, no softmax: a tile A loaded once through a tensor descriptor,
then a loop of tiles B through another, accumulating A @ B^T, with and without the specialization,
in both 16-bit types, against float32 on the GPU. compute-sanitizer racecheck over it (and over
the attention forward) reports hazards between the specialized kernel's dispatch of warps to
their partitions (a per-warp state in shared memory written by the producer warpgroup, read by
the consumers after a CTA-wide barrier) and nothing else.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def dot_loop_kernel(a_ptr, b_ptr, out_ptr, n_rows, BLOCK: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    desc_a = tl.make_tensor_descriptor(a_ptr, shape=[n_rows, 64], strides=[64, 1], block_shape=[BLOCK, 64])
    desc_b = tl.make_tensor_descriptor(b_ptr, shape=[n_rows, 64], strides=[64, 1], block_shape=[BLOCK, 64])
    a = desc_a.load([tl.program_id(0) * BLOCK, 0])
    acc = tl.zeros([BLOCK, BLOCK], tl.float32)
    for start in tl.range(0, n_rows, BLOCK, warp_specialize=WARP_SPECIALIZE):
        acc = tl.dot(a, tl.trans(desc_b.load([start, 0])), acc)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + rows[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :], acc)


def main() -> None:
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}")
    block, n_rows = 128, 512
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        a = torch.randn(n_rows, 64, device="cuda", generator=gen).to(dtype)
        b = torch.randn(n_rows, 64, device="cuda", generator=gen).to(dtype)
        # Row r of A against every block of B, summed over the blocks: out[r, c] = sum_i a_r . b_(i*BLOCK + c).
        expected = a.float() @ b.float().view(n_rows // block, block, 64).sum(0).T
        for specialize in (False, True):
            out = torch.full((n_rows, block), float("nan"), device="cuda")
            kernel = dot_loop_kernel[(n_rows // block,)](a, b, out, n_rows, BLOCK=block, WARP_SPECIALIZE=specialize,
                                                         num_warps=4, num_stages=2)
            torch.cuda.synchronize()
            error = ((out - expected).norm() / expected.norm()).item()
            print(f"{str(dtype)[6:]:9s} warp_specialize={specialize!s:5s} warps run {kernel.metadata.num_warps:2d}: "
                  f"relative error {error:.1e} {'ok' if error < 1e-2 else 'WRONG'}")


if __name__ == "__main__":
    main()
