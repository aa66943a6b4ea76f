#pragma once
// CUDA, cuBLASLt and NCCL status codes as Results: every call that can fail says which call, and
// why, in words.

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "lockstep/common/result.h"

namespace lockstep::trainer::gpu {

// Loads cuBLASLt and NCCL (gpu_libraries.cpp), or says which cannot be loaded and why.
Result<void> gpuLibraries();

inline Error cudaError(cudaError_t e, const char* what) {
  return Error{ErrorCode::kInternal, std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"};
}
inline Error cublasError(cublasStatus_t s, const char* what) {
  return Error{ErrorCode::kInternal, std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s))};
}
inline Error ncclError(ncclResult_t r, const char* what) {
  return Error{r == ncclRemoteError || r == ncclSystemError ? ErrorCode::kPeerLost : ErrorCode::kInternal,
               std::string(what) + ": " + ncclGetErrorString(r)};
}

}  // namespace lockstep::trainer::gpu

#define LOCKSTEP_CUDA(call)                                                                 \
  do {                                                                                      \
    if (const cudaError_t lockstep_e = (call); lockstep_e != cudaSuccess)                   \
      return ::lockstep::trainer::gpu::cudaError(lockstep_e, #call);                        \
  } while (0)
#define LOCKSTEP_CUBLAS(call)                                                               \
  do {                                                                                      \
    if (const cublasStatus_t lockstep_s = (call); lockstep_s != CUBLAS_STATUS_SUCCESS)      \
      return ::lockstep::trainer::gpu::cublasError(lockstep_s, #call);                      \
  } while (0)
#define LOCKSTEP_NCCL(call)                                                                 \
  do {                                                                                      \
    if (const ncclResult_t lockstep_r = (call); lockstep_r != ncclSuccess)                  \
      return ::lockstep::trainer::gpu::ncclError(lockstep_r, #call);                        \
  } while (0)
