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
# FindPkgConfig needs a pkg-config program, libcurl needs LDAP (with SASL and
# GnuTLS) and libunistring (an H200 machine's image had none of them; its
# compiler and Python bring libgmp and libffi, which GnuTLS and p11-kit use).
# check.sh's preflight lists any library still "not found".
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
  libldap-2.5-0 libsasl2-2 libsasl2-modules-db libdb5.3 libgnutls30 libhogweed6 libnettle8
  libp11-kit0 libtasn1-6 libidn2-0 libunistring2
)
(cd "$bundle/debs" && apt-get download "${packages[@]}" >/dev/null)

# The bundle must stay under the device tool's 64 MiB (the packages take
# 39 MB), and synth keeps about 56 distinct questions per image, so both
# datasets ask 64 or more per image.
# The training stage's dataset: 532 questions on 10 images of 384 px (5 MB),
# 17 optimiser steps of 2 x 16 per epoch (the last one short), enough for a
# steady samples/s on a fast GPU.
"$build/vqa_prep" synth --train-questions 600 --test-questions 32 --image-size 384 \
  --questions-per-image 64 -o "$bundle/synth384.h5" >/dev/null
# The side-by-side benchmark's (check.sh's bench stage, jobs/bench_gpu.sh):
# 560 questions of M3AE's 32 tokens over RoBERTa's vocabulary, on 10 images
# with their 512 px sources for the random resized crop (13 MB): 8 steps of
# 64 per epoch, 35 of 16.
"$build/vqa_prep" synth --train-questions 1280 --test-questions 8 --image-size 384 \
  --max-len 32 --vocab-size 50265 --questions-per-image 128 --source-size 512 \
  -o "$bundle/bench384.h5" >/dev/null
du -sh "$bundle" | sed 's/^/make_bundle.sh: /'
