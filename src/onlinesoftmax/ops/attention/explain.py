"""``onlinesoftmax explain --op attention``: an attention call's GPU plans in words, on any machine."""

from __future__ import annotations

import torch

from .plan import attention_plan, backward_plans, forward_flops, kv_stationary_plan


def explain(batch: int, heads_q: int, heads_kv: int, n_queries: int, n_keys: int, head_dim: int,
            dtype: torch.dtype = torch.bfloat16, causal: bool = False, sms: int = 132) -> str:
    """The GPU plans of an attention call on contiguous (B, H, S, D) q, k, v (and dO), on any
    machine (``onlinesoftmax explain --op attention``): the forward's, then the backward's kernels
    with their grids."""
    device = torch.device("cuda")
    # Contiguous: every stride is a multiple of the head dim, so a row of whole 16-byte vectors
    # makes every tensor descriptor-ready and every row a run of vectors.
    vectors = head_dim * dtype.itemsize % 16 == 0
    rows = vectors and batch * max(heads_q, heads_kv) * max(n_queries, n_keys) < 2**31
    mask = "causal (top left)" if causal else "no mask"
    flops = forward_flops(batch, heads_q, n_queries, n_keys, head_dim, causal)
    lines = [f"attention B{batch} H{heads_q}/{heads_kv} queries {n_queries} keys {n_keys} head dim {head_dim}, "
             f"{str(dtype)[6:]}, {mask}; contiguous (B, H, S, D) tensors, {sms} SMs",
             f"forward: {flops / 1e9:.3g} GFLOP; backward: {2.5 * flops / 1e9:.3g} GFLOP"]

    def grid(blocks: int, what: str, programs: int, each: str) -> str:
        total = blocks * programs
        return f"    grid: {blocks} {what} x {programs} {each} = {total} programs ({total / sms:.1f} an SM)"

    forward = attention_plan("forward", head_dim, dtype, causal, device, n_queries, n_keys, vectors, rows,
                             whole_vectors=vectors, interpreting=False, query_heads=batch * heads_q, sms=sms)
    stationary = kv_stationary_plan(head_dim, dtype, causal, device, n_queries, n_keys, heads_q // heads_kv,
                                    batch * heads_kv, sms, forward.warp_specialize)
    if stationary is not None:
        lines += ["  " + stationary.describe(),
                  grid(stationary.group_split, "parts of each group", batch * heads_kv, "KV heads")
                  if stationary.group_split > 1 else f"    grid: {batch * heads_kv} programs, one a batch and KV head"]
    else:
        lines += ["  " + forward.describe(),
                  grid(-(-n_queries // forward.block_m), "query blocks", batch * heads_q, "query heads")]
    first, dq = backward_plans(head_dim, dtype, causal, device, batch, heads_q, heads_kv, n_queries, n_keys, vectors,
                               batch * heads_q, vectors, sms, interpreting=False)
    if dq is None:
        lines += ["  " + first.describe() + " (one kernel: dQ, dK and dV)",
                  f"    grid: {batch * heads_kv} programs, one a batch and KV head"]
    else:
        programs = batch * heads_kv * first.group_split
        each = "KV heads" if first.group_split == 1 else "parts of KV heads' groups"
        lines += ["  attention backward_delta: rowsum(dO * O) of every query, a small kernel first",
                  "  " + first.describe(), grid(first.blocks, "key blocks", programs, each),
                  "  " + dq.describe(), grid(dq.blocks, "query blocks", batch * heads_q, "query heads")]
    return "\n".join(lines)
