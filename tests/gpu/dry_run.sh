#!/usr/bin/env bash
# The GPU check's route proven where a missing piece shows: tests/gpu/check.sh
# with VQA_GPU_DEVICE=cpu, run in a Debian 12 root made with mmdebstrap that
# holds what the GPU machine brings and nothing of the bundle:
#   - a compiler, CMake, Ninja, Python 3 with NumPy (installed with apt);
#   - a CPU LibTorch and its Python package in /opt/torch, as a wheel carries
#     them: Debian's libtorch and python3-torch files, with the libraries they
#     need that neither the root nor the bundle has copied beside them into
#     /opt/torch/private, found through their RPATH alone (patchelf), under
#     names of their own (as auditwheel names a wheel's libraries). Debian's
#     LibTorch needs OpenCV and its image codecs (GDAL, ...): it gets its own
#     copy, which cannot stand in for the bundle's. What else it shares with
#     the bundle (libcurl, libibverbs, TBB, ...) it takes from the bundle, as
#     the check's programs do (two copies of libnl in one process crash).
# Debian's CMake depends on libcurl4, libssl3 and four more of the bundle's
# packages (the GPU machine's CMake brings its own): their libraries move to
# /opt/cmake-libs, reached by cmake, ctest and cpack alone (DT_RPATH), and the
# packages are purged. zlib1g stays: dpkg needs it, and every Debian or
# Ubuntu system has it. The script then checks that no other package of
# tests/gpu/make_bundle.sh is in the root, that cmake runs there, and that
# LibTorch misses only libraries the bundle brings; the check's preflight
# then imports torch with the bundle's libraries on LD_LIBRARY_PATH.
#
#   tests/gpu/dry_run.sh
#
# Needs root (chroot, mounts), the bundle (tests/gpu/make_bundle.sh: made
# here when missing, from build/vqa_prep) and the host's own LibTorch
# (env/setup.sh). The check runs in new mount and PID namespaces, which end
# with it together with anything it left running.
#
# Settings (environment):
#   VQA_DRY_ROOT    the root (default /var/cache/vqa-hpc/bookworm-gpu-check);
#                   reused while its stamp matches, else made again
#   VQA_DRY_MIRROR  Debian mirror (default http://deb.debian.org/debian)
#   VQA_GPU_UNTIL   the check's last stage (default train: every stage)
#   VQA_GPU_PRESET, VQA_GPU_STEPS, VQA_GPU_EPOCHS, VQA_GPU_BATCH
#                   passed to the check (defaults here: tiny, 2, 2, 4)
#   VQA_GPU_BUDGET_S, VQA_GPU_BENCH, VQA_GPU_BENCH_S, VQA_GPU_BENCH_BATCHES,
#   _STEPS, _PRECISIONS, _COMPILE, WARMUP
#                   passed to the check (defaults here: 0, no budget; 1;
#                   240: the rows that fit in 4 minutes, the others say
#                   "not run"; 4; 3; bf16; default; 2: small rows)
# The check's logs and summary are copied to .gpu-check/dry-run/.
set -euo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
repo=$(cd "$(dirname "$self")/../.." && pwd)
home=/var/cache/vqa-hpc
root=${VQA_DRY_ROOT:-$home/bookworm-gpu-check}
mirror=${VQA_DRY_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
stamp=$root/.vqa-gpu-dry-run
arch_lib=usr/lib/x86_64-linux-gnu

# What the GPU machine brings (its CMake, compiler, Ninja, Python)...
tools=(g++ cmake ninja-build python3 python3-numpy python3-typing-extensions)
# ...and its CPU LibTorch: these packages' files, from the host, into /opt/torch.
torch_packages=(libtorch1.13 libtorch-dev python3-torch libgflags-dev libgflags2.2 libgoogle-glog-dev
  libgoogle-glog0v6 libprotobuf-dev libprotobuf32)
torch=/opt/torch
torch_lib=$torch/$arch_lib
private=$torch/private
cmake_libs=/opt/cmake-libs

log() { printf 'gpu-dry-run: %s\n' "$*"; }
die() { log "error: $*" >&2; exit 1; }

if [[ ${1:-} == --in-namespace ]]; then
  # Called by unshare (below): mounts into this mount namespace, then the
  # check in the chroot with a clean environment.
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mount --rbind /dev "$root/dev"
  mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
  mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
  exec chroot "$root" /usr/bin/env -i \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 TERM=dumb \
    PYTHONPATH=$torch/usr/lib/python3/dist-packages \
    TORCH_DIR=$torch_lib/cmake CMAKE_PREFIX_PATH=$torch/usr \
    VQA_GPU_DEVICE=cpu VQA_GPU_UNTIL="${VQA_GPU_UNTIL:-train}" \
    VQA_GPU_PRESET="${VQA_GPU_PRESET:-tiny}" VQA_GPU_STEPS="${VQA_GPU_STEPS:-2}" \
    VQA_GPU_EPOCHS="${VQA_GPU_EPOCHS:-2}" VQA_GPU_BATCH="${VQA_GPU_BATCH:-4}" \
    VQA_GPU_BUDGET_S="${VQA_GPU_BUDGET_S:-0}" VQA_GPU_BENCH="${VQA_GPU_BENCH:-1}" \
    VQA_GPU_BENCH_S="${VQA_GPU_BENCH_S:-240}" \
    VQA_GPU_BENCH_BATCHES="${VQA_GPU_BENCH_BATCHES:-4}" VQA_GPU_BENCH_STEPS="${VQA_GPU_BENCH_STEPS:-3}" \
    VQA_GPU_BENCH_PRECISIONS="${VQA_GPU_BENCH_PRECISIONS:-bf16}" \
    VQA_GPU_BENCH_COMPILE="${VQA_GPU_BENCH_COMPILE-default}" WARMUP="${WARMUP:-2}" \
    VQA_GPU_WORK=/build/work OUT=/build/out \
    /bin/bash /src/vqa-hpc/tests/gpu/check.sh
fi

in_root() { chroot "$root" "$@"; }

# The packages of tests/gpu/make_bundle.sh (its packages=( ... ) list).
bundle_packages() {
  sed -n '/^packages=(/,/^)/p' "$repo/tests/gpu/make_bundle.sh" | sed '1d;$d;s/#.*//' |
    tr -s ' \t' '\n' | sed '/^$/d'
}

# The sonames of the bundle's libraries (from .gpu-check/debs).
bundle_sonames() {
  local deb
  for deb in "$repo"/.gpu-check/debs/*.deb; do
    dpkg-deb -c "$deb" | awk '{print $6}' | sed -n 's#.*/\([^/]*\.so\.[0-9.]*\)$#\1#p'
  done | sort -u
}

installed_in_root() {  # installed_in_root PACKAGE...: prints those installed
  local package
  for package in "$@"; do
    # shellcheck disable=SC2016  # (dpkg-query's format, not the shell's)
    [[ $(in_root dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null) == installed ]] &&
      printf '%s\n' "$package"
  done
  return 0
}

is_elf() { [[ -f $1 && ! -L $1 && $(head -c 4 "$1" | od -An -c | tr -d ' ') == 177ELF ]]; }

# CMake's libcurl and the rest out of the root's library path, for CMake alone.
move_cmake_libraries() {
  local package file bundled moved=()
  mapfile -t bundled < <(bundle_packages)
  mapfile -t moved < <(installed_in_root "${bundled[@]}" | grep -vx zlib1g)
  mkdir -p "$root$cmake_libs"
  for package in "${moved[@]}"; do
    while IFS= read -r file; do
      [[ $file == *.so* && ( -f $root$file || -L $root$file ) && ! -d $root$file ]] &&
        cp -a "$root$file" "$root$cmake_libs/"
    done < <(in_root dpkg -L "$package")
  done
  in_root dpkg --purge --force-depends "${moved[@]}" >/dev/null 2>&1
  for file in cmake ctest cpack; do
    patchelf --force-rpath --set-rpath "$cmake_libs" "$root/usr/bin/$file"
  done
  log "  moved to $cmake_libs for cmake, ctest, cpack (packages purged): ${moved[*]:-none}"
}

# Debian's LibTorch as a wheel carries it: its files in /opt/torch, the
# libraries they need that the root lacks in /opt/torch/private, renamed as
# auditwheel renames a wheel's libraries (libfoo.so.1 -> libfoo-torch.so.1,
# in their SONAME and in every NEEDED entry naming them). Debian's LibTorch
# needs OpenCV, which the bundle carries too: without the new names the
# linker (which searches LD_LIBRARY_PATH before a library's RPATH) would
# take the bundle's OpenCV for LibTorch's and ask for GDAL, and a missing
# package of the bundle could hide behind LibTorch's copy.
stage_torch() {
  local package soname path file new count=0 args
  mkdir -p "$root$torch" "$root$private"
  for package in "${torch_packages[@]}"; do
    dpkg-query -L "$package" | while IFS= read -r file; do
      if [[ -L $file || -f $file ]]; then printf '%s\0' "${file#/}"; fi
    done
  done | tar -C / --null -T - -cf - | tar -C "$root$torch" -xf -
  # The host's copies of every library the root cannot give (ldd on the host:
  # the same Debian release, the whole closure).
  declare -A needed=() renamed=()
  while IFS= read -r -d '' file; do
    is_elf "$file" || continue
    while read -r soname path; do
      needed[$soname]=$path
    done < <(ldd "/${file#"$root$torch"/}" 2>/dev/null | sed -n 's/^\s*\(\S*\) => \(\/\S*\) .*/\1 \2/p')
  done < <(find "$root$torch" -name '*.so*' -type f -print0)
  declare -A bundled=()
  while read -r soname; do bundled[$soname]=1; done < <(bundle_sonames)
  for soname in "${!needed[@]}"; do
    [[ -e $root$torch_lib/$soname || -e $root/$arch_lib/$soname || -e $root/lib/x86_64-linux-gnu/$soname ]] &&
      continue
    # The bundle's libraries (but OpenCV's) are shared: two copies of
    # libnl or libibverbs in one process crash at exit.
    [[ -n ${bundled[$soname]:-} && $soname != libopencv_* ]] && continue
    new=${soname/.so/-torch.so}
    renamed[$soname]=$new
    cp -L "${needed[$soname]}" "$root$private/$new"
    patchelf --set-soname "$new" "$root$private/$new"
    count=$((count + 1))
  done
  while IFS= read -r -d '' file; do
    is_elf "$file" || continue
    args=()
    while read -r soname; do
      [[ -n ${renamed[$soname]:-} ]] && args+=(--replace-needed "$soname" "${renamed[$soname]}")
    done < <(readelf -d "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    # (two calls: Debian 12's patchelf 0.14 garbles the string table when
    # one call both replaces NEEDED entries and sets the RPATH)
    ((${#args[@]} == 0)) || patchelf "${args[@]}" "$file"
    patchelf --force-rpath --set-rpath "$torch_lib:$private" "$file"
  done < <(find "$root$torch" -name '*.so*' -type f -print0)
  log "  LibTorch $(dpkg-query -W -f='${Version}' libtorch1.13) in $torch; $count libraries it needs in $private ($(du -sh "$root$private" | cut -f1))"
}

make_root() {
  local want
  want=$(printf '%s\n' "$suite ${tools[*]}" "$(dpkg-query -W "${torch_packages[@]}")" \
    "$(cat "$self" <(bundle_sonames) | sha256sum | cut -c1-16)")
  if [[ -f $stamp && $(<"$stamp") == "$want" ]]; then
    log "  $root is complete (reused)"
    return
  fi
  rm -rf "$root"
  mkdir -p "$(dirname "$root")" "$home/apt-archives/bootstrap-$suite"
  # shellcheck disable=SC2016  # ($1 is the root, for mmdebstrap's hook)
  mmdebstrap --variant=minbase --include="$(IFS=,; echo "${tools[*]}")" --skip=essential/unlink \
    --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
    --setup-hook="sync-in $home/apt-archives/bootstrap-$suite /var/cache/apt/archives/" \
    --customize-hook="sync-out /var/cache/apt/archives $home/apt-archives/bootstrap-$suite" \
    "$suite" "$root" "$mirror" >"$home/mmdebstrap-$suite.log" 2>&1 || {
    tail -n 30 "$home/mmdebstrap-$suite.log" >&2
    die "mmdebstrap failed (log: $home/mmdebstrap-$suite.log)"
  }
  move_cmake_libraries
  stage_torch
  printf '%s\n' "$want" >"$stamp"
}

# Nothing of the bundle in the root (zlib1g aside), and the tools work there.
check_root() {
  local left broken bundled
  mapfile -t bundled < <(bundle_packages)
  left=$(installed_in_root "${bundled[@]}" | { grep -vx zlib1g || true; } | tr "\n" " ")
  [[ -z $left ]] || die "bundled packages in the root: $left"
  broken=$(in_root ldd /usr/bin/cmake 2>&1 | grep 'not found' || true)
  [[ -z $broken ]] || die "cmake in the root misses libraries: $broken"
  # LibTorch's libraries may miss only what the bundle brings (the check's
  # LD_LIBRARY_PATH): the check's preflight imports torch with it.
  broken=$(for file in "$torch_lib"/lib*.so.*.* "$private"/*; do
    { in_root ldd "$file" 2>&1 || true; } | sed -n 's/^\s*\(\S*\) => not found.*/\1/p'
  done | sort -u | comm -23 - <(bundle_sonames) | tr '\n' ' ')
  [[ -z $broken ]] || die "LibTorch's libraries miss, in the root and the bundle: $broken"
  log "  $(in_root cmake --version | head -n 1); $(in_root c++ --version | head -n 1); ninja $(in_root ninja --version)"
  log "  none of the bundle's $(bundle_packages | wc -l) packages in the root (zlib1g aside)"
}

# The working tree (tracked and untracked files git does not ignore) and the
# bundle, afresh.
copy_source() {
  local bundle=$repo/.gpu-check
  # (/build/work, the check's prefix and build, stays: a second run reuses the build)
  rm -rf "$root/src/vqa-hpc" "$root/build/out"
  mkdir -p "$root/src/vqa-hpc/.gpu-check" "$root/build"
  git -C "$repo" ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' file; do
      if [[ -e $repo/$file ]]; then printf '%s\0' "$file"; fi
    done | tar -C "$repo" --null -T - -cf - | tar -C "$root/src/vqa-hpc" -xf -
  cp -a "$bundle/debs" "$bundle/synth384.h5" "$bundle/bench384.h5" "$root/src/vqa-hpc/.gpu-check/"
}

main() {
  [[ $(id -u) -eq 0 ]] || die "needs root (chroot and mounts)"
  local missing=() tool start status=0
  for tool in mmdebstrap patchelf; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  if ((${#missing[@]})); then
    log "installing ${missing[*]} on the host (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  start=$SECONDS
  [[ -d $repo/.gpu-check/debs && -f $repo/.gpu-check/synth384.h5 && -f $repo/.gpu-check/bench384.h5 ]] || {
    [[ -x $repo/build/vqa_prep ]] || die "no bundle and no build/vqa_prep to make it: build the project first"
    bash "$repo/tests/gpu/make_bundle.sh"
  }
  make_root
  check_root
  log "stage root ... $((SECONDS - start)) s ok"
  copy_source
  start=$SECONDS
  unshare --mount --pid --fork --propagation private -- "$BASH" "$self" --in-namespace || status=$?
  rm -rf "$repo/.gpu-check/dry-run"
  cp -a "$root/build/out" "$repo/.gpu-check/dry-run" 2>/dev/null || true
  cp -a "$root/build/work/logs" "$repo/.gpu-check/dry-run/logs" 2>/dev/null || true
  ((status == 0)) || die "the check failed in the root after $((SECONDS - start)) s (logs: .gpu-check/dry-run)"
  log "the check passed in the root in $((SECONDS - start)) s (logs: .gpu-check/dry-run)"
}

main "$@"
