"""The dK/dV kernel's GQA group shared by several programs (plan.dkdv_group_split, float32 partials
summed after) against one program a group, beside SDPA's FLASH backend: which programs-an-SM
setting (ATTENTION_BACKWARD_GROUP_SPLIT_PROGRAMS, non-causal / causal) the plan should take.

Each line: a shape (batch, Hq, Hkv, S, D), the mask, then per setting the group split it gave and
milliseconds of forward + backward through autograd (do_bench median over four rotated input sets
/ calls back to back / CUDA-graph replays), and FLASH's. The shapes: the attention sweep's random
cells where GQA and MQA trailed FLASH (head dims 32 and 80), GQA at batch 1 and small batches,
and GQA whose programs fill the GPU (the plan leaves them whole). "plan" is the library's own split
(ATTENTION_BACKWARD_WAVE_SPLIT_* included).

    python scripts/probes/probe_group_split.py [--shapes BxHQxHKVxSxD,...] [--settings plan,whole,...]
        [--splits 2,4]   (GPU; bf16)
"""

import sys
from unittest import mock

import torch

from onlinesoftmax.ops.attention import plan

from probe_fused_backward import compare_settings, input_sets, shapes_from_argv

SHAPES = [(4, 28, 4, 2770, 32), (5, 28, 4, 8936, 32), (11, 16, 1, 388, 80), (4, 40, 8, 541, 128),
          (5, 64, 8, 981, 96), (1, 64, 8, 12278, 64), (1, 32, 8, 8192, 128), (2, 32, 8, 4096, 128),
          (1, 16, 1, 4096, 128), (8, 32, 4, 1024, 128), (64, 32, 8, 512, 128)]
# Table values by setting: the plan's own; one program a group; every split below 1 << 20 programs an SM
# (each its group's smallest divisor reaching 2/4, 4/8 or 8/16 an SM, non-causal/causal, or every head).
WHOLE = {"ATTENTION_BACKWARD_GROUP_SPLIT_PROGRAMS": (0, 0), "ATTENTION_BACKWARD_WAVE_SPLIT_COST": (0.0, 0.0)}
SETTINGS = {"plan": {}, "whole": WHOLE} | {
    name: {"ATTENTION_BACKWARD_GROUP_SPLIT_PROGRAMS": per_sm, "ATTENTION_BACKWARD_GROUP_SPLIT_BELOW": 1 << 20}
    for name, per_sm in (("2/4", (2, 4)), ("4/8", (4, 8)), ("8/16", (8, 16)), ("every head", (1 << 20, 1 << 20)))}


def main():
    shapes = shapes_from_argv(SHAPES)
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}; plan {plan.ATTENTION_BACKWARD_GROUP_SPLIT_PROGRAMS}; "
          "ms per forward + backward (do_bench / back to back / graph)", flush=True)
    names = sys.argv[sys.argv.index("--settings") + 1].split(",") if "--settings" in sys.argv else list(SETTINGS)
    settings = {name: SETTINGS[name] for name in names}
    # --splits 2,4: also each of these splits forced (where it divides the group), FLASH's column left out
    forced = [int(v) for v in sys.argv[sys.argv.index("--splits") + 1].split(",")] if "--splits" in sys.argv else []

    def label():
        return f"x{plan.last_attention_plan().group_split}, "
    for shape in shapes:
        sets = input_sets(gen, *shape)
        for causal in (False, True):
            parts = compare_settings(sets, causal, settings, label)
            for split in (s for s in forced if (shape[1] // shape[2]) % s == 0):
                with mock.patch.object(plan, "dkdv_group_split", lambda *args, split=split, **kwargs: split):
                    parts[-1:-1] = compare_settings(sets, causal, {"forced": {}}, label)[:-1]
            print(shape, "causal" if causal else "full", " | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
