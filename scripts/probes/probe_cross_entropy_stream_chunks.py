"""How many chunks a row for the stream forward? (GPU)

The forward that keeps the logits (the stream kernel) cuts each row into chunks of tiles, a program
a chunk; the row's last program to finish merges the chunks' partials (plan.STREAM_MIN_PROGRAMS_PER_SM,
STREAM_MAX_CHUNKS). The forward alone (a "mean" loss, no gradient), do_bench with the L2 flushed,
at each cap on the chunks a row (1: the whole row in one program; 256: one tile a program for these
rows), beside what the plan chooses.

    python scripts/probes/probe_cross_entropy_stream_chunks.py
"""

import torch

import onlinesoftmax
from onlinesoftmax.bench.harness import time_ms
from onlinesoftmax.ops.cross_entropy import launch, plan

SHAPES = ((8192, 128256), (8192, 50257), (8192, 32000), (32768, 32000), (16384, 50257), (4096, 256000),
          (2048, 50257), (1024, 128256), (528, 128256), (132, 128256), (64, 151937), (8192, 4097))
CAPS = (256, 1, 2, 4, 8, 16)
OPTIONS = (-100, "mean", 0.0, 0.0, 0.0, 1.0)


def main():
    torch.manual_seed(0)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; ms of the forward; 'cap C (chunks x tiles)'")
    for dtype in (torch.bfloat16, torch.float32):
        for rows, cols in SHAPES:
            xs = [torch.randn(rows, cols, device="cuda", dtype=dtype) for _ in range(2)]
            target = torch.randint(0, cols, (rows,), device="cuda")

            def forward(x):
                return launch.launch_forward(x, target, None, *OPTIONS, False)

            cells = []
            for cap in CAPS:  # the cap alone decides (no programs an SM asked for)
                with onlinesoftmax.override_plan("cross_entropy", STREAM_MAX_CHUNKS=cap,
                                                 STREAM_MIN_PROGRAMS_PER_SM=1 << 30):
                    chosen = plan.choose("forward", rows, cols, dtype, torch.device("cuda"))
                    cells.append(f"cap {cap:3d} ({chosen.num_chunks:3d} chunks x {chosen.tiles_per_chunk:2d}) "
                                 f"{time_ms(forward, [(x,) for x in xs]):.4f}")
            chosen = plan.choose("forward", rows, cols, dtype, torch.device("cuda"))
            cells.append(f"plan ({chosen.num_chunks:3d} chunks x {chosen.tiles_per_chunk:2d}) "
                         f"{time_ms(forward, [(x,) for x in xs]):.4f}")
            print(f"{str(dtype)[6:]:9s} {rows:6d}x{cols:<7d} " + " | ".join(cells), flush=True)
            del xs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
