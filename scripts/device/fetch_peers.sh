#!/usr/bin/env bash
# Fetch the bench's optional peers as wheels for the GPU machine (it has no registry access) into
# .peers1/ and .peers2/ (both git-ignored). Liger is one small wheel; Quack needs nvidia-cutlass-dsl
# with its libs-base, libs-core and libs-cu13 wheels (the torch there is cu130), apache-tvm-ffi and
# torch-c-dlpack-ext. The libs-cu13 wheel (92 MB) is over one call's transfer limit, so it is split:
# the first half travels with the small wheels in .peers1 (scripts/device/gpu_session.sh's 'stash' stage
# keeps them on the machine), the second in .peers2 with the next call, which joins and installs.
#     bash scripts/device/fetch_peers.sh
set -euo pipefail
CUTLASS=4.8.1
rm -rf .peers1 .peers2 && mkdir -p .peers1 .peers2
platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
for name in liger-kernel quack-kernels apache-tvm-ffi torch-c-dlpack-ext nvidia-cutlass-dsl==$CUTLASS \
            nvidia-cutlass-dsl-libs-base==$CUTLASS nvidia-cutlass-dsl-libs-core==$CUTLASS nvidia-cutlass-dsl-libs-cu13==$CUTLASS; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        $platforms -d .peers1 "$name" 2>&1 | grep -v "^WARNING: Location" || true
done
big=$(ls .peers1/nvidia_cutlass_dsl_libs_cu13-*.whl)
split -n 2 "$big" "$big.part_" && rm "$big" && mv "$big.part_ab" .peers2/
du -sh .peers1 .peers2
