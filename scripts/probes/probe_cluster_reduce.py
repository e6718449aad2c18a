"""Can Triton (3.6 on the H100) hold a softmax row in a cluster of CTAs (GPU)?

    python scripts/probes/probe_cluster_reduce.py

Quack reads a vocabulary-sized row once by spreading it over a thread-block cluster and meeting
in distributed shared memory. Triton's route to that is ``num_ctas > 1``, where one program's
tensors are laid out across the cluster's CTAs and a reduction over them would cross CTAs. This
compiles a one-program-per-row softmax with the row in one block, written with a rank-1 tile and
with a [1, BLOCK] tile, at several cluster sizes, and reports the error or the time (CUDA graph over
rotated inputs) and the relative error. Output of the 2026-11-23 run:
docs/notes/2026-11/probe_cluster_reduce-h100.log.
"""
import torch
import triton
import triton.language as tl

from onlinesoftmax.bench.harness import graph_time_ms, rotation_count


@triton.jit
def row_softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr, RANK2: tl.constexpr):
    row = tl.program_id(0)
    if RANK2:
        cols = tl.arange(0, BLOCK)[None, :]
        mask = cols < n_cols
        x = tl.load(x_ptr + row.to(tl.int64) * n_cols + cols, mask=mask, other=float("-inf"))
        e = tl.exp(x - tl.max(x, 1)[:, None])
        y = e / tl.sum(e, 1)[:, None]
    else:
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row.to(tl.int64) * n_cols + cols, mask=mask, other=float("-inf"))
        e = tl.exp(x - tl.max(x, 0))
        y = e / tl.sum(e, 0)
    tl.store(y_ptr + row.to(tl.int64) * n_cols + cols, y, mask=mask)


def main():
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}")
    for rows, cols in ((256, 131072), (256, 151936), (64, 128256)):
        nbytes = 2 * rows * cols * 4
        xs = [(torch.randn(rows, cols, device="cuda"),) for _ in range(rotation_count(nbytes))]
        ref = torch.softmax(xs[0][0].double(), -1)
        for rank2 in (False, True):
            for ctas, warps in ((4, 32), (8, 8), (8, 16), (16, 8)):
                label = f"{rows}x{cols} rank {2 if rank2 else 1} ctas {ctas:2d} warps {warps:2d}"

                def run(x, ctas=ctas, warps=warps, rank2=rank2):
                    y = torch.empty_like(x)
                    row_softmax_kernel[(rows,)](x, y, cols, BLOCK=triton.next_power_of_2(cols), RANK2=rank2,
                                                num_warps=warps, num_ctas=ctas)
                    return y

                try:
                    err = ((run(xs[0][0]).double() - ref).norm() / ref.norm()).item()
                    ms = graph_time_ms(run, xs)
                    print(f"{label}: rel err {err:.1e}, {ms * 1e3:.1f} us, {nbytes / ms / 1e6:.0f} GB/s", flush=True)
                except Exception as exc:  # the compiler's verdict is the result
                    first = next((line for line in str(exc).splitlines() if "error" in line), str(exc)[:200])
                    print(f"{label}: {type(exc).__name__}: {first.strip()[:160]}", flush=True)
        del xs


if __name__ == "__main__":
    main()
