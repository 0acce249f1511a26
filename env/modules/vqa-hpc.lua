-- Example Lmod module for building and running vqa-hpc on a GPU cluster.
-- Copy it into your site's module path and change the module names and the
-- LibTorch location to what your site provides (`module spider` lists them).
help([[vqa-hpc: multi-GPU M3AE-style medical VQA fine-tuning (LibTorch + MPI + NCCL + parallel HDF5)]])
whatis("Name: vqa-hpc")

-- Toolchain and libraries the build finds with find_package.
load("gcc/12")
load("cmake/3.25")
load("cuda/12.4")
load("nccl/2.21")
load("openmpi/4.1")          -- the same MPI that HDF5 was built against
load("hdf5/1.14-openmpi")    -- must be the parallel (MPI-IO) build
load("boost/1.83")
load("opencv/4.8")
load("pcre2/10.42")          -- the RoBERTa tokenizer's Unicode pattern in vqa_prep

-- A CUDA LibTorch 2.x unpacked by the site or the user (download from pytorch.org).
local libtorch = os.getenv("LIBTORCH_ROOT") or "/opt/libtorch-2.4-cu124"
prepend_path("CMAKE_PREFIX_PATH", libtorch)
prepend_path("LD_LIBRARY_PATH", pathJoin(libtorch, "lib"))

-- One CPU thread per rank unless the job script says otherwise.
setenv("OMP_NUM_THREADS", "1")
