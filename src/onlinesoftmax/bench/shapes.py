"""The bench's --shape values and the sweeps' choice of shapes (the named cases, or a sweep's grid,
with --random's seeded shapes)."""

from __future__ import annotations


def parse_dims(text: str, count: int) -> tuple[int, ...]:
    """``"16x262144"`` -> ``(16, 262144)``: a --shape value with exactly ``count`` positive dims."""
    try:
        dims = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shape {text!r}: expected {count} integers joined by 'x'") from None
    if len(dims) != count or min(dims) < 1:
        raise SystemExit(f"--shape {text!r}: expected {count} positive integers joined by 'x'")
    return dims


def sweep_shapes_asked(args, count: int, random_shapes, grid) -> list[tuple[int, ...]]:
    """A sweep's shapes: the --shape cases (``count`` dims each) with --random's seeded shapes beside
    them, or, with no --shape, the sweep's ``grid(quick, n_random, seed)``."""
    if not args.shape:
        return grid(args.quick, args.random, args.seed)
    return [parse_dims(t, count) for t in args.shape] + random_shapes(args.random, args.seed)
