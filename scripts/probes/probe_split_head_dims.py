"""The attention forward at head dims that two power-of-two parts cover with less padding than one:
right on the GPU, and faster than padding them whole?

    python scripts/probes/probe_split_head_dims.py [--check D,... [--configs M:N:W:S,...]] [--time D,...]
        [--loads D,...] [--seq S] [--batch B]

``--check``: for each head dim, in a process of its own (a fault takes down the CUDA context), the
forward of B2 H4/2 at 1000 x 1000, 37 x 50 and 4097 x 4097 queries x keys, every mask, against
float64 SDPA on the same inputs; split into ``plan.head_dim_parts(D)`` (forced:
ATTENTION_FORWARD_SPLIT_HEAD_DIMS = (D,)) and padded whole (PADDED). ``--configs``: the
split forward at each (BLOCK_M, BLOCK_N, warps, stages) instead of the plan's, checked at the first
two shapes and, unless ``--seq 0``, timed. ``--time``: do_bench medians (ms) of the split forward,
the padded one and SDPA's FLASH backend at B x H16 x S bf16, non-causal and causal. ``--loads``:
the plan's forward, the same through pointer loads alone, and the inputs zero-padded to the next
multiple of 16 columns, against FLASH.

A second part that runs past the head dim (40 as 32 + 16, 72 as 64 + 16) computed wrong outputs
and faulted on the H100 under Triton 3.6 until the kernels were told that such a head dim's rows
are whole 16-byte vectors (kernels.on_vectors); the plan splits them only where they are
(ATTENTION_FORWARD_SPLIT_VECTORS_FROM; docs/notes/2026-11/probe_split_head_dims-h100.log).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import torch

import onlinesoftmax
from onlinesoftmax.ops.attention import plan
from onlinesoftmax.ops.attention.op import MAX_HEAD_DIM

SHAPES = [(1000, 1000), (37, 50), (4097, 4097)]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: under TRITON_INTERPRET=1 (slow)
# No split: the exact head dims emptied, the overrun ones from past the largest head dim.
PADDED = {"ATTENTION_FORWARD_SPLIT_HEAD_DIMS": (), "ATTENTION_FORWARD_SPLIT_VECTORS_FROM": MAX_HEAD_DIM + 1}
MODES = {"none": False, "top_left": True, "bottom_right": "bottom_right"}


def reference(q, k, v, mode):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    qd, kd, vd = (t.double() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kd, vd = kd.repeat_interleave(group, 1), vd.repeat_interleave(group, 1)
    if mode == "none":
        return sdpa(qd, kd, vd)
    n_q, n_k = q.shape[2], k.shape[2]
    offset = 0 if mode == "top_left" else n_k - n_q
    mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(offset)
    return sdpa(qd, kd, vd, attn_mask=mask).nan_to_num(0.0)  # rows with no key: 0, as ours


def config_overrides(config) -> dict:
    """override_plan arguments that give every forward row ``config`` (BLOCK_M, BLOCK_N, warps, stages)."""
    if config is None:
        return {}
    rows = tuple((bound, config, config) for bound, _, _ in plan.ATTENTION_CONFIGS["forward"])
    return {"ATTENTION_CONFIGS": {**plan.ATTENTION_CONFIGS, "forward": rows},
            "ATTENTION_SHORT_CONFIGS": {**plan.ATTENTION_SHORT_CONFIGS, "forward": ()}}


def check(head_dim: int, config=None, shapes=SHAPES) -> bool:
    gen = torch.Generator(device=DEVICE).manual_seed(head_dim)
    ok = True
    for n_q, n_k in shapes:
        q = torch.randn(2, 4, n_q, head_dim, device=DEVICE, generator=gen).bfloat16()
        k, v = (torch.randn(2, 2, n_k, head_dim, device=DEVICE, generator=gen).bfloat16() for _ in range(2))
        for mode, causal in MODES.items():
            want = reference(q, k, v, mode)
            for split in ((True,) if config else (True, False)):
                overrides = ({"ATTENTION_FORWARD_SPLIT_HEAD_DIMS": (head_dim,), **config_overrides(config)} if split
                             else PADDED)
                with onlinesoftmax.override_plan("attention", **overrides):
                    got = onlinesoftmax.attention(q, k, v, causal=causal)
                    chosen = plan.last_attention_plan()
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                error = ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()
                good = error < 1e-2
                ok &= good
                print(f"D{head_dim} {n_q}x{n_k} {mode:12s} {'split ' if split else 'padded'} "
                      f"({chosen.block_d}+{chosen.block_d2}, "
                      f"{chosen.block_m}x{chosen.block_n} {chosen.num_warps}w {chosen.num_stages}s, "
                      f"{'rows' if chosen.row_descriptors else 'pointer'}): error {error:.2e} "
                      f"{'ok' if good else 'WRONG'}")
    return ok


def time_head_dim(head_dim: int, batch: int, seq: int, config=None) -> None:
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(batch, 16, seq, head_dim, device=DEVICE, generator=gen).bfloat16() for _ in range(3))
    for causal in (False, True):
        ms = {}
        for name, overrides in (("split", {"ATTENTION_FORWARD_SPLIT_HEAD_DIMS": (head_dim,),
                                           **config_overrides(config)}),
                                ("padded", PADDED)):
            with onlinesoftmax.override_plan("attention", **overrides):
                ms[name] = triton.testing.do_bench(lambda: onlinesoftmax.attention(q, k, v, causal=causal),
                                                   warmup=50, rep=300)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ms["flash"] = triton.testing.do_bench(
                lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
                warmup=50, rep=300)
        flops = 4 * batch * 16 * seq * seq * head_dim / (2 if causal else 1)
        line = ", ".join(f"{n} {t:.4f} ms ({flops / t / 1e9:.0f} TFLOP/s)" for n, t in ms.items())
        print(f"forward B{batch} H16 S{seq} D{head_dim}{' causal' if causal else ''}: {line}; "
              f"split / padded {ms['padded'] / ms['split']:.2f}x, FLASH / split {ms['flash'] / ms['split']:.2f}x",
              flush=True)


def time_loads(head_dim: int, batch: int, seq: int) -> None:
    """The padded forward of head dim D through the plan's loads, through pointer loads alone, and on
    the same inputs zero-padded to the next multiple of 16 columns (then sliced), against FLASH."""
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from onlinesoftmax.ops.attention import launch as attention_launch

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(batch, 16, seq, head_dim, device=DEVICE, generator=gen).bfloat16() for _ in range(3))
    wide = -(-head_dim // 16) * 16
    qw, kw, vw = (torch.nn.functional.pad(t, (0, wide - head_dim)) for t in (q, k, v))
    scale = head_dim ** -0.5
    real_check = attention_launch.descriptor_ok
    for causal in (False, True):
        ms = {}
        ms["plan"] = triton.testing.do_bench(lambda: onlinesoftmax.attention(q, k, v, causal=causal),
                                             warmup=50, rep=300)
        attention_launch.descriptor_ok = lambda *tensors: False
        with onlinesoftmax.override_plan("attention"):  # forget the calls prepared under the real check
            ms["pointer"] = triton.testing.do_bench(lambda: onlinesoftmax.attention(q, k, v, causal=causal),
                                                    warmup=50, rep=300)
        attention_launch.descriptor_ok = real_check
        with onlinesoftmax.override_plan("attention"):
            ms[f"as D{wide}"] = triton.testing.do_bench(
                lambda: onlinesoftmax.attention(qw, kw, vw, causal=causal, scale=scale), warmup=50, rep=300)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ms["flash"] = triton.testing.do_bench(
                lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
                warmup=50, rep=300)
        line = ", ".join(f"{n} {t:.4f} ms" for n, t in ms.items())
        print(f"forward B{batch} H16 S{seq} D{head_dim}{' causal' if causal else ''}: {line}; "
              f"FLASH / plan {ms['flash'] / ms['plan']:.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", default="", help="head dims to check, each in its own process")
    parser.add_argument("--time", default="", help="head dims to time")
    parser.add_argument("--loads", default="", help="head dims whose padded forward to time by load path")
    parser.add_argument("--seq", type=int, default=2048, help="0: --configs checked, not timed")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--configs", default="",
                        help="with --check: BLOCK_M:BLOCK_N:warps:stages,... each checked (37 x 50 and 1000 x 1000) "
                             "and, if right, timed, a process each")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child process of --check
    parser.add_argument("--config", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        config = tuple(int(x) for x in args.config.split(":")) if args.config else None
        ok = check(args.one, config, SHAPES[:2] if config else SHAPES)
        if ok and config and args.seq:
            time_head_dim(args.one, args.batch, args.seq, config)
        sys.exit(0 if ok else 1)
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU"
    print(f"{device}, torch {torch.__version__}, triton {__import__('triton').__version__}")
    failed = []
    configs = args.configs.split(",") if args.configs else [""]
    runs = [(int(d), c) for d in args.check.split(",") if d for c in configs]
    for head_dim, config in runs:
        result = subprocess.run([sys.executable, __file__, "--one", str(head_dim), "--config", config,
                                 "--batch", str(args.batch), "--seq", str(args.seq)], capture_output=True, text=True)
        print(result.stdout, end="")
        if result.returncode:
            failed.append((head_dim, config) if config else head_dim)
            print(f"D{head_dim} {config}: FAILED (exit {result.returncode}) {result.stderr.strip().splitlines()[-1:]}")
    if args.check:
        print(f"checked: {'all right' if not failed else f'failed at {failed}'}", flush=True)
        if failed:
            sys.exit(1)
    for head_dim in (int(d) for d in args.time.split(",") if d):
        time_head_dim(head_dim, args.batch, args.seq)
    for head_dim in (int(d) for d in args.loads.split(",") if d):
        time_loads(head_dim, args.batch, args.seq)


if __name__ == "__main__":
    main()
