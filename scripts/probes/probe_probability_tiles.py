"""Tiles of the probability-target kernels over short rows (GPU): rows a program and warps.

    python scripts/probes/probe_probability_tiles.py

For rows of a few hundred to a few thousand classes the kernels hold several rows a program
(probability.layout: tiles of PROBABILITY_TILE_ELEMENTS on PROBABILITY_WARPS). This times the
public call (a "mean" loss: forward alone, and forward + backward through torch.autograd.grad)
under CUDA graphs, bf16 logits and targets, for other tile sizes and warp counts given to
layout, beside torch's F.cross_entropy and torch.compile's; ms, the median of do_bench_cudagraph.
"""
import torch
import torch.nn.functional as F
import triton

import onlinesoftmax
from onlinesoftmax.ops.cross_entropy import probability

SHAPES = [(4007, 369), (225, 108), (1952, 1151), (509, 1601), (3523, 1327), (6, 571), (8192, 700), (16384, 129)]
VARIANTS = [(2048, 8), (2048, 4), (1024, 4), (1024, 2), (4096, 8), (4096, 4), (8192, 8)]  # (tile elements, warps)
BASE_LAYOUT = probability.layout


def with_tiles(tile_elements, warps):
    def layout(n_rows, n_cols, element_size, sms, contiguous, forward):
        cut = BASE_LAYOUT(n_rows, n_cols, element_size, sms, contiguous, forward)
        if cut.rows == 1:  # long rows keep their plan
            return cut
        rows = max(1, tile_elements // cut.block)
        return cut._replace(rows=rows, num_warps=warps)
    return layout


def timed(fn, x, p):
    def forward():
        with torch.no_grad():
            fn(x, p)

    def step():
        torch.autograd.grad(fn(x, p), x)

    return [triton.testing.do_bench_cudagraph(call, rep=50) for call in (forward, step)]


def main():
    compiled = torch.compile(lambda x, p: F.cross_entropy(x, p))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; bf16, ms forward / forward + backward")
    for rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16).requires_grad_()
        p = torch.softmax(torch.randn(rows, cols, device="cuda"), -1).to(torch.bfloat16)
        cells = [("torch", timed(F.cross_entropy, x, p)), ("torch.compile", timed(compiled, x, p))]
        for tile_elements, warps in VARIANTS:
            probability.layout = with_tiles(tile_elements, warps)
            probability._FORWARD_CALLS.clear()
            probability._BACKWARD_CALLS.clear()
            cells.append((f"{tile_elements}/{warps}w", timed(onlinesoftmax.cross_entropy, x, p)))
        probability.layout = BASE_LAYOUT
        print(f"{rows}x{cols}: " + "  ".join(f"{name} {f:.4f}/{s:.4f}" for name, (f, s) in cells), flush=True)


if __name__ == "__main__":
    main()
