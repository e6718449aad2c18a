"""The benchmark harness's logic on CPU: byte and bandwidth math, rotation, correctness flags,
speedups, and the files it writes (the timings themselves need a GPU and are not tests)."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from onlinesoftmax import cli
from onlinesoftmax.bench import harness, shapes, softmax_suite
from onlinesoftmax.bench.harness import Case, Implementation, Row


def test_bandwidth_counts_bytes_per_second():
    # 3 GB in 1 ms is 3000 GB/s; softmax of a 1024x32768 fp32 matrix moves 2 * 128 MiB.
    assert harness.gbs(3 * 10**9, 1.0) == pytest.approx(3000.0)
    case = softmax_suite.forward_case((1024, 32768), torch.float32, device="cpu")
    assert case.bytes_moved == 2 * 1024 * 32768 * 4
    back = softmax_suite.backward_case((16, 262144), torch.bfloat16, device="cpu")
    assert back.bytes_moved == 3 * 16 * 262144 * 2


@pytest.mark.parametrize("bytes_per_set, expected", [(1, 400 * 10**6), (10**6, 400), (134 * 10**6, 3),
                                                      (10**9, 2)])
def test_rotation_cycles_at_least_400_mb_and_two_sets(bytes_per_set, expected):
    count = harness.rotation_count(bytes_per_set)
    assert count == expected
    assert count * bytes_per_set >= harness.ROTATION_BYTES and count >= 2


def test_relative_error_ignores_reference_infinities_and_reports_nan():
    ref = torch.tensor([0.5, 0.25, float("-inf")], dtype=torch.float64)
    assert harness.relative_error(torch.tensor([0.5, 0.25, float("-inf")]), ref) == 0.0
    assert harness.relative_error(torch.tensor([0.5, 0.30, float("-inf")]), ref) == pytest.approx(
        0.05 / math.hypot(0.5, 0.25))
    assert math.isnan(harness.relative_error(torch.tensor([float("nan"), 0.25, 0.0]), ref))


def _case():
    def make(gen):
        return (torch.randn(3, 7, generator=gen),)

    return Case("3x7", torch.float32, "forward", 2 * 3 * 7 * 4, make, lambda xs: torch.softmax(xs[0].double(), -1))


def test_run_case_flags_wrong_nan_errors_and_skips_instead_of_hiding_them():
    def broken(x):
        raise RuntimeError("unsupported shape\nsecond line")

    impls = [Implementation("torch", lambda x: torch.softmax(x, -1)),
             Implementation("wrong", lambda x: torch.softmax(2 * x, -1)),
             Implementation("nan", lambda x: torch.full_like(x, float("nan"))),
             Implementation("broken", broken),
             Implementation("absent", skipped="No module named 'absent'")]
    rows = harness.run_case(_case(), impls, torch.Generator().manual_seed(0), timed=False)
    status = {r.impl: r.status for r in rows}
    assert status == {"torch": "ok", "wrong": "WRONG", "nan": "NaN",
                      "broken": "error: RuntimeError: unsupported shape",
                      "absent": "skipped: No module named 'absent'"}
    assert rows[0].rel_error < 1e-6 and rows[1].rel_error > harness.tolerance(torch.float32)


def test_second_pass_times_in_reverse_order_and_keeps_the_faster(monkeypatch):
    # Back-to-back timings (CUDA events) replaced by a record of the order and a script of results.
    order, results = [], iter([3.0, 5.0, 4.0, 1.0, 6.0])
    def timed(fn, input_sets):
        order.append(fn.__name__)
        return next(results)
    monkeypatch.setattr(harness, "back_to_back_ms", timed)
    def first(x): return torch.softmax(x, -1)
    def second(x): return torch.softmax(x, -1)
    def wrong(x): return torch.softmax(2 * x, -1)
    impls = [Implementation("first", first), Implementation("second", second), Implementation("wrong", wrong)]
    rows = harness.run_case(_case(), impls, torch.Generator().manual_seed(0), max_input_sets=1, back_to_back=True,
                            second_pass=True)
    # Every implementation timed in order, then those with a correct result again in reverse.
    assert order == ["first", "second", "wrong", "second", "first"]
    assert [r.ms for r in rows] == [3.0, 1.0, 4.0]
    assert [r.status for r in rows] == ["ok", "ok", "WRONG"]


def test_finish_rows_fills_percent_of_copy_and_speedup_against_torch_of_the_same_case():
    rows = [Row("a", "float32", "forward", "torch", ms=2.0, gbs=1000.0),
            Row("a", "float32", "forward", "ours", ms=0.5, gbs=4000.0),
            Row("a", "bfloat16", "forward", "ours", ms=1.0, gbs=500.0),
            Row("a", "float32", "forward", "peer", status="skipped: x")]
    harness.finish_rows(rows, copy_gbs=2000.0)
    assert rows[0].speedup_vs_torch == 1.0 and rows[1].speedup_vs_torch == 4.0
    assert rows[1].pct_of_copy == 200.0 and rows[0].pct_of_copy == 50.0
    assert rows[2].speedup_vs_torch is None  # no torch row for bfloat16: no made-up baseline
    assert rows[3].pct_of_copy is None


def test_softmax_summary_geomean_and_best_peer():
    rows = [Row("a", "float32", "forward", "torch", ms=4.0, gbs=100.0),
            Row("a", "float32", "forward", "peer", ms=1.0, gbs=400.0),
            Row("a", "float32", "forward", "onlinesoftmax", ms=2.0, gbs=200.0),
            Row("b", "float32", "forward", "torch", ms=1.0, gbs=100.0),
            Row("b", "float32", "forward", "onlinesoftmax", ms=0.25, gbs=400.0)]
    harness.finish_rows(rows, 1000.0)
    summary = softmax_suite.softmax_summary(rows, 1000.0)
    assert summary["forward_geomean_speedup_vs_torch"] == pytest.approx(math.sqrt(2.0 * 4.0))
    first = summary["cases"][0]
    assert first["best_peer"] == "peer" and first["ours_vs_best_peer"] == pytest.approx(0.5)
    text = softmax_suite.summary_text(summary)
    assert "behind the best peer: forward float32 a: 0.50x of peer" in text


def test_results_files_carry_the_command_environment_and_rows(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["onlinesoftmax", "bench", "softmax", "--out", "unit"])
    rows = [Row("3x7", "float32", "forward", "torch", ms=1.0, gbs=10.0, rel_error=0.0),
            Row("3x7", "float32", "forward", "onlinesoftmax", ms=0.5, gbs=20.0, rel_error=1e-7)]
    harness.finish_rows(rows, 40.0)
    args = argparse.Namespace(out=str(tmp_path), seed=7)
    stem = harness.write_results(args, "softmax", rows, 40.0, "a note")
    assert stem == str(tmp_path / "softmax")
    payload = json.loads((tmp_path / "softmax.json").read_text())
    assert payload["environment"]["command"] == "onlinesoftmax bench softmax --out unit"
    assert payload["seed"] == 7 and payload["copy_gbs"] == 40.0
    assert [r["impl"] for r in payload["rows"]] == ["torch", "onlinesoftmax"]
    assert payload["rows"][1]["speedup_vs_torch"] == 2.0
    md = (tmp_path / "softmax.md").read_text()
    assert "Command: `onlinesoftmax bench softmax --out unit`" in md and "a note" in md
    assert "| forward | float32 | 3x7 | onlinesoftmax | 0.5000 | 20 | 50.0 | 2.00x |" in md
    assert (tmp_path / "softmax.png").read_bytes()[:4] == b"\x89PNG"
    # Every suite writes into the results folder under its own name.
    assert harness.write_results(args, "topk", rows, 40.0) == str(tmp_path / "topk")


def test_merge_keeps_the_earlier_runs_rows_of_cases_not_measured_again(tmp_path, monkeypatch):
    def measured(dtype, ms):
        return [Row(case, dtype, direction, impl, ms=ms * (2 if impl == "torch" else 1), gbs=1.0 / ms, rel_error=0.0)
                for direction in ("forward", "backward") for case in ("3x7", "5x9") for impl in ("torch", "onlinesoftmax")]

    args = argparse.Namespace(out=str(tmp_path), seed=7, merge=True)
    dates = iter(f"2026-11-25 0{hour}:00:00 UTC" for hour in range(1, 9))  # runs apart in time, as on the device
    monkeypatch.setattr(harness, "environment", lambda command: {"command": command, "date": next(dates),
                                                                "torch": "t", "triton": "t", "device": "d"})
    monkeypatch.setattr("sys.argv", ["onlinesoftmax", "bench", "--dtype", "fp32"])
    first = measured("float32", 1.0)
    harness.finish_rows(first, 40.0)
    assert harness.merge_with_previous(args, "softmax", first) == (first, [])  # nothing there yet
    harness.write_results(args, "softmax", first, 40.0)
    monkeypatch.setattr("sys.argv", ["onlinesoftmax", "bench", "--dtype", "bf16", "--merge"])
    second = measured("bfloat16", 4.0) + [Row("3x7", "float32", "forward", "onlinesoftmax", ms=0.25, gbs=4.0)]
    harness.finish_rows(second, 50.0)
    rows, runs = harness.merge_with_previous(args, "softmax", second)
    # float32 forward 3x7 was measured again by one implementation (as --impls runs them): its row is
    # this run's, the torch row beside it the first run's, and its speedup is against that row.
    assert [(r.dtype, r.case, r.impl, r.ms) for r in rows if r.direction == "forward" and r.case == "3x7"] == [
        ("float32", "3x7", "torch", 2.0), ("float32", "3x7", "onlinesoftmax", 0.25), ("bfloat16", "3x7", "torch", 8.0),
        ("bfloat16", "3x7", "onlinesoftmax", 4.0)]
    assert rows[1].speedup_vs_torch == 8.0
    assert len(rows) == 8 + 8 and [r.direction for r in rows] == ["forward"] * 8 + ["backward"] * 8
    kept = next(r for r in rows if (r.direction, r.dtype, r.case, r.impl) == ("backward", "float32", "5x9", "onlinesoftmax"))
    assert kept.pct_of_copy == 100.0 / 40.0 and kept.speedup_vs_torch == 2.0  # its own run's figures
    assert runs == [{"command": "onlinesoftmax bench --dtype fp32", "date": "2026-11-25 01:00:00 UTC", "copy_gbs": 40.0}]
    harness.write_results(args, "softmax", rows, 50.0, "", None, runs)
    payload = json.loads((tmp_path / "softmax.json").read_text())
    assert payload["earlier_runs"] == runs and len(payload["rows"]) == 16
    assert "come from earlier runs (--merge): `onlinesoftmax bench --dtype fp32`" in (tmp_path / "softmax.md").read_text()
    # A third run that measures every float32 case again: the first run's rows are gone, and so is
    # its record; the second run's are kept.
    monkeypatch.setattr("sys.argv", ["onlinesoftmax", "bench", "--dtype", "fp32", "--merge"])
    third = measured("float32", 2.0)
    harness.finish_rows(third, 45.0)
    rows, runs = harness.merge_with_previous(args, "softmax", third)
    assert len(rows) == 16 and {r.ms for r in rows if r.dtype == "float32"} == {2.0, 4.0}
    assert [run["command"] for run in runs] == ["onlinesoftmax bench --dtype bf16 --merge"]
    # Without --merge the file is replaced.
    args.merge = False
    assert harness.merge_with_previous(args, "softmax", second) == (second, [])


def test_impls_runs_only_the_implementations_named():
    case = harness.Case("3x7", torch.float32, "forward", 168, lambda gen: (torch.randn(3, 7, generator=gen),),
                        lambda inputs: torch.softmax(inputs[0].double(), -1))
    impls = [Implementation("torch", lambda x: torch.softmax(x, -1)),
             Implementation("peer", lambda x: torch.softmax(x, -1))]
    gen = torch.Generator().manual_seed(0)
    try:
        harness.select_implementations("torch, onlinesoftmax")
        assert [r.impl for r in harness.run_case(case, impls, gen, timed=False)] == ["torch"]
        harness.select_implementations("onlinesoftmax")
        assert harness.run_case(case, impls, gen, timed=False) == []
    finally:
        harness.select_implementations(None)
    assert [r.impl for r in harness.run_case(case, impls, gen, timed=False)] == ["torch", "peer"]


@pytest.mark.parametrize("text, count, expected", [("16x262144", 2, (16, 262144)), ("1X25000X5", 3, (1, 25000, 5))])
def test_parse_dims(text, count, expected):
    assert shapes.parse_dims(text, count) == expected


@pytest.mark.parametrize("text", ["16", "16x0", "axb", "1x2x3"])
def test_parse_dims_rejects_bad_shapes(text):
    with pytest.raises(SystemExit, match="--shape"):
        shapes.parse_dims(text, 2)


def test_sweep_shapes_asked_puts_random_shapes_beside_the_named_ones():
    # --shape picks the cases and --random adds its seeded shapes beside them; without --shape the
    # sweep's own grid (which adds the random shapes itself).
    from types import SimpleNamespace

    def randoms(n, seed):
        return [(seed, i) for i in range(n)]

    def grid(quick, n, seed):
        return [("grid", quick)] + randoms(n, seed)

    named = SimpleNamespace(shape=["3x5", "7X11"], random=2, seed=9, quick=False)
    assert shapes.sweep_shapes_asked(named, 2, randoms, grid) == [(3, 5), (7, 11), (9, 0), (9, 1)]
    whole = SimpleNamespace(shape=None, random=1, seed=4, quick=True)
    assert shapes.sweep_shapes_asked(whole, 2, randoms, grid) == [("grid", True), (4, 0)]
    with pytest.raises(SystemExit, match="--shape"):
        shapes.sweep_shapes_asked(SimpleNamespace(shape=["3x5x7"], random=0, seed=0, quick=False), 2, randoms, grid)


def test_explain_prints_the_plan_without_a_gpu(capsys):
    assert cli.main(["explain", "1x16777216", "--dtype", "bf16", "--sms", "132"]) == 0
    out = capsys.readouterr().out
    assert "strategy:    split_row" in out and "bytes moved: 67.11 MB" in out
    assert "registers:" not in out  # split_row streams; nothing waits in registers
    assert cli.main(["explain", "2048x8200", "--dtype", "bf16", "--sms", "132"]) == 0
    assert "8192 cols x 1 rows per tile, then a tail tile of 16 cols" in capsys.readouterr().out


def test_explain_prints_the_cross_entropy_plans(capsys):
    # A training step's plans: keeping the logits (forward, backward) and in place, whose plain rows
    # take their own kernel; a small step is said to be the host's time.
    assert cli.main(["explain", "8192x128256", "--op", "cross_entropy", "--dtype", "bf16", "--sms", "132"]) == 0
    out = capsys.readouterr().out
    assert "cross_entropy forward " in out and "cross_entropy backward " in out and "cross_entropy forward_grad" in out
    assert "the kernel for plain rows" in out and "in place with any of those options" in out
    assert "in place with label smoothing:" in out and "in place with a softcap:" in out  # their own launches
    assert "host's time" not in out
    assert cli.main(["explain", "100x32000", "--op", "cross_entropy", "--dtype", "bf16", "--sms", "132"]) == 0
    out = capsys.readouterr().out
    assert "separate" in out and "the backward kernel" in out and "host's time" in out and "any of those options" not in out


@pytest.mark.parametrize("shape, dtype, op, narrow", [("1024x32768", "bf16", "softmax", True),
                                                      ("1024x32768", "fp32", "softmax", False),
                                                      ("64x128256", "bf16", "softmax", True),
                                                      ("64x128256", "bf16", "softmax_backward", True),
                                                      ("4096x4096", "bf16", "softmax", False)])
def test_explain_says_which_tiles_wait_at_16_bits(capsys, shape, dtype, op, narrow):
    assert cli.main(["explain", shape, "--dtype", dtype, "--op", op, "--sms", "132"]) == 0
    assert ("registers:   the tile waits in bfloat16" in capsys.readouterr().out) == narrow


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU check runs only where there is no GPU")
@pytest.mark.parametrize("suite", ["softmax", "topk", "attention"])
def test_bench_without_a_gpu_runs_the_suites_cpu_check(capsys, monkeypatch, tmp_path, suite):
    if suite == "topk":  # torch's CPU paths (2 s; the kernels through the interpreter took 17 s in CI)
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert cli.main(["bench", suite, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "No CUDA GPU here" in out and " ok" in out and "FAIL" not in out
    assert not list(tmp_path.iterdir())  # no GPU, no results files


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU check runs only where there is no GPU")
def test_cpu_check_of_cross_entropy_takes_probability_targets(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # torch's CPU paths: seconds, not minutes
    assert cli.main(["bench", "cross_entropy_probabilities", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("cross_entropy soft") == 4 and "FAIL" not in out


def test_no_arguments_print_help_and_exit_0(capsys):
    assert cli.main([]) == 0
    assert "usage: onlinesoftmax" in capsys.readouterr().out


def test_version(capsys):
    import onlinesoftmax

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0 and onlinesoftmax.__version__ in capsys.readouterr().out


@pytest.mark.parametrize("name, slug", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                        ("NVIDIA A100-SXM4-40GB", "a100"), ("NVIDIA GeForce RTX 4090", "rtx4090"),
                                        ("Some New GPU", "some-new-gpu")])
def test_results_go_to_a_folder_named_after_the_device(name, slug):
    assert harness.device_slug(name) == slug


def test_existing_results_are_not_overwritten_unless_asked(tmp_path, capsys, monkeypatch):
    (tmp_path / "softmax.json").write_text("{}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cli.main(["bench", "softmax", "--out", str(tmp_path)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (tmp_path / "softmax.json").read_text() == "{}"


def test_deadline_stops_handing_out_cases_and_says_how_many_were_left(capsys):
    from onlinesoftmax.bench import harness

    ticks = iter([0.0, 1.0, 2.0, 5.0, 9.0])
    assert list(harness.until_deadline([1, 2, 3, 4], 3.0, clock=lambda: next(ticks))) == [1, 2]
    assert "2 of 4 cases not measured" in capsys.readouterr().out
    assert list(harness.until_deadline([1, 2, 3], None)) == [1, 2, 3]
    with pytest.raises(SystemExit):  # only the sweeps take it
        cli.main(["bench", "softmax", "--deadline", "60"])
    assert "--deadline applies to the sweeps" in capsys.readouterr().err


def test_no_forward_times_the_backward_direction_alone(capsys):
    from argparse import Namespace

    from onlinesoftmax.bench import harness

    assert harness.directions(Namespace(no_forward=True, no_backward=False), "forward", "backward") == ["backward"]
    assert harness.directions(Namespace(no_forward=False, no_backward=True), "forward", "backward") == ["forward"]
    assert harness.directions(Namespace(no_backward=False), "forward", "backward") == ["forward", "backward"]
    for argv in (["bench", "sweep", "--no-forward", "--no-backward"], ["bench", "topk", "--no-forward"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert "--no-forward applies to" in capsys.readouterr().err


def test_host_bench_alternates_our_runs_with_the_peers(monkeypatch):
    # Host time drifts over seconds: ours and the peer's runs take turns, the context (the route
    # turned off) around ours alone, and the warm-up run is not kept.
    import contextlib

    from onlinesoftmax.bench import host_suite

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(host_suite, "CALLS", 3)
    monkeypatch.setattr(host_suite, "WARMUP_CALLS", 2)
    monkeypatch.setattr(host_suite, "RUN_WARMUP_CALLS", 1)
    calls, inside = [], []

    @contextlib.contextmanager
    def route_off():
        inside.append(True)
        yield
        inside.pop()

    def ours():
        assert inside, "ours ran outside its context"
        calls.append("ours")

    def theirs():
        assert not inside, "the peer ran inside our context"
        calls.append("theirs")

    ours_us, theirs_us = host_suite.host_us(ours, theirs, route_off)
    runs = [calls[0]] + [b for a, b in zip(calls, calls[1:]) if a != b]
    assert runs == ["ours", "theirs"] * (host_suite.REPEATS + 1)
    assert len(calls) == 2 * (2 + 1 + host_suite.REPEATS * (3 + 1))
    assert ours_us > 0 and theirs_us > 0


def test_merge_is_refused_for_suites_that_do_not_merge(capsys):
    # The bench grids and the sweeps merge; elsewhere the flag would be ignored silently.
    for argv in (["bench", "ladder", "--merge"], ["bench", "host", "--merge"]):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and "--merge applies to the" in err, err


def test_sweep_merges_runs_of_other_dtypes_into_one_set_of_cells(tmp_path, monkeypatch):
    # A full sweep takes longer than one call of the device machine: each dtype in its own run.
    from onlinesoftmax.bench import sweep_suite

    def run(dtype, ours_ms):
        rows = [Row(f"{op} {shape}", dtype, direction, impl, ms=ours_ms if impl == "onlinesoftmax" else 1.0)
                for direction in ("forward", "backward") for op in ("softmax", "log_softmax")
                for shape in ("1x1000", "32x50257") for impl in ("torch", "torch.compile", "onlinesoftmax")]
        harness.finish_rows(rows, None)
        return rows

    args = argparse.Namespace(out=str(tmp_path), seed=7, merge=True)
    monkeypatch.setattr("sys.argv", ["onlinesoftmax", "bench", "sweep", "--dtype", "bf16"])
    sweep_suite.write(args, run("bfloat16", 0.5), None)
    monkeypatch.setattr("sys.argv", ["onlinesoftmax", "bench", "sweep", "--dtype", "fp32", "--merge"])
    sweep_suite.write(args, run("float32", 2.0), None)
    payload = json.loads((tmp_path / "sweep.json").read_text())
    by_dtype = {dtype: [c["vs_torch"] for c in payload["cells"] if c["dtype"] == dtype] for dtype in ("bfloat16", "float32")}
    assert by_dtype == {"bfloat16": [2.0] * 8, "float32": [0.5] * 8}
    assert payload["shapes"] == [[1, 1000], [32, 50257]]
    assert [run["command"] for run in payload["earlier_runs"]] == ["onlinesoftmax bench sweep --dtype bf16"]
    assert "come from earlier runs (--merge)" in (tmp_path / "sweep.md").read_text()
    for name in ("sweep-bfloat16-forward.png", "sweep-float32-backward.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_inputs_are_drawn_on_their_device_from_the_runs_seed():
    # Each input set is drawn by a generator on the inputs' device seeded from the run's generator:
    # the same seed gives the same inputs, another seed others, and each set of a run is fresh.
    from onlinesoftmax.bench import cross_entropy_suite

    make = cross_entropy_suite.case((8, 50), torch.float32, "cpu").make_inputs
    first, again, other = (make(torch.Generator().manual_seed(seed)) for seed in (3, 3, 4))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])
    gen = torch.Generator().manual_seed(3)
    assert not torch.equal(make(gen)[0], make(gen)[0])
    drawn = harness.device_generator(torch.Generator().manual_seed(3), "cpu")
    assert drawn.device.type == "cpu" and drawn.initial_seed() != 3


def test_sweep_summary_says_when_torch_compile_was_not_run():
    # --impls onlinesoftmax,torch: no compile column; the summary says so instead of "nanx".
    from onlinesoftmax.bench import sweep_suite

    cell = dict(direction="forward", dtype="bfloat16", op="softmax", shape="1x1000", ours_ms=0.5, torch_ms=1.0,
                vs_torch=2.0, status="ok", vs_compile=None, graph_vs_torch=None)
    text = sweep_suite.summary_markdown([cell])
    assert "torch.compile not run" in text and "nan" not in text
    text = sweep_suite.summary_markdown([dict(cell, vs_compile=0.8)])
    assert "0.80x torch.compile" in text and "1 below 0.9x torch.compile" in text


def test_heat_maps_leave_out_panels_a_deadline_left_empty(tmp_path):
    # A sweep cut by --deadline can end with one op (or dtype, direction) unmeasured: its panel is
    # left out, and a map with no cells at all is not written.
    full = ("softmax", [1, 32], [1000, 50257], {(1, 1000): 0.9, (32, 50257): 1.4})
    empty = ("log_softmax", [], [], {})
    path = harness.heat_maps(str(tmp_path / "one.png"), [full, empty])
    assert path and (tmp_path / "one.png").read_bytes()[:4] == b"\x89PNG"
    assert harness.heat_maps(str(tmp_path / "none.png"), [empty]) is None
    assert not (tmp_path / "none.png").exists()


def test_attention_sweep_random_shapes_follow_the_seed_and_stay_in_range():
    # --random N adds shapes no fixed list holds: the same seed gives the same shapes, another seed
    # others; lengths of any integer in 100-16384, head dims and head layouts from the tables.
    from onlinesoftmax.bench import attention_suite as suite

    shapes = suite.random_shapes(64, 5)
    assert shapes == suite.random_shapes(64, 5) and shapes != suite.random_shapes(64, 6)
    assert len(suite.sweep_shapes(True, 64, 5)) == len(suite.sweep_shapes(True)) + 64
    for batch, heads_q, heads_kv, seq, head_dim in shapes:
        assert batch >= 1 and 100 <= seq <= 16384 and head_dim in suite.RANDOM_HEAD_DIMS
        assert (heads_q, heads_kv) in suite.RANDOM_HEADS
    assert any(seq % 64 for *_, seq, _ in shapes) and any(d & (d - 1) for *_, d in shapes)


def test_explain_prints_the_decode_plan(capsys):
    # Batch 1 against 128K keys: the keys are split across the GPU, the count decided on the device.
    assert cli.main(["explain", "1x32x8x1x131072x128x0", "--op", "decode", "--dtype", "bf16", "--sms", "132"]) == 0
    out = capsys.readouterr().out
    assert "path: split" in out and "heads 32/8" in out
    assert cli.main(["explain", "1x32x8x1x131072x128x0"]) == 2  # a decode shape without --op decode
    # Decode runs in 16 bits: bf16 unless told, fp32 refused.
    assert cli.main(["explain", "1x8x2x1x256x128x0", "--op", "decode"]) == 0
    assert "bfloat16" in capsys.readouterr().out
    assert cli.main(["explain", "1x8x2x1x256x128x0", "--op", "decode", "--dtype", "fp32"]) == 2
    assert "float16 and bfloat16" in capsys.readouterr().err


def test_explain_prints_the_attention_plans(capsys):
    # MQA over 11 short causal sequences: the split backward shares each group among programs and
    # launches the heaviest key blocks first; a short MHA sequence takes the fused backward.
    assert cli.main(["explain", "11x16x1x388x80", "--op", "attention", "--causal", "--sms", "132"]) == 0
    out = capsys.readouterr().out
    assert "head dim 80 computed as 64 + 16" in out and "each GQA group over 16 programs" in out
    assert "heaviest block launched first" in out and "backward_fused" not in out
    assert "grid: 7 key blocks x 176 parts of KV heads' groups = 1232 programs" in out
    assert cli.main(["explain", "1x16x16x128x64", "--op", "attention", "--sms", "132"]) == 0
    out = capsys.readouterr().out
    assert "backward_fused" in out and "backward_dq" not in out and "no mask" in out
    # Queries and keys apart (BxHQxHKVxSQxSKxD); bf16 unless told.
    assert cli.main(["explain", "2x32x8x1x8192x128", "--op", "attention"]) == 0
    assert "queries 1 keys 8192" in capsys.readouterr().out
    for argv in (["4x32x8x4096x128", "--op", "attention", "--dtype", "fp32"],  # 16-bit only
                 ["4x32x6x4096x128", "--op", "attention"],  # heads not a multiple of KV heads
                 ["1x2x2x128x512", "--op", "attention"],  # a head dim attention() refuses
                 ["4096x32x8x64x64", "--op", "attention"],  # batch x heads past the grid's axis
                 ["4x4096", "--op", "attention"], ["4x4096", "--causal"]):
        assert cli.main(["explain", *argv]) == 2
    err = capsys.readouterr().err
    assert "--causal applies to --op attention" in err and "head dim 512 is not supported" in err
    assert "must be a multiple of the key/value heads" in err and "exceeds 65535" in err


def test_report_case_prints_each_implementation(capsys):
    # The per-case line is what a run cut short by a machine's time limit leaves in its log.
    from types import SimpleNamespace

    harness.report_case("bf16 8192x32000", [SimpleNamespace(impl="onlinesoftmax", ms=0.4904, status="ok"),
                                            SimpleNamespace(impl="quack", ms=None, status="skipped: not installed")])
    assert capsys.readouterr().out == "bf16 8192x32000: onlinesoftmax 0.4904 ms, quack skipped: not installed\n"


def test_sdpa_expanded_kv_follows_the_tensors_it_was_made_from():
    # SDPA backends without enable_gqa get K and V expanded once per input set (forward only). An
    # expansion is kept with the K and V it came from (an address alone could be a later tensor's)
    # and dropped when the shape changes.
    from torch.nn.attention import SDPBackend

    from onlinesoftmax.bench.attention_suite import SdpaBackend

    sdpa = SdpaBackend(SDPBackend.MATH)
    sdpa.gqa = "expanded K/V"
    gen = torch.Generator().manual_seed(7)

    def check(n_keys):
        q = torch.randn(1, 4, 5, 16, generator=gen)
        k, v = (torch.randn(1, 2, n_keys, 16, generator=gen) for _ in range(2))
        want = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1),
                                                                v.repeat_interleave(2, 1))
        torch.testing.assert_close(sdpa(q, k, v, False), want)
        torch.testing.assert_close(sdpa(q, k, v, False), want)  # the kept expansion
        return k, v

    kept = [check(7), check(7)]
    assert len(sdpa._expanded) == 2
    check(9)
    assert len(sdpa._expanded) == 1
    del kept


def test_linear_cross_entropy_peers_compute_the_reference():
    # Every runnable peer of bench linear_cross_entropy (ours, torch's chunked F.linear_cross_entropy
    # where torch has it, Liger where installed) against the case's float64 reference at a tiny
    # size, on the GPU where there is one (Liger's kernels take CUDA tensors only), else on the CPU.
    from onlinesoftmax.bench import cross_entropy_suite

    device = "cuda" if torch.cuda.is_available() else "cpu"
    case = cross_entropy_suite.linear_case((64, 32, 200), torch.float32, device=device)
    gen = torch.Generator().manual_seed(0)
    ran = []
    for impl in cross_entropy_suite.linear_implementations():
        if impl.skipped or impl.name == "torch.compile":  # compiling is minutes on the CPU machine
            continue
        if impl.name == "liger" and device == "cpu":
            continue
        inputs = case.make_inputs(gen)
        got = impl.check(impl.fn(*inputs), inputs)
        error = harness.relative_error(got, case.reference(inputs))
        assert error < 1e-4, f"{impl.name}: relative error {error:.2e}"
        ran.append(impl.name)
    assert {"torch", "onlinesoftmax", "onlinesoftmax vocab_chunk"} <= set(ran), ran
    if hasattr(torch.nn.functional, "linear_cross_entropy"):
        assert "torch chunked" in ran

