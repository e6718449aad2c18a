"""The work log's ladder (onlinesoftmax.ladder) against float64 torch: every step, forced explicitly.

Without a GPU the kernels run in numba's CUDA simulator (one Python thread per CUDA thread, so the
sizes and blocks are tiny); the simulator has no shfl_down_sync, so step 4 runs on a GPU only. On a
GPU the same tests run the compiled kernels on CUDA tensors, plus the work log's own launch sizes.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import pytest
import torch

from conftest import DEVICE, ON_GPU, assert_matches, make_logits

if importlib.util.find_spec("numba") is None:
    pytest.skip("numba-cuda is not installed (pip install -e '.[ladder]'); CI installs it", allow_module_level=True)


def _import_ladder():
    """Import the ladder, on a machine without a GPU with numba.cuda as the simulator.

    numba reads NUMBA_ENABLE_CUDASIM once, when numba.cuda is first imported: set it for that import
    only and put the environment back, so no other test sees it.
    """
    if ON_GPU or "numba.cuda" in sys.modules:
        return importlib.import_module("onlinesoftmax.ladder")
    previous = os.environ.get("NUMBA_ENABLE_CUDASIM")
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    try:
        return importlib.import_module("onlinesoftmax.ladder")
    finally:
        if previous is None:
            del os.environ["NUMBA_ENABLE_CUDASIM"]
        else:
            os.environ["NUMBA_ENABLE_CUDASIM"] = previous


ladder = _import_ladder()
if not ON_GPU and not ladder.SIMULATED:
    pytest.skip("numba.cuda was imported without the simulator before this module and there is no GPU",
                allow_module_level=True)

NO_SHUFFLE = "numba's CUDA simulator has no shfl_down_sync: the warp-shuffle step runs on a GPU only"
STEPS = {name.split()[0]: fn for name, fn, _ in ladder.ROW_STEPS}
THREAD_PER_ROW = ("1", "2")


def step_params():
    return [pytest.param(step, id=f"step{step}",
                         marks=[pytest.mark.skipif(not ON_GPU, reason=NO_SHUFFLE)] if step == "4" else [])
            for step in STEPS]


def logits_with_infinities(shape, gen):
    """Outliers, -inf at the start of every other row (the case the log's update gets wrong), and a
    row of only -inf when there are three rows or more."""
    x = make_logits(shape, gen=gen, device="cpu")
    if x.shape[-1] > 1:
        x[::2, : max(1, x.shape[-1] // 3)] = float("-inf")
    if x.shape[0] >= 3:
        x[2] = float("-inf")
    return x.to(DEVICE)


# (rows, cols, threads_per_block). Threads per row kernels: rows above and below one block. Block per
# row kernels: rows shorter than the block (idle threads hold -inf, 0) and several strides long.
SIM_CASES = {
    "1": [(3, 37, 32), (40, 19, 16), (1, 1, 32)],
    "2": [(3, 37, 32), (40, 19, 16), (1, 1, 32)],
    "3": [(3, 37, 64), (4, 131, 16), (1, 1, 32)],
    "4": [(3, 37, 64), (4, 131, 32), (1, 1, 32)],
}
# On a GPU: the log's launch sizes on non-power-of-two rows, and the log's own shape.
GPU_CASES = [(7, 1000, None), (300, 4097, None), (1024, 32768, None), (33, 5000, 128)]


def row_step_cases():
    params = []
    for step in STEPS:
        marks = [pytest.mark.skipif(not ON_GPU, reason=NO_SHUFFLE)] if step == "4" else []
        for rows, cols, threads in SIM_CASES[step] + (GPU_CASES if ON_GPU else []):
            params.append(pytest.param(step, rows, cols, threads, marks=marks,
                                       id=f"step{step}-{rows}x{cols}-T{threads or 'log'}"))
    return params


def launch(step, x, threads, **options):
    return STEPS[step](x, **({} if threads is None else {"threads_per_block": threads}), **options)


@pytest.mark.parametrize("step, rows, cols, threads", row_step_cases())
def test_row_steps_match_float64(step, rows, cols, threads, gen):
    x = logits_with_infinities((rows, cols), gen)
    out = launch(step, x, threads)
    ref = torch.softmax(x.double(), -1)
    assert_matches(out, ref, torch.float32, f"step {step} {rows}x{cols} T={threads}")
    if rows >= 3 and cols > 1:
        assert torch.isnan(out[2]).all(), "a row of only -inf is NaN, as in torch"
    if ON_GPU:
        # Bitwise, so that the all -inf row's NaNs compare equal to themselves.
        again = launch(step, x, threads)
        assert torch.equal(out.view(torch.int32), again.view(torch.int32)), "a second run differs: not deterministic"


@pytest.mark.parametrize("step", step_params())
def test_row_steps_on_a_strided_view(step, gen):
    x = make_logits((37, 5), gen=gen).t()  # (5, 37), column stride 5
    out = launch(step, x, 32)
    assert_matches(out, torch.softmax(x.double(), -1), torch.float32, f"step {step} transposed")


@pytest.mark.parametrize("step", step_params())
@pytest.mark.parametrize("column", [0, 20])
def test_row_steps_propagate_nan_to_the_whole_row(step, column, gen):
    # Column 0 is the first element its thread sees: the online update must not skip it.
    x = make_logits((3, 37), gen=gen)
    x[1, column] = float("nan")
    out = launch(step, x, 32)
    assert torch.isnan(out[1]).all() and not torch.isnan(out[[0, 2]]).any()


@pytest.mark.parametrize("step", step_params())
@pytest.mark.parametrize("shape", [(0, 5), (3, 0)])
def test_row_steps_on_empty_tensors(step, shape):
    out = launch(step, torch.empty(shape, device=DEVICE), 32)
    assert out.shape == shape


@pytest.mark.skipif(not ON_GPU, reason="fastmath changes the compiled code; the simulator ignores it")
@pytest.mark.parametrize("step", list(STEPS))
def test_row_steps_fastmath_builds(step, gen):
    # No outliers: __expf's error grows with |x|, and the point is that the build runs and agrees.
    x = make_logits((64, 3000), gen=gen, outliers=False)
    out = launch(step, x, None, fastmath=True)
    assert_matches(out, torch.softmax(x.double(), -1), torch.float32, f"step {step} fastmath")


@pytest.mark.skipif(not ON_GPU, reason="torch streams need a GPU")
@pytest.mark.parametrize("step", list(STEPS))
def test_row_steps_run_on_torch_current_stream(step, gen):
    x = make_logits((64, 2048), gen=gen)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = x * 2  # queued on the side stream: the kernel must wait for it on that stream
        out = launch(step, y, None)
    stream.synchronize()
    assert_matches(out, torch.softmax(y.double(), -1), torch.float32, f"step {step} side stream")


@pytest.mark.skipif(ON_GPU, reason="only the simulator lacks shfl_down_sync")
def test_warp_shuffle_step_says_why_it_cannot_run_in_the_simulator():
    with pytest.raises(NotImplementedError, match="shfl_down_sync"):
        ladder.softmax_block_warp_shuffle(torch.zeros(2, 8))


# (n, threads_per_block, partial_blocks): seed 002's one block per T elements; fewer blocks than
# that (each loops over the grid stride); more partials than merge threads (the merge loops too).
VECTOR_CASES = [(1, 8, None), (37, 8, None), (80, 8, None), (100, 16, 2)]
VECTOR_GPU_CASES = [(16 * 2**20 + 3, 256, None), (1_000_003, 256, 264), (5000, 1024, None)]


@pytest.mark.parametrize("n, threads, partial_blocks", VECTOR_CASES + (VECTOR_GPU_CASES if ON_GPU else []))
@pytest.mark.parametrize("fill", ["finite", "leading-inf", "all-inf"])
def test_vector_three_kernels_match_float64(n, threads, partial_blocks, fill, gen):
    x = make_logits((n,), gen=gen, device="cpu")
    if fill == "leading-inf":
        x[: (2 * n) // 3] = float("-inf")  # whole blocks of -inf: partials (-inf, 0) must merge away
    elif fill == "all-inf":
        x[:] = float("-inf")
    x = x.to(DEVICE)
    out = ladder.softmax_vector_three_kernels(x, threads_per_block=threads, partial_blocks=partial_blocks)
    ref = torch.softmax(x.double(), -1)
    assert_matches(out, ref, torch.float32, f"vector n={n} T={threads} blocks={partial_blocks} {fill}")
    if fill == "all-inf":
        assert torch.isnan(out).all()


def test_vector_propagates_nan(gen):
    x = make_logits((40,), gen=gen)
    x[17] = float("nan")
    assert torch.isnan(ladder.softmax_vector_three_kernels(x, threads_per_block=8)).all()


@pytest.mark.parametrize("loops", ["softmax_three_loops", "softmax_two_loops"])
@pytest.mark.parametrize("shape", [(5, 1000), (3, 1), (8, 37)])
def test_cpu_loops_match_float64(loops, shape, gen):
    x = logits_with_infinities(shape, gen).cpu()
    out = getattr(ladder, loops)(x)
    assert_matches(out, torch.softmax(x.double(), -1), torch.float32, f"{loops} {shape}")


def test_errors_at_the_boundary():
    x = torch.zeros(2, 64, device=DEVICE)
    with pytest.raises(TypeError, match="fp32 only"):
        ladder.softmax_online_per_thread(x.double())
    with pytest.raises(TypeError, match="torch.Tensor"):
        ladder.softmax_three_pass_per_thread(x.cpu().numpy())
    with pytest.raises(ValueError, match="2-D"):
        ladder.softmax_block_shared_tree(x[0])
    with pytest.raises(ValueError, match="1-D"):
        ladder.softmax_vector_three_kernels(x)
    with pytest.raises(ValueError, match="power of two"):
        ladder.softmax_block_shared_tree(x, threads_per_block=48)
    with pytest.raises(ValueError, match="multiple of 32"):
        ladder.softmax_block_warp_shuffle(x, threads_per_block=16)
    with pytest.raises(ValueError, match="partial_blocks"):
        ladder.softmax_vector_three_kernels(x[0], partial_blocks=0)
    with pytest.raises(ValueError, match="CPU tensor"):
        ladder.softmax_two_loops(x.half())


@pytest.mark.skipif(not ON_GPU, reason="outside the simulator, CPU tensors are refused; needs a GPU")
def test_cpu_tensors_are_refused_on_a_gpu():
    with pytest.raises(ValueError, match="CUDA tensors"):
        ladder.softmax_block_shared_tree(torch.zeros(2, 8))


def test_importing_onlinesoftmax_does_not_import_the_ladder():
    import subprocess

    code = "import sys, onlinesoftmax; sys.exit(1 if 'numba' in sys.modules or 'onlinesoftmax.ladder' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_bench_summary_orders_the_ladder_with_the_logs_figures():
    from onlinesoftmax.bench import harness, ladder_suite
    from onlinesoftmax.bench.harness import Row

    case = "1024x32768"
    timings = {"torch": 0.17, "onlinesoftmax": 0.16, "1 three-pass, thread/row": 20.0, "2 online, thread/row": 16.0,
               "3 block/row, shared tree": 0.2, "4 block/row, warp shuffle": 0.19, "4 block/row, warp shuffle fastmath": 0.18}
    rows = [Row(case, "float32", "forward", impl, ms=ms, gbs=harness.gbs(8 * 1024 * 32768, ms))
            for impl, ms in timings.items()]
    rows.append(Row("16777216", "float32", "forward", "torch", ms=0.1, gbs=1000.0))
    summary = {e["impl"]: e for e in ladder_suite.ladder_summary(rows, copy_gbs=3000.0)}
    assert set(summary) == set(timings), "only the matrix rows, each once"
    assert summary["1 three-pass, thread/row"]["speedup_over_previous_step"] is None
    assert summary["2 online, thread/row"]["speedup_over_previous_step"] == pytest.approx(20.0 / 16.0)
    assert summary["3 block/row, shared tree"]["log_speedup_over_previous_step"] == pytest.approx(88.1 / 6.61)
    assert summary["4 block/row, warp shuffle"]["vs_cuda_c_port"] == pytest.approx(0.190 / 0.19)
    assert summary["torch"]["log_1050ti_ms"] == 7.23 and summary["onlinesoftmax"]["log_1050ti_ms"] is None
    fastmath = summary["4 block/row, warp shuffle fastmath"]
    assert fastmath["log_1050ti_ms"] is None and "speedup_over_previous_step" not in fastmath
    assert summary["3 block/row, shared tree"]["pct_of_copy"] == pytest.approx(100 * harness.gbs(8 * 1024 * 32768, 0.2) / 3000)
    table = ladder_suite.summary_markdown(list(summary.values()))
    assert "| 1 three-pass, thread/row | 20.0000 |" in table and "124.10" in table


@pytest.mark.skipif(ON_GPU, reason="the message is for machines without a GPU")
def test_bench_ladder_without_a_gpu_says_what_to_run_instead(capsys):
    from onlinesoftmax import cli

    assert cli.main(["bench", "ladder"]) == 0  # the CPU check of the softmax it ends with passes
    out = capsys.readouterr().out
    assert "No CUDA GPU here" in out and "tests/test_ladder.py" in out
