"""In place, rows just past a wave of two_pass programs: the plan against two_pass and separate. (GPU)

two_pass's programs of 32 warps run one an SM, a row each; rows a little past a multiple of the SMs
leave a few programs to run alone after the rest (plan.TWO_PASS_SEPARATE_*). The in-place forward
(the gradient written over the logits: the step's whole GPU work for an upstream gradient of 1)
under CUDA graphs, ms, as the plan chooses and with each strategy forced.

    python scripts/probes/probe_cross_entropy_inplace_waves.py [--shapes bf16:140x128256,fp32:175x65537]
"""

import argparse

import torch

from onlinesoftmax.bench.harness import graph_time_ms, rotation_count
from onlinesoftmax.ops.cross_entropy import launch, plan

OPTIONS = (-100, "mean", 0.0, 0.0, 0.0, 1.0, False)
SHAPES = ("bf16:140x128256,bf16:170x128256,bf16:190x128256,bf16:270x128256,bf16:280x128256,bf16:290x128256,"
          "bf16:310x128256,bf16:133x200019,bf16:160x200019,bf16:275x200019,bf16:160x100000,bf16:270x100000,"
          "fp32:140x65537,fp32:175x65537,fp32:270x65537,fp32:285x65537,fp32:150x32000,fp32:280x32000")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES, help="comma-separated DTYPE:ROWSxCOLS")
    args = parser.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; ms under CUDA graphs, the in-place forward")
    for item in args.shapes.split(","):
        name, shape = item.split(":")
        dtype = DTYPES[name]
        rows, cols = map(int, shape.split("x"))
        xs = [torch.randn(rows, cols, device="cuda", dtype=dtype)
              for _ in range(max(2, rotation_count(rows * cols * dtype.itemsize)))]
        target = torch.randint(0, cols, (rows,), device="cuda")
        cells = []
        for strategy in (None, "two_pass", "separate"):
            ms = graph_time_ms(lambda x: launch.launch_forward(x, target, None, *OPTIONS, strategy, inplace=True),
                               [(x,) for x in xs])
            label = f"plan {plan.last_plan().strategy}" if strategy is None else f"forced {strategy}"
            cells.append(f"{label} {ms:.4f}")
        print(f"{str(dtype)[6:]:9s} {rows:5d}x{cols:<7d} " + " | ".join(cells), flush=True)
        xs.clear()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
