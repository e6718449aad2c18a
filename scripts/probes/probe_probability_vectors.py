"""The probability-target forward's rows on 16-byte vectors (GPU).

    python scripts/probes/probe_probability_vectors.py

Rows a program holds alone, contiguous, are read in tiles on 16-byte vectors (probability.layout),
the partial first and last vectors of rows that start or end inside one element-wise; the
forward leaves rows of one tile with partial vectors to tiles from each row's first column. This
times the public call (a "mean" loss: forward alone, and forward + backward through
torch.autograd.grad) under CUDA graphs with the forward's vectors as layout gives them, with
none, and as the backward takes them (rows with edges of any number of tiles on vectors); ms, the
median of do_bench_cudagraph, in one process on the same inputs, each setting twice in turn.
"""
import torch
import triton

import onlinesoftmax
from onlinesoftmax.ops.cross_entropy import probability

SHAPES = {torch.bfloat16: [(1952, 1151), (509, 1601), (8192, 2053), (2048, 4099), (4096, 5003), (1024, 9001),
                           (2049, 32003), (8192, 50257), (8192, 1000), (8192, 128256), (1024, 151936), (64, 256000),
                           (119, 15792)],
          torch.float32: [(4096, 2053), (2048, 3001), (2048, 4099), (2048, 6151), (1024, 10243), (1024, 16381),
                          (777, 50257), (4096, 128256)]}
BASE_LAYOUT = probability.layout


def forward_without_vectors(n_rows, n_cols, element_size, sms, contiguous, forward):
    return BASE_LAYOUT(n_rows, n_cols, element_size, sms, contiguous and not forward, forward)


def forward_as_backward(n_rows, n_cols, element_size, sms, contiguous, forward):
    # The backward's choice: vectors for rows with edges of any number of tiles.
    return BASE_LAYOUT(n_rows, n_cols, element_size, sms, contiguous, False)


def timed(x, p):
    def forward():
        with torch.no_grad():
            onlinesoftmax.cross_entropy(x, p)

    def step():
        torch.autograd.grad(onlinesoftmax.cross_entropy(x, p), x)

    return [triton.testing.do_bench_cudagraph(call, rep=50) for call in (forward, step)]


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          "ms forward / forward + backward under CUDA graphs")
    for dtype, shapes in SHAPES.items():
        for rows, cols in shapes:
            x = torch.randn(rows, cols, device="cuda", dtype=dtype).requires_grad_()
            p = torch.softmax(torch.randn(rows, cols, device="cuda"), -1).to(dtype)
            cells = []
            for name, layout in (("layout's", BASE_LAYOUT), ("no vectors", forward_without_vectors),
                                 ("as the backward", forward_as_backward)) * 2:
                probability.layout = layout
                probability._FORWARD_CALLS.clear()
                cells.append((name, timed(x, p)))
            probability.layout = BASE_LAYOUT
            cut = BASE_LAYOUT(rows, cols, x.element_size(), probability.sm_count(x.device), True, True)
            print(f"{str(dtype)[6:]} {rows}x{cols} (forward: align {cut.align}, edges {cut.edges}, "
                  f"{cut.chunks} chunks): " + "  ".join(f"{name} {f:.4f}/{s:.4f}" for name, (f, s) in cells),
                  flush=True)


if __name__ == "__main__":
    main()
