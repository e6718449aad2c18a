"""``onlinesoftmax check`` and the CPU side of ``onlinesoftmax bench``: each op against float64.

On a GPU the Triton kernels run; on a CPU, torch's kernels or (with ``TRITON_INTERPRET=1``) the
Triton kernels through the interpreter. Small inputs with outliers, a fresh seed printed first.
"""

from __future__ import annotations

import secrets
import time

import torch

# Bound on ||out - ref|| / ||ref|| by result dtype (the tests' table, loosened for attention's bf16 products).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    finite = torch.isfinite(ref)
    if torch.isnan(out[finite]).any():
        return float("nan")
    return ((out[finite] - ref[finite]).norm() / ref[finite].norm().clamp_min(1e-300)).item()


def _logits(shape, dtype, gen, device):
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 3
    flat = x.view(-1)
    flat[torch.randint(0, flat.numel(), (max(1, flat.numel() // 50),), generator=gen)] *= 20
    return x.to(dtype).to(device)


def _softmax_family(gen, device):
    import onlinesoftmax

    for shape in [(33, 1000), (4, 50257)]:
        for dtype in (torch.float32, torch.bfloat16):
            x = _logits(shape, dtype, gen, device)
            for name, ours, ref in (("softmax", onlinesoftmax.softmax, torch.softmax),
                                    ("log_softmax", onlinesoftmax.log_softmax, torch.log_softmax),
                                    ("logsumexp", onlinesoftmax.logsumexp, torch.logsumexp)):
                yield name, shape, dtype, _relative_error(ours(x, -1), ref(x.double(), -1)), TOLERANCE[dtype]


def _topk(gen, device):
    import onlinesoftmax

    for shape, k in [((8, 5000), 5), ((2, 4099), 50)]:
        for dtype in (torch.float32, torch.bfloat16):
            x = _logits(shape, dtype, gen, device)
            values, indices = onlinesoftmax.softmax_topk(x, k)
            probs = torch.softmax(x.double(), -1)
            ref = torch.topk(probs, k).values
            err = max(_relative_error(values, ref), _relative_error(probs.gather(-1, indices), ref))
            yield "softmax_topk", shape + (k,), dtype, err, TOLERANCE[dtype]


def _attention(gen, device):
    import onlinesoftmax

    for causal in (False, True):
        q, k, v = (torch.randn((1, 2, 77, 64), generator=gen).to(device=device, dtype=torch.bfloat16)
                   for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        out = onlinesoftmax.attention(q, k, v, causal=causal)
        yield "attention" + (" causal" if causal else ""), tuple(q.shape), torch.bfloat16, _relative_error(out, ref), 2e-2


def _decode(gen, device):
    from .bench import decode_suite

    yield from decode_suite.check(gen, device)


def _cross_entropy(gen, device):
    import onlinesoftmax

    for shape in [(33, 1000), (5, 50257)]:
        for dtype in (torch.float32, torch.bfloat16):
            x = _logits(shape, dtype, gen, device)
            target = torch.randint(0, shape[1], (shape[0],), generator=gen).to(device)
            ref = torch.nn.functional.cross_entropy(x.double(), target, reduction="none")
            err = _relative_error(onlinesoftmax.cross_entropy(x, target, reduction="none"), ref)
            yield "cross_entropy", shape, dtype, err, TOLERANCE[dtype]
            # Probability targets (soft labels), the logits' dtype.
            soft = torch.softmax(torch.randn(shape, generator=gen), -1).to(device=device, dtype=dtype)
            ref = torch.nn.functional.cross_entropy(x.double(), soft.double(), reduction="none")
            err = _relative_error(onlinesoftmax.cross_entropy(x, soft, reduction="none"), ref)
            yield "cross_entropy soft", shape, dtype, err, TOLERANCE[dtype]


CHECKS = {
    "softmax": (_softmax_family,),
    "topk": (_topk,),
    "attention": (_attention,),
    "decode": (_decode,),
    "cross_entropy": (_cross_entropy,),
}
SUITE_CHECKS = {"sweep": "softmax", "host": "softmax", "topk_paper": "topk", "ladder": "softmax",
                "linear_cross_entropy": "cross_entropy", "cross_entropy_probabilities": "cross_entropy"}


def run_checks(suite: str) -> int:
    """Print one line per check; 0 when all pass, 1 otherwise."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    seed = secrets.randbits(31)
    gen = torch.Generator().manual_seed(seed)
    names = list(CHECKS) if suite == "all" else [SUITE_CHECKS.get(suite, suite)]
    names = [n for n in names if n in CHECKS]
    print(f"device: {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}; seed {seed}")
    print(f"{'op':>18s} {'shape':>18s} {'dtype':>9s} {'rel err':>9s} {'ms':>8s}")
    failures = 0
    for name in names:
        for check in CHECKS[name]:
            start = time.perf_counter()
            for op, shape, dtype, err, tol in check(gen, device):
                ok = err <= tol
                failures += not ok
                ms = (time.perf_counter() - start) * 1e3
                print(f"{op:>18s} {str(shape):>18s} {str(dtype)[6:]:>9s} {err:9.1e} {ms:8.1f} {'ok' if ok else 'FAIL'}")
                start = time.perf_counter()
    if not names:
        print(f"(no CPU check for {suite!r})")
    return 1 if failures else 0
