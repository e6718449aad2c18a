"""Cross-entropy tables (GPU): ``ops/cross_entropy/plan.py``'s tiles and strategies under other
values, one training step (forward + gradient, "mean") as the bench times it.

    python scripts/tune/sweep_cross_entropy.py [--shapes 8192x128256 ...] [--variants default ...] [--modes inplace separate]
        [--graph]

Each line: one shape, one mode (inplace_backward=True: the gradient written over the logits by the
forward; separate: the forward reads, the backward reads again and writes; inplace_smooth,
inplace_softcap, inplace_weight, inplace_z and two pairs: in place with label smoothing 0.1, softcap
30, a weight of one per class or z-loss 1e-4, each of which leaves rows to the general kernel), one
variant; do_bench medians over rotated inputs, GB/s against that mode's floor bytes (fused: logits read + gradient
written; separate: 2 reads + 1 write), the plans the step ran. Variants change tables only through
``onlinesoftmax.override_plan("cross_entropy", ...)``. ``--graph`` adds the step replayed from a CUDA
graph (each input set once a replay): the GPU's time alone, where an eager step of a few hundred
microseconds is the host's.
"""

import argparse

import torch

import onlinesoftmax
from onlinesoftmax.bench import cross_entropy_suite as suite
from onlinesoftmax.bench.harness import copy_bandwidth_gbs, graph_time_ms, rotation_count, time_ms
from onlinesoftmax.bench.shapes import parse_dims
from onlinesoftmax.ops.cross_entropy import launch as ce_launch, plan as ce_plan

def _two_pass(warps: int, hold_l2: bool = True, tile_bytes: int = 0) -> dict:
    """two_pass forced at every row length, the general kernel at ``warps`` a program in every dtype
    (0: by the tile) over tiles of ``tile_bytes`` (0: the stream tile), whatever the options."""
    table = {e: ((1 << 62, warps, tile_bytes // e),) for e in (4, 2)}
    return dict(SPLIT_MAX_TILE=0, ON_CHIP_MAX_COLS={4: 0, 2: 0}, TWO_PASS_HOLD_L2=hold_l2, TWO_PASS_LAUNCH=table,
                TWO_PASS_OPTIONS_LAUNCH={})


def _plain_bf16(*table) -> dict:
    """The kernel for plain rows with ``table`` for bf16 rows (fp32's as planned)."""
    return dict(TWO_PASS_PLAIN_LAUNCH={4: ce_plan.TWO_PASS_PLAIN_LAUNCH[4], 2: table})


def _plain_fp32(*table) -> dict:
    """The kernel for plain rows with ``table`` for fp32 rows (bf16's as planned)."""
    return dict(TWO_PASS_PLAIN_LAUNCH={4: table, 2: ce_plan.TWO_PASS_PLAIN_LAUNCH[2]})


def _plain(warps: int, tile_bytes: int) -> dict:
    """two_pass's kernel for plain rows at ``warps`` a program over tiles of ``tile_bytes``, every row length."""
    return dict(TWO_PASS_PLAIN_LAUNCH={e: ((1 << 62, warps, tile_bytes // e),) for e in (4, 2)})


def _plain_caps(caps: dict) -> dict:
    """The plan's PLAIN_MAX_REGISTERS with ``caps`` in place of some of its entries."""
    return dict(PLAIN_MAX_REGISTERS={**ce_plan.PLAIN_MAX_REGISTERS, **caps})


VARIANTS = {
    "default": {},
    "split_tile32K": dict(SPLIT_TILE_BYTES=32768, SPLIT_MAX_TILE=32768),
    "split_tile8K": dict(SPLIT_TILE_BYTES=8192),
    "elements32": dict(ELEMENTS_PER_THREAD=32),
    "elements8": dict(ELEMENTS_PER_THREAD=8),
    # two_pass with the first plan's tables (no eviction hints, warps by the tile), then the hints
    # with warps by the tile and at 32, 16 and 8.
    "two_pass_plain": _two_pass(0, hold_l2=False),
    "two_pass_hold": _two_pass(0),
    "two_pass_hold_w32": _two_pass(32),
    "two_pass_hold_w16": _two_pass(16),
    "two_pass_hold_w8": _two_pass(8),
    # two_pass with larger tiles (Liger's in-place kernel: 32768 columns a step on 32 warps).
    "two_pass_hold_w32_64K": _two_pass(32, tile_bytes=65536),
    "two_pass_hold_w32_32K": _two_pass(32, tile_bytes=32768),
    "two_pass_hold_w16_32K": _two_pass(16, tile_bytes=32768),
    # Smaller programs for the general kernel's options (label smoothing, softcap: 40-48 registers a
    # thread at 32 warps, one program an SM; scripts/probes/kernel_resources.py --ce-options).
    "two_pass_hold_w32_16K": _two_pass(32, tile_bytes=16384),
    "two_pass_hold_w16_16K": _two_pass(16, tile_bytes=16384),
    "two_pass_hold_w8_8K": _two_pass(8, tile_bytes=8192),
    "two_pass_hold_w8_16K": _two_pass(8, tile_bytes=16384),
    "two_pass_hold_w16_8K": _two_pass(16, tile_bytes=8192),
    "two_pass_hold_w4_4K": _two_pass(4, tile_bytes=4096),
    "two_pass_nohold_w32_64K": _two_pass(32, hold_l2=False, tile_bytes=65536),
    # The plan's launches but 64 KB tiles for bf16 rows over 128 KB.
    "two_pass_big_rows_64K": dict(TWO_PASS_LAUNCH={4: ((1 << 62, 32, 0),),
                                                   2: ((65536, 8, 0), (131072, 16, 0), (1 << 62, 32, 32768))}),
    # The general kernel's launches before its rows over 128 KB took larger tiles.
    "two_pass_before_big_tiles": dict(TWO_PASS_LAUNCH={4: ((1 << 62, 32, 0),),
                                                       2: ((65536, 8, 0), (131072, 16, 0), (1 << 62, 32, 16384))}),
    "split_on_chip": dict(TWO_PASS_MIN_ROWS_PER_SM={4: 0, 2: 0}),
    # The kernel for plain rows (the default options) under other launches.
    "plain_64K_w32": _plain(32, 65536),
    "plain_32K_w32": _plain(32, 32768),
    "plain_32K_w16": _plain(16, 32768),
    "plain_16K_w16": _plain(16, 16384),
    "plain_16K_w8": _plain(8, 16384),
    "plain_8K_w4": _plain(4, 8192),
    "plain_8K_w8": _plain(8, 8192),
    "plain_4K_w4": _plain(4, 4096),
    # fp32's rows of up to 200 KB on the table for longer rows (32 warps over 64 KB tiles, as before).
    "plain_fp32_w32_64K": dict(TWO_PASS_PLAIN_LAUNCH={4: ((1 << 62, 32, 16384),),
                                                      2: ce_plan.TWO_PASS_PLAIN_LAUNCH[2]}),
    # Every tile of the kernel for plain rows the table's, a row's short last part too (before PLAIN_TAIL_MAX_SHARE).
    "plain_no_tail": dict(PLAIN_TAIL_MAX_SHARE=0),
    # The bf16 table and no tail as before the tail: rows of 64-192 KB at 32 warps over 32 KB tiles,
    # longer ones over 64 KB.
    "plain_before_mid": dict(PLAIN_TAIL_MAX_SHARE=0, **_plain_bf16(
        (65536, 8, 8192), (196608, 32, 16384), (1 << 62, 32, 32768))),
    # bf16 rows of 64-112 KB on smaller programs: 8 warps over 16 KB tiles, 4 over 8 KB, or each in
    # part (rows of 192-240 KB over 64 KB tiles, as when these ran).
    "plain_mid_16K_w8": _plain_bf16((65536, 8, 8192), (114688, 8, 8192), (196608, 32, 16384), (1 << 62, 32, 32768)),
    "plain_mid_8K_w4": _plain_bf16((65536, 8, 8192), (114688, 4, 4096), (196608, 32, 16384), (1 << 62, 32, 32768)),
    "plain_mid_split": _plain_bf16((81920, 8, 8192), (114688, 4, 4096), (196608, 32, 16384), (1 << 62, 32, 32768)),
    # Rows that are not whole 16-byte vectors: the general kernel, or the kernel for plain rows
    # over runs of 16 or 128 bytes (partial first and last runs element-wise).
    "general_edges": dict(PLAIN_EDGES={4: (1 << 62, 16), 2: (1 << 62, 16)}),
    "plain_edges16": dict(PLAIN_EDGES={4: (0, 16), 2: (0, 16)}),
    "plain_edges128": dict(PLAIN_EDGES={4: (0, 128), 2: (0, 128)}),
    "plain_edges16_16K_w16": dict(PLAIN_EDGES={4: (0, 16), 2: (0, 16)}, **_plain(16, 16384)),
    "plain_edges128_16K_w16": dict(PLAIN_EDGES={4: (0, 128), 2: (0, 128)}, **_plain(16, 16384)),
    # The kernel for plain rows over rows of partial vectors at most PLAIN_EDGES_UP_TO bytes long:
    # none (the general kernel's) and no register caps, as before the band; the band over runs of 16
    # bytes in fp32 too; under other caps (PLAIN_MAX_REGISTERS: none; bf16 rows with edges at 56 or
    # 48; bf16 aligned rows uncapped; fp32 rows with edges at 40, three 16-warp programs an SM).
    "plain_before_band": dict(PLAIN_EDGES_UP_TO={4: 0, 2: 0}, PLAIN_MAX_REGISTERS={}),
    # The band up to the rows of the table's 8-warp (bf16) and 16-warp (fp32) programs only, the
    # general kernel up to PLAIN_EDGES' bytes (the plan before the band reached further), and the
    # band up to them in bf16 too.
    "plain_band_before_wide": dict(PLAIN_EDGES_UP_TO={4: 204800, 2: 110592}),
    "plain_band_bf16_to_192K": dict(PLAIN_EDGES_UP_TO={4: 262143, 2: 196608}),
    "plain_band_runs16": dict(PLAIN_EDGES={4: (262144, 16), 2: (196608 + 1, 16)}),
    "plain_uncapped": dict(PLAIN_MAX_REGISTERS={}),
    "plain_edges_cap56": _plain_caps({(2, 8, True): (56, 1 << 62)}),
    "plain_edges_cap48": _plain_caps({(2, 8, True): (48, 1 << 62)}),
    "plain_aligned_uncapped": dict(PLAIN_MAX_REGISTERS={(2, 8, True): (64, 1 << 62)}),
    "plain_aligned_cap48_any": _plain_caps({(2, 8, False): (48, 1 << 62)}),
    "plain_fp32_edges_cap40": _plain_caps({(4, 16, True): (40, 1 << 62)}),
    # fp32 rows of up to 200 KB (and the band's rows with edges) on 8 warps over 16 or 32 KB tiles,
    # in place of 16 warps over 32 KB: once the target left the kernel's loops, 16 warps there took
    # 40 registers and kept 2 of 4 loads in flight (8 warps over 16 KB: 39 and 4 of 4).
    "plain_fp32_16K_w8": _plain_fp32((204800, 8, 4096), (1 << 62, 32, 16384)),
    "plain_fp32_32K_w8": _plain_fp32((204800, 8, 8192), (1 << 62, 32, 16384)),
    # ... on 32 warps over 32 KB tiles (29 registers: two programs an SM, 2 of 2 loads in flight), or
    # on 16 warps over 32 KB tiles in two loops (whole tiles, then half tiles: 4 of 4 and 2 of 2).
    "plain_fp32_32K_w32": _plain_fp32((204800, 32, 8192), (1 << 62, 32, 16384)),
    "plain_fp32_two_loops": _plain_caps({(4, 16, False): (48, 1 << 62)}),
    # fp32 rows of 96-200 KB on 16 warps as before (the plan's 32 warps from 96 KB), and the band's
    # fp32 rows with edges on 32 warps over 32 KB tiles.
    "plain_fp32_w16_to_200K": _plain_fp32((204800, 16, 8192), (1 << 62, 32, 16384)),
    "plain_fp32_band_32K_w32": dict(PLAIN_EDGES_BAND_LAUNCH={4: (262143, 32, 8192), 2: (110592, 8, 8192)}),
    "plain_fp32_band_16K_w8": dict(PLAIN_EDGES_BAND_LAUNCH={4: (262143, 8, 4096), 2: (110592, 8, 8192)}),
    "plain_fp32_all_16K_w8": dict(PLAIN_EDGES_BAND_LAUNCH={4: (262143, 8, 4096), 2: (110592, 8, 8192)},
                                  **_plain_fp32((204800, 8, 4096), (1 << 62, 32, 16384))),
    # bf16 rows with edges of 108-192 KB on 8 warps over 16 KB tiles up to 129 KB and the general
    # kernel from there (the plan before their 32-warp programs under a cap of 32); on 16 warps over 16
    # KB tiles (40 registers, three programs an SM); on the 32-warp programs uncapped (52 registers,
    # one program); and the bf16 32-warp programs uncapped, aligned rows too.
    "plain_band_bf16_before_w32": dict(PLAIN_EDGES_UP_TO={4: 262143, 2: 132096},
                                       PLAIN_EDGES_BAND_LAUNCH={4: (262143, 16, 8192), 2: (196608, 8, 8192)}),
    "plain_band_bf16_w16": dict(PLAIN_EDGES_BAND_LAUNCH={4: (262143, 16, 8192), 2: (1 << 62, 16, 8192)}),
    "plain_band_bf16_w32_uncapped": dict(PLAIN_MAX_REGISTERS={
        k: v for k, v in ce_plan.PLAIN_MAX_REGISTERS.items() if k != (2, 32, True)}),
    # Under any cap, the kernel's one masked loop where a row has no last part of its own (the plan
    # splits it into whole and half tiles under caps below PLAIN_ONE_LOOP_MIN_REGISTERS).
    "plain_one_loop_any": dict(PLAIN_ONE_LOOP_MIN_REGISTERS=0),
    # bf16 rows with edges of 192-240 KB (PLAIN_EDGES' over 16-byte runs, 32 KB tiles) at 32 registers too.
    "plain_edges_w32_cap_to_240K": _plain_caps({(2, 32, True): (32, 245760)}),
    "plain_w32_uncapped": dict(PLAIN_MAX_REGISTERS={
        k: v for k, v in ce_plan.PLAIN_MAX_REGISTERS.items() if k[1] != 32}),
    "stream_runs128": dict(STREAM_RUN_BYTES={4: 128, 2: 128}),
    "stream_runs64": dict(STREAM_RUN_BYTES={4: 64, 2: 64}),
    # Label smoothing and softcap rows on TWO_PASS_LAUNCH (before their own tables).
    "options_general": dict(TWO_PASS_OPTIONS_LAUNCH={}),
    # The general table's bf16 rows of up to 32 KB on 16 KB tiles (8 warps, as those of up to 64 KB).
    "general_small_16K": dict(TWO_PASS_LAUNCH={4: ce_plan.TWO_PASS_LAUNCH[4],
                                               2: ((65536, 8, 0),) + ce_plan.TWO_PASS_LAUNCH[2][2:]}),
    # The stream forward and the backward: a row's last part in a program of its own (before
    # STREAM_TAIL_MAX_SHARE), or with the row's last tile however wide it is.
    "stream_no_tail": dict(STREAM_TAIL_MAX_SHARE=0),
    "stream_tail_any": dict(STREAM_TAIL_MAX_SHARE=1),
    "stream_tail_few_rows": dict(STREAM_TAIL_MIN_ROWS_PER_SM=0),  # fewer rows than two an SM take it too
    # The stream's last chunk reduces the row's last part: before its tiles, after them, or between
    # its first tile's load and that tile's reduction, in both element sizes.
    "stream_tail_first": dict(STREAM_TAIL_ORDER={4: "first", 2: "first"}),
    "stream_tail_last": dict(STREAM_TAIL_ORDER={4: "last", 2: "last"}),
    "stream_tail_overlap": dict(STREAM_TAIL_ORDER={4: "overlap", 2: "overlap"}),
    "stream32K": dict(STREAM_BLOCK={4: 8192, 2: 16384}, BACKWARD_BLOCK={4: 8192, 2: 16384}),
    "stream8K": dict(STREAM_BLOCK={4: 2048, 2: 4096}, BACKWARD_BLOCK={4: 2048, 2: 4096}),
}
# inplace_OPTION: an option keeps every row from the kernel for plain rows (the general one's rows);
# "weight" is a weight of one per class.
MODES = {"inplace": dict(inplace_backward=True), "separate": {},
         "inplace_smooth": dict(inplace_backward=True, label_smoothing=0.1),
         "inplace_softcap": dict(inplace_backward=True, softcap=30.0),
         "inplace_weight": dict(inplace_backward=True, weight="ones"),
         "inplace_z": dict(inplace_backward=True, z_loss=1e-4),
         "inplace_smooth_softcap": dict(inplace_backward=True, label_smoothing=0.1, softcap=30.0),
         "inplace_smooth_weight": dict(inplace_backward=True, label_smoothing=0.1, weight="ones")}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="*", default=["8192x128256", "8192x50257", "8192x32000"])
    parser.add_argument("--dtype", default="bf16", choices=list(suite.DTYPES))
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    parser.add_argument("--graph", action="store_true", help="also time the step replayed from a CUDA graph")
    args = parser.parse_args()
    dtype = suite.DTYPES[args.dtype]
    copy = copy_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}, copy {copy:.0f} GB/s", flush=True)
    gen = torch.Generator().manual_seed(0)
    for text in args.shapes:
        shape = parse_dims(text, 2)
        case = suite.case(shape, dtype)
        sets = [case.make_inputs(gen) for _ in range(rotation_count(case.bytes_moved))]
        logits_bytes = shape[0] * shape[1] * dtype.itemsize
        print(f"\n{text} {args.dtype}: logits {logits_bytes / 1e9:.2f} GB; floors {2 * logits_bytes / copy / 1e6:.3f} ms "
              f"fused, {3 * logits_bytes / copy / 1e6:.3f} ms separate", flush=True)
        for mode in args.modes:
            options = dict(MODES[mode])
            if options.get("weight") == "ones":
                options["weight"] = torch.ones(shape[1], device="cuda", dtype=torch.float32)
            step = suite._step(lambda x, t: onlinesoftmax.cross_entropy(x, t, **options))
            floor_bytes = (3 if mode == "separate" else 2) * logits_bytes
            for name in args.variants:
                with onlinesoftmax.override_plan("cross_entropy", **VARIANTS[name]):
                    try:
                        ms = time_ms(step, sets)
                        graph = ""
                        if args.graph:
                            graph_ms = graph_time_ms(step, sets)
                            graph = f" graph {graph_ms:8.4f} ms" if graph_ms is not None else " graph failed"
                        chosen = ce_plan.choose("forward" if mode == "separate" else "forward_grad", *shape, dtype,
                                                torch.device("cuda"), **ce_launch.row_options(
                                                    "weight" in options, options.get("label_smoothing", 0.0),
                                                    options.get("softcap", 0.0), options.get("z_loss", 0.0), False))
                        print(f"  {mode:15s} {name:21s} {ms:7.3f} ms {floor_bytes / ms / 1e6:6.0f} GB/s{graph}"
                              "  forward: "
                              f"{chosen.strategy} block {chosen.block} warps {chosen.num_warps} chunks {chosen.num_chunks}"
                              f" grid {chosen.grid[0]}{' plain' if chosen.plain else ''}",
                              flush=True)
                    except Exception as exc:  # a variant the planner refuses for this shape
                        print(f"  {mode:15s} {name:21s} {type(exc).__name__}: {str(exc).splitlines()[0][:100]}",
                              flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
