"""Row statistics (m, d) alone, by a stand-alone kernel: how fast can the stream forward read? (GPU)

Each program reads a chunk of tiles of its row (all of the row at 0 chunks) and stores the chunk's
(m, d), with per-lane running pairs merged once at the end (PER_LANE) or the tile's pair merged each
tile; do_bench with the L2 flushed, GB/s of logits read. The comparison for the stream kernel's
chunks (docs/perf-cross_entropy.md, "The stream forward: a row's tiles in few chunks").

    python scripts/probes/probe_cross_entropy_lane_stats.py
"""

import torch
import triton
import triton.language as tl

from onlinesoftmax.bench.harness import time_ms


@triton.jit
def lane_stats(x_ptr, part_ptr, n_cols, stride, tiles_per_chunk, BLOCK: tl.constexpr, VEC: tl.constexpr,
               PER_LANE: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    R: tl.constexpr = BLOCK // VEC
    offs = tl.arange(0, R)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    start = chunk * tiles_per_chunk * BLOCK
    row_ptr = x_ptr + row.to(tl.int64) * stride
    if PER_LANE:
        m_acc = tl.full((R,), float("-inf"), tl.float32)
        d_acc = tl.zeros((R,), tl.float32)
        for k in range(0, tiles_per_chunk):
            cols = start + k * BLOCK + offs
            y = tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m_acc, tl.max(y, 1))
            ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            d_acc = d_acc * tl.exp(m_acc - ref) + tl.sum(tl.exp(y - ref[:, None]), 1)
            m_acc = m_new
        m = tl.max(m_acc, 0)
        ref = tl.where(m == float("-inf"), 0.0, m)
        d = tl.sum(d_acc * tl.exp(m_acc - ref), 0)
    else:
        m = tl.full((), float("-inf"), tl.float32)
        d = tl.zeros((), tl.float32)
        for k in range(0, tiles_per_chunk):
            cols = start + k * BLOCK + offs
            y = tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
            tm = tl.max(tl.max(y, 1), 0)
            m_new = tl.maximum(m, tm)
            ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            d = d * tl.exp(m - ref) + tl.sum(tl.sum(tl.exp(y - ref), 1), 0)
            m = m_new
    n_chunks = tl.num_programs(1)
    tl.store(part_ptr + row * n_chunks + chunk, m)
    tl.store(part_ptr + tl.num_programs(0) * n_chunks + row * n_chunks + chunk, d)


def main():
    torch.manual_seed(0)
    cases = ((torch.bfloat16, (8192, 128256)), (torch.bfloat16, (8192, 32000)), (torch.float32, (8192, 128256)))
    for dtype, (rows, cols) in cases:
        xs = [torch.randn(rows, cols, device="cuda", dtype=dtype) for _ in range(2)]
        read = rows * cols * dtype.itemsize
        vec = 16 // dtype.itemsize
        expected = torch.logsumexp(xs[0].float(), -1)
        for block in (4096, 8192):
            for per_lane in (True, False):
                for tiles_asked in (1, 4, 0):  # 0: the whole row
                    tiles = triton.cdiv(cols, block)
                    per_chunk = tiles if tiles_asked == 0 else tiles_asked
                    chunks = triton.cdiv(tiles, per_chunk)
                    parts = torch.empty(2 * rows * chunks, device="cuda")
                    for warps in (4, 8):
                        if block // (32 * warps) < vec:
                            continue

                        def stats(x, block=block, per_lane=per_lane, per_chunk=per_chunk, chunks=chunks,
                                  parts=parts, warps=warps):
                            lane_stats[(rows, chunks)](x, parts, cols, x.stride(0), per_chunk, BLOCK=block, VEC=vec,
                                                       PER_LANE=per_lane, num_warps=warps)

                        stats(xs[0])
                        m, d = parts[: rows * chunks].view(rows, chunks), parts[rows * chunks:].view(rows, chunks)
                        err = (torch.logsumexp(m + d.log(), -1) - expected).abs().max().item()
                        ms = time_ms(stats, [(x,) for x in xs])
                        print(f"{str(dtype)[6:]} {rows}x{cols} block {block} lane {int(per_lane)} tiles/prog "
                              f"{per_chunk:3d} warps {warps:2d}: {ms:.3f} ms {read / ms / 1e6:.0f} GB/s err {err:.1e}",
                              flush=True)
        del xs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
