"""Kernel launches with a per-launcher cache of compiled kernels, skipping Triton's per-call binding.

``kernel[grid](*args, **meta)`` re-derives, on every call, the specialization of each argument (int
equal to 1, divisible by 16, 32 or 64 bits; pointer 16-byte aligned), the cache key, the current
device and stream, and checks the kernel's globals. On the H100 machine's host that cost 10.6 us for
a one-argument kernel and 19.6 us for one shaped like ours (scripts/probes/launch_overhead.py), more than
the GPU needs for a decode-sized softmax (a 16x262144 bf16 row set moves 16 MB: 6 us at 3 TB/s).

Callers already know everything that decides the specialization: the op's launch recipe is cached
by shape, strides, dtypes and options, which fix every integer argument and every constexpr. They
pass that knowledge as ``key`` (plus what varies per call: the input pointer's alignment), and a
repeated key goes straight to the compiled kernel's launcher. A new key takes Triton's own path
once, which compiles (or finds) the kernel and launches it; its result is remembered under the key.

The key contract: two calls with equal keys must give Triton equal specializations. Outputs come
from the caching allocator (aligned to 512 bytes), so only caller-owned tensors' alignment needs to
be in the key. Under the interpreter, or with launch hooks installed (a profiler such as proton), every call
takes Triton's path; without any, the fast path hands the launcher None for the hooks.
"""

from __future__ import annotations

import functools

import torch
from triton import knobs
from triton.runtime.jit import JITFunction

from ._device import programmatic_launch


MAX_KEYS = 8192  # compiled-kernel entries per launcher before the table starts over


class Launcher:
    """``Launcher(jit_fn)(grid, key, *args, num_warps=..., **constexprs)`` launches ``jit_fn``.

    Positional ``args`` are the kernel's runtime arguments, in order, the first a tensor (it names
    the device); keyword arguments its constexprs and launch options, as for ``jit_fn[grid]``.
    """

    def __init__(self, fn):
        self.fn = fn
        self.compiled: dict = {}
        self.fast = isinstance(fn, JITFunction)  # the interpreter wraps kernels in another type
        if self.fast:
            self.arg_names = list(fn.arg_names)
            self.defaults = {p.name: p.default for p in fn.params}

    def __call__(self, grid, key, *args, **meta):
        hooks = knobs.runtime
        if not self.fast or hooks.launch_enter_hook.calls or hooks.launch_exit_hook.calls:
            self.fn[grid](*args, **meta)
            return
        device = torch._C._cuda_getDevice()
        if args[0].get_device() != device:
            # Triton launches on the current device; run where the tensors are, as torch ops do.
            with torch.cuda.device(args[0].device):
                return self(grid, key, *args, **meta)
        entry = self.compiled.get((device, key))
        if entry is None:
            kernel = self.fn[grid](*args, **meta)  # compiles on first use, launches
            # The compiled launcher takes every parameter, constexprs included, in signature order.
            tail = tuple(meta[name] if name in meta else self.defaults[name]
                         for name in self.arg_names[len(args):])
            if len(self.compiled) >= MAX_KEYS:
                self.compiled.clear()
            self.compiled[(device, key)] = _direct_launch(kernel, tail)
            return
        launch, prefix, tail = entry
        launch(*_grid3(grid), torch._C._cuda_getCurrentRawStream(device), *prefix, *args, *tail)

    def bind(self, grid, key, **meta) -> "BoundLaunch":
        """This kernel's launch for one recipe: grid, key and constexprs fixed, called with the runtime
        arguments alone (what a prepared call repeats every time)."""
        return BoundLaunch(self, grid, key, meta)

    def entry(self, key):
        """(device, launch, prefix, tail) of ``key`` on the current device, once launched there; else None."""
        device = torch._C._cuda_getDevice()
        entry = self.compiled.get((device, key))
        return None if entry is None else (device, *entry)


def dependent_launch(device: torch.device) -> dict:
    """The constexpr WAIT and the launch option of a kernel that begins with
    ``_triton.dependent_start(WAIT, ...)``: launched programmatically dependent on the kernel before
    it where the device allows (_device.programmatic_launch), else plainly."""
    return dict(WAIT=True, launch_pdl=True) if programmatic_launch(device) else dict(WAIT=False)


def _grid3(grid) -> tuple:
    """A grid of one to three dims as the three the launcher takes."""
    return (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)


def _direct_launch(kernel, tail: tuple) -> tuple:
    """(launch, prefix, tail) such that ``launch(gx, gy, gz, stream, *prefix, *args, *tail)`` launches
    ``kernel``: its C launcher itself when the kernel needs no scratch memory from Triton's
    allocators (which its Python wrapper would allocate per launch), else that wrapper."""
    run = kernel.run
    launch = getattr(run, "launch", None)
    if (getattr(run, "global_scratch_size", 1) == 0 and getattr(run, "profile_scratch_size", 1) == 0
            and type(launch).__name__ == "builtin_function_or_method"):
        # CudaLauncher.__call__ without its per-launch Python: no scratch, no launch hooks.
        return launch, (kernel.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                        kernel.packed_metadata, None, None, None), tail
    return run, (kernel.function, kernel.packed_metadata, None, None, None), tail


class BoundLaunch:
    """``Launcher.bind(grid, key, **meta)``: ``bound(*args)`` launches as ``launcher(grid, key, *args,
    **meta)`` does, without re-reading the grid, the key and the constexprs every call: the first
    call (and any call made with launch hooks installed, or another current device) goes through
    the launcher; later ones call the compiled kernel's launcher directly (see _direct_call)."""

    __slots__ = ("launcher", "grid", "key", "meta", "grid3", "device", "direct")

    def __init__(self, launcher: Launcher, grid, key, meta: dict):
        self.launcher, self.grid, self.key, self.meta = launcher, grid, key, meta
        self.grid3 = _grid3(grid)
        self.device = self.direct = None

    def __call__(self, *args):
        direct = self.direct
        hooks = knobs.runtime
        if (direct is None or hooks.launch_enter_hook.calls or hooks.launch_exit_hook.calls
                or torch._C._cuda_getDevice() != self.device):
            self.launcher(self.grid, self.key, *args, **self.meta)
            entry = self.launcher.entry(self.key) if self.launcher.fast and direct is None else None
            if entry is not None:
                self.device, self.direct = entry[0], _direct_call(entry, self.grid3, args)
            return
        direct(*args)


# Tensor arguments reach a bound kernel's C launcher as their addresses. Given a tensor, the
# launcher calls its data_ptr() and then asks the driver about the address on every launch
# (cuPointerGetAttribute, to refuse CPU tensors; callers have checked the devices already); an int
# it takes as it is. scripts/probes/probe_pointer_args.py: about 0.3 µs a pointer on an H200
# machine's host, where ``t.data_ptr()`` in Python costs about half that.
POINTERS_AS_ADDRESSES = True


def _direct_call(entry: tuple, grid3: tuple, sample: tuple):
    """``call(*args)``, launching ``entry``'s compiled kernel (Launcher.entry) on ``grid3`` on the
    current stream: one straight call of its launcher, whose fixed arguments are the function's
    own names, with each argument that ``sample`` (the first call's) held a tensor at passed as
    its address (POINTERS_AS_ADDRESSES). Generated once per bound launch, as Triton generates its
    binders: a call that unpacks four tuples into the launcher costs more host time."""
    device, launch, prefix, tail = entry
    scope = {"launch": launch, "stream": torch._C._cuda_getCurrentRawStream, "device": device}
    fixed = []
    for name, values in (("g", grid3), ("p", prefix)):
        for i, value in enumerate(values):
            scope[f"{name}{i}"] = value
            fixed.append(f"{name}{i}")
    names = [f"a{i}" for i in range(len(sample))]
    passed = [f"{name}.data_ptr()" if POINTERS_AS_ADDRESSES and isinstance(value, torch.Tensor) else name
              for name, value in zip(names, sample)]
    for i, value in enumerate(tail):
        scope[f"t{i}"] = value
        passed.append(f"t{i}")
    arguments = ", ".join([*fixed[:3], "stream(device)", *fixed[3:], *passed])
    exec(f"def direct_call({', '.join(names)}):\n    launch({arguments})\n", scope)
    return scope["direct_call"]


def op_when_compiling(custom_op, launch):
    """``launch`` directly in eager mode, ``custom_op`` while torch.compile traces.

    The custom-op dispatcher costs tens of microseconds per call in eager mode, as much as a
    decode-sized kernel; only torch.compile needs the op boundary (and its fake implementation).
    """

    def call(*args):
        if torch.compiler.is_compiling():
            return custom_op(*args)
        return launch(*args)

    # Both take the same positional arguments: tests/test_launch.py checks the op's schema against
    # the launch's parameters (a mismatch once fed a strategy into an in-place flag).
    call.custom_op, call.launch = custom_op, launch
    return call


def aligned(t: torch.Tensor) -> bool:
    """Whether Triton sees ``t``'s pointer as 16-byte aligned (part of its specialization)."""
    return t.data_ptr() % 16 == 0


def vector_width(head_dim: int, *tensors: torch.Tensor) -> int:
    """VEC for the attention and decode kernels (``_triton.known_multiple`` of their head dim and
    strides) where the head dim of these 4-D tensors (dims 0-2 any order of batch, heads, rows) is
    no multiple of 16, so Triton's specialization tells the compiler nothing of its alignment: the
    most elements, up to 16 bytes' worth, that divide it and every other stride, with unit stride
    along the head dim (8 bf16 at head dim 40, 4 at 36); else 1."""
    if head_dim % 16 == 0 or any(t.stride(3) != 1 for t in tensors):
        return 1
    values = (head_dim, *(stride for t in tensors for stride in t.stride()[:3]))
    vec = 16 // tensors[0].element_size()
    while vec > 1 and any(value % vec for value in values):
        vec //= 2
    return vec


def rows_of_whole_vectors(head_dim: int, vec: int, *tensors: torch.Tensor) -> bool:
    """Whether the compiler sees every row of these 4-D tensors (head dim last, unit stride) as
    whole 16-byte vectors from 16-byte aligned pointers: told so by VEC (``vector_width``) where
    the head dim is no multiple of 16, or from Triton's own specialization (integers divisible by
    16) where the head dim and every stride of dims 0-2 are multiples of 16 elements. The attention
    plans split head dims whose second part runs past them (176 = 128 + 64) only then."""
    if not all(aligned(t) and t.stride(3) == 1 for t in tensors):
        return False
    if vec * tensors[0].element_size() == 16:
        return True
    return head_dim % 16 == 0 and all(stride % 16 == 0 for t in tensors for stride in t.stride()[:3])


class RegisterCap:
    """``compile_options`` from a plan's ``max_registers`` (a cap on registers a thread, Triton's
    maxnreg; 0: the compiler's choice), built once per plan since every launch reads it."""

    @functools.cached_property
    def compile_options(self) -> dict:
        """Options for Triton's compiler beyond num_warps and num_stages (the interpreter ignores them)."""
        return {"maxnreg": self.max_registers} if self.max_registers else {}
