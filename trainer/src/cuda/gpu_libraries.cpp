// cuBLASLt and NCCL, loaded when a rank first needs them (dlopen), not when lockstep-trainer
// starts: the same binary then runs CPU jobs on nodes without CUDA's libraries. Each function the
// GPU backend calls is defined here with the library's own prototype and forwards to the loaded
// symbol; without the library it fails with the library's "not initialized" status, and
// gpuLibraries() says which file is missing. The CUDA runtime is linked statically and finds the
// driver the same way.

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "cuda_check.h"

namespace lockstep::trainer::gpu {
namespace {

struct Library {
  explicit Library(const char* name) : file(name) {}
  const char* file;
  void* handle = nullptr;
  std::string error;
  std::once_flag once;

  void* get() {
    std::call_once(once, [this] {
      handle = dlopen(file, RTLD_NOW | RTLD_LOCAL);
      if (!handle) error = dlerror();
    });
    return handle;
  }
  void* symbol(const char* name) {
    void* h = get();
    return h ? dlsym(h, name) : nullptr;
  }
};

Library cublasLt{"libcublasLt.so.13"};
Library nccl{"libnccl.so.2"};

}  // namespace

Result<void> gpuLibraries() {
  for (Library* lib : {&cublasLt, &nccl}) {
    if (!lib->get()) {
      return Error{ErrorCode::kFailedPrecondition,
                   std::string("--backend cuda needs ") + lib->file + " (CUDA 13's cuBLASLt, NCCL 2.28), which " +
                       "cannot be loaded: " + lib->error + "; install it, or put its directory on LD_LIBRARY_PATH"};
    }
  }
  return {};
}

}  // namespace lockstep::trainer::gpu

// Each forwarder resolves its symbol once; `fail` is what it returns without the library.
#define LOCKSTEP_FORWARD(lib, ret, fail, name, params, args)                                             \
  ret name params {                                                                                      \
    static const auto fn = reinterpret_cast<decltype(&name)>(lockstep::trainer::gpu::lib.symbol(#name)); \
    return fn ? fn args : (fail);                                                                        \
  }

extern "C" {

LOCKSTEP_FORWARD(cublasLt, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasLtCreate, (cublasLtHandle_t * h), (h))
LOCKSTEP_FORWARD(cublasLt, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasLtDestroy, (cublasLtHandle_t h), (h))
LOCKSTEP_FORWARD(cublasLt, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasLtMatmulDescCreate,
                 (cublasLtMatmulDesc_t * d, cublasComputeType_t c, cudaDataType_t s), (d, c, s))
LOCKSTEP_FORWARD(cublasLt, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasLtMatmulDescDestroy,
                 (cublasLtMatmulDesc_t d), (d))
LOCKSTEP_FORWARD(cublasLt, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasLtMatmulDescSetAttribute,
                 (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void* b, size_t n), (d, a, b, n))
LOCKSTEP_FORWARD(cublasLt, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasLtMatrixLayoutCreate,
                 (cublasLtMatrixLayout_t * l, cudaDataType t, uint64_t r, uint64_t c, int64_t ld), (l, t, r, c, ld))
LOCKSTEP_FORWARD(cublasLt, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasLtMatrixLayoutDestroy,
                 (cublasLtMatrixLayout_t l), (l))
LOCKSTEP_FORWARD(cublasLt, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasLtMatmulPreferenceCreate,
                 (cublasLtMatmulPreference_t * p), (p))
LOCKSTEP_FORWARD(cublasLt, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasLtMatmulPreferenceDestroy,
                 (cublasLtMatmulPreference_t p), (p))
LOCKSTEP_FORWARD(cublasLt, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasLtMatmulPreferenceSetAttribute,
                 (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void* b, size_t n),
                 (p, a, b, n))
LOCKSTEP_FORWARD(cublasLt, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasLtMatmulAlgoGetHeuristic,
                 (cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                  cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t p, int n,
                  cublasLtMatmulHeuristicResult_t* r, int* found),
                 (h, d, a, b, c, dd, p, n, r, found))
LOCKSTEP_FORWARD(cublasLt, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasLtMatmul,
                 (cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha, const void* A,
                  cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta, const void* C,
                  cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t dd, const cublasLtMatmulAlgo_t* algo,
                  void* workspace, size_t workspaceBytes, cudaStream_t stream),
                 (h, d, alpha, A, a, B, b, beta, C, c, D, dd, algo, workspace, workspaceBytes, stream))

LOCKSTEP_FORWARD(nccl, ncclResult_t, ncclSystemError, ncclGetUniqueId, (ncclUniqueId * id), (id))
LOCKSTEP_FORWARD(nccl, ncclResult_t, ncclSystemError, ncclCommInitRankConfig,
                 (ncclComm_t * comm, int n, ncclUniqueId id, int rank, ncclConfig_t* config), (comm, n, id, rank, config))
LOCKSTEP_FORWARD(nccl, ncclResult_t, ncclSystemError, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* r),
                 (comm, r))
LOCKSTEP_FORWARD(nccl, ncclResult_t, ncclSystemError, ncclCommAbort, (ncclComm_t comm), (comm))
LOCKSTEP_FORWARD(nccl, ncclResult_t, ncclSystemError, ncclCommDestroy, (ncclComm_t comm), (comm))
LOCKSTEP_FORWARD(nccl, const char*, "libnccl.so.2 is not loaded", ncclGetErrorString, (ncclResult_t r), (r))
LOCKSTEP_FORWARD(nccl, ncclResult_t, ncclSystemError, ncclGroupStart, (), ())
LOCKSTEP_FORWARD(nccl, ncclResult_t, ncclSystemError, ncclGroupEnd, (), ())
LOCKSTEP_FORWARD(nccl, ncclResult_t, ncclSystemError, ncclAllReduce,
                 (const void* send, void* recv, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                  cudaStream_t stream),
                 (send, recv, n, t, op, comm, stream))
LOCKSTEP_FORWARD(nccl, ncclResult_t, ncclSystemError, ncclReduce,
                 (const void* send, void* recv, size_t n, ncclDataType_t t, ncclRedOp_t op, int root, ncclComm_t comm,
                  cudaStream_t stream),
                 (send, recv, n, t, op, root, comm, stream))
LOCKSTEP_FORWARD(nccl, ncclResult_t, ncclSystemError, ncclBroadcast,
                 (const void* send, void* recv, size_t n, ncclDataType_t t, int root, ncclComm_t comm,
                  cudaStream_t stream),
                 (send, recv, n, t, root, comm, stream))

}  // extern "C"
