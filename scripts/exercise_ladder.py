"""Every step of onlinesoftmax.ladder once at small sizes on the GPU, for compute-sanitizer
(memcheck, racecheck): non-power-of-two rows, rows shorter than the block, -inf and all -inf rows,
both builds (IEEE and fastmath), seed 002's vector with fewer partials than threads and more.
Prints the relative error of each against float64; exits 1 if any is off.
"""

import sys

import torch

from onlinesoftmax import ladder
from onlinesoftmax.bench.harness import relative_error

torch.manual_seed(0)
failures = 0


def report(what, out, ref):
    global failures
    err = relative_error(out, ref)
    nan_ok = torch.equal(torch.isnan(out), torch.isnan(ref))
    ok = err <= 1e-5 and nan_ok
    failures += not ok
    print(f"{what}: rel err {err:.1e}, NaN placement {'ok' if nan_ok else 'WRONG'}{'' if ok else '  FAIL'}")


x = torch.randn(37, 1000, device="cuda") * 3
x[::3, :100] = float("-inf")
x[5] = float("-inf")
short = torch.randn(6, 70, device="cuda")
for name, fn, _ in ladder.ROW_STEPS:
    for fastmath in (False, True):
        report(f"{name} fastmath={fastmath} 37x1000", fn(x, fastmath=fastmath), torch.softmax(x.double(), -1))
    report(f"{name} 6x70", fn(short), torch.softmax(short.double(), -1))
for n, partial_blocks in ((100_003, None), (100_003, 3), (70, None)):
    v = torch.randn(n, device="cuda") * 3
    v[: n // 2] = float("-inf")
    report(f"vector n={n} partial_blocks={partial_blocks}", ladder.softmax_vector_three_kernels(v, partial_blocks=partial_blocks),
           torch.softmax(v.double(), -1))
torch.cuda.synchronize()
sys.exit(1 if failures else 0)
