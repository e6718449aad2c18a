"""row_on_chip on few short rows under CUDA graphs, where the host's time is gone and torch's kernel
took 2.0-2.2 µs against ours 3.4-4.1 at 10 x 221 (the softmax sweep's random shapes): the plan as
it packs rows (up to ROW_TILE_ELEMENTS a program) against the same with ROW_TILE_SPREAD_OVER_SMS
(no more rows a program than leave every SM one), beside torch.

Each line: op, dtype, shape, rows a program and programs of each plan, then µs a call of CUDA-graph
replays (harness.graph_time_ms: one call a rotated input set) for torch, the plan, the spread plan.

    python scripts/probes/probe_small_rows_graph.py     (GPU)
"""

import torch

import onlinesoftmax
from onlinesoftmax.bench import harness
from onlinesoftmax.ops.softmax import plan

SHAPES = [(10, 221), (16, 710), (5, 1172), (1, 1000), (8, 2048), (32, 1000), (64, 512), (56, 1366),
          (193, 1069), (1024, 256)]
OPS = {"softmax": (onlinesoftmax.softmax, torch.softmax), "log_softmax": (onlinesoftmax.log_softmax, torch.log_softmax)}


def main():
    gen = torch.Generator().manual_seed(0)
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}; µs a call, CUDA-graph replays", flush=True)
    for dtype in (torch.bfloat16, torch.float32):
        for rows, cols in SHAPES:
            sets = [((torch.randn(rows, cols, generator=gen) * 2).to("cuda", dtype),) for _ in range(4)]
            for name, (ours, theirs) in OPS.items():
                parts = [f"torch {1000 * harness.graph_time_ms(lambda x: theirs(x, -1), sets):.2f}"]
                for label, spread in (("plan", False), ("spread", True)):
                    with onlinesoftmax.override_plan("softmax", ROW_TILE_SPREAD_OVER_SMS=spread,
                                                     EAGER_HOST_US=plan.EAGER_ROUTE_OFF):
                        out = ours(sets[0][0], -1)
                        chosen = plan.last_plan()
                        err = ((out.double() - theirs(sets[0][0].double(), -1)).norm()
                               / theirs(sets[0][0].double(), -1).norm()).item()
                        ms = harness.graph_time_ms(lambda x: ours(x, -1), sets)
                    parts.append(f"{label} {chosen.strategy} {chosen.rows_per_program}r x{chosen.grid[0]} "
                                 f"{chosen.num_warps}w {1000 * ms:.2f} (err {err:.0e})")
                print(f"{name} {str(dtype)[6:]} {rows}x{cols}: " + " | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
