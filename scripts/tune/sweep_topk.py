"""Tuning data for softmax_topk (GPU): every insertion scheme, block and warp count on the issue's grid.

    python scripts/tune/sweep_topk.py [--out sweep_topk.json] [--quick] [--dtypes fp32,bf16]
                                 [--schemes one_by_one,compact,lane_best,lane_best2,lane_best_lanes,lane_best2_lanes]
                                 [--configs 1024x4,2048x8]
                                 [--max-k 16] [--cases 1024x25000x5,4096x4096x8]

Kernel time only (replayed from a CUDA graph over inputs rotated through >= 400 MB, so neither the
host's launch cost nor L2 flatters it). Next to each case: the read floor (bytes of x at the copy
bandwidth measured in this run) and the same launch grid streaming only the online normalizer
("normalizer"), the floor of this loop structure with no selection at all: what the top-k list
costs is the difference.
"""

import argparse
import itertools
import json

import torch
import triton
import triton.language as tl

import onlinesoftmax
from onlinesoftmax._triton import load_scaled, merge_normalizers, online_update, NEG_INF
from onlinesoftmax.bench.harness import copy_bandwidth_gbs, graph_time_ms, rotation_count
from onlinesoftmax.bench.topk_suite import GRID
from onlinesoftmax.ops.topk import launch as topk_launch
from onlinesoftmax.ops.topk import plan


@triton.jit
def normalizer_only_kernel(x_ptr, part_m_ptr, part_d_ptr, n_cols, x_stride_row, chunk_size, num_chunks,
                           BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    start = chunk * chunk_size
    stop = tl.minimum(start + chunk_size, n_cols)
    x_row = x_ptr + row.to(tl.int64) * x_stride_row
    m = tl.full([BLOCK], NEG_INF, tl.float32)
    d = tl.zeros([BLOCK], tl.float32)
    for block_start in range(start, stop, BLOCK):
        cols = block_start + tl.arange(0, BLOCK)
        b_x = load_scaled(x_row, cols, 1, stop, 1.0, True)
        m, d = online_update(m, d, b_x)
        # The gate the top-k kernel pays on every block (one block-wide max and a branch).
        if tl.max(b_x, 0) > 1e30:
            d += 1.0
    m_row, d_row = merge_normalizers(m, d, 0)
    tl.store(part_m_ptr + row * num_chunks + chunk, m_row)
    tl.store(part_d_ptr + row * num_chunks + chunk, d_row)


def normalizer_only(x, chosen):
    part = torch.empty((2, x.shape[0], chosen.num_chunks), device=x.device)
    normalizer_only_kernel[(x.shape[0], chosen.num_chunks)](
        x, part[0], part[1], x.shape[1], x.stride(0), chosen.chunk_size, chosen.num_chunks,
        BLOCK=chosen.block, num_warps=chosen.num_warps)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true", help="fp32 only, fewer configurations")
    parser.add_argument("--dtypes", default=None, help="comma-separated: fp32,bf16 (overrides --quick's fp32)")
    parser.add_argument("--schemes", default=None, help="comma-separated subset of one_by_one,compact,lane_best,lane_best2,lane_best_lanes,lane_best2_lanes")
    parser.add_argument("--configs", default=None, help="comma-separated BLOCKxWARPS, e.g. 1024x4,2048x8")
    parser.add_argument("--max-k", type=int, default=None, help="only the grid's cases with k up to this")
    parser.add_argument("--cases", default=None, help="comma-separated ROWSxCOLSxK (default: the grid)")
    args = parser.parse_args()
    copy = copy_bandwidth_gbs()
    print(f"copy bandwidth: {copy:.0f} GB/s", flush=True)
    results = []
    dtypes = [torch.float32] if args.quick else [torch.float32, torch.bfloat16]
    if args.dtypes:
        dtypes = [{"fp32": torch.float32, "bf16": torch.bfloat16}[d] for d in args.dtypes.split(",")]
    # (block, warps, split programs per SM)
    configs = [(2048, 8, 4), (1024, 4, 4), (2048, 4, 4), (4096, 8, 4), (4096, 4, 4)]
    if not args.quick:
        configs += [(1024, 8, 4), (4096, 16, 4), (2048, 8, 8), (1024, 4, 8), (8192, 16, 4)]
    if args.configs:
        configs = [tuple(int(v) for v in c.split("x")) + (4,) for c in args.configs.split(",")]
    # scheme -> (TOPK_COMPACT_ABOVE_K, lane_keep, second_read): the running list inserting
    # survivors one by one or compacting them, or the lanes keeping their best (any k: a sorting
    # network over the lanes' best above k = 16) or their two best (k <= plan.TOPK_LANE_KEEP2_MAX_K),
    # reading the chunk again when they must, or ("..._lanes") only the suspect lanes.
    schemes = {"one_by_one": (plan.TOPK_MAX_K, 0, None), "compact": (0, 0, None),
               "lane_best": (plan.TOPK_MAX_K, 1, "chunk"), "lane_best2": (plan.TOPK_COMPACT_ABOVE_K, 2, "chunk"),
               "lane_best_lanes": (plan.TOPK_MAX_K, 1, "lanes"), "lane_best2_lanes": (plan.TOPK_COMPACT_ABOVE_K, 2, "lanes")}
    if args.schemes:
        schemes = {name: schemes[name] for name in args.schemes.split(",")}
    runs = [(config, scheme) for config in configs for scheme in schemes
            if not (args.quick and scheme == "one_by_one" and config != configs[0])]
    grid = [case for case in GRID if args.max_k is None or case[2] <= args.max_k]
    if args.cases:
        wanted = {tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")}
        grid = sorted(wanted, key=lambda case: (case[2], case[0] * case[1]))  # any shape, not only the grid
    for dtype, (rows, cols, k) in itertools.product(dtypes, grid):
        nbytes = rows * cols * dtype.itemsize
        xs = [(torch.randn(rows, cols, device="cuda").mul_(2.0).to(dtype),) for _ in range(rotation_count(nbytes))]
        floor_us = nbytes / copy / 1e3
        want = torch.topk(torch.softmax(xs[0][0].float(), -1), k).indices
        line = f"{str(dtype)[6:]:8s} {rows}x{cols}:k{k}  floor {floor_us:6.1f} us |"
        print(line, flush=True)
        normalizer_timed = set()
        for (block, nw, pps), scheme in runs:
            compact_above_k, lane_keep, second_read = schemes[scheme]
            if lane_keep == 2 and k > plan.TOPK_LANE_KEEP2_MAX_K:
                continue
            tables = dict(TOPK_WARPS=nw, TOPK_SPLIT_PROGRAMS_PER_SM=pps, TOPK_COMPACT_ABOVE_K=compact_above_k)
            with onlinesoftmax.override_plan("topk", **tables):
                chosen = plan.topk_plan(rows, cols, k, dtype, torch.device("cuda"), None, block, None,
                                        lane_keep=lane_keep, second_read=second_read)
                if chosen.strategy == "single" and pps != 4:
                    continue  # the programs-per-SM knob only moves split plans
                try:
                    got = topk_launch.launch_forward(xs[0][0], k, 1.0, None, block, None, lane_keep=lane_keep,
                                                     second_read=second_read)[1]
                    ok = bool(torch.equal(got, want)) or dtype != torch.float32  # bf16 ties: torch's order
                    us = graph_time_ms(lambda x: topk_launch.launch_forward(x, k, 1.0, None, block, None,
                                                                            lane_keep=lane_keep,
                                                                            second_read=second_read), xs) * 1e3
                    base_us = None
                    if (block, nw, pps) not in normalizer_timed:
                        normalizer_timed.add((block, nw, pps))
                        base_us = graph_time_ms(lambda x: normalizer_only(x, chosen), xs) * 1e3
                except Exception as exc:
                    print(f"   block {block} warps {nw} pps {pps} {scheme}: {type(exc).__name__} {exc}"[:200])
                    continue
            results.append(dict(dtype=str(dtype), rows=rows, cols=cols, k=k, block=block, warps=nw,
                                programs_per_sm=pps, scheme=scheme, second_read=second_read, strategy=chosen.strategy,
                                num_chunks=chosen.num_chunks, us=us, normalizer_us=base_us, floor_us=floor_us,
                                indices_equal_torch=ok))
            base = f" normalizer {base_us:7.1f}" if base_us else ""
            print(f"   {chosen.strategy:6s} chunks {chosen.num_chunks:3d} block {block:5d} warps {nw:2d} "
                  f"{scheme:10s} {us:8.1f} us{base}{'' if ok else '  INDICES DIFFER'}", flush=True)
        del xs
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(copy_gbs=copy, device=torch.cuda.get_device_name(), results=results), f, indent=1)


if __name__ == "__main__":
    main()
