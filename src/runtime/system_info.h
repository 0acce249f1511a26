// Facts about the process's environment that change performance.
#pragma once

#include <string>

namespace vqa::runtime {

// Which BLAS the process loaded: "OpenBLAS <config>", "reference BLAS (<path>)",
// or the path of another libblas. LibTorch's CPU matrix products run about 16x
// slower on Debian's reference BLAS than on OpenBLAS.
std::string blas_description();
bool blas_is_reference();

// Prints a warning with the remedy on stderr when the reference BLAS is loaded.
// Returns true when it warned.
bool warn_if_reference_blas();

// glibc's malloc hands every freed block above 128 KiB back to the kernel
// (munmap, or a heap trim), so a training step that frees and re-allocates
// the same activation tensors pays page faults for all of them on every step:
// about 440,000 faults per 32 steps of the `small` preset, half of the step
// time on one core. This raises the mmap threshold to 32 MiB and the trim
// threshold to 256 MiB, so freed tensor memory stays in the process and is
// reused (both are needed: either alone is slower). Call once, first thing in
// main. Does nothing when the user set MALLOC_MMAP_THRESHOLD_,
// MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES, or without glibc. Returns true
// when it changed the settings.
bool keep_freed_memory_for_reuse();

// Open MPI's progress loop spins while a collective waits for another rank;
// the communicator's progress thread doing so takes a core from backward
// whenever ranks share cores (2 ranks on 2 cores: backward 290 -> 260 ms per
// step of the small preset, 2-rank samples/s +15%). This sets
// OMPI_MCA_mpi_yield_when_idle=1 (sched_yield() in the loop when nothing
// progressed) for MPI_Init to read. Call before MPI_Init. Does nothing when
// the variable is set already (by the user, or by mpirun --mca
// mpi_yield_when_idle V, which exports it). Returns true when it set it.
bool mpi_yield_when_idle();

// A rank whose peer's host died mid-collective writes into a connection the
// peer's kernel reset; with SIGPIPE's default action that write ends the
// rank at once ("Broken pipe", exit 141) before any line says which peer was
// lost (seen with a Slurm node taken away). Ignored, the write fails with
// EPIPE instead, the MPI call returns its error and the watchdog or the
// checked call names the peer. Call once, first thing in main.
void ignore_broken_pipe_signal();

// Start time of process `pid` in clock ticks since boot (/proc/PID/stat
// field 22), or -1. Together with the pid it identifies a process: a reused
// pid has another start time.
long long process_start_ticks(long pid);

}  // namespace vqa::runtime
