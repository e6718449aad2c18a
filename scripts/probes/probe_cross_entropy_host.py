"""Where cross_entropy's host time goes on tiny inputs, beside F.cross_entropy's (GPU).

`bench host` has our forward + backward at 8 x 1024 fp32 at 1.5-1.9x F.cross_entropy's. This times
the whole step and its parts (the forward without autograd, the launchers called directly, five
bare allocations, an autograd step of a trivial op) as `bench host` times a call, then cProfiles
our step and torch's.

    python scripts/probes/probe_cross_entropy_host.py
"""

import torch
import torch.nn.functional as F

import onlinesoftmax
from onlinesoftmax.bench.host_suite import host_us, print_profile
from onlinesoftmax.ops.cross_entropy import launch


def main():
    x = torch.randn(8, 1024, device="cuda", requires_grad=True)
    target = torch.randint(0, 1024, (8,), device="cuda")
    logits = x.detach()
    upstream = torch.ones((), device="cuda")
    options = (-100, "mean", 0.0, 0.0, 0.0, 1.0)

    def ours():
        onlinesoftmax.cross_entropy(x, target).backward()

    def theirs():
        F.cross_entropy(x, target).backward()

    def ours_forward():
        with torch.no_grad():
            onlinesoftmax.cross_entropy(x, target)

    def theirs_forward():
        with torch.no_grad():
            F.cross_entropy(x, target)

    def launchers():
        loss, lse, lse_low, denom = launch.launch_forward(logits, target, None, *options, False, None)
        launch.launch_backward(logits, target, None, lse, lse_low, denom, upstream, *options, None)

    def launch_forward():
        launch.launch_forward(logits, target, None, *options, False, None)

    def allocations():
        for _ in range(5):
            torch.empty(8, device="cuda")

    def trivial_step():
        (x * 1.0).sum().backward()

    for name, fn in [("ours forward + backward", ours), ("torch forward + backward", theirs),
                     ("ours forward, no grad", ours_forward), ("torch forward, no grad", theirs_forward),
                     ("launch_forward + launch_backward", launchers), ("launch_forward", launch_forward),
                     ("5 torch.empty", allocations), ("(x * 1).sum().backward()", trivial_step)]:
        print(f"{name:36s} {host_us(fn):8.1f} us", flush=True)
    for fn in (ours, theirs):
        print_profile(fn, 22)


if __name__ == "__main__":
    main()
