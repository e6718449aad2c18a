"""Does compute-sanitizer's racecheck honour the barriers Triton's warp specialization uses?

Triton 3.6 warp-specializes a loop by parking the worker warps in a dispatch loop: the default
warpgroup writes one state byte per worker warp to shared memory, every warp meets at the
CTA-wide named barrier 1 (PTX ``barrier.sync 1``), the workers read their byte, run their
partition, meet again, and read the next state (exit). Racecheck reports hazards between that
read and those writes in every warp-specialized kernel (docs/notes/2026-11/probe_warp_specialize-h100.log).

This replays the protocol in CUDA C (CuPy, NVRTC, sm_90a), 12 warps as Triton runs them: warps
0-3 write (the default partition), 4-7 and 8-11 read (two worker partitions), with the same
barriers and the same register reconfiguration (setmaxnreg), in variants:

* ``no_barrier``: the positive control; racecheck must report it.
* ``syncthreads``: the protocol with ``__syncthreads()`` (barrier 0).
* ``named_barrier``: the protocol with ``barrier.sync 1``, as Triton emits it.
* ``named_barrier_setmaxnreg``: the same with Triton's ``setmaxnreg`` around the barriers.
* ``named_barrier_setmaxnreg_partial``: and inside each partition the warpgroup-wide barriers
  Triton adds (``bar.sync 0, 128`` in the default warpgroup, ``bar.sync 2, 128`` and
  ``bar.sync 3, 128`` in the workers).
* ``triton_like``: as Triton's machine code does it, the default warpgroup first meets at
  ``bar.sync 0, 128`` several times (Triton initializes its mbarriers so), then every one of its
  threads writes the eight state bytes with one 64-bit store.
* ``triton_like_barrier_4``: the same with those warpgroup barriers on id 4 instead of 0.
* ``write_all``, ``pre_barriers``, ``write_all_only``: one ingredient of ``triton_like`` at a time
  (the 64-bit store by every writer thread; the warpgroup barriers before the first write; the
  store by every writer thread in the plain ``named_barrier`` protocol).

    compute-sanitizer --tool racecheck python scripts/probes/probe_racecheck_barriers.py
"""

from __future__ import annotations

import cupy

SOURCE = r"""
#define WRITER (threadIdx.x < 128)
#define WARP (threadIdx.x / 32)
#define LANE (threadIdx.x % 32)

__device__ __forceinline__ void named_barrier() { asm volatile("barrier.sync 1;" ::: "memory"); }
__device__ __forceinline__ void cta_barrier() { __syncthreads(); }
// A partition's own barrier among its 128 threads, as Triton syncs a warpgroup: ids 0, 2, 3.
__device__ __forceinline__ void partition_barrier() {
#if PARTIAL
    if (threadIdx.x < 128) asm volatile("bar.sync 0, 128;" ::: "memory");
    else if (threadIdx.x < 256) asm volatile("bar.sync 2, 128;" ::: "memory");
    else asm volatile("bar.sync 3, 128;" ::: "memory");
#endif
}
__device__ __forceinline__ void shrink() {
#if SETMAXNREG
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
#endif
}
// As in Triton's kernels the default warpgroup grows more than the workers (232 and 120 registers:
// 128 * 232 + 256 * 120 fit the SM's 65536).
__device__ __forceinline__ void grow() {
#if SETMAXNREG
    if (WRITER) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    else asm volatile("setmaxnreg.inc.sync.aligned.u32 120;");
#endif
}

// The dispatch protocol: a state byte per worker warp (warp w reads byte w + 4, the eight bytes
// 8-byte aligned as in Triton's layout); 0 = run the partition, 2 = exit.
__device__ __forceinline__ void writer_prologue() {
    for (int i = 0; i < PRE_BARRIERS; ++i) {
        if (PRE_BARRIER_ID == 0) asm volatile("bar.sync 0, 128;" ::: "memory");
        else asm volatile("bar.sync 4, 128;" ::: "memory");
    }
}
__device__ __forceinline__ void write_state(volatile unsigned char* state, unsigned char value) {
#if WRITE_ALL  /* every writer thread stores the 8 worker bytes at once, as Triton's STS.64 */
    unsigned long long word = 0x0101010101010101ull * value;
    *(volatile unsigned long long*)(state + 8) = word;
#else
    if (threadIdx.x == 0) for (int w = 4; w < 12; ++w) state[w + 4] = value;
#endif
}

#define PROTOCOL(BARRIER)                                                                  \
    __shared__ __align__(8) volatile unsigned char state[16];                              \
    if (WRITER) {                                                                          \
        writer_prologue();                                                                 \
        write_state(state, 0);                                                             \
        BARRIER(); shrink(); BARRIER();                                                    \
        partition_barrier();                                                               \
        out[threadIdx.x] = threadIdx.x; /* the default partition's work */                \
        partition_barrier();                                                               \
        BARRIER(); grow();                                                                 \
        write_state(state, 2);                                                             \
        BARRIER();                                                                         \
        return;                                                                            \
    }                                                                                      \
    for (;;) {                                                                             \
        shrink();                                                                          \
        BARRIER();                                                                         \
        unsigned char s = state[WARP + 4];                                                     \
        if (s == 2) return;                                                                \
        grow();                                                                            \
        BARRIER();                                                                         \
        partition_barrier();                                                               \
        out[threadIdx.x] = s + 1; /* the worker partition's work */                       \
        partition_barrier();                                                               \
        BARRIER();                                                                         \
    }

extern "C" __global__ void KERNEL_NAME(int* out) {
#if NO_BARRIER
    __shared__ volatile unsigned char state[16];
    if (threadIdx.x == 0) for (int w = 4; w < 12; ++w) state[w + 4] = 2;
    if (!WRITER) out[threadIdx.x] = state[WARP + 4];
#else
    PROTOCOL(BARRIER_FN)
#endif
}
"""

VARIANTS = {
    "no_barrier": dict(NO_BARRIER=1),
    "syncthreads": dict(BARRIER_FN="cta_barrier"),
    "named_barrier": dict(),
    "named_barrier_setmaxnreg": dict(SETMAXNREG=1),
    "named_barrier_setmaxnreg_partial": dict(SETMAXNREG=1, PARTIAL=1),
    "write_all": dict(SETMAXNREG=1, PARTIAL=1, WRITE_ALL=1),
    "pre_barriers": dict(SETMAXNREG=1, PARTIAL=1, PRE_BARRIERS=9),
    "write_all_only": dict(WRITE_ALL=1),
    "triton_like": dict(SETMAXNREG=1, PARTIAL=1, PRE_BARRIERS=9, WRITE_ALL=1),
    "triton_like_barrier_4": dict(SETMAXNREG=1, PARTIAL=1, PRE_BARRIERS=9, WRITE_ALL=1, PRE_BARRIER_ID=4),
}


def main() -> None:
    out = cupy.zeros(384, dtype=cupy.int32)
    defaults = dict(NO_BARRIER=0, SETMAXNREG=0, PARTIAL=0, PRE_BARRIERS=0, PRE_BARRIER_ID=0, WRITE_ALL=0,
                    BARRIER_FN="named_barrier")
    for name, macros in VARIANTS.items():
        defines = "".join(f"#define {key} {value}\n" for key, value in dict(defaults, **macros, KERNEL_NAME=name).items())
        # 168 registers at entry (384 threads * 168 fit the SM), as setmaxnreg needs a known count.
        module = cupy.RawModule(code=defines + SOURCE, options=("-arch=sm_90a", "--maxrregcount=168"))
        module.get_function(name)((1,), (384,), (out,))
        cupy.cuda.runtime.deviceSynchronize()
        print(f"{name}: ran, out[383] = {int(out[383])}", flush=True)


if __name__ == "__main__":
    main()
