"""Attention forwards that launch few programs (one sequence or a few, few heads: 128-query blocks x
batch x heads near the SM count), where the causal forward's last query block, walking every key,
decides the call while most SMs idle (B1 H8 S2195 D72 causal: 144 programs, 0.97x FLASH under CUDA
graphs in the random-shape sweep of seed 3205). Times the plan, the plan without
ATTENTION_FEW_PROGRAMS ("tables"), every forward on 64-query blocks ("m64": 4 warps, the
row's key block and stages; warp specialization off, which needs 128), and SDPA's FLASH and cuDNN,
under CUDA graphs; each variant's output is checked against FLASH's. bf16.

    python scripts/probes/probe_attention_few_programs.py [--backward] [--shapes B,Hq,Hkv,S,D,causal;...]

--backward times forward + backward instead, the dQ kernel on 64-query blocks beside the plan.
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import onlinesoftmax
from onlinesoftmax.bench import harness
from onlinesoftmax.ops.attention import plan

SHAPES = ("1,8,8,2195,72,1;1,8,8,2195,72,0;1,8,8,2048,64,1;1,8,8,4096,128,1;1,8,8,4096,128,0;"
          "1,16,16,2048,128,1;1,32,8,2048,128,1;1,8,8,8192,128,1;1,4,4,8192,128,1;2,8,8,3000,96,1;"
          "1,12,12,2382,48,1;1,16,16,4096,64,1;4,8,8,1024,128,1;1,32,32,4096,128,1")


def m64(config):
    return None if config is None else (64, config[1], 4, *config[3:])


def variants():
    yield "plan", {}
    yield "tables", dict(ATTENTION_FEW_PROGRAMS={})  # the plan without the few-programs rule
    forward = tuple((row[0], m64(row[1]), m64(row[2])) for row in plan.ATTENTION_CONFIGS["forward"])
    yield "m64", dict(ATTENTION_CONFIGS={**plan.ATTENTION_CONFIGS, "forward": forward},
                      ATTENTION_FORWARD_WARP_SPECIALIZED={},
                      ATTENTION_FORWARD_POINTER_CONFIGS={d: tuple(m64(c) for c in pair)
                                                         for d, pair in plan.ATTENTION_FORWARD_POINTER_CONFIGS.items()})


def backward_variants():
    yield "plan", {}
    yield "tables", dict(ATTENTION_FEW_PROGRAMS={})
    dq = tuple((row[0], m64(row[1]), m64(row[2])) for row in plan.ATTENTION_CONFIGS["backward_dq"])
    own = {**plan.ATTENTION_HEAD_DIM_CONFIGS, "backward_dq": {
        d: tuple(m64(c) for c in pair) for d, pair in plan.ATTENTION_HEAD_DIM_CONFIGS["backward_dq"].items()}}
    yield "dq64", dict(ATTENTION_CONFIGS={**plan.ATTENTION_CONFIGS, "backward_dq": dq}, ATTENTION_HEAD_DIM_CONFIGS=own)


def backward_main(shapes):
    """--backward: forward + backward under CUDA graphs, the plan, the plan without
    ATTENTION_FEW_PROGRAMS and the dQ kernel on 64-query blocks (4 warps) at every size, FLASH
    beside; dQ's relative error against FLASH's."""
    gen = torch.Generator(device="cuda").manual_seed(3302)
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}; bf16 forward + backward, CUDA-graph ms; "
          "rel err of dQ against FLASH")
    for text in shapes.split(";"):
        b, hq, hkv, s, d, causal = (int(x) for x in text.split(","))
        per_set = 2 * (b * (4 * hq + 4 * hkv) * s * d)
        sets = [(*(torch.randn(b, h, s, d, device="cuda", generator=gen).bfloat16().requires_grad_()
                   for h in (hq, hkv, hkv)), torch.randn(b, hq, s, d, device="cuda", generator=gen).bfloat16())
                for _ in range(harness.rotation_count(per_set))]

        def step(fn):
            def run(q, k, v, d_out):
                return torch.autograd.grad(fn(q, k, v), (q, k, v), d_out)
            return run

        def flash(q, k, v):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), enable_gqa=hq != hkv)
        ref = step(flash)(*sets[0])[0].float()
        cells = [f"flash {harness.graph_time_ms(step(flash), sets):.4f}"]
        for name, tables in backward_variants():
            with onlinesoftmax.override_plan("attention", **tables):
                def ours(q, k, v):
                    return onlinesoftmax.attention(q, k, v, causal=bool(causal))
                err = harness.relative_error(step(ours)(*sets[0])[0].float(), ref)
                chosen = plan.last_attention_plan()
                ms = harness.graph_time_ms(step(ours), sets)
                cells.append(f"{name} {ms:.4f} ({chosen.kernel} {chosen.block_m}x{chosen.block_n} w{chosen.num_warps} "
                             f"s{chosen.num_stages}, err {err:.1e})")
        print(f"B{b} H{hq}/{hkv} S{s} D{d} {'causal' if causal else 'non-causal'}: " + "; ".join(cells), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--backward", action="store_true", help="forward + backward, the dQ kernel's query blocks")
    args = parser.parse_args()
    if args.backward:
        return backward_main(args.shapes)
    gen = torch.Generator(device="cuda").manual_seed(3301)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), f"({sms} SMs), torch {torch.__version__}; bf16 forward, CUDA-graph ms "
          "(TFLOP/s); rel err against FLASH")
    for text in args.shapes.split(";"):
        b, hq, hkv, s, d, causal = (int(x) for x in text.split(","))
        per_set = 2 * (b * (2 * hq + 2 * hkv) * s * d)
        sets = [tuple(torch.randn(b, h, s, d, device="cuda", generator=gen).bfloat16() for h in (hq, hkv, hkv))
                for _ in range(harness.rotation_count(per_set))]
        cells, work = [], plan.forward_flops(b, hq, s, s, d, bool(causal))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ref = F.scaled_dot_product_attention(*sets[0], is_causal=bool(causal), enable_gqa=hq != hkv).float()
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            def peer(q, k, v, backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), enable_gqa=hq != hkv)
            try:
                ms = harness.graph_time_ms(peer, sets)
                cells.append(f"{backend.name.split('_')[0].lower()} {ms:.4f} ({work / ms / 1e9:.0f})")
            except RuntimeError as error:
                cells.append(f"{backend.name} error {str(error)[:40]}")
        for name, tables in variants():
            with onlinesoftmax.override_plan("attention", **tables):
                def ours(q, k, v):
                    return onlinesoftmax.attention(q, k, v, causal=bool(causal))
                err = harness.relative_error(ours(*sets[0]).float(), ref)
                chosen = plan.last_attention_plan()
                ms = harness.graph_time_ms(ours, sets)
                blocks = -(-s // chosen.block_m)
                cells.append(f"{name} {ms:.4f} ({work / ms / 1e9:.0f}; {chosen.block_m}x"
                             f"{chosen.block_n} w{chosen.num_warps} s{chosen.num_stages}"
                             f"{' ws' if chosen.warp_specialize else ''}, {blocks * b * hq} programs, err {err:.1e})")
        print(f"B{b} H{hq}/{hkv} S{s} D{d} {'causal' if causal else 'non-causal'}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
