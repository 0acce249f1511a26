#!/usr/bin/env bash
# Installs every system package vqa-hpc needs on Debian 12 / Ubuntu 22.04+.
# Idempotent: when everything is present it only checks (a second or two).
# Needs root (or sudo). CUDA and NCCL are not installed here: on GPU machines
# they come from the site (modules, /usr/local/cuda); see docs/install.md.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config      # build
  libtorch-dev                          # LibTorch (CPU build) for the model and training loop
  libopenblas0-openmp                   # fast BLAS for LibTorch on CPU (reference BLAS is ~16x slower)
  libopenmpi-dev openmpi-bin            # MPI: ranks, NCCL id exchange, CPU allreduce, mpirun
  libhdf5-openmpi-dev hdf5-tools        # parallel HDF5 (MPI-IO) for the dataset; h5ls/h5dump
  libboost-program-options-dev          # command line + INI configuration
  libopencv-core-dev libopencv-imgcodecs-dev libopencv-imgproc-dev  # image decode/resize in vqa_prep
  nlohmann-json3-dev                    # VQA-RAD / SLAKE JSON in vqa_prep
  libpcre2-dev                          # GPT-2's pre-tokenisation pattern (\p{L}, \p{N}) in vqa_prep
  zlib1g-dev                            # CRC-32 checksums of checkpoints
  libprotobuf-dev protobuf-compiler     # TensorBoard's event files (the event messages)
  libgtest-dev                          # tests
  shellcheck                            # lint of the job scripts (a test)
  slurmctld slurmd slurm-client munge   # a real single-node Slurm for the cluster-script tests
  iproute2                              # network namespaces, veth and tc: emulated hosts (jobs/emulated_hosts.sh), the partition test
  clang libclang-rt-14-dev              # libFuzzer targets (tests/fuzz)
  gnuplot-nox                           # the scaling report's PNG (jobs/bench_scaling.sh)
  python3 python3-torch                 # tests/slurm's metrics comparison; the PyTorch DDP reference (jobs/ddp_reference.py)
  python3-pil                           # test: Pillow's resize, the reference of convert's (tests/data)
  python3-h5py                          # test: the M3AE reference reads the dataset file (tests/model/m3ae_reference.py)
  python3-protobuf python3-crc32c       # test: an independent reader of the TensorBoard event files (tests/train)
  nodejs                                # test: gpt-3-encoder, the reference of the RoBERTa BPE (tests/data)
)

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$package")
done
# Debian's nodejs comes without npm; NodeSource's nodejs brings its own.
command -v npm >/dev/null 2>&1 || missing+=(npm)

if ((${#missing[@]})); then
  echo "env/setup.sh: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq \
    "${missing[@]}" >/dev/null
fi

# Test-only npm packages (env/npm/package-lock.json pins them) into the
# git-ignored env/npm/node_modules; again only when the lock file changes.
npm_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/npm"
if [[ ! -e $npm_dir/node_modules/.package-lock.json ||
      $npm_dir/package-lock.json -nt $npm_dir/node_modules/.package-lock.json ]]; then
  echo "env/setup.sh: npm ci in $npm_dir (test references)"
  npm ci --prefix "$npm_dir" --no-audit --no-fund --loglevel=error >/dev/null ||
    echo "env/setup.sh: warning: npm ci failed (no registry?); the BPE parity test" \
         "(data_tokenizer) will fail until it succeeds" >&2
fi

# Debian picks OpenBLAS over the reference BLAS by priority; say which is active.
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo unknown)
case "$blas" in
  *openblas*) ;;
  *) echo "env/setup.sh: warning: libblas.so.3 is $blas, not OpenBLAS;" \
          "run: update-alternatives --config libblas.so.3-x86_64-linux-gnu" >&2 ;;
esac
echo "env/setup.sh: all ${#packages[@]} packages present"
