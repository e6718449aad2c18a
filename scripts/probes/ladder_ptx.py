"""Why ladder step 2 (numba) trails the CUDA C port: the first pass's loop in PTX, side by side.

    pip install numba-cuda nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12   # no GPU needed
    python scripts/probes/ladder_ptx.py

Steps 1 and 2 give each of 1024 rows to one thread, so the kernels are bound by how many loads a
thread keeps in flight (memory-level parallelism), not by bandwidth. This prints, for the first
pass of step 1 (max) and step 2 (online max and sum) as numba builds them, and for the work log's
kernel 2 as NVRTC builds it: how far the loop is unrolled (loads per trip), whether the loads are
global or generic, and whether a branch sits between consecutive loads.
"""

import re

from numba import cuda, float32

from onlinesoftmax.ladder import kernels

# The work log's kernel 2, writing to a separate output as the numba step does.
KERNEL_2_CUDA_C = rb"""
extern "C" __global__ void softmax_kernel2(const float* input, float* output, int M, int N) {
    int row = blockDim.x * blockIdx.x + threadIdx.x;
    if (row < M) {
        float x_max = -INFINITY;
        float norm = 0.0f;
        for (int col = 0; col < N; col++) {
            float curr = input[row * N + col];
            if (curr > x_max) { norm = norm * expf(x_max - curr); x_max = curr; }
            norm += expf(curr - x_max);
        }
        for (int col = 0; col < N; col++) output[row * N + col] = expf(input[row * N + col] - x_max) / norm;
    }
}
"""


def nvrtc_ptx(source: bytes) -> str:
    from cuda.bindings import nvrtc

    _, prog = nvrtc.nvrtcCreateProgram(source, b"kernel2.cu", 0, [], [])
    options = [b"--gpu-architecture=compute_90", b"-DINFINITY=__int_as_float(0x7f800000)"]
    (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(log.decode())
    _, size = nvrtc.nvrtcGetPTXSize(prog)
    ptx = b" " * size
    nvrtc.nvrtcGetPTX(prog, ptx)
    return ptx.rstrip(b"\0").decode()


def first_loop(ptx: str) -> list[str]:
    """The body of the first loop that loads from memory: from its label to its back edge."""
    lines = [line.strip() for line in ptx.splitlines()]
    for i, line in enumerate(lines):
        label = re.match(r"^(\$L__BB\d+_\d+):$", line)
        if not label:
            continue
        for j in range(i + 1, len(lines)):
            if re.search(rf"bra(\.uni)?\s+{re.escape(label.group(1))};", lines[j]):
                body = lines[i:j + 1]
                if any(re.match(r"ld\.(global\.)?f32", b) for b in body):
                    return body
                break
    raise ValueError("no loading loop found")


def describe(name: str, ptx: str) -> str:
    body = first_loop(ptx)
    loads = [i for i, line in enumerate(body) if re.match(r"ld\.(global\.)?f32", line)]
    kinds = {"global" if ".global" in body[i] else "generic" for i in loads}
    branched = sum(any(line.startswith("@") and " bra" in line for line in body[a:b])
                   for a, b in zip(loads, loads[1:]))
    instructions = sum(1 for line in body if line and not line.endswith(":") and not line.startswith("//"))
    return (f"{name:48s} loads per trip {len(loads)}  ({'/'.join(sorted(kinds))})  "
            f"branches between loads {branched}/{max(len(loads) - 1, 0)}  instructions per load "
            f"{instructions / max(len(loads), 1):.0f}")


def main():
    signature = (float32[:, :], float32[:, :])
    for name, fn in (("step 1 (numba), max pass", kernels.three_pass_per_thread),
                     ("step 2 (numba), online pass", kernels.online_per_thread)):
        ptx, _ = cuda.compile_ptx(fn, signature, cc=(9, 0))
        print(describe(name, ptx))
    print(describe("work-log kernel 2 (CUDA C, NVRTC), online pass", nvrtc_ptx(KERNEL_2_CUDA_C)))


if __name__ == "__main__":
    main()
