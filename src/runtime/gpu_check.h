// CUDA and NCCL members of the check family (check.h). Private to the
// runtime folder: only code that already includes cuda_runtime.h and nccl.h
// may include this header.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include "runtime/check.h"  // fatal_error

#define VQA_CHECK_CUDA(call)                                         \
  do {                                                               \
    const cudaError_t vqa_cuda_rc_ = (call);                         \
    if (vqa_cuda_rc_ != cudaSuccess) {                               \
      ::vqa::runtime::fatal_error("CUDA", #call, __FILE__, __LINE__, \
                                  cudaGetErrorString(vqa_cuda_rc_)); \
    }                                                                \
  } while (0)

#define VQA_CHECK_NCCL(call)                                         \
  do {                                                               \
    const ncclResult_t vqa_nccl_rc_ = (call);                        \
    if (vqa_nccl_rc_ != ncclSuccess) {                               \
      ::vqa::runtime::fatal_error("NCCL", #call, __FILE__, __LINE__, \
                                  ncclGetErrorString(vqa_nccl_rc_)); \
    }                                                                \
  } while (0)
