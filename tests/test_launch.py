"""The compiled-kernel key contract of onlinesoftmax._launch, checked where no GPU is needed.

A Launcher reuses the kernel compiled for the first call with a given key. That is only correct if
two calls with equal keys get equal specializations from Triton (each integer argument equal to 1,
divisible by 16, 32 or 64 bits; each pointer 16-byte aligned or not; the constexprs). Record every
launch of a varied workload and hold each key's calls to that, with Triton's own specializer.
Also the eager host path's other contracts: the custom ops' arguments, no gradient made for an lse.
"""

from __future__ import annotations

import collections

import pytest
import torch
import triton
import triton.language as tl
from torch.utils._python_dispatch import TorchDispatchMode
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

import onlinesoftmax
from onlinesoftmax import _buffers, _launch
from onlinesoftmax.ops.softmax import kernels as softmax_kernels, launch as softmax_launch

from conftest import DEVICE, TRITON_RUNS, make_logits, needs_triton


def specialization(args):
    return tuple(native_specialize_impl(BaseBackend, a, False, True, True) for a in args)


def _every_bound_launch_through_its_launcher(monkeypatch):
    # A bound launch calls the compiled kernel directly after its first call (on a GPU): route
    # every call through Launcher.__call__ so that the recording sees them all.
    monkeypatch.setattr(_launch.BoundLaunch, "__call__",
                        lambda self, *args: self.launcher(self.grid, self.key, *args, **self.meta))


@needs_triton
def test_equal_keys_mean_equal_specializations(gen, monkeypatch):
    seen = collections.defaultdict(set)

    def recording(self, grid, key, *args, **meta):
        # The keys and Triton's specializations are the question, not the results: the launches
        # are recorded, not made (no host code of these ops reads a kernel's output).
        seen[(id(self), key)].add((specialization(args), tuple(sorted(meta.items()))))

    monkeypatch.setattr(_launch.Launcher, "__call__", recording)
    _every_bound_launch_through_its_launcher(monkeypatch)
    base = make_logits((6, 208), torch.float32, gen)
    flat = make_logits((6 * 64 + 4,), torch.float32, gen)
    views = [
        flat[:384].view(6, 64)[:, :40], flat[1:385].view(6, 64)[:, :40],  # same layout, alignment differs
        base[:, :32], base[:, :33], base[:, 1:33],  # a row length divisible by 16 or not, an offset start
        base.view(-1)[1:1 + 6 * 32].view(6, 32),  # a pointer off 16-byte alignment
        base[::2, :48], base[:1, :48], base[:, 16:].t(),  # other row strides, one row, columns strided
        base[:, :-16], base[:, :-15],
    ]
    for x in views:
        for strategy in ("row_on_chip", "looped", "split_row"):
            for temperature in (1.0, 0.7):
                onlinesoftmax.softmax(x, strategy=strategy, temperature=temperature)
            onlinesoftmax.log_softmax(x, strategy=strategy)
            onlinesoftmax.logsumexp(x, strategy=strategy)
            leaf = x.detach().clone().requires_grad_()
            onlinesoftmax.softmax(leaf, strategy=strategy).backward(torch.ones_like(leaf))
        if x.shape[-1] >= 8:
            for strategy in ("single", "split"):
                onlinesoftmax.softmax_topk(x, 3, strategy=strategy)
    assert len(seen) > 20, "the workload should reach many distinct launch keys"
    shared = {key: calls for key, calls in seen.items() if len(calls) > 1}
    assert not shared, f"keys shared by calls that Triton specializes differently: {list(shared.values())[:2]}"


@needs_triton
def test_the_check_catches_a_key_that_leaves_out_the_alignment(gen, monkeypatch):
    # The same workload with alignment dropped from the key must trip the check above: the test
    # is able to fail.
    seen = collections.defaultdict(set)
    launch = _launch.Launcher.__call__

    def recording(self, grid, key, *args, **meta):
        seen[(id(self), key)].add(specialization(args))
        return launch(self, grid, key, *args, **meta)

    monkeypatch.setattr(_launch.Launcher, "__call__", recording)
    _every_bound_launch_through_its_launcher(monkeypatch)
    monkeypatch.setattr(softmax_launch, "aligned", lambda t: True)
    flat = make_logits((6 * 64 + 4,), torch.float32, gen)
    onlinesoftmax.softmax(flat[:384].view(6, 64)[:, :40], strategy="looped")
    onlinesoftmax.softmax(flat[1:385].view(6, 64)[:, :40], strategy="looped")  # 4 bytes off
    assert any(len(calls) > 1 for calls in seen.values())


@needs_triton
@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the fast path is the one taken")
def test_interpreted_kernels_take_tritons_own_path():
    # Under the interpreter the kernels are not JITFunctions and must not reach the compiled path.
    assert not _launch.Launcher(softmax_kernels.row_on_chip_softmax_kernel).fast


@triton.jit
def _store_as_bf16_kernel(src, dst, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(dst + offsets, tl.load(src + offsets, mask=mask).to(tl.bfloat16), mask=mask)


@needs_triton
def test_bf16_stores_round_to_nearest_even():
    # The GPU rounds fp32 -> bf16 to nearest even; conftest makes the interpreter do the same (it
    # truncates otherwise), so the bf16 tolerances hold for one rounding as on the GPU. Halfway
    # cases both ways, just past halfway, a carry into the exponent, overflow, subnormals, inf, NaN.
    one, ulp = 1.0, 2.0 ** -7
    values = [one + ulp / 2, one + 3 * ulp / 2, one + ulp / 2 + 2.0 ** -20, -(one + ulp / 2 + 2.0 ** -20),
              2.0 - 2.0 ** -20, 3.3895e38, -3.4e38, 1.5e-39, -2.5e-40, 1e-45, 0.0, -0.0,
              float("inf"), float("-inf"), float("nan"), 0.1, -7.77, 1234.5678]
    src = torch.tensor(values, dtype=torch.float32, device=DEVICE)
    dst = torch.full_like(src, float("nan"), dtype=torch.bfloat16)
    _store_as_bf16_kernel[(1,)](src, dst, len(values), BLOCK=32)
    want = src.to(torch.bfloat16)
    assert torch.equal(dst.view(torch.int16).cpu(), want.view(torch.int16).cpu()), \
        f"{dst.float().tolist()} vs {want.float().tolist()}"
    # The cases are not vacuous: truncation gives other bits on the second and third.
    assert want[1].item() == one + 2 * ulp and want[2].item() == one + ulp


class _FakeCompiled:
    """Stands in for Triton's CompiledKernel: ``run`` is a launcher whose C ``launch`` records calls."""

    def __init__(self, calls, scratch=0):
        launcher = type("Launcher", (), {})()
        launcher.launch = lambda *args: calls.append(("C", args))  # a Python function: not Triton's C launcher
        launcher.global_scratch_size = scratch
        launcher.profile_scratch_size = 0
        launcher.launch_cooperative_grid = False
        launcher.launch_pdl = False
        self.run, self.function, self.packed_metadata = launcher, "function", "metadata"


def test_bound_launch_goes_direct_after_its_first_call(monkeypatch):
    # The compiled path needs a GPU; here its pieces are stand-ins: the first call goes through
    # the launcher (Triton's own path, which compiles), every later one straight to the kernel's
    # launcher with the grid, the stream, the launcher's fixed arguments, the runtime arguments
    # (a tensor as its address: _launch.POINTERS_AS_ADDRESSES) and the constexprs in signature order.
    calls = []

    class FakeJit:
        arg_names = ["x", "n", "BLOCK", "FLAG"]
        params = [type("P", (), {"name": n, "default": d})() for n, d in
                  (("x", None), ("n", None), ("BLOCK", None), ("FLAG", True))]

        def __getitem__(self, grid):
            def first(*args, **meta):
                calls.append(("triton", grid, args, meta))
                return compiled
            return first

    compiled = _FakeCompiled(calls)
    monkeypatch.setattr(_launch, "_direct_launch", lambda kernel, tail: (
        lambda *args: calls.append(("C", args)),
        (kernel.function, False, False, None, None, kernel.packed_metadata, None, None, None), tail))
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    launcher = _launch.Launcher(FakeJit())
    launcher.fast = True  # as for a JITFunction
    launcher.arg_names, launcher.defaults = FakeJit.arg_names, {p.name: p.default for p in FakeJit.params}
    x = torch.zeros(4)
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    bound = launcher.bind((7,), "key", BLOCK=16)
    bound(x, 3)
    assert calls == [("triton", (7,), (x, 3), {"BLOCK": 16})] and bound.direct is not None
    bound(x, 5)
    assert calls[1] == ("C", (7, 1, 1, 1234, "function", False, False, None, None, "metadata", None, None, None,
                              x.data_ptr(), 5, 16, True))
    other = torch.zeros(3)
    bound(other, 6)  # the address of the tensor of this call
    assert calls.pop() == ("C", (7, 1, 1, 1234, "function", False, False, None, None, "metadata", None, None, None,
                                 other.data_ptr(), 6, 16, True))
    # The launcher itself, called again with the same key, takes the same direct path.
    launcher((7, 2), "key", x, 9, BLOCK=16)
    assert calls[2] == ("C", (7, 2, 1, 1234, "function", False, False, None, None, "metadata", None, None, None,
                              x, 9, 16, True))
    # Launch hooks installed (a profiler): every call takes Triton's path again.
    from triton import knobs
    monkeypatch.setattr(knobs.runtime.launch_enter_hook, "calls", [lambda *a: None])
    launcher_calls = []
    monkeypatch.setattr(_launch.Launcher, "__call__", lambda self, *a, **k: launcher_calls.append(a))
    bound(x, 6)
    assert launcher_calls == [((7,), "key", x, 6)] and len(calls) == 3


def test_direct_launch_takes_the_c_launcher_only_without_scratch():
    calls = []
    builtin_launch = len  # any builtin stands for the compiled C function
    plain = _FakeCompiled(calls)
    plain.run.launch = builtin_launch
    launch, prefix, tail = _launch._direct_launch(plain, (1,))
    assert launch is builtin_launch and prefix == ("function", False, False, None, None, "metadata", None, None, None)
    scratch = _FakeCompiled(calls, scratch=128)  # device-side descriptors: Triton's wrapper allocates
    scratch.run.launch = builtin_launch
    launch, prefix, tail = _launch._direct_launch(scratch, (1,))
    assert launch is scratch.run and prefix == ("function", "metadata", None, None, None)


def test_capture_check_asks_the_driver_only_off_the_default_stream(monkeypatch):
    # The legacy default stream (handle 0) cannot capture: its handle answers, and the driver's query
    # (0.3 us a call) runs only on other streams, where it decides.
    from onlinesoftmax import _device

    asked = []

    def query():
        asked.append(True)
        return True

    monkeypatch.setattr(_device, "_stream_is_capturing", query)
    monkeypatch.setattr(_device, "current_raw_stream", lambda index: 0)
    assert not _device.capturing(0) and not asked
    monkeypatch.setattr(_device, "current_raw_stream", lambda index: 0x5A5A)
    assert _device.capturing(0) and asked == [True]
    monkeypatch.setattr(_device, "_stream_is_capturing", lambda: False)
    assert not _device.capturing(0)


# The real allocators, taken before the autouse fixture replaces them with NaN-filled ones.
_template, _cached_empty = _buffers.template, _buffers.empty


@pytest.mark.parametrize("shape", [(4, 8), (2, 3, 5), (1, 7), (7, 1), (1, 1), (1,), (), (0,), (0, 5), (3, 0, 2)])
def test_templates_give_fresh_contiguous_buffers(shape):
    stand_in = _template(shape, torch.float16, torch.device("cpu"))
    assert stand_in.untyped_storage().nbytes() <= 2 or stand_in.numel() <= 1  # one element, whatever the shape
    first, second = torch.empty_like(stand_in), torch.empty_like(stand_in)
    for buffer in (first, second):
        assert buffer.shape == shape and buffer.dtype == torch.float16
        assert buffer.stride() == torch.empty(shape).stride(), "not laid out contiguously"
    if first.numel():
        assert first.data_ptr() != second.data_ptr()


def test_cached_empty_matches_torch_empty():
    device = torch.device("cpu")
    for shape in [(3, 4), (3, 4), [2, 2], (), (0, 3)]:
        buffer = _cached_empty(shape, torch.int64, device)
        assert buffer.shape == tuple(shape) and buffer.dtype == torch.int64 and buffer.is_contiguous()
    a, b = _cached_empty((3, 4), torch.float32, device), _cached_empty((3, 4), torch.float32, device)
    assert a.data_ptr() != b.data_ptr()
    # A device without an index means the current one at each call: never cached.
    _cached_empty((5,), torch.float32, "cpu")
    assert ((5,), torch.float32, "cpu") not in _buffers._TEMPLATES


def test_eager_launches_take_their_custom_ops_arguments():
    # op_when_compiling hands the same positional arguments to the custom op (while tracing) and to
    # the eager launch. Parameters must line up by position: cross_entropy's eager forward once took
    # the op's ``strategy`` as its in-place flag and overwrote the logits.
    import functools
    import importlib
    import inspect

    pairs = []
    for name in ("softmax", "topk", "attention", "decode", "cross_entropy"):
        op = importlib.import_module(f"onlinesoftmax.ops.{name}.op")
        pairs += [(f"{name}.{attr}", value) for attr, value in vars(op).items() if hasattr(value, "custom_op")]
    assert len(pairs) >= 11, [p[0] for p in pairs]
    for what, call in pairs:
        schema = [a.name for a in call.custom_op._opoverload._schema.arguments]
        launch = call.launch
        fixed = launch.keywords if isinstance(launch, functools.partial) else {}
        params = [p for p in inspect.signature(launch).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in fixed]
        assert [p.name for p in params[:len(schema)]] == schema, what
        # Whatever the launch takes beyond the op's arguments has a default.
        assert all(p.default is not p.empty for p in params[len(schema):]), what


class _RecordedOps(TorchDispatchMode):
    """The aten ops run while it is active (autograd's own included)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("op", ["cross_entropy", "attention"])
def test_backward_makes_no_gradient_for_the_lse(op, gen):
    # The lse these functions also return is not differentiable; autograd would still make (and
    # fill) a zero gradient for it at every backward unless the function asks it not to: an
    # allocation and a kernel launch, 30-50 us of host time on the H100 machine (bench host).
    if op == "cross_entropy":
        x = make_logits((4, 30), torch.float32, gen).requires_grad_()
        target = torch.randint(0, 30, (4,), generator=gen).to(DEVICE)
        loss, lse = onlinesoftmax.cross_entropy(x, target, return_lse=True)
    else:
        if DEVICE.type == "cpu" and not TRITON_RUNS:
            pytest.skip("torch's attention backward on the CPU makes zeros of its own")
        q, k, v = (make_logits((1, 2, 16, 32), torch.bfloat16, gen).requires_grad_() for _ in range(3))
        loss = onlinesoftmax.attention(q, k, v, causal=True).float().sum()
    with _RecordedOps() as recorded:
        loss.backward()
    assert "aten.zeros.default" not in recorded.ops, recorded.ops


@needs_triton
@pytest.mark.parametrize("cols", [30, 301], ids=["one_chunk", "split_rows"])
@pytest.mark.parametrize("options", [dict(reduction="mean"), dict(reduction="sum", z_loss=1e-3),
                                     dict(reduction="mean", label_smoothing=0.1, weight=True)],
                         ids=["mean", "sum_z", "mean_weighted_smoothed"])
@pytest.mark.parametrize("max_rows", [None, 4], ids=["few_rows", "many_rows"])
def test_forward_reduces_the_loss_in_its_one_launch(cols, options, max_rows, gen, monkeypatch):
    # The separate forward's stream kernel reduces the rows' losses in its last row to finish
    # (REDUCE: one launch a call where a reduce launch followed), the denominators too unless a
    # count launch had to go first. That row is found at a counter the kernel leaves at zero, kept
    # between launches on a GPU (_buffers.row_exchange): calls in a row on one stream must each
    # write the loss (the output starts as NaN). Past REDUCE_IN_ROWS_MAX_ROWS rows the reduce
    # launch follows.
    _every_bound_launch_through_its_launcher(monkeypatch)
    names = []
    call = _launch.Launcher.__call__
    monkeypatch.setattr(_launch.Launcher, "__call__",
                        lambda self, grid, key, *a, **k: (names.append(self.fn.__name__), call(self, grid, key, *a, **k)))
    x = make_logits((5, cols), torch.float32, gen)
    target = torch.randint(0, cols, (5,), generator=gen).to(DEVICE)
    target[1] = -100
    weight = torch.rand(cols, generator=gen).to(DEVICE) + 0.5 if options.get("weight") else None
    kwargs = dict(options, weight=weight)
    z_loss = kwargs.pop("z_loss", 0.0)
    expected = torch.nn.functional.cross_entropy(x.double(), target, **{k: v.double() if k == "weight" and v is not None
                                                                     else v for k, v in kwargs.items()})
    if z_loss:
        lse = torch.logsumexp(x.double()[target != -100], -1)
        expected = expected + z_loss * (lse * lse).sum()
    losses = []
    table = {} if max_rows is None else dict(REDUCE_IN_ROWS_MAX_ROWS=max_rows)
    for _ in range(3):
        names.clear()
        with onlinesoftmax.override_plan("cross_entropy", **table):
            losses.append(onlinesoftmax.cross_entropy(x, target, z_loss=z_loss, **kwargs))
        count = ["cross_entropy_reduce_kernel"] if weight is not None else []  # the count goes first there
        reduce = [] if max_rows is None else ["cross_entropy_reduce_kernel"]
        assert names == count + ["cross_entropy_stream_kernel"] + reduce, names
    assert torch.allclose(losses[0].double(), expected, rtol=1e-5), (losses[0], expected)
    assert all(torch.equal(loss, losses[0]) for loss in losses), losses
