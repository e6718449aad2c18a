"""``onlinesoftmax bench decode``: attention_with_kvcache against SDPA's backends, FlexAttention,
flash-attn and FlashInfer, in GB/s of the K/V bytes read.

Bytes: decode attention is a stream over the cache, so a row's floor is its visible K/V bytes read
once (sum over sequences of seqlen x Hkv x D x 2 tensors x element size) plus q read and the
output written; its time at the device's copy bandwidth (measured in the same run) is the floor.
Keys past a sequence's length, pages no sequence uses and the padding peers read are not counted.

Peers get the layout they prefer, built once per input set and untimed: SDPA and FlexAttention a
contiguous (B, Hkv, L, D) cache of the longest length L, gathered from the paged cache where the
row is paged, with a boolean mask (B, 1, Sq, L) where lengths differ (a padded batch) and the
bottom-right causal mask where Sq > 1; SDPA's GQA through ``enable_gqa=True`` where the backend
takes it, else K/V repeated to Hq heads (the notes say which). flash-attn reads our contiguous
cache in place, and our paged cache where its page size is allowed (else the gathered cache);
FlashInfer reads our paged cache in place (a contiguous cache as one page per sequence).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from . import harness
from .harness import Case, Implementation

FORWARD = "forward"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TARGET_GBS = 2500.0  # issue 24: >= 2.5 TB/s of K/V read where the cache read is >= 64 MB
TARGET_MIN_BYTES = 64 * 10**6
TARGET_FLOOR_RATIO = 1.3  # batch 1 at 128K keys within 1.3x of the floor


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int
    heads_q: int
    heads_kv: int
    n_queries: int
    head_dim: int
    max_len: int
    page_size: int = 0  # 0: contiguous (B, S_max, Hkv, D)
    lengths: str = "uniform"  # "uniform" | "uneven" (uniform in [max/16, max]) | "skewed" (one max, the rest max/32)

    def lens(self) -> list[int]:
        if self.lengths == "uniform":
            return [self.max_len] * self.batch
        if self.lengths == "skewed":
            return [self.max_len] + [max(1, self.max_len // 32)] * (self.batch - 1)
        gen = torch.Generator().manual_seed(self.batch * 1000003 + self.max_len)  # fixed: bytes are per case
        lens = torch.randint(max(1, self.max_len // 16), self.max_len + 1, (self.batch,), generator=gen).tolist()
        lens[0] = self.max_len
        return lens

    def label(self) -> str:
        lengths = "" if self.lengths == "uniform" else f"-{self.lengths}"
        layout = f"page{self.page_size}" if self.page_size else "contig"
        return (f"B{self.batch}-H{self.heads_q}/{self.heads_kv}-Sq{self.n_queries}-S{self.max_len}{lengths}"
                f"-D{self.head_dim}-{layout}")


# bf16, causal. Issue 24's three rows first, each contiguous and paged; then a batch of short
# sequences, uneven and skewed batches (peers: a padded batch with a mask), MQA, and head dim 64.
# About 4 minutes of an H100 with every peer present (FlexAttention compiles once per row).
GRID = [
    Shape(1, 32, 8, 1, 128, 131072), Shape(1, 32, 8, 1, 128, 131072, page_size=64),
    Shape(64, 32, 8, 1, 128, 4096), Shape(64, 32, 8, 1, 128, 4096, page_size=16),
    Shape(8, 32, 8, 4, 128, 32768), Shape(8, 32, 8, 4, 128, 32768, page_size=64),
    Shape(128, 32, 8, 1, 128, 1024, page_size=16),
    Shape(16, 32, 8, 1, 128, 32768, page_size=16, lengths="uneven"),
    Shape(16, 32, 8, 4, 128, 32768, page_size=64, lengths="skewed"),
    Shape(1, 8, 1, 1, 128, 131072), Shape(32, 8, 1, 4, 128, 8192, page_size=64),
    Shape(4, 32, 8, 1, 64, 32768, page_size=16),
]


def kv_bytes(shape: Shape, element: int) -> int:
    return sum(shape.lens()) * shape.heads_kv * shape.head_dim * 2 * element


def bytes_moved(shape: Shape, element: int) -> int:
    qo = 2 * shape.batch * shape.n_queries * shape.heads_q * shape.head_dim * element
    return kv_bytes(shape, element) + qo


class PeerInputs:
    """The peers' views of one input set, built on first use (untimed) and freed with the set."""

    def __init__(self, shape: Shape, q, k_cache, v_cache, lens, table):
        self.shape, self.q, self.k_cache, self.v_cache, self.lens, self.table = shape, q, k_cache, v_cache, lens, table
        self.built: dict = {}

    def get(self, name, build):
        if name not in self.built:
            self.built[name] = build()
        return self.built[name]

    def gathered(self):
        """(K, V) as contiguous (B, L, Hkv, D) of the longest length L (a padded batch)."""
        def build():
            if self.table is None:
                return self.k_cache, self.v_cache
            keys = torch.arange(self.shape.max_len, device=self.q.device)
            pages = self.table[:, keys // self.shape.page_size].long()
            return self.k_cache[pages, keys % self.shape.page_size], self.v_cache[pages, keys % self.shape.page_size]
        return self.get("gathered", build)

    def bhsd(self):
        """q as (B, Hq, Sq, D) and K, V as contiguous (B, Hkv, L, D): SDPA's and Flex's layout."""
        def build():
            k, v = self.gathered()
            return (self.q.transpose(1, 2), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())
        return self.get("bhsd", build)

    def visible(self):
        """SDPA's mask: None when every query sees every key, the bottom-right causal bias when only
        Sq > 1 needs one (FLASH and EFFICIENT take it), else (B, 1, Sq, L) bool (a padded batch)."""
        def build():
            s = self.shape
            if s.lengths == "uniform" and s.n_queries == 1:
                return None
            if s.lengths == "uniform":
                from torch.nn.attention.bias import causal_lower_right

                return causal_lower_right(s.n_queries, s.max_len)
            keys = torch.arange(s.max_len, device=self.q.device)
            limit = self.lens.long()[:, None] - (s.n_queries - 1 - torch.arange(s.n_queries, device=self.q.device))
            return (keys[None, None, :] < limit[:, :, None])[:, None]
        return self.get("visible", build)


def make_case(shape: Shape, dtype: torch.dtype, device="cuda") -> Case:
    lens_list = shape.lens()

    def make(gen):
        cuda_gen = harness.device_generator(gen, device)
        randn = lambda *size: torch.randn(size, generator=cuda_gen, device=device, dtype=dtype)  # noqa: E731
        q = randn(shape.batch, shape.n_queries, shape.heads_q, shape.head_dim)
        lens = torch.tensor(lens_list, dtype=torch.int32, device=device)
        if shape.page_size:
            per_seq = [-(-n // shape.page_size) for n in lens_list]
            num_blocks = sum(per_seq)
            k_cache = randn(num_blocks, shape.page_size, shape.heads_kv, shape.head_dim)
            v_cache = randn(num_blocks, shape.page_size, shape.heads_kv, shape.head_dim)
            order = torch.randperm(num_blocks, generator=cuda_gen, device=device).int()  # pages shuffled
            table = torch.zeros((shape.batch, max(per_seq)), dtype=torch.int32, device=device)
            start = 0
            for b, n in enumerate(per_seq):
                table[b, :n] = order[start:start + n]
                start += n
        else:
            k_cache = randn(shape.batch, shape.max_len, shape.heads_kv, shape.head_dim)
            v_cache = randn(shape.batch, shape.max_len, shape.heads_kv, shape.head_dim)
            table = None
        return q, k_cache, v_cache, lens, table, PeerInputs(shape, q, k_cache, v_cache, lens, table)

    def reference(inputs):
        from ..ops.decode import op

        q, k_cache, v_cache, lens, table, _ = inputs
        return op.decode_torch(q, k_cache, v_cache, lens, table, True, shape.head_dim ** -0.5, False)[0].float()

    return Case(shape.label(), dtype, FORWARD, bytes_moved(shape, dtype.itemsize), make, reference)


# --------------------------------------------------------------------------------------------
# Implementations
# --------------------------------------------------------------------------------------------


def ours(q, k_cache, v_cache, lens, table, peers):
    from ..ops.decode import attention_with_kvcache

    return attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table, causal=True)


def from_bhsd(out, inputs):
    return out.transpose(1, 2)  # (B, Hq, Sq, D) -> ours (B, Sq, Hq, D)


class Sdpa:
    """SDPA with one backend forced, on the gathered contiguous cache (masked where lengths differ
    or Sq > 1). GQA by ``enable_gqa=True`` where the backend takes it, else K/V repeated to Hq heads
    (built once per input set, untimed); ``gqa`` records which, per row (the mask decides it too)."""

    def __init__(self, backend):
        self.backend = backend
        self.gqa: dict = {}  # Shape -> "enable_gqa=True" | "K/V repeated"

    def __call__(self, q, k_cache, v_cache, lens, table, peers):
        from torch.nn.attention import sdpa_kernel

        sdpa = torch.nn.functional.scaled_dot_product_attention
        qt, k, v = peers.bhsd()
        mask = peers.visible()
        with sdpa_kernel(self.backend):
            if self.gqa.get(peers.shape) != "K/V repeated":
                try:
                    out = sdpa(qt, k, v, attn_mask=mask, enable_gqa=True)
                    self.gqa[peers.shape] = "enable_gqa=True"
                    return out
                except (RuntimeError, TypeError, ValueError):  # the first call of a row, untimed
                    self.gqa[peers.shape] = "K/V repeated"
            group = qt.shape[1] // k.shape[1]
            k, v = peers.get("repeated", lambda: (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)))
            return sdpa(qt, k, v, attn_mask=mask)


class Flex:
    """torch.compile'd FlexAttention on the gathered cache; the block mask (lengths and the
    bottom-right causal mask) is built once per input set."""

    def __init__(self):
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        for knob in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 256)
        self.flex = torch.compile(flex_attention, dynamic=False)

    def __call__(self, q, k_cache, v_cache, lens, table, peers):
        from torch.nn.attention.flex_attention import create_block_mask

        qt, k, v = peers.bhsd()
        n_queries = qt.shape[2]

        def visible(b, h, q_idx, kv_idx):
            return kv_idx <= lens[b] - n_queries + q_idx

        mask = peers.get("flex_mask", lambda: create_block_mask(visible, qt.shape[0], None, n_queries, k.shape[2],
                                                                device=qt.device))
        return self.flex(qt, k, v, block_mask=mask, enable_gqa=qt.shape[1] != k.shape[1])


class FlashAttn:
    """flash-attn's flash_attn_with_kvcache: our caches in place; paged rows whose page size it
    refuses read the gathered contiguous cache instead (``paged_note`` says so)."""

    def __init__(self):
        from flash_attn import flash_attn_with_kvcache

        self.fn = flash_attn_with_kvcache
        self.paged_note: Optional[str] = None

    def __call__(self, q, k_cache, v_cache, lens, table, peers):
        if table is not None and not self.paged_note:
            try:
                return self.fn(q, k_cache, v_cache, cache_seqlens=lens, block_table=table, causal=True)
            except RuntimeError as exc:
                self.paged_note = f"paged rows on the gathered cache ({str(exc).splitlines()[0][:80]})"
        k, v = peers.gathered() if table is not None else (k_cache, v_cache)
        return self.fn(q, k, v, cache_seqlens=lens, causal=True)


class FlashInfer:
    """FlashInfer's batch decode (Sq = 1) or paged prefill (Sq > 1, causal) wrapper on our cache:
    pages as they are, a contiguous cache as one page of S_max per sequence. Planned once per
    input set (its plan reads the page table on the host), untimed."""

    def __init__(self):
        import flashinfer

        self.flashinfer = flashinfer
        self.workspace = None

    def _wrapper(self, q, k_cache, lens, table, shape: Shape):
        fi = self.flashinfer
        if self.workspace is None:
            self.workspace = torch.empty(256 * 2**20, dtype=torch.uint8, device=q.device)
        page = k_cache.shape[1]
        lens_cpu = lens.cpu()
        pages = (lens_cpu + page - 1) // page
        indptr = torch.cat([torch.zeros(1, dtype=torch.int64), pages.cumsum(0)]).int()
        if table is not None:
            indices = torch.cat([table[b, :int(n)].cpu() for b, n in enumerate(pages)])
        else:
            indices = torch.arange(shape.batch, dtype=torch.int32)
        last = (lens_cpu - (pages - 1) * page).int()
        device = q.device
        common = (indptr.to(device), indices.to(device), last.to(device))
        if shape.n_queries == 1:
            wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True)
            wrapper.plan(*common, shape.heads_q, shape.heads_kv, shape.head_dim, page,
                         q_data_type=q.dtype, kv_data_type=k_cache.dtype)
        else:
            wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
            qo_indptr = torch.arange(shape.batch + 1, dtype=torch.int32, device=device) * shape.n_queries
            wrapper.plan(qo_indptr, *common, shape.heads_q, shape.heads_kv, shape.head_dim, page, causal=True,
                         q_data_type=q.dtype, kv_data_type=k_cache.dtype)
        return wrapper

    def __call__(self, q, k_cache, v_cache, lens, table, peers):
        wrapper = peers.get("flashinfer", lambda: self._wrapper(q, k_cache, lens, table, peers.shape))
        out = wrapper.run(q.reshape(-1, q.shape[2], q.shape[3]), (k_cache, v_cache))
        return out.view(q.shape)


def _peer(name, make):
    try:
        return Implementation(name, make())
    except Exception as exc:  # not installed, or no GPU support here: a skipped peer with its reason
        return Implementation(name, skipped=f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}")


def implementations():
    from torch.nn.attention import SDPBackend

    sdpa = {name: Sdpa(backend) for name, backend in
            (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
             ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION))}
    impls = [Implementation(name, fn, check=from_bhsd) for name, fn in sdpa.items()]
    flex = _peer("flex-compiled", Flex)
    flex.check = from_bhsd
    flash_attn = _peer("flash-attn", FlashAttn)
    impls += [flex, flash_attn, _peer("flashinfer", FlashInfer), Implementation("onlinesoftmax", ours)]
    return {FORWARD: impls}, sdpa, flash_attn


# --------------------------------------------------------------------------------------------
# Summary against issue 24's targets
# --------------------------------------------------------------------------------------------


def summary(rows, shapes_by_label: dict, copy_gbs: Optional[float]) -> dict:
    out = []
    for (dtype, label) in dict.fromkeys((r.dtype, r.case) for r in rows):
        sel = {r.impl: r for r in rows if (r.dtype, r.case) == (dtype, label) and r.status == "ok" and r.ms}
        ours_row = sel.pop("onlinesoftmax", None)
        shape = shapes_by_label[label]
        element = DTYPES["bf16" if dtype == "bfloat16" else "fp16"].itemsize
        entry = {"dtype": dtype, "case": label, "kv_mb": kv_bytes(shape, element) / 1e6,
                 "ours_gbs": ours_row.gbs if ours_row else None, "misses": []}
        if ours_row is None:
            entry["misses"].append("ours has no timing")
            out.append(entry)
            continue
        floor_ms = bytes_moved(shape, element) / (copy_gbs * 1e6) if copy_gbs else None
        entry["floor_ms"] = floor_ms
        entry["vs_floor"] = ours_row.ms / floor_ms if floor_ms else None
        for name, row in sel.items():
            entry[f"vs_{name}"] = row.ms / ours_row.ms  # > 1: ours is faster
            if row.ms < ours_row.ms:
                entry["misses"].append(f"{name} faster ({row.ms:.4f} ms against {ours_row.ms:.4f})")
        if entry["kv_mb"] * 1e6 >= TARGET_MIN_BYTES and ours_row.gbs < TARGET_GBS:
            entry["misses"].append(f"{ours_row.gbs:.0f} GB/s < {TARGET_GBS:.0f}")
        if shape.batch == 1 and shape.max_len >= 131072 and floor_ms and ours_row.ms > TARGET_FLOOR_RATIO * floor_ms:
            entry["misses"].append(f"{ours_row.ms / floor_ms:.2f}x the floor > {TARGET_FLOOR_RATIO}")
        out.append(entry)
    return {"cases": out}


def summary_text(result: dict, sdpa: dict, flash_attn: Implementation) -> str:
    lines = ["GB/s = (visible K/V bytes + q + out) / time; the floor is those bytes at this run's copy bandwidth. "
             "Peers read the gathered contiguous cache (padded to the longest sequence, masked) where noted "
             "in the module docstring; their padding is not counted."]
    for name, backend in sdpa.items():
        for mode in ("enable_gqa=True", "K/V repeated"):
            labels = [shape.label() for shape, used in backend.gqa.items() if used == mode]
            if labels:
                lines.append(f"{name} ran GQA through {mode} on {', '.join(labels)}.")
    if flash_attn.fn is not None and flash_attn.fn.paged_note:
        lines.append(f"flash-attn: {flash_attn.fn.paged_note}.")
    for c in result["cases"]:
        if c["ours_gbs"] is None:
            lines.append(f"{c['dtype']} {c['case']}: ours has no timing")
            continue
        ratios = ", ".join(f"{c[k]:.2f}x {k[3:]}" for k in c if k.startswith("vs_") and k != "vs_floor")
        floor = f", {c['vs_floor']:.2f}x the floor" if c.get("vs_floor") else ""
        lines.append(f"{c['dtype']} {c['case']} ({c['kv_mb']:.0f} MB of K/V): ours {c['ours_gbs']:.0f} GB/s{floor}"
                     + (f"; peer time / ours: {ratios}" if ratios else "")
                     + (f"  MISS: {'; '.join(c['misses'])}" if c["misses"] else ""))
    return "\n".join(lines)


def run(args) -> int:
    """``onlinesoftmax bench decode``: the grid (or ``--shape BxHqxHkvxSqxSxDxPAGE``, PAGE 0 for a
    contiguous cache), every peer, eager and CUDA-graph timings, GB/s against this run's copy."""
    if not torch.cuda.is_available():
        print("No CUDA GPU found: the decode benchmark needs one (tests/test_decode.py covers correctness on CPU).")
        return 0
    dtypes = harness.half_dtypes(args, "decode attention")
    shapes = [parse_shape(text) for text in args.shape] if args.shape else GRID
    gen = torch.Generator().manual_seed(args.seed)
    copy_gbs = harness.copy_bandwidth_gbs()
    impls, sdpa, flash_attn = implementations()
    cases = [make_case(shape, dtype) for dtype in dtypes for shape in shapes]
    rows = harness.run_cases("decode", cases, impls, gen, graph_timing=not args.no_graph)
    harness.finish_rows(rows, copy_gbs)
    rows, earlier_runs = harness.merge_with_previous(args, "decode", rows)
    shapes_by_label = {s.label(): s for s in GRID + shapes}
    result = summary([r for r in rows if r.case in shapes_by_label], shapes_by_label, copy_gbs)
    harness.write_results(args, "decode", rows, copy_gbs, summary_text(result, sdpa, flash_attn), {"summary": result},
                          earlier_runs)
    return harness.exit_code(rows)


def _dense_reference(shape: Shape, q, k, v, lens):
    """float64 attention over the gathered (B, L, Hkv, D) cache with the score matrix formed whole
    (small shapes): bottom-right causal, keys past each length masked."""
    group = shape.heads_q // shape.heads_kv
    k, v = (t.double().repeat_interleave(group, 2) for t in (k, v))  # (B, L, Hq, D)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k) * shape.head_dim ** -0.5
    keys = torch.arange(k.shape[1], device=q.device)
    limit = lens.long()[:, None] - (shape.n_queries - 1 - torch.arange(shape.n_queries, device=q.device))
    scores = scores.masked_fill(~(keys[None, None, :] < limit[:, :, None])[:, None], float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, -1), v)


def check(gen, device):
    """(op, shape, dtype, relative error, tolerance) of small calls against float64, contiguous and
    paged, split and not: ``onlinesoftmax check`` / the CPU side of ``bench decode``."""
    from ..ops.decode import attention_with_kvcache

    for shape, num_splits in ((Shape(3, 8, 2, 1, 64, 300, lengths="uneven"), "auto"),
                              (Shape(2, 8, 2, 3, 64, 200, page_size=16), 3)):
        case = make_case(shape, torch.bfloat16, device)
        inputs = case.make_inputs(gen)
        q, k_cache, v_cache, lens, table, _ = inputs
        out = attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table, num_splits=num_splits)
        ref = _dense_reference(shape, q, *inputs[-1].gathered(), lens)
        err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()
        yield "attention_with_kvcache", (shape.batch, shape.max_len, shape.page_size), torch.bfloat16, err, 1e-2


def parse_shape(text: str) -> Shape:
    """``"1x32x8x1x131072x128x0"``: B x Hq x Hkv x Sq x S x D x PAGE (0: contiguous), uniform lengths."""
    try:
        batch, heads_q, heads_kv, n_queries, max_len, head_dim, page = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shape {text!r}: expected BxHqxHkvxSqxSxDxPAGE, 7 integers (PAGE 0: contiguous)") from None
    if min(batch, heads_q, heads_kv, n_queries, max_len, head_dim) < 1 or page < 0:
        raise SystemExit(f"--shape {text!r}: dims must be positive (PAGE >= 0)")
    return Shape(batch, heads_q, heads_kv, n_queries, head_dim, max_len, page)


def floor_ms(shape: Shape, element: int = 2, copy_gbs: float = 3000.0) -> float:
    """The row's floor at ``copy_gbs`` (docs/perf-decode.md's table)."""
    return bytes_moved(shape, element) / (copy_gbs * 1e6)
