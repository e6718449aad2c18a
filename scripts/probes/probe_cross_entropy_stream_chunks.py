"""How many chunks a row for the stream forward? (GPU)

The forward that keeps the logits (the stream kernel) cuts each row into chunks of tiles, a program
a chunk; the row's last program to finish merges the chunks' partials (plan.STREAM_MIN_PROGRAMS_PER_SM,
STREAM_MAX_CHUNKS). The forward alone (a "mean" loss, no gradient), do_bench with the L2 flushed,
at each cap on the chunks a row (1: the whole row in one program; 256: one tile a program for these
rows), beside what the plan chooses without and with its waves balanced.

    python scripts/probes/probe_cross_entropy_stream_chunks.py
    python scripts/probes/probe_cross_entropy_stream_chunks.py --graph --shapes 333x256003,700x128256 --caps 1,2,3,4
"""

import argparse

import torch

import onlinesoftmax
from onlinesoftmax import _device
from onlinesoftmax.bench.harness import graph_time_ms, rotation_count, time_ms
from onlinesoftmax.ops.cross_entropy import launch, plan

SHAPES = ((8192, 128256), (8192, 50257), (8192, 32000), (32768, 32000), (16384, 50257), (4096, 256000),
          (2048, 50257), (1024, 128256), (528, 128256), (132, 128256), (64, 151937), (8192, 4097))
CAPS = (256, 1, 2, 4, 8, 16)
OPTIONS = (-100, "mean", 0.0, 0.0, 0.0, 1.0)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", help="comma-separated ROWSxCOLS instead of SHAPES")
    parser.add_argument("--caps", default=",".join(map(str, CAPS)), help="comma-separated caps on the chunks a row")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--graph", action="store_true",
                        help="time replays of a CUDA graph (the host's launch hidden) instead of do_bench")
    return parser.parse_args()


def main():
    args = parse_args()
    shapes = SHAPES if not args.shapes else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    caps = [int(c) for c in args.caps.split(",")]
    torch.manual_seed(0)
    timer = "CUDA-graph replays" if args.graph else "do_bench"
    print(f"# {torch.cuda.get_device_name()}, {_device.sm_count(torch.device('cuda'))} SMs, torch {torch.__version__}; "
          f"ms of the forward ({timer}); 'cap C (chunks x tiles)', programs = rows x chunks")
    for dtype in [getattr(torch, name) for name in args.dtypes.split(",")]:
        for rows, cols in shapes:
            n_sets = max(2, rotation_count(rows * cols * dtype.itemsize))
            xs = [torch.randn(rows, cols, device="cuda", dtype=dtype) for _ in range(n_sets)]
            target = torch.randint(0, cols, (rows,), device="cuda")

            def forward(x):
                return launch.launch_forward(x, target, None, *OPTIONS, False)

            def timed():
                sets = [(x,) for x in xs]
                return graph_time_ms(forward, sets) if args.graph else time_ms(forward, sets)

            cells = []
            # the cap alone decides (no programs an SM asked for, no waves balanced); then the plan
            # without and with its waves balanced (plan.STREAM_BALANCE_MAX_WAVES)
            settings = [(f"cap {cap:3d}", dict(STREAM_MAX_CHUNKS=cap, STREAM_MIN_PROGRAMS_PER_SM=1 << 30,
                                               STREAM_BALANCE_MAX_WAVES=0)) for cap in caps]
            settings += [("unbalanced", dict(STREAM_BALANCE_MAX_WAVES=0)), ("plan", {})]
            for label, tables in settings:
                with onlinesoftmax.override_plan("cross_entropy", **tables):
                    chosen = plan.choose("forward", rows, cols, dtype, torch.device("cuda"))
                    cells.append(f"{label} ({chosen.num_chunks:3d} chunks x {chosen.tiles_per_chunk:2d}) "
                                 f"{timed():.4f}")
            print(f"{str(dtype)[6:]:9s} {rows:6d}x{cols:<7d} " + " | ".join(cells), flush=True)
            xs.clear()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
