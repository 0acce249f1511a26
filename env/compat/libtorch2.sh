#!/usr/bin/env bash
# Builds and tests vqa-hpc against LibTorch 2.6, the version of Debian 13
# (trixie), in a trixie root of its own outside the repository; nothing of
# trixie is installed into the host. Needs root (chroot, mounts) and
# mmdebstrap (installed on the host with apt-get when missing).
#
#   env/compat/libtorch2.sh [STAGE...]
#
# Stages, in this order (default: all of them):
#   root        make the trixie root, or reuse it when its stamp says it is
#               complete: libtorch-dev 2.6 (CPU) and every package of
#               env/setup.sh under its trixie name (read from env/setup.sh;
#               a changed list installs what is missing)
#   cpu-build   configure and build the whole tree against LibTorch 2.6
#               (CPU); npm ci of env/npm (the tests' JavaScript reference)
#   cpu-test    the whole CTest suite, as tests/run_all.sh runs it (with
#               VQA_LT2_CTEST's selection, which must match a test)
#   cuda-root   unpack (dpkg -x, never install) the CUDA LibTorch 2.6
#               (libtorch-cuda-dev, contrib) into /opt/libtorch-cuda, and the
#               CUDA 12.4 toolkit (non-free) and NCCL 2.22 (contrib) into the
#               root's /usr, as installing them would. libtorch-cuda-2.6
#               cannot be installed: it depends on nvidia-cudnn, which
#               downloads cuDNN from NVIDIA.
#   cuda-build  configure with -DVQA_WITH_NCCL=ON against the CUDA LibTorch,
#               compile and link every target (or VQA_LT2_CUDA_TARGETS), and check that the CUDA code
#               paths were compiled (no GPU: nothing runs)
#
# Settings (environment):
#   VQA_LT2_HOME    state folder (default /var/cache/vqa-hpc)
#   VQA_LT2_ROOT    the trixie root (default $VQA_LT2_HOME/trixie-libtorch2)
#   VQA_LT2_CACHE   downloaded .deb files, kept across runs (default $VQA_LT2_HOME/apt-archives)
#   VQA_LT2_MIRROR  Debian mirror (default http://deb.debian.org/debian)
#   VQA_LT2_JOBS    parallel compile jobs (default 2)
#   VQA_LT2_TARGETS cpu-build builds only these targets (e.g. "test_model"; default all)
#   VQA_LT2_CUDA_TARGETS  cuda-build likewise (default all)
#   VQA_LT2_CTEST   extra ctest arguments for cpu-test (e.g. "-R model"); a
#                   selection that matches no test fails the stage
#   VQA_LT2_TESTS   cpu-test runs only these tests (exact names, e.g. "model
#                   train_runs"); a name that is no test fails the stage
#   VQA_LT2_FRESH=1 remove the root first (the .deb and ccache caches stay)
#
# Prints one line per stage with its time (and before it, the stage's
# findings: the configure lines naming the backends, the failed tests); the
# full logs are in $VQA_LT2_ROOT/build/logs. Exits non-zero when any stage
# fails.
#
#   env/compat/libtorch2.sh --run 'COMMAND'
#
# runs COMMAND in the root (in /build/cpu, as the tests run), for looking
# into a failure by hand.
#
# Every package of env/setup.sh is in the root (clang 19 instead of 14). The
# tests that need root (Slurm daemons, network namespaces, tmpfs mounts) run
# as root inside the chroot, in mount and PID namespaces of their own, which
# end with each stage together with anything the tests left running.
set -euo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
suite=trixie
lt_cuda=/opt/libtorch-cuda/usr              # the CUDA LibTorch, inside the root
lt_cuda_lib=$lt_cuda/lib/x86_64-linux-gnu
lt_cuda_libs=$lt_cuda_lib:$lt_cuda/lib        # (gloo's libraries are in lib/)
cuda_stubs=/usr/lib/x86_64-linux-gnu/stubs  # NVIDIA's link stubs (nvidia-cuda-dev)
link_stubs=/opt/libtorch-cuda/link-stubs    # their names as libtorch_cuda needs them

# env/setup.sh's packages (its packages=( ... ) list) under their trixie
# names, plus ccache (the build uses it when present; its cache is kept
# outside the root), procps (ps, kill in the tests) and npm (env/setup.sh
# installs it when the npm command is missing).
declare -A trixie_name=([libclang-rt-14-dev]=libclang-rt-19-dev)
extra_packages=(ccache procps npm)
# The CUDA stage. Installed: g++-13, the newest host compiler nvcc 12.4
# takes, and libcu++ (<nv/target>, which cuda_fp16.h includes; Debian's
# nvidia-cuda-dev depends on it).
cuda_install=(g++-13 libcu++-dev)
# Unpacked into /opt/libtorch-cuda: it cannot share /usr with the CPU LibTorch.
cuda_torch=(libtorch-cuda-dev libtorch-cuda-2.6 libgloo-cuda-0 libtensorpipe-cuda-0)
# Unpacked into /: nvcc (LibTorch's CMake package runs it: find_package(CUDA),
# enable_language(CUDA)), the CUDA headers, libcudart, NCCL. cuBLAS, cuFFT,
# cuRAND, cuSPARSE, cuSOLVER and the driver are linked through NVIDIA's stubs;
# cuDNN, which Debian does not ship, not at all (hence
# --unresolved-symbols=ignore-in-shared-libs, which still reports every
# undefined symbol of the project's own objects).
cuda_system=(nvidia-cuda-toolkit nvidia-cuda-dev libcudart12 libnvtoolsext1 libnccl-dev libnccl2)

log() { printf 'libtorch2: %s\n' "$*"; }
die() { printf 'libtorch2: error: %s\n' "$*" >&2; exit 1; }

# ======== Inside the root (the script runs itself there) ====================

inside_install() {
  local packages
  mapfile -t packages </build/packages.txt
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${packages[@]}" \
    >/build/logs/apt-install.log 2>&1 || { tail -n 40 /build/logs/apt-install.log; return 1; }
  log "  ${#packages[@]} packages: $(dpkg-query -W -f='${Package} ${Version}, ' libtorch-dev \
    openmpi-bin libhdf5-openmpi-dev g++ cmake | sed 's/, $//')"
}

# Shows the configure log's summary lines ("vqa-hpc: ... backend: built").
configure() {  # configure NAME CMAKE-ARGS...
  local name=$1
  shift
  cmake -S /src/vqa-hpc -B "/build/$name" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" \
    >"/build/logs/$name-configure.log" 2>&1 ||
    { tail -n 40 "/build/logs/$name-configure.log"; return 1; }
  grep 'vqa-hpc:' "/build/logs/$name-configure.log" | sed 's/^-- /libtorch2:   /'
}

# Builds everything it can (-k 0), so that one run shows every error.
build() {  # build NAME [TARGET...]
  local name=$1 targets=()
  shift
  (($#)) && targets=(--target "$@")
  cmake --build "/build/$name" --parallel "${VQA_LT2_JOBS:-2}" "${targets[@]}" -- -k 0 \
    >"/build/logs/$name-build.log" 2>&1 || {
    grep -E -A12 'error:|FAILED:|undefined reference' "/build/logs/$name-build.log" | head -n 200
    return 1
  }
  log "  $(grep -c 'warning:' "/build/logs/$name-build.log" || true) compiler warnings (/build/logs/$name-build.log)"
}

# env/setup.sh's npm ci of env/npm, into /build/npm (kept across runs; the
# source tree is copied afresh), linked into the tree where the tests look.
inside_npm() {
  local lock=/src/vqa-hpc/env/npm/package-lock.json
  if ! cmp -s "$lock" /build/npm/package-lock.json || [[ ! -d /build/npm/node_modules ]]; then
    rm -rf /build/npm
    mkdir -p /build/npm
    cp /src/vqa-hpc/env/npm/package.json "$lock" /build/npm/
    # As env/setup.sh: without the registry the build goes on, and the BPE
    # parity test (data_tokenizer) fails, saying what is missing.
    npm ci --prefix /build/npm --no-audit --no-fund --loglevel=error \
      >/build/logs/npm-ci.log 2>&1 || {
      log "  warning: npm ci failed (/build/logs/npm-ci.log): $(grep -m1 'ERR!.*reason\|ERR! code' /build/logs/npm-ci.log)"
      rm -rf /build/npm
      return 0
    }
  fi
  ln -sfn /build/npm/node_modules /src/vqa-hpc/env/npm/node_modules
}

inside_cpu_build() {
  inside_npm
  local targets=()
  read -r -a targets <<<"${VQA_LT2_TARGETS:-}"
  configure cpu -DVQA_WITH_NCCL=OFF
  build cpu "${targets[@]}"
}

inside_cpu_test() {
  local status=0 extra=()
  read -r -a extra <<<"${VQA_LT2_CTEST:-}"
  cd /build/cpu
  if [[ -n ${VQA_LT2_TESTS:-} ]]; then
    local names=() name listed missing=()
    read -r -a names <<<"$VQA_LT2_TESTS"
    listed=$(ctest -N | sed -n 's/^ *Test *#[0-9]*: //p')
    for name in "${names[@]}"; do
      grep -qxF -- "$name" <<<"$listed" || missing+=("$name")
    done
    ((${#missing[@]} == 0)) || { log "  VQA_LT2_TESTS names no test: ${missing[*]}"; return 1; }
    extra+=(-R "^($(IFS='|' && echo "${names[*]}"))\$")
  fi
  # --no-tests=error: a -R in VQA_LT2_CTEST that matches nothing fails the
  # stage (CTest would only log "No tests were found" and exit 0).
  ctest --output-on-failure --no-tests=error --timeout 900 "${extra[@]}" \
    >/build/logs/cpu-test.log 2>&1 || status=$?
  # CTest's count, and one line per failed test.
  if grep -q 'No tests were found' /build/logs/cpu-test.log; then
    log "  no test matches VQA_LT2_CTEST (${VQA_LT2_CTEST:-})"
  else
    log "  $(grep -E '[0-9]+% tests passed' /build/logs/cpu-test.log || echo 'no tests ran')"
  fi
  grep -E '^ *[0-9]+/[0-9]+ Test +#' /build/logs/cpu-test.log |
    grep -v ' Passed ' | sed 's/^ */libtorch2:   /' || true
  return "$status"
}

inside_run() {  # inside_run COMMAND
  cd /build/cpu 2>/dev/null || cd /build
  bash -c "$1"
}

# Fetches PACKAGE's .deb into the current folder unless it is there with the
# archive's checksum.
fetch_deb() {  # fetch_deb PACKAGE -> prints the file name
  local info file sha
  info=$(apt-cache show --no-all-versions "$1")
  file=$(sed -n 's/^Filename: //p' <<<"$info" | head -n 1)
  sha=$(sed -n 's/^SHA256: //p' <<<"$info" | head -n 1)
  file=${file##*/}
  if ! sha256sum --quiet -c - <<<"$sha  $file" >/dev/null 2>&1; then
    rm -f "$file"
    apt-get download -qq "$1" >&2
    sha256sum --quiet -c - <<<"$sha  $file" >&2
  fi
  printf '%s\n' "$file"
}

inside_cuda_unpack() {
  local package deb name missing=()
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${cuda_install[@]}" \
    >/build/logs/apt-install-cuda.log 2>&1 || { tail -n 40 /build/logs/apt-install-cuda.log; return 1; }
  mkdir -p /var/cache/apt/archives/unpacked
  chown _apt:root /var/cache/apt/archives/unpacked
  cd /var/cache/apt/archives/unpacked
  rm -rf /opt/libtorch-cuda
  mkdir -p /opt/libtorch-cuda "$link_stubs"
  for package in "${cuda_torch[@]}"; do
    deb=$(fetch_deb "$package")
    log "  $deb -> /opt/libtorch-cuda"
    dpkg -x "$deb" /opt/libtorch-cuda
  done
  for package in "${cuda_system[@]}"; do
    deb=$(fetch_deb "$package")
    log "  $deb -> /"
    dpkg -x "$deb" /
  done
  # The libraries the CUDA LibTorch needs that are absent: NVIDIA's stub
  # under the name it asks for where there is one (the link resolves against
  # it), else left missing.
  while read -r name; do
    [[ -e $lt_cuda_lib/$name || -e $lt_cuda/lib/$name || -e /usr/lib/x86_64-linux-gnu/$name ]] &&
      continue
    if [[ -e $cuda_stubs/${name%.so.*}.so ]]; then
      ln -sf "$cuda_stubs/${name%.so.*}.so" "$link_stubs/$name"
    else
      missing+=("$name")
    fi
  done < <(for lib in "$lt_cuda_lib"/lib*.so.*.* "$lt_cuda"/lib/lib*.so.*.*; do
             readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
           done | sort -u)
  log "  stubs for: $(cd "$link_stubs" && echo *)"
  log "  absent (no stub; left unresolved): ${missing[*]:-none}"
  nvcc --version | tail -n 2 | sed 's/^/libtorch2:   /'
}

inside_cuda_build() {
  local flags="-Wl,--unresolved-symbols=ignore-in-shared-libs -Wl,-rpath-link,$lt_cuda_libs:$link_stubs"
  configure cuda -DVQA_WITH_NCCL=ON -DCMAKE_PREFIX_PATH="$lt_cuda" \
    -DTorch_DIR="$lt_cuda_lib/cmake/Torch" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags"
  grep -q 'NCCL communicator backend: built' /build/logs/cuda-configure.log ||
    { log "  the NCCL backend is not built"; return 1; }
  local targets=()
  read -r -a targets <<<"${VQA_LT2_CUDA_TARGETS:-}"
  build cuda "${targets[@]}"

  # The CUDA code paths were compiled: VQA_TORCH_HAS_CUDA on each file, the
  # CUDA LibTorch's headers, and the objects call what only those paths call
  # (getCurrentCUDAStream; the CUDA graph's capture). A file's object is the
  # unity batch that includes it (VQA_UNITY_BUILD, the default), or its own.
  local file symbol unit line object commands objects=/build/cuda/src/runtime/CMakeFiles/vqa_runtime.dir
  commands=$(ninja -C /build/cuda -t commands)
  for file in nccl_communicator stream_clock cuda_graph; do
    symbol=c10::cuda::getCurrentCUDAStream
    [[ $file == cuda_graph ]] && symbol=at::cuda::CUDAGraph::capture_begin
    unit=$(grep -l "/src/runtime/$file.cpp\"" "$objects"/Unity/*.cxx 2>/dev/null | head -n 1 || true)
    if [[ -n $unit ]]; then
      object=$unit.o
    else
      unit=runtime/$file.cpp object=$objects/$file.cpp.o
    fi
    line=$(grep -F -- "$unit" <<<"$commands" | head -n 1 || true)
    [[ -n $line ]] || { log "  $file.cpp: no compile command for $unit"; return 1; }
    grep -q -- '-DVQA_TORCH_HAS_CUDA=1' <<<"$line" ||
      { log "  $file.cpp: not compiled with VQA_TORCH_HAS_CUDA"; return 1; }
    grep -q -- "$lt_cuda/include" <<<"$line" ||
      { log "  $file.cpp: not compiled against $lt_cuda/include"; return 1; }
    # (grep without -q: it reads all of nm's output, so pipefail sees no SIGPIPE)
    nm -C --undefined-only "$object" | grep -F "$symbol" >/dev/null ||
      { log "  $file.cpp (${object##*/}) does not call $symbol"; return 1; }
  done
  log "  nccl_communicator.cpp, stream_clock.cpp, cuda_graph.cpp: compiled with VQA_TORCH_HAS_CUDA; they call c10::cuda::getCurrentCUDAStream and at::cuda::CUDAGraph::capture_begin"

  # Every executable is linked; those with LibTorch against the CUDA one.
  local exe total=0 cuda=0 nccl=0 wrong=()
  while IFS= read -r -d '' exe; do
    readelf -h "$exe" 2>/dev/null | grep -E 'Type: +(EXEC|DYN)' >/dev/null || continue
    total=$((total + 1))
    local needed
    needed=$(readelf -d "$exe" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    grep -qx 'libtorch_cuda.so.2.6' <<<"$needed" && cuda=$((cuda + 1))
    grep -qx 'libnccl.so.2' <<<"$needed" && nccl=$((nccl + 1))
    if grep -q '^libtorch' <<<"$needed" && ! grep -qx 'libtorch_cuda.so.2.6' <<<"$needed"; then
      wrong+=("${exe#/build/cuda/}")
    fi
  done < <(find /build/cuda -type f -perm -u+x -not -path '*/CMakeFiles/*' -print0)
  log "  $total executables linked; $cuda against libtorch_cuda.so.2.6, $nccl against libnccl.so.2"
  ((${#wrong[@]} == 0)) || { log "  LibTorch without CUDA in: ${wrong[*]}"; return 1; }
  ((cuda > 0 && nccl > 0))
}

case ${1:-} in
  --in-root)
    # Called as: libtorch2.sh --in-root STEP, by chroot (below).
    case $2 in
      install) inside_install ;;
      cpu-build) inside_cpu_build ;;
      cpu-test) inside_cpu_test ;;
      cuda-unpack) inside_cuda_unpack ;;
      cuda-build) inside_cuda_build ;;
      run) inside_run "$3" ;;
      *) die "unknown step $2" ;;
    esac
    exit
    ;;
  --in-namespace)
    # Called as: libtorch2.sh --in-namespace ROOT CACHE CCACHE STEP [ARG], by
    # unshare: mounts what the root needs into this mount namespace (they end
    # with it), then runs the step in the chroot with a clean environment.
    ns_root=$2 ns_cache=$3 ns_ccache=$4 ns_step=$5 ns_arg=${6:-}
    # The root bound onto itself, so that its / is a mount point: `ip netns
    # exec` and `ip -n` make / a slave mount ("mount --make-rslave /"), which
    # fails with EINVAL on a folder that is not one (the tests of the
    # emulated hosts and the multi-node Slurm use them).
    mount --bind "$ns_root" "$ns_root"
    mount -t proc proc "$ns_root/proc"
    mount --rbind /sys "$ns_root/sys"
    mount --rbind /dev "$ns_root/dev"
    mount -t tmpfs -o mode=1777 tmpfs "$ns_root/dev/shm"
    mount -t tmpfs -o mode=755 tmpfs "$ns_root/run"
    # A fresh /tmp: Open MPI's session folders are named after mpirun's pid,
    # and pids start again at 1 in every new PID namespace.
    mount -t tmpfs -o mode=1777 tmpfs "$ns_root/tmp"
    mkdir -p "$ns_root/run/lock" "$ns_root/var/cache/ccache"
    mount --bind "$ns_cache" "$ns_root/var/cache/apt/archives"
    mount --bind "$ns_ccache" "$ns_root/var/cache/ccache"
    proxy=()  # the host's proxy settings, where it has any
    for variable in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
      if [[ -n ${!variable:-} ]]; then proxy+=("$variable=${!variable}"); fi
    done
    if [[ -L $ns_root/etc/resolv.conf || ! -e $ns_root/etc/resolv.conf ]]; then
      rm -f "$ns_root/etc/resolv.conf"
      touch "$ns_root/etc/resolv.conf"
    fi
    mount --bind /etc/resolv.conf "$ns_root/etc/resolv.conf"
    # The host's CA certificates (a site's TLS proxy among them) for npm's
    # registry; the root's own store is left as Debian made it.
    touch "$ns_root/etc/ssl/host-ca-certificates.crt"
    if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
      mount --bind -o ro /etc/ssl/certs/ca-certificates.crt "$ns_root/etc/ssl/host-ca-certificates.crt"
    fi
    exec chroot "$ns_root" /usr/bin/env -i \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      HOME=/root LANG=C.UTF-8 TERM=dumb DEBIAN_FRONTEND=noninteractive \
      CCACHE_DIR=/var/cache/ccache CCACHE_MAXSIZE=5G \
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      NODE_EXTRA_CA_CERTS=/etc/ssl/host-ca-certificates.crt "${proxy[@]}" \
      VQA_LT2_JOBS="${VQA_LT2_JOBS:-2}" VQA_LT2_CTEST="${VQA_LT2_CTEST:-}" VQA_LT2_TESTS="${VQA_LT2_TESTS:-}" VQA_LT2_TARGETS="${VQA_LT2_TARGETS:-}" VQA_LT2_CUDA_TARGETS="${VQA_LT2_CUDA_TARGETS:-}" \
      /bin/bash /build/libtorch2.sh --in-root "$ns_step" "$ns_arg"
    ;;
esac

# ======== On the host ======================================================

repo=$(cd "$(dirname "$self")/../.." && pwd)
home=${VQA_LT2_HOME:-/var/cache/vqa-hpc}
root=${VQA_LT2_ROOT:-$home/trixie-libtorch2}
cache=${VQA_LT2_CACHE:-$home/apt-archives}
mirror=${VQA_LT2_MIRROR:-http://deb.debian.org/debian}
stamp=$root/.vqa-libtorch2-root
cuda_stamp=$root/.vqa-libtorch2-cuda
logs=$root/build/logs

# The root's packages: env/setup.sh's list under trixie names, and the extras.
root_packages() {
  local name
  # (each word of the lines between "packages=(" and ")", comments removed)
  sed -n '/^packages=(/,/^)/p' "$repo/env/setup.sh" | sed '1d;$d;s/#.*//' |
    tr -s ' \t' '\n' | sed '/^$/d' | while read -r name; do
      printf '%s\n' "${trixie_name[$name]:-$name}"
    done
  printf '%s\n' "${extra_packages[@]}"
}

# in_root STEP [ARG]: runs inside_STEP in the root, in new mount and PID
# namespaces.
in_root() {
  mkdir -p "$logs"
  # A new file, not rewritten in place: a step still running keeps its own.
  cp "$self" "$root/build/.libtorch2.sh.new"
  mv "$root/build/.libtorch2.sh.new" "$root/build/libtorch2.sh"
  unshare --mount --pid --fork --propagation private -- \
    "$BASH" "$self" --in-namespace "$root" "$cache/install" "$home/ccache" "$@"
}

stage_root() {
  local want
  want=$(printf '%s\n' "$suite" && root_packages)
  [[ $want == *libtorch-dev* ]] || { log "  no package list in $repo/env/setup.sh"; return 1; }
  if [[ -f $stamp && $(<"$stamp") == "$want" ]]; then
    log "  $root is complete (reused)"
    return
  fi
  if [[ ! -f $root/.vqa-libtorch2-base ]]; then
    # None yet, or one from an interrupted run: start again. The base
    # system's .deb files are kept in $cache/bootstrap.
    rm -rf "$root"
    mkdir -p "$(dirname "$root")"
    mmdebstrap --variant=minbase --components=main,contrib,non-free \
      --include=ca-certificates --skip=essential/unlink \
      --setup-hook="mkdir -p \"\$1\"/var/cache/apt/archives/" \
      --setup-hook="sync-in $cache/bootstrap /var/cache/apt/archives/" \
      --customize-hook="sync-out /var/cache/apt/archives $cache/bootstrap" \
      "$suite" "$root" "$mirror" >"$home/mmdebstrap.log" 2>&1 || {
      tail -n 30 "$home/mmdebstrap.log" >&2
      log "  mmdebstrap failed (log: $home/mmdebstrap.log)"
      return 1
    }
    mkdir -p "$root/build/logs" "$root/src"
    touch "$root/.vqa-libtorch2-base"
  fi
  rm -f "$stamp" "$cuda_stamp"
  mkdir -p "$root/build"
  root_packages >"$root/build/packages.txt"
  in_root install
  printf '%s\n' "$want" >"$stamp"
}

# Copies the working tree (tracked and untracked files that git does not
# ignore) to /src/vqa-hpc in the root. A file whose bytes are those of the
# previous copy keeps that copy's modification time, and any other file gets
# the present time, so that a rebuild compiles exactly what changed (the
# source's own times would hide a file edited while a build was running).
copy_source() {
  local new=$root/src/.vqa-hpc.new old=$root/src/vqa-hpc file
  rm -rf "$new"
  mkdir -p "$new"
  if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$repo" ls-files -z --cached --others --exclude-standard |
      while IFS= read -r -d '' file; do
        if [[ -e $repo/$file ]]; then printf '%s\0' "$file"; fi  # not deleted
      done |
      tar -C "$repo" --null -T - -cf - | tar -C "$new" -xf -
  else
    tar -C "$repo" --exclude='./build*' -cf - . | tar -C "$new" -xf -
  fi
  while IFS= read -r -d '' file; do
    if cmp -s "$new/$file" "$old/$file"; then
      touch -r "$old/$file" "$new/$file"
    else
      touch "$new/$file"
    fi
  done < <(cd "$new" && find . -type f -print0)
  rm -rf "$old"
  mv "$new" "$old"
}

stage_cpu_build() {
  copy_source
  in_root cpu-build
}

stage_cpu_test() {
  [[ -f $root/build/cpu/build.ninja ]] || { log "  run the cpu-build stage first"; return 1; }
  in_root cpu-test
}

stage_cuda_root() {
  local want="${cuda_install[*]} ${cuda_torch[*]} ${cuda_system[*]}"
  if [[ -f $cuda_stamp && $(<"$cuda_stamp") == "$want" ]]; then
    log "  CUDA packages unpacked (reused)"
    return
  fi
  in_root cuda-unpack
  printf '%s\n' "$want" >"$cuda_stamp"
}

stage_cuda_build() {
  [[ -f $cuda_stamp ]] || { log "  run the cuda-root stage first"; return 1; }
  copy_source
  in_root cuda-build
}

# The whole of main is read before it runs: editing this file meanwhile is harmless.
main() {
  if [[ ${1:-} == --run ]]; then
    (($# == 2)) || die "usage: $0 --run 'COMMAND'"
    [[ $(id -u) -eq 0 ]] || die "needs root (chroot and mounts)"
    [[ -f $stamp ]] || die "no complete root at $root: run the root stage first"
    in_root run "$2"
    return
  fi
  all_stages=(root cpu-build cpu-test cuda-root cuda-build)
  if (($#)); then stages=("$@"); else stages=("${all_stages[@]}"); fi
  for stage in "${stages[@]}"; do
    [[ " ${all_stages[*]} " == *" $stage "* ]] || die "unknown stage '$stage' (stages: ${all_stages[*]})"
  done

  [[ $(id -u) -eq 0 ]] || die "needs root (chroot and mounts)"
  case $root/ in
    "$repo"/*) die "VQA_LT2_ROOT=$root is inside the repository; put it outside" ;;
  esac
  if ! command -v mmdebstrap >/dev/null; then
    log "installing mmdebstrap on the host (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null
  fi
  if [[ ${VQA_LT2_FRESH:-0} == 1 ]]; then
    log "removing $root (VQA_LT2_FRESH=1)"
    rm -rf "$root"
  fi
  mkdir -p "$cache/install/partial" "$cache/bootstrap" "$home/ccache"

  # A failed stage fails the run, but the stages that do not need it still
  # run (a test failure does not hide the CUDA build's result).
  local -A needs=([cpu-build]=root [cpu-test]=cpu-build [cuda-root]=root [cuda-build]=cuda-root)
  local -A failed=()
  local total_start=$SECONDS start status stage
  for stage in "${stages[@]}"; do
    start=$SECONDS
    if [[ -n ${needs[$stage]:-} && -n ${failed[${needs[$stage]}]:-} ]]; then
      log "stage $stage ... skipped (stage ${needs[$stage]} failed)"
      failed[$stage]=1
      continue
    fi
    if [[ $stage != root && ! -f $stamp ]]; then
      die "stage $stage needs the root: run the root stage first"
    fi
    # A subshell outside any condition, so that set -e holds inside the stage.
    set +e
    (
      set -e
      case $stage in
        root) stage_root ;;
        cpu-build) stage_cpu_build ;;
        cpu-test) stage_cpu_test ;;
        cuda-root) stage_cuda_root ;;
        cuda-build) stage_cuda_build ;;
      esac
    )
    status=$?
    set -e
    if ((status == 0)); then
      log "stage $stage ... $((SECONDS - start)) s ok"
    else
      log "stage $stage ... $((SECONDS - start)) s FAILED (logs: $logs)"
      failed[$stage]=1
    fi
  done
  if ((${#failed[@]})); then
    log "all stages (${stages[*]}) ... $((SECONDS - total_start)) s FAILED: ${!failed[*]}"
    return 1
  fi
  log "all stages (${stages[*]}) ... $((SECONDS - total_start)) s ok"
}

main "$@"
exit
