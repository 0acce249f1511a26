#include "runtime/system_info.h"

#include <dlfcn.h>
#include <link.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace vqa::runtime {

namespace {

// Path of the loaded shared object whose name contains `fragment`, links resolved.
std::string loaded_library_path(const char* fragment) {
  struct Search {
    const char* fragment;
    std::string found;
  } search{fragment, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        if (info->dlpi_name &&
            std::string(info->dlpi_name).find(s->fragment) != std::string::npos) {
          char* resolved = realpath(info->dlpi_name, nullptr);
          s->found = resolved ? resolved : info->dlpi_name;
          std::free(resolved);
          return 1;
        }
        return 0;
      },
      &search);
  return search.found;
}

}  // namespace

std::string blas_description() {
  using ConfigFn = char* (*)();
  if (auto config = reinterpret_cast<ConfigFn>(dlsym(RTLD_DEFAULT, "openblas_get_config"))) {
    return std::string("OpenBLAS ") + config();
  }
  const std::string path = loaded_library_path("libblas");
  if (path.empty()) return "no separate BLAS library loaded (LibTorch's own kernels)";
  if (blas_is_reference()) return "reference BLAS (" + path + ")";
  return path;
}

bool blas_is_reference() {
  if (dlsym(RTLD_DEFAULT, "openblas_get_config")) return false;
  // Debian installs Netlib's reference implementation under .../blas/libblas.so.3
  // and reaches it through the libblas.so.3 alternative.
  return loaded_library_path("libblas").find("/blas/libblas") != std::string::npos;
}

bool warn_if_reference_blas() {
  if (!blas_is_reference()) return false;
  std::fprintf(stderr,
               "[vqa] warning: LibTorch is using the reference BLAS (%s), which makes CPU "
               "training about 16x slower. Install OpenBLAS (apt-get install "
               "libopenblas0-openmp; env/setup.sh does it) or select it with "
               "update-alternatives --config libblas.so.3-x86_64-linux-gnu.\n",
               blas_description().c_str());
  return true;
}

bool keep_freed_memory_for_reuse() {
#if defined(__GLIBC__)
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}) {
    if (std::getenv(name) != nullptr) return false;
  }
  constexpr int kMmapThreshold = 32 << 20;   // glibc's largest allowed value on 64-bit
  constexpr int kTrimThreshold = 256 << 20;  // keep up to this much free at the heap's top
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
#else
  return false;
#endif
}

long long process_start_ticks(long pid) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!file || !std::getline(file, text)) return -1;
  const size_t name_end = text.rfind(')');  // the command name may hold spaces
  if (name_end == std::string::npos) return -1;
  std::istringstream fields(text.substr(name_end + 1));
  std::string field;
  for (int number = 3; fields >> field; ++number) {
    if (number == 22) return std::atoll(field.c_str());
  }
  return -1;
}

void ignore_broken_pipe_signal() { std::signal(SIGPIPE, SIG_IGN); }

bool mpi_yield_when_idle() {
  constexpr const char* kName = "OMPI_MCA_mpi_yield_when_idle";
  if (std::getenv(kName) != nullptr) return false;
  return setenv(kName, "1", /*overwrite=*/0) == 0;
}

}  // namespace vqa::runtime
