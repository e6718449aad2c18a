"""Short sequences with K and V held by the program: one program a KV head, looping over its query
heads' query blocks, timed beside the library's forward and SDPA (GPU).

    python scripts/probes/probe_kv_stationary.py [--shapes 256x32x8x128x128,...] [--configs 64x4x2,...] [--tables]
        [--graphs]

At 125-128 keys the forward's short rows (64 x 32 blocks, 4 warps, 3 stages) give each program one
query block of one head, and every program of a GQA group reads the group's K and V again (from
L2): at B256 H32/8 S128 D128 that is 8 programs a KV head, 1.3 GB of tile loads for 0.27 GB of
queries, against 0.67 GB that the call has to move. SDPA's FLASH backend does the same (the
tables' forward was 0.91-0.92x of it on the H200); cuDNN runs near the memory floor. Here a program
loads its KV head's keys and values once (all keys in one block, at most 256) and loops over
group x query blocks tiles, each one query block of one head (q load, two products, the row's
softmax, out and lse stores); Triton pipelines the loop's query loads (num_stages).

The kernel is the library's (kernels.attention_forward_kv_stationary_kernel), launched here at each
config; its first runs used a copy of it in this file. Since the library took it
(ops/attention/plan.py ATTENTION_FORWARD_KV_STATIONARY), "ours" is this kernel wherever the plan's
row applies; --tables adds the library with that row off. Configs:
BLOCK_M x warps x stages [x split: programs a KV head, each taking every split-th tile, for calls
of too few KV heads to fill the SMs [x 1: causal tiles over the keys in two halves, skipping the
second where their rows end before it]]. --graphs times CUDA-graph replays (every column; the host's
time out of small calls). Each output is checked against SDPA's math backend (float32),
times are do_bench medians (L2 flushed), TFLOP/s at 4 B Hq S^2 D (half for causal).
"""

import argparse

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import onlinesoftmax
from onlinesoftmax.ops.attention.kernels import LOG2E, attention_forward_kv_stationary_kernel

SHAPES = "256x32x8x128x128,267x40x8x125x128,256x16x16x128x128,256x32x8x128x64,512x12x12x197x64"
CONFIGS = "64x4x2,64x4x3,64x8x2,128x8x2,128x8x1"


def kv_stationary(q, k, v, causal, block_m, warps, stages, split=1, halves=0):
    batch, heads_q, n_queries, head_dim = q.shape
    heads_kv, n_keys = k.shape[1], k.shape[2]
    out = torch.empty((batch, heads_q, n_queries, head_dim), device=q.device, dtype=q.dtype)
    lse = torch.empty((batch, heads_q, n_queries), device=q.device, dtype=torch.float32)
    attention_forward_kv_stationary_kernel[(batch * heads_kv, split)](
        q, k, v, out, lse, heads_q, heads_q // heads_kv, batch, n_queries, n_keys, head_dim,
        *q.stride(), *k.stride(), *v.stride(), head_dim ** -0.5 * LOG2E, 0,
        BLOCK_M=block_m, BLOCK_N=max(16, triton.next_power_of_2(n_keys)), BLOCK_D=triton.next_power_of_2(head_dim),
        CAUSAL=causal, STAGES=stages, KEY_HALVES=bool(halves) and causal, num_warps=warps)
    return out


def tflops(ms, batch, heads_q, seq, head_dim, causal):
    return 4 * batch * heads_q * seq * seq * head_dim / (2 if causal else 1) / ms / 1e9


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=SHAPES, help="BxHQxHKVxSxD, comma-separated")
    parser.add_argument("--configs", default=CONFIGS,
                        help="BLOCK_MxWARPSxSTAGES[xSPLIT[x1 for key halves]], comma-separated ('' for none)")
    parser.add_argument("--graphs", action="store_true", help="time CUDA-graph replays instead of eager calls")
    parser.add_argument("--tables", action="store_true",
                        help="also the library with its KV-stationary rule off (the tables' forward)")
    args = parser.parse_args()
    configs = [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",") if c]
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    for spec in args.shapes.split(","):
        batch, heads_q, heads_kv, seq, head_dim = (int(v) for v in spec.split("x"))
        q = torch.randn(batch, heads_q, seq, head_dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, heads_kv, seq, head_dim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(batch, heads_kv, seq, head_dim, device="cuda", dtype=torch.bfloat16)
        for causal in (False, True):
            with sdpa_kernel(SDPBackend.MATH):
                ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                       is_causal=causal, enable_gqa=True)
            ref_err = (ref.to(torch.bfloat16).float() - ref).abs().max().item()
            line = [f"B{batch} H{heads_q}/{heads_kv} S{seq} D{head_dim}{' causal' if causal else ''}:"]
            peers = {"ours": lambda: onlinesoftmax.attention(q, k, v, causal=causal)}
            if args.tables:
                def tables():
                    with onlinesoftmax.override_plan("attention", ATTENTION_FORWARD_KV_STATIONARY=()):
                        return onlinesoftmax.attention(q, k, v, causal=causal)
                peers["ours, tables"] = tables
            for name, backend in (("FLASH", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
                def sdpa(backend=backend):
                    with sdpa_kernel(backend):
                        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                                enable_gqa=True)
                peers[name] = sdpa
            for config in configs:
                name = ("kv {}x{}w{}s".format(*config) + (f" split{config[3]}" if len(config) > 3 else "")
                        + (" halves" if config[4:] == (1,) else ""))
                peers[name] = lambda c=config: kv_stationary(q, k, v, causal, *c)
            for name, fn in peers.items():
                try:
                    err = (fn().float() - ref).abs().max().item()
                    ms = (triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") if args.graphs
                          else triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
                except Exception as exc:  # a config that does not fit (registers, shared memory)
                    line.append(f"{name} {type(exc).__name__}")
                    continue
                flag = "" if err <= 4 * ref_err + 1e-2 else f" WRONG (err {err:.1e})"
                line.append(f"{name} {tflops(ms, batch, heads_q, seq, head_dim, causal):.1f}{flag}")
            print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
