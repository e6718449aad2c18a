"""split_row_on_chip forward on the H100: three experiments behind ops/softmax/plan.py's choices (GPU).

    python scripts/tune/sweep_split_on_chip.py {wait,pipelined,sync}

wait:      the kernel as first written, with the row wait removed (WAIT=0, wrong results, timing
           only) and with tickets replaced by program ids: what the wait itself costs. It calls
           the library's take_ticket / wait_for_row; the recorded run predates the counters'
           padding (sync mode measures that separately).
pipelined: a persistent variant that loads and publishes its next chunk before waiting for the
           current row (two tiles in registers): measured and not adopted (no faster).
sync:      how a program polls its row counter (atomic or volatile load), the counters' spacing
           (PAD 32 = one 128-byte line each, adopted) and a nanosleep back-off.

Times are CUDA-graph replays over rotated inputs; GB/s counts x read once and y written once.
Output of the 2026-11-23 runs: docs/notes/2026-11/sweep_split_on_chip-h100.log.
"""
import sys

import torch
import triton
import triton.language as tl

from onlinesoftmax._triton import NEG_INF, merge_row_partials, store_row_partial, take_ticket, wait_for_row
from onlinesoftmax.bench.harness import graph_time_ms, rotation_count


@triton.jit
def chunk_partial(x_ptr, ticket, n_cols, chunk_size, num_chunks, lanes, valid):
    # Ticket -> row and chunk; the chunk loaded into registers and its (m, d).
    row = ticket // num_chunks
    chunk = ticket % num_chunks
    cols = chunk * chunk_size + lanes
    mask = (lanes < chunk_size) & (cols < n_cols) & valid
    b_x = tl.load(x_ptr + row.to(tl.int64) * n_cols + cols, mask=mask, other=NEG_INF).to(tl.float32)
    m = tl.max(b_x, 0)
    d = tl.sum(tl.exp(b_x - tl.where(m == NEG_INF, 0.0, m)), 0)
    return row, chunk, cols, mask, b_x, m, d


# --- wait ---
@triton.jit
def wait_kernel(x_ptr, y_ptr, parts_ptr, sync_ptr, n_cols, chunk_size, num_chunks,
         BLOCK_COLS: tl.constexpr, CHUNKS_POW2: tl.constexpr, WAIT: tl.constexpr, TICKET: tl.constexpr, EXP2: tl.constexpr):
    if TICKET:
        ticket = take_ticket(sync_ptr)
    else:
        ticket = tl.program_id(0)
    row, chunk, cols, mask, b_x, m, d = chunk_partial(x_ptr, ticket, n_cols, chunk_size, num_chunks,
                                                      tl.arange(0, BLOCK_COLS), True)
    if WAIT:
        n_parts = tl.num_programs(0).to(tl.int64)
        store_row_partial(parts_ptr, n_parts, row, chunk, num_chunks, m, d)
        wait_for_row(sync_ptr, row, num_chunks)
        m, d = merge_row_partials(parts_ptr, n_parts, row, num_chunks, CHUNKS_POW2, True)
    if EXP2:
        b_y = tl.exp2((b_x - m) * 1.4426950408889634) * (1.0 / d)
    else:
        b_y = tl.exp(b_x - m) * (1.0 / d)
    tl.store(y_ptr + row.to(tl.int64) * n_cols + cols, b_y.to(y_ptr.dtype.element_ty), mask=mask)


def run_wait():
    for dtype in (torch.float32, torch.bfloat16):
        rows, cols = 256, 151936
        nbytes = 2 * rows * cols * dtype.itemsize
        xs = [(torch.randn(rows, cols, device="cuda", dtype=dtype),) for _ in range(rotation_count(nbytes))]
        for tile, warps in ((4096, 4), (8192, 8), (8192, 4)):
            C = -(-cols // tile); chunk = -(-(-(-cols // C)) // 16) * 16; C = -(-cols // chunk)
            parts = torch.empty(2 * rows * C, device="cuda")
            sync = torch.zeros(32 * (1 + rows), dtype=torch.int32, device="cuda")  # the library's padded counters
            for wait, ticket, exp2 in ((1, 1, 0), (1, 0, 0), (0, 1, 0), (0, 0, 0), (1, 1, 1)):
                def f(x):
                    y = torch.empty_like(x)
                    wait_kernel[(rows * C,)](x, y, parts, sync, cols, chunk, C, BLOCK_COLS=tile, CHUNKS_POW2=triton.next_power_of_2(C),
                                      WAIT=wait, TICKET=ticket, EXP2=exp2, num_warps=warps)
                    return y
                x0 = xs[0][0]
                y = f(x0)
                if wait:
                    err = (y.double() - torch.softmax(x0.double(), -1)).abs().max().item()
                else:
                    err = -1
                ms = graph_time_ms(f, xs)
                assert not sync.any()
                print(f"{str(dtype)[6:]:8s} tile {tile} warps {warps} wait {wait} ticket {ticket} exp2 {exp2}: {ms*1e3:7.1f} us {nbytes/ms/1e6:6.0f} GB/s err {err:.1e}", flush=True)


# --- pipelined ---
@triton.jit
def pipelined_take(sync_ptr, last):
    t = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    if t == last:
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed")
    return t

@triton.jit
def pipelined_load_arrive(x_ptr, parts_ptr, sync_ptr, ticket, n_tickets, n_cols, chunk_size, num_chunks, lanes):
    valid = ticket < n_tickets
    row, chunk, cols, mask, b_x, m, d = chunk_partial(x_ptr, ticket, n_cols, chunk_size, num_chunks, lanes, valid)
    if valid:
        store_row_partial(parts_ptr, n_tickets, row, chunk, num_chunks, m, d)
        tl.debug_barrier()
        count_ptr = sync_ptr + 1 + row
        if tl.atomic_add(count_ptr, 1, sem="acq_rel") == num_chunks - 1:
            tl.atomic_xchg(count_ptr, 0, sem="acq_rel")
    return b_x

@triton.jit
def pipelined_kernel(x_ptr, y_ptr, parts_ptr, sync_ptr, n_cols, chunk_size, num_chunks, n_tickets,
         BLOCK_COLS: tl.constexpr, CHUNKS_POW2: tl.constexpr):
    lanes = tl.arange(0, BLOCK_COLS)
    last = n_tickets + tl.num_programs(0) - 1
    ticket = pipelined_take(sync_ptr, last)
    b_x = pipelined_load_arrive(x_ptr, parts_ptr, sync_ptr, ticket, n_tickets, n_cols, chunk_size, num_chunks, lanes)
    while ticket < n_tickets:
        next_ticket = pipelined_take(sync_ptr, last)
        b_next = pipelined_load_arrive(x_ptr, parts_ptr, sync_ptr, next_ticket, n_tickets, n_cols, chunk_size, num_chunks, lanes)
        row = ticket // num_chunks
        chunk = ticket % num_chunks
        count_ptr = sync_ptr + 1 + row
        while tl.atomic_add(count_ptr, 0, sem="acquire") != 0:
            pass
        tl.debug_barrier()
        m, d = merge_row_partials(parts_ptr, n_tickets, row, num_chunks, CHUNKS_POW2, True)
        cols = chunk * chunk_size + lanes
        mask = (lanes < chunk_size) & (cols < n_cols)
        b_y = tl.exp(b_x - m) * (1.0 / d)
        tl.store(y_ptr + row.to(tl.int64) * n_cols + cols, b_y.to(y_ptr.dtype.element_ty), mask=mask)
        ticket = next_ticket
        b_x = b_next


def run_pipelined():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for dtype in (torch.float32, torch.bfloat16):
      for rows, cols in ((256, 151936), (64, 128256), (16, 262144)):
        nbytes = 2 * rows * cols * dtype.itemsize
        xs = [(torch.randn(rows, cols, device="cuda", dtype=dtype),) for _ in range(rotation_count(nbytes))]
        for tile, warps in ((4096, 4), (8192, 8), (8192, 4), (16384, 8)):
            C = -(-cols // tile); chunk = -(-(-(-cols // C)) // 16) * 16; C = -(-cols // chunk)
            n_tickets = rows * C
            parts = torch.empty(2 * n_tickets, device="cuda")
            sync = torch.zeros(1 + rows, dtype=torch.int32, device="cuda")
            for per_sm in (2, 4, 8):
                P = min(n_tickets, sms * per_sm)
                def f(x):
                    y = torch.empty_like(x)
                    pipelined_kernel[(P,)](x, y, parts, sync, cols, chunk, C, n_tickets, BLOCK_COLS=tile,
                               CHUNKS_POW2=triton.next_power_of_2(C), num_warps=warps)
                    return y
                x0 = xs[0][0]
                y = f(x0)
                err = (y.double() - torch.softmax(x0.double(), -1)).abs().max().item()
                ms = graph_time_ms(f, xs)
                assert not sync.any()
                print(f"{str(dtype)[6:]:8s} {rows}x{cols} tile {tile} warps {warps} per_sm {per_sm}: {ms*1e3:7.1f} us {nbytes/ms/1e6:6.0f} GB/s err {err:.1e}", flush=True)


# --- sync ---
@triton.jit
def sync_kernel(x_ptr, y_ptr, parts_ptr, sync_ptr, n_cols, chunk_size, num_chunks,
         BLOCK_COLS: tl.constexpr, CHUNKS_POW2: tl.constexpr, POLL: tl.constexpr, PAD: tl.constexpr, SLEEP: tl.constexpr):
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    if ticket == tl.num_programs(0) - 1:
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed")
    row, chunk, cols, mask, b_x, m, d = chunk_partial(x_ptr, ticket, n_cols, chunk_size, num_chunks,
                                                      tl.arange(0, BLOCK_COLS), True)
    n_parts = tl.num_programs(0).to(tl.int64)
    store_row_partial(parts_ptr, n_parts, row, chunk, num_chunks, m, d)
    tl.debug_barrier()
    count_ptr = sync_ptr + PAD * (1 + row)
    arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel") + 1
    if arrived == num_chunks:
        tl.atomic_xchg(count_ptr, 0, sem="acq_rel")
    else:
        if POLL == 0:
            while arrived != 0:
                if SLEEP > 0:
                    tl.inline_asm_elementwise(f"nanosleep.u32 {SLEEP}; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
                arrived = tl.atomic_add(count_ptr, 0, sem="acquire")
        else:
            while arrived != 0:
                if SLEEP > 0:
                    tl.inline_asm_elementwise(f"nanosleep.u32 {SLEEP}; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
                arrived = tl.load(count_ptr, volatile=True)
            tl.atomic_add(count_ptr, 0, sem="acquire")
    tl.debug_barrier()
    m, d = merge_row_partials(parts_ptr, n_parts, row, num_chunks, CHUNKS_POW2, True)
    b_y = tl.exp(b_x - m) * (1.0 / d)
    tl.store(y_ptr + row.to(tl.int64) * n_cols + cols, b_y.to(y_ptr.dtype.element_ty), mask=mask)


def run_sync():
    for dtype in (torch.float32, torch.bfloat16):
      for rows, cols in ((256, 151936), (64, 128256), (16, 262144)):
        nbytes = 2 * rows * cols * dtype.itemsize
        xs = [(torch.randn(rows, cols, device="cuda", dtype=dtype),) for _ in range(rotation_count(nbytes))]
        for tile, warps in ((4096, 4), (8192, 8), (8192, 4)):
            C = -(-cols // tile); chunk = -(-(-(-cols // C)) // 16) * 16; C = -(-cols // chunk)
            parts = torch.empty(2 * rows * C, device="cuda")
            sync = torch.zeros(32 * (1 + rows), dtype=torch.int32, device="cuda")
            for poll, pad, sleep in ((0, 1, 0), (1, 1, 0), (0, 32, 0), (1, 32, 0), (1, 32, 100), (0, 32, 200), (1, 32, 500)):
                def f(x):
                    y = torch.empty_like(x)
                    sync_kernel[(rows * C,)](x, y, parts, sync, cols, chunk, C, BLOCK_COLS=tile, CHUNKS_POW2=triton.next_power_of_2(C),
                                      POLL=poll, PAD=pad, SLEEP=sleep, num_warps=warps)
                    return y
                x0 = xs[0][0]
                y = f(x0)
                err = (y.double() - torch.softmax(x0.double(), -1)).abs().max().item()
                ms = graph_time_ms(f, xs)
                assert not sync.any()
                print(f"{str(dtype)[6:]:8s} {rows}x{cols} tile {tile} w{warps} poll {poll} pad {pad:2d} sleep {sleep:3d}: {ms*1e3:7.1f} us {nbytes/ms/1e6:6.0f} GB/s err {err:.1e}", flush=True)



if __name__ == "__main__":
    {"wait": run_wait, "pipelined": run_pipelined, "sync": run_sync}[sys.argv[1]]()
