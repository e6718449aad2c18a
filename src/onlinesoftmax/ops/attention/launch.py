"""Flash attention launchers: layout checks (TMA descriptors or pointer loads), the forward and
backward launches. ``launch_forward`` and ``launch_backward`` take validated inputs; the
distributed module's context-parallel attention builds on them."""

from __future__ import annotations

from typing import Optional

import torch
import triton
from triton.runtime import _allocation

from ... import _buffers, cpu
from ..._device import interpreter_active, next_power_of_2, plan_cache as _device_plan_cache, remember
from ..._launch import Launcher, aligned, rows_of_whole_vectors, vector_width
from . import plan as planner
from .backward_kernels import (
    attention_backward_delta_kernel,
    attention_backward_dkdv_kernel,
    attention_backward_dq_kernel,
    attention_backward_fused_kernel,
    attention_backward_sum_parts_kernel,
)
from .kernels import LOG2E, attention_forward_kernel, attention_forward_kv_stationary_kernel



def _descriptor_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator():
    # Device-side tensor descriptors need global scratch for the descriptor itself (128 bytes per
    # program); Triton asks the allocator registered with triton.set_allocator. That registration
    # is a ContextVar: set in one thread it is absent in another (autograd runs backward in its
    # own thread), so it is checked before every launch. A user's own allocator is left alone.
    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_descriptor_scratch)


def _head_stride(t: torch.Tensor) -> Optional[int]:
    """Stride of the merged (batch * heads) dim of a (B, H, S, D) tensor, or None if they do not merge."""
    b, h = t.shape[0], t.shape[1]
    if h == 1:
        return t.stride(0)
    if b == 1 or t.stride(0) == h * t.stride(1):
        return t.stride(1)
    return None


def descriptor_ok(*tensors: torch.Tensor) -> bool:
    """TMA's conditions: unit stride along the head dim, 16-byte aligned base and strides, no empty
    dim; and rows of a 16-byte multiple, for the outputs the kernels write contiguous through
    descriptors of their own (a head dim of 44 read from rows of 48 had passed on the inputs alone)."""
    if tensors and (tensors[0].shape[3] * tensors[0].element_size()) % 16:
        return False
    for t in tensors:
        head_stride = _head_stride(t)
        # Broadcast views (stride 0, e.g. K/V expanded over heads) are left to pointer loads.
        if t.numel() == 0 or t.stride(3) != 1 or not head_stride or t.stride(2) <= 0:
            return False
        elem = t.element_size()
        if t.data_ptr() % 16 or (head_stride * elem) % 16 or (t.stride(2) * elem) % 16:
            return False
    return True


def heads_follow_rows(*tensors: torch.Tensor) -> bool:
    """Whether each (B, H, S, D) tensor is a stack of (S, D) heads one after another, as 2-D
    descriptors over (B * H * S, D) need (on top of descriptor_ok's conditions)."""
    for t in tensors:
        batch, heads, seq = t.shape[:3]
        # Even with one row a head: its row stride is the descriptor's, so it must be the head stride.
        if batch * heads * seq >= 2**31 or _head_stride(t) != seq * t.stride(2):
            return False
    return True


def rows_ok(*tensors: torch.Tensor) -> bool:
    """Whether the tensors allow the forward's row descriptors: TMA's conditions, heads after heads."""
    return descriptor_ok(*tensors) and heads_follow_rows(*tensors)


def _strides(t: torch.Tensor):
    return tuple(t.stride())


def _head_strides(*tensors):
    return tuple(_head_stride(t) or 0 for t in tensors)


def _causal_offset(mode: str, n_queries: int, n_keys: int) -> int:
    return n_keys - n_queries if mode == "bottom_right" else 0


# Launches skip Triton's per-call argument binding (_launch.Launcher), keyed by what decides the
# kernels' specialization: the launch plan, every shape, stride and dtype, and the alignment of the
# caller's tensors (outputs come aligned from the caching allocator). A forward and backward of
# B1 H2 S128 took 1.0 ms of host time per step through Triton's path on the H100 machine's host,
# more than the GPU needs for B8 H16 S1024 (0.93 ms).
_forward_launcher = Launcher(attention_forward_kernel)
_kv_stationary_launcher = Launcher(attention_forward_kv_stationary_kernel)
_delta_launcher = Launcher(attention_backward_delta_kernel)
_dkdv_launcher = Launcher(attention_backward_dkdv_kernel)
_dq_launcher = Launcher(attention_backward_dq_kernel)
_fused_launcher = Launcher(attention_backward_fused_kernel)
_sum_parts_launcher = Launcher(attention_backward_sum_parts_kernel)
# Elements of a KV head's dK (and dV) a program of the partials' sum adds.
SUM_PARTS_BLOCK = 1024


def _block_grid(blocks: int, programs: int, chosen: planner.AttentionPlan) -> tuple[int, int]:
    """A backward kernel's grid: (blocks, programs of a block), or (programs, blocks) where the plan
    launches every head's heaviest block first."""
    return (programs, blocks) if chosen.heavy_first else (blocks, programs)


def _plan_meta(chosen: planner.AttentionPlan, causal: bool) -> dict:
    """The constexprs and launch options every attention kernel takes from its plan."""
    return dict(BLOCK_M=chosen.block_m, BLOCK_N=chosen.block_n, BLOCK_D=chosen.block_d, CAUSAL=causal,
                USE_DESCRIPTOR=chosen.use_descriptor, num_warps=chosen.num_warps, num_stages=chosen.num_stages,
                **chosen.compile_options)


class _ForwardCall:
    """One forward call signature (shapes, strides, dtypes, the tensors' alignment, the mask, the
    load path) with the plan and every launch argument but the scale decided once: a repeated call
    allocates its outputs and launches (on the H100 machine's host the checks and planning of an
    unprepared call cost more than a short sequence's kernel)."""

    __slots__ = ("plan", "out", "lse", "ints", "offset", "launch", "mode")

    def __init__(self, key, q, k, v, mode, use_descriptor):
        batch, n_heads_q, n_queries, head_dim = q.shape
        n_heads_kv, n_keys = k.shape[1], k.shape[2]
        tma_ok = descriptor_ok(q, k, v)
        vec = vector_width(head_dim, q, k, v)
        chosen = self.plan = planner.attention_plan(
            "forward", head_dim, q.dtype, mode != "none", q.device, n_queries, n_keys,
            tma_ok if use_descriptor is None else use_descriptor,
            tma_ok and use_descriptor is not False and heads_follow_rows(q, k, v),
            whole_vectors=rows_of_whole_vectors(head_dim, vec, q, k, v), query_heads=batch * n_heads_q)
        self.mode = mode
        # Templates of the outputs (_buffers.template): out contiguous in q's shape and dtype, lse float32.
        self.out = _buffers.template(q.shape, q.dtype, q.device)
        self.lse = _buffers.template((batch, n_heads_q, n_queries), torch.float32, q.device)
        self.ints = (n_heads_q, n_heads_q // n_heads_kv, batch, n_queries, n_keys, head_dim,
                     *_strides(q), *_strides(k), *_strides(v))
        self.offset = _causal_offset(mode, n_queries, n_keys)
        self.launch = None
        stationary = None if chosen.path == "torch" or use_descriptor else planner.kv_stationary_plan(
            head_dim, q.dtype, mode != "none", q.device, n_queries, n_keys, n_heads_q // n_heads_kv, batch * n_heads_kv,
            tables_specialized=chosen.warp_specialize)
        if stationary is not None:
            chosen = self.plan = stationary
            self.launch = _kv_stationary_launcher.bind(
                (batch * n_heads_kv, chosen.group_split), (key, chosen), BLOCK_M=chosen.block_m, BLOCK_N=chosen.block_n,
                BLOCK_D=chosen.block_d, CAUSAL=mode != "none", STAGES=chosen.num_stages, KEY_HALVES=chosen.key_halves,
                num_warps=chosen.num_warps)
        elif chosen.path != "torch":
            self.ints += _head_strides(q, k, v)  # the merged (batch x heads) strides of its descriptors
            grid = (triton.cdiv(n_queries, chosen.block_m), batch * n_heads_q)
            # The plan completes the compiled-kernel key: the call signature alone would launch a kernel
            # compiled under other tables (override_plan) on this plan's grid.
            self.launch = _forward_launcher.bind(
                grid, (key, chosen), **_plan_meta(chosen, mode != "none"), ROW_DESCRIPTORS=chosen.row_descriptors,
                WARP_SPECIALIZE=chosen.warp_specialize, BLOCK_D2=chosen.block_d2, VEC=vec)

    def __call__(self, q, k, v, scale):
        chosen = self.plan
        planner.record_attention(chosen)
        if self.launch is None:
            return cpu.attention_forward(q, k, v, self.mode, scale)
        out, lse = _buffers.empty_like(self.out), _buffers.empty_like(self.lse)
        if out.numel() == 0:
            return out, lse
        if chosen.use_descriptor or chosen.row_descriptors:
            _ensure_allocator()
        self.launch(q, k, v, out, lse, *self.ints, scale * LOG2E, self.offset)
        return out, lse


_FORWARD_CALLS: dict = {}
_device_plan_cache(_FORWARD_CALLS.clear)


def launch_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: str, scale: float,
                   use_descriptor: Optional[bool] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) for validated inputs; ``mode`` is "none", "top_left" or "bottom_right".
    ``use_descriptor`` overrides the layout check: False forces pointer loads everywhere."""
    key = (q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, q.device, aligned(q), aligned(k),
           aligned(v), mode, use_descriptor, interpreter_active())
    call = _FORWARD_CALLS.get(key)
    if call is None:
        call = remember(_FORWARD_CALLS, key, _ForwardCall(key, q, k, v, mode, use_descriptor))
    return call(q, k, v, scale)


class _BackwardCall:
    """One backward call signature, decided once like the forward's: the plans, the launch
    arguments but the tensors, and the launches bound (delta, dK/dV, dQ; or the fused kernel alone
    where the plan gives one). A training step calls it once per layer; unprepared, its planning,
    keys and launch keywords cost more host time than the short sequences' kernels."""

    __slots__ = ("plan", "mode", "delta_buffer", "grads", "zeros", "delta", "dkdv", "dq", "fused", "delta_ints",
                 "ints", "offset", "descriptors", "partials", "sum_parts", "head_size")

    def __init__(self, key, do, q, k, v, mode, use_descriptor):
        batch, n_heads_q, n_queries, head_dim = q.shape
        n_heads_kv, n_keys = k.shape[1], k.shape[2]
        causal = mode != "none"
        ok = descriptor_ok(q, k, v, do) if use_descriptor is None else use_descriptor
        vec = vector_width(head_dim, q, k, v, do)
        whole_vectors = rows_of_whole_vectors(head_dim, vec, q, k, v, do)
        # A forced load path leaves the work out: the plan then keeps it as given.
        batch_heads = batch * n_heads_q if use_descriptor is None else None
        dkdv_plan, dq_plan = planner.backward_plans(head_dim, q.dtype, causal, q.device, batch, n_heads_q, n_heads_kv,
                                                    n_queries, n_keys, ok, batch_heads, whole_vectors)
        self.plan = dkdv_plan
        self.mode = mode
        # Templates (_buffers.template) of delta and the gradients, which the kernels write contiguous.
        self.delta_buffer = _buffers.template((batch, n_heads_q, n_queries), torch.float32, q.device)
        self.grads = tuple(_buffers.template(t.shape, t.dtype, t.device) for t in (q, k, v))
        self.zeros = q.numel() == 0 or k.numel() == 0
        self.delta = self.dkdv = self.dq = self.fused = None
        self.descriptors = dkdv_plan.use_descriptor
        if dkdv_plan.path == "torch" or self.zeros:
            return
        self.ints = (n_heads_q, n_heads_q // n_heads_kv, batch, n_queries, n_keys, head_dim,
                     *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_head_strides(q, k, v, do))
        self.offset = _causal_offset(mode, n_queries, n_keys)
        if dq_plan is None:
            self.fused = _fused_launcher.bind((batch * n_heads_kv,), (key, dkdv_plan),
                                              **_plan_meta(dkdv_plan, causal), VEC=vec)
            return
        delta_block = 64 if head_dim <= 128 else 32
        self.delta = _delta_launcher.bind(
            (triton.cdiv(n_queries, delta_block), batch * n_heads_q), key,
            BLOCK_M=delta_block, BLOCK_D=next_power_of_2(head_dim), VEC=vec, num_warps=4)
        self.delta_ints = (n_heads_q, n_queries, head_dim, *_strides(do))
        # Each kernel's plan in its key, as the forward's.
        split = dkdv_plan.group_split
        if split > 1:
            # float32 partials of dK and dV, a part's rows after another's: (batch, KV heads, parts, keys, D).
            self.partials = _buffers.template((batch * n_heads_kv * split, n_keys, head_dim), torch.float32, q.device)
            self.head_size = n_keys * head_dim
            self.sum_parts = _sum_parts_launcher.bind(
                (triton.cdiv(self.head_size, SUM_PARTS_BLOCK), batch * n_heads_kv), (key, split),
                SPLIT=split, BLOCK=SUM_PARTS_BLOCK, num_warps=4)
        self.dkdv = _dkdv_launcher.bind(_block_grid(dkdv_plan.blocks, batch * n_heads_kv * split, dkdv_plan),
                                        (key, dkdv_plan), **_plan_meta(dkdv_plan, causal), VEC=vec,
                                        BLOCK_D2=dkdv_plan.block_d2, GROUP_SPLIT=split,
                                        HEAVY_FIRST=dkdv_plan.heavy_first)
        self.dq = _dq_launcher.bind(_block_grid(dq_plan.blocks, batch * n_heads_q, dq_plan),
                                    (key, dq_plan), **_plan_meta(dq_plan, causal), VEC=vec,
                                    BLOCK_D2=dq_plan.block_d2, HEAVY_FIRST=dq_plan.heavy_first)
        self.descriptors = dkdv_plan.use_descriptor or dq_plan.use_descriptor

    def __call__(self, do, q, k, v, out, lse, scale):
        planner.record_attention(self.plan)
        if self.plan.path == "torch":
            return cpu.attention_backward(do, q, k, v, out, lse, self.mode, scale)
        dq, dk, dv = (_buffers.empty_like(t) for t in self.grads)
        if self.zeros:
            return dq.zero_(), dk.zero_(), dv.zero_()
        if self.descriptors:
            _ensure_allocator()
        args = (*self.ints, scale * LOG2E, scale, self.offset)
        if self.fused is not None:
            self.fused(q, k, v, out, do, lse, dq, dk, dv, *args)
            return dq, dk, dv
        delta = _buffers.empty_like(self.delta_buffer)
        self.delta(out, do, delta, *self.delta_ints)
        if self.plan.group_split > 1:
            dk_parts, dv_parts = _buffers.empty_like(self.partials), _buffers.empty_like(self.partials)
            self.dkdv(q, k, v, do, lse, delta, dk_parts, dv_parts, *args)
            self.sum_parts(dk_parts, dv_parts, dk, dv, self.head_size)
        else:
            self.dkdv(q, k, v, do, lse, delta, dk, dv, *args)
        self.dq(q, k, v, do, lse, delta, dq, *args)
        return dq, dk, dv


_BACKWARD_CALLS: dict = {}
_device_plan_cache(_BACKWARD_CALLS.clear)


def launch_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, mode: str, scale: float, use_descriptor: Optional[bool] = None):
    """(dq, dk, dv) from the saved forward (out, lse) and the upstream gradient ``do``."""
    # out and lse are the forward's own outputs (contiguous, from the allocator): their layout
    # follows from q's, and only the caller-owned tensors' alignment enters the key.
    key = (q.shape, q.stride(), k.shape, k.stride(), v.stride(), do.stride(), q.dtype, q.device, aligned(q),
           aligned(k), aligned(v), aligned(do), mode, use_descriptor, interpreter_active())
    call = _BACKWARD_CALLS.get(key)
    if call is None:
        call = remember(_BACKWARD_CALLS, key, _BackwardCall(key, do, q, k, v, mode, use_descriptor))
    return call(do, q, k, v, out, lse, scale)
