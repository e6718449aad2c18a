"""Decode knobs (GPU): the split-count, key-tile and stage tables of ``ops/decode/plan.py`` under
other values, on the decode bench's rows.

    python scripts/tune/sweep_decode.py [--rows B1-H8/1 ...] [--shapes 1x32x8x1x131072x72x0 ...]
        [--variants default waves8 ...] [--peer sdpa-cudnn]

Each line: one bench row under one variant, CUDA-graph replays over rotated inputs (the kernels
alone) and do_bench with L2 flushes (what the bench's eager column reports), GB/s of the visible
K/V plus q and out, the plan's splits and programs, and the relative error against the float32
reference on the first input set. Variants change tables only through
``onlinesoftmax.override_plan("decode", ...)``. ``--peer``: an SDPA backend timed the same way on
each row first, in the same process.
"""

import argparse

import torch

import onlinesoftmax
from onlinesoftmax.bench import decode_suite
from onlinesoftmax.bench.harness import copy_bandwidth_gbs, graph_time_ms, relative_error, rotation_count, time_ms
from onlinesoftmax.ops.decode import plan as decode_plan

VARIANTS = {
    "default": {},
    "waves1": dict(TARGET_WAVES=1),
    "waves2": dict(TARGET_WAVES=2),
    "waves3": dict(TARGET_WAVES=3),
    "waves4": dict(TARGET_WAVES=4),
    "waves8": dict(TARGET_WAVES=8),
    "min_keys128": dict(MIN_SPLIT_KEYS=128),
    "min_keys512": dict(MIN_SPLIT_KEYS=512),
    "partials1/4": dict(PARTIAL_BYTES_FRACTION=1 / 4),
    "partials1/64": dict(PARTIAL_BYTES_FRACTION=1 / 64),
    "resident2": dict(PROGRAMS_PER_SM=2),
    "resident4": dict(PROGRAMS_PER_SM=4),
    "keys128": dict(KEY_TILE_ELEMENTS=16384),
    "keys32": dict(KEY_TILE_ELEMENTS=4096),
    "stages4": dict(NUM_STAGES={"none": 4, "per block": 6, "per key": 6}),
    "stages2": dict(NUM_STAGES={"none": 2, "per block": 5, "per key": 5}),
    "keys128_stages2": dict(KEY_TILE_ELEMENTS=16384, NUM_STAGES={"none": 2, "per block": 4, "per key": 4}),
    "waves8_keys128": dict(TARGET_WAVES=8, MIN_SPLIT_KEYS=128),
    "partials1/4_keys128": dict(PARTIAL_BYTES_FRACTION=1 / 4, MIN_SPLIT_KEYS=128),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", nargs="*", default=[], help="label prefixes of decode_suite.GRID rows (default: all)")
    parser.add_argument("--shapes", nargs="*", default=[],
                        help="rows off the grid, as bench decode's --shape: BxHqxHkvxSqxSxDxPAGE")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--peer", choices=("sdpa-cudnn", "sdpa-flash"),
                        help="also time this SDPA backend on each row, in the same process")
    args = parser.parse_args()
    copy = copy_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}, copy {copy:.0f} GB/s", flush=True)
    shapes = [s for s in decode_suite.GRID if (args.rows or not args.shapes)
              and (not args.rows or any(s.label().startswith(r) for r in args.rows))]
    shapes += [decode_suite.parse_shape(text) for text in args.shapes]
    gen = torch.Generator().manual_seed(0)
    for shape in shapes:
        case = decode_suite.make_case(shape, torch.bfloat16)
        sets = [case.make_inputs(gen) for _ in range(rotation_count(case.bytes_moved))]
        reference = case.reference(sets[0])
        floor_us = case.bytes_moved / copy / 1e3
        print(f"\n{shape.label()}: {case.bytes_moved / 1e6:.0f} MB, floor {floor_us:.1f} us", flush=True)
        if args.peer:
            time_peer(args.peer, sets, case)
        for name in args.variants:
            with onlinesoftmax.override_plan("decode", **VARIANTS[name]):
                fn = decode_suite.ours
                err = relative_error(fn(*sets[0]).float(), reference)
                chosen = decode_plan.last_plan()
                graph = graph_time_ms(fn, sets)
                eager = time_ms(fn, sets)
            programs = chosen.grid[0] * chosen.grid[1]
            graph_text = f"{graph * 1e3:7.1f} us {case.bytes_moved / graph / 1e6:5.0f} GB/s" if graph else "graph failed"
            print(f"  {name:20s} graph {graph_text}  eager {eager * 1e3:7.1f} us  "
                  f"{chosen.path} slots {chosen.slots} target {chosen.target_splits} min {chosen.min_chunk_blocks}"
                  f"x{chosen.block_n} programs<= {programs}  err {err:.1e}", flush=True)
        del sets
        torch.cuda.empty_cache()


def time_peer(name: str, sets, case) -> None:
    """One SDPA backend on the row's input sets, timed as ours (its views of the cache built untimed)."""
    _, sdpa, _ = decode_suite.implementations()
    peer = sdpa[name]
    for inputs in sets:  # build the gathered views (inputs[-1]) before any timing
        peer(*inputs)
    graph = graph_time_ms(peer, sets)
    eager = time_ms(peer, sets)
    graph_text = f"{graph * 1e3:7.1f} us {case.bytes_moved / graph / 1e6:5.0f} GB/s" if graph else "graph failed"
    print(f"  {name:20s} graph {graph_text}  eager {eager * 1e3:7.1f} us", flush=True)


if __name__ == "__main__":
    main()
