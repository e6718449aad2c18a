"""softmax and log_softmax over a dim that is not the last (GPU): (N, C, H, W) over C, columns of a
matrix (dim 0), attention-shaped scores over their keys at dim -2; the plan's strategy and rows
against torch, forward and a training step (forward, then the input's gradient), eager (back to back,
the host included) and under CUDA graphs, ms; and the forward's error against float64.

    python scripts/probes/probe_softmax_inner_dims.py [--dtype bf16] [--cases 8x21x256x256:1,4096x1000:0]
        [--override "ROW_UNIT_TILE_ELEMENTS={4: 2048, 2: 4096}"]

``--override NAME=VALUE``: our runs under that softmax plan table value (a Python literal).
"""

import argparse

import torch

import onlinesoftmax
from onlinesoftmax.bench import cross_entropy_suite as suite
from onlinesoftmax.bench.harness import back_to_back_ms, graph_time_ms, plan_tables, relative_error, rotation_count
from onlinesoftmax.ops.softmax import plan

CASES = ("8x21x256x256:1,1x19x512x1024:1,32x1000x7x7:1,64x128x32x32:1,4096x1000:0,1000x50257:0,16x1024x1024:-2,"
         "4x16x2048x128:-2,2x4x8192x16:1")
OPS = {"softmax": (onlinesoftmax.softmax, torch.softmax), "log_softmax": (onlinesoftmax.log_softmax, torch.log_softmax)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=suite.DTYPES)
    parser.add_argument("--cases", default=CASES, help="SHAPE:DIM, comma-separated")
    parser.add_argument("--override", action="append", default=[], help="NAME=VALUE, a Python literal")
    args = parser.parse_args()
    if args.override:
        print(f"# under {args.override}")
    with onlinesoftmax.override_plan("softmax", **plan_tables(args.override)):
        run(args.cases, suite.DTYPES[args.dtype])


def run(cases: str, dtype: torch.dtype) -> None:
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {dtype}; ms: forward eager, graph | "
          "step eager, graph; torch / ours (ratio, torch over ours)")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for case in cases.split(","):
        shape_text, dim = case.split(":")
        shape, dim = tuple(map(int, shape_text.split("x"))), int(dim)
        count = min(rotation_count(2 * torch.Size(shape).numel() * dtype.itemsize), 4)
        sets = [((torch.randn(shape, device="cuda", generator=gen) * 3).to(dtype).requires_grad_(),)
                for _ in range(count)]
        for name, (ours, theirs) in OPS.items():
            def forward(fn):
                return lambda x: fn(x, dim)

            def step(fn):
                def run(x):
                    y = fn(x, dim)
                    return torch.autograd.grad(y, x, y.detach())  # a cotangent of the output's own values
                return run

            with torch.no_grad():
                got = ours(sets[0][0], dim)
            chosen = plan.last_plan()
            err = relative_error(got.double(), theirs(sets[0][0].double(), dim))
            cells = []
            for make in (forward, step):
                for timer in (back_to_back_ms, graph_time_ms):
                    t_ms, o_ms = timer(make(theirs), sets), timer(make(ours), sets)
                    cells.append(f"{t_ms:.4f} / {o_ms:.4f} ({t_ms / o_ms:.2f}x)" if t_ms and o_ms else "-")
            unit = ", rows of unit stride" if getattr(chosen, "unit_rows", False) else ""
            print(f"{name:11s} {shape_text:>14s} dim {dim:2d} | {chosen.strategy}, {chosen.num_warps} warps, "
                  f"grid {chosen.grid}{unit} | " + " | ".join(cells) + f" | err {err:.1e}", flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
