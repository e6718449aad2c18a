"""torch.compile with dynamic shapes: one compiled graph serves every batch (and sequence) size.

Serving code compiles a model once and calls it at whatever batch size the step has; torch.compile
marks a dim dynamic after the first size change (or at once, through ``mark_dynamic``) and traces
it as a symbol. A public function that reads that size as a Python value while it is traced (a
lookup of a signature by shape, a plan) specializes the dim, and every new size compiles the graph
again, up to dynamo's recompile limit, after which the frame runs uncompiled. Here each op's dims
that vary between calls in practice are marked dynamic (dynamo raises if the op specializes one),
and a second size must run without recompiling and match the eager call.
"""

from __future__ import annotations

import pytest
import torch

import onlinesoftmax

from conftest import DEVICE, ON_GPU, make_logits

BACKEND = "inductor" if ON_GPU else "aot_eager"  # aot_eager: dynamo and AOT autograd without compiling C++
BF16 = torch.bfloat16


def _softmax_inputs(n, gen):
    return (make_logits((n, 33), torch.float32, gen),)


def _cross_entropy_inputs(n, gen):
    return make_logits((n, 40), torch.float32, gen), torch.randint(0, 40, (n,), generator=gen).to(DEVICE)


def _qkv(batch, seq, gen):
    return tuple(make_logits((batch, 2, seq, 16), BF16, gen, outliers=False) for _ in range(3))


def _kvcache_inputs(n, gen):
    q = make_logits((n, 1, 2, 16), BF16, gen, outliers=False)
    k_cache, v_cache = (make_logits((n, 48, 2, 16), BF16, gen, outliers=False) for _ in range(2))
    lens = torch.randint(1, 49, (n,), generator=gen).to(torch.int32).to(DEVICE)
    return q, k_cache, v_cache, lens


def _merge_inputs(n, gen):
    return make_logits((3, n, 2, 16), torch.float32, gen), make_logits((3, n, 2), torch.float32, gen)


def _linear_inputs(n, gen):
    x, w = make_logits((n, 16), torch.float32, gen, scale=0.5), make_logits((40, 16), torch.float32, gen, scale=0.5)
    return x, w, torch.randint(0, 40, (n,), generator=gen).to(DEVICE)


# name: (the compiled function, inputs at size n, the (input, dim) pairs marked dynamic, whether
# the inputs that are floating point take gradients).
CASES = {
    "softmax": (lambda x: onlinesoftmax.softmax(x, -1), _softmax_inputs, [(0, 0)], False),
    "log_softmax, differentiated": (lambda x: onlinesoftmax.log_softmax(x, -1) * 2.0, _softmax_inputs, [(0, 0)], True),
    "logsumexp, differentiated": (lambda x: onlinesoftmax.logsumexp(x, -1), _softmax_inputs, [(0, 0)], True),
    "softmax with temperature": (lambda x: onlinesoftmax.softmax(x, -1, temperature=0.5), _softmax_inputs,
                                 [(0, 0)], False),
    "cross_entropy, differentiated": (lambda x, t: onlinesoftmax.cross_entropy(x, t), _cross_entropy_inputs,
                                      [(0, 0), (1, 0)], True),
    "cross_entropy, reduction none": (lambda x, t: onlinesoftmax.cross_entropy(x, t, reduction="none"),
                                      _cross_entropy_inputs, [(0, 0), (1, 0)], True),
    "softmax_topk, differentiated": (lambda x: onlinesoftmax.softmax_topk(x, 3)[0], _softmax_inputs, [(0, 0)], True),
    "attention, batch": (lambda q, k, v: onlinesoftmax.attention(q, k, v, causal=True),
                         lambda n, gen: _qkv(n, 16, gen), [(0, 0), (1, 0), (2, 0)], True),
    "attention, sequence": (lambda q, k, v: onlinesoftmax.attention(q, k, v),
                            lambda n, gen: _qkv(1, 4 * n + 1, gen), [(0, 2), (1, 2), (2, 2)], True),
    "attention_with_kvcache": (lambda q, k, v, lens: onlinesoftmax.attention_with_kvcache(
        q, k, v, cache_seqlens=lens), _kvcache_inputs, [(0, 0), (1, 0), (2, 0), (3, 0)], False),
    "linear_cross_entropy, differentiated": (lambda x, w, t: onlinesoftmax.linear_cross_entropy(x, w, t),
                                             _linear_inputs, [(0, 0), (2, 0)], True),
    "merge_attention": (lambda outs, lses: onlinesoftmax.merge_attention(outs, lses)[0], _merge_inputs,
                        [(0, 1), (1, 1)], False),
}


def _run(fn, args, grad):
    """fn's output and, with ``grad``, the gradients of its floating-point inputs (a fixed cotangent)."""
    out = fn(*args)
    if not grad:
        return [out]
    leaves = [a for a in args if a.requires_grad]
    cotangent = torch.ones_like(out) if out.dim() == 0 else torch.linspace(-1, 1, out.numel(), device=out.device
                                                                           ).reshape(out.shape).to(out.dtype)
    return [out, *torch.autograd.grad(out, leaves, cotangent)]


@pytest.mark.parametrize("mode", ["marked dims", "dynamic=True"])
@pytest.mark.parametrize("name", list(CASES))
def test_one_graph_serves_every_size(name, mode, gen):
    # "dynamic=True" traces every dim as a symbol, and the public functions' float defaults too
    # (math.isfinite of one was a graph break: _validate.finite).
    fn, make, dynamic, grad = CASES[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=BACKEND, dynamic=True if mode == "dynamic=True" else None)
    for n, recompile_is_error in ((5, False), (7, True)):
        args = [a.requires_grad_() if grad and a.is_floating_point() else a for a in make(n, gen)]
        for i, d in dynamic if mode == "marked dims" else ():
            torch._dynamo.mark_dynamic(args[i], d)  # dynamo raises if the traced op specializes the dim
        with torch._dynamo.config.patch(error_on_recompile=recompile_is_error):
            got = _run(compiled, args, grad)
        want = _run(fn, args, grad)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name} at size {n}: {m}")


def test_export_with_a_dynamic_batch(gen):
    # torch.export (what AOTInductor and other serving runtimes take) traces the same path: one
    # program for every batch size in the declared range.
    class Model(torch.nn.Module):
        def forward(self, x, t, q, k, v):
            return (onlinesoftmax.softmax(x, -1).sum() + onlinesoftmax.cross_entropy(x, t)
                    + onlinesoftmax.softmax_topk(x, 3)[0].sum() + onlinesoftmax.logsumexp(x, -1).sum()
                    + onlinesoftmax.attention(q, k, v).float().sum())

    def inputs(n):
        return (*_cross_entropy_inputs(n, gen), *_qkv(n, 16, gen))

    batch = torch.export.Dim("batch", min=2, max=1024)
    program = torch.export.export(Model(), inputs(5), dynamic_shapes=({0: batch},) * 5)
    for n in (5, 9):
        args = inputs(n)
        torch.testing.assert_close(program.module()(*args), Model()(*args), rtol=1e-5, atol=1e-5)
