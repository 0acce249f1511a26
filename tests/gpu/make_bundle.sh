#!/usr/bin/env bash
# Prepares, on a Debian 12 machine with the project's packages (env/setup.sh),
# what tests/gpu/check.sh needs on a GPU machine that has CUDA, a CUDA
# PyTorch wheel (its LibTorch) and the NCCL wheel, but no Open MPI, parallel
# HDF5, Boost or OpenCV, and reaches no package registry:
#   .gpu-check/debs/    the Debian packages of those (about 31 MB), unpacked
#                       there into a prefix of their own, never into /
#   .gpu-check/*.h5     the synthetic datasets of the check, made here with
#                       build/vqa_prep (whose OpenCV needs GDAL at run time,
#                       which the bundle does not carry)
# .gpu-check/ is listed in git's info/exclude, so it travels only when asked
# for (the device tool's `carry`).
#
#   tests/gpu/make_bundle.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
bundle=.gpu-check
# A clone need not have .git/info (git clone --template= makes none); outside
# a git checkout there is nothing to exclude from.
if exclude=$(git rev-parse --git-path info/exclude 2>/dev/null); then
  mkdir -p "$(dirname "$exclude")"
  grep -qxF "/$bundle/" "$exclude" 2>/dev/null || echo "/$bundle/" >>"$exclude"
fi
rm -rf "$bundle"
mkdir -p "$bundle/debs"

# Runtime and development packages, with the libraries they need that an
# Ubuntu-based CUDA image lacks: parallel HDF5 links libcurl and libcrypto
# (libssl3), Open MPI's UCX and OFI components libnuma and the verbs
# providers (libefa, libmlx5), zlib1g-dev's libz.so points at zlib1g's library, CMake's
# FindPkgConfig needs a pkg-config program. check.sh's preflight lists any
# library still "not found".
packages=(
  libopenmpi3 libopenmpi-dev openmpi-bin openmpi-common libhwloc15 libhwloc-dev
  libevent-2.1-7 libevent-core-2.1-7 libevent-pthreads-2.1-7 libevent-dev
  libpmix2 libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200
  libpsm2-2 libpsm-infinipath1 libmunge2 libnuma1 ibverbs-providers
  libhdf5-openmpi-103-1 libhdf5-openmpi-dev libsz2 libaec0 libaec-dev
  libboost-program-options1.74.0 libboost-program-options1.74-dev libboost1.74-dev
  nlohmann-json3-dev libgtest-dev zlib1g-dev
  libpcre2-dev libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libopencv-core-dev libopencv-core406 libopencv-imgproc-dev libopencv-imgproc406
  libopencv-imgcodecs-dev libopencv-imgcodecs406 libtbb12
  libcurl4 libssl3 zlib1g libnghttp2-14 libpsl5 librtmp1 libssh2-1 libbrotli1
  pkg-config pkgconf pkgconf-bin libpkgconf3
)
(cd "$bundle/debs" && apt-get download "${packages[@]}" >/dev/null)

# The datasets: the tiny set of the communicator tests' neighbours and the
# for a few batches of 16.
# 32 images (14 MB): the bundle must stay under the device tool's 64 MiB.
"$build/vqa_prep" synth --train-questions 128 --test-questions 16 --image-size 384 \
  --questions-per-image 4 -o "$bundle/synth384.h5" >/dev/null
du -sh "$bundle" | sed 's/^/make_bundle.sh: /'
