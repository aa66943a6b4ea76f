# Every dependency is an imported target; Debian 12 packages provide all of them
# (./lockstep.sh installs the list).

find_package(Threads REQUIRED)

find_package(Protobuf REQUIRED)
set_package_properties(Protobuf PROPERTIES TYPE REQUIRED
  PURPOSE "wire schema (libprotobuf-dev, protobuf-compiler)")

# libsodium: CURVE keys' fingerprints (net/) and the rendezvous store's HMAC (common/).
find_package(PkgConfig REQUIRED)
pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)
set_package_properties(PkgConfig PROPERTIES TYPE REQUIRED PURPOSE "finds libsodium (libsodium-dev)")

find_package(cppzmq REQUIRED)
set_package_properties(cppzmq PROPERTIES TYPE REQUIRED
  PURPOSE "ZeroMQ transport (libzmq3-dev, cppzmq-dev)")

find_package(Gloo REQUIRED)
set_package_properties(Gloo PROPERTIES TYPE REQUIRED
  PURPOSE "CPU collectives for the trainer (libgloo-dev)")
# Debian's GlooConfig exports a bare `gloo` target without its include path dependencies; give it
# a namespaced alias so a typo is a configure error rather than a link flag.
if(TARGET gloo AND NOT TARGET Gloo::gloo)
  add_library(Gloo::gloo ALIAS gloo)
endif()

find_package(OpenBLAS CONFIG REQUIRED)
set_package_properties(OpenBLAS PROPERTIES TYPE REQUIRED
  PURPOSE "CPU GEMMs for the trainer (libopenblas-dev)")
if(NOT TARGET OpenBLAS::OpenBLAS)
  add_library(OpenBLAS::OpenBLAS UNKNOWN IMPORTED)
  set_target_properties(OpenBLAS::OpenBLAS PROPERTIES
    IMPORTED_LOCATION "${OpenBLAS_LIBRARIES}"
    INTERFACE_INCLUDE_DIRECTORIES "${OpenBLAS_INCLUDE_DIRS}")
endif()

find_package(nlohmann_json 3.10 REQUIRED)
set_package_properties(nlohmann_json PROPERTIES TYPE REQUIRED
  PURPOSE "safetensors headers, metrics and config (nlohmann-json3-dev)")

find_package(CURL REQUIRED)
set_package_properties(CURL PROPERTIES TYPE REQUIRED
  PURPOSE "alerts' webhooks, HTTP and HTTPS (libcurl4-openssl-dev)")

find_package(SQLite3 REQUIRED)
set_package_properties(SQLite3 PROPERTIES TYPE REQUIRED
  PURPOSE "the job history (libsqlite3-dev)")

# CUDA is optional: the build and the CPU test suite never need it.
include(CheckLanguage)
if(LOCKSTEP_WITH_CUDA)
  check_language(CUDA)
endif()
# The CUDA backend needs nvcc, cuBLASLt and NCCL (CUDA 13 and NCCL 2.28 under /usr/local/cuda here).
set(LOCKSTEP_HAVE_CUDA OFF)
if(LOCKSTEP_WITH_CUDA AND CMAKE_CUDA_COMPILER)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)  # Hopper (H100, H200); add yours: -DCMAKE_CUDA_ARCHITECTURES="80;90"
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit)
  get_filename_component(lockstep_cuda_root "${CMAKE_CUDA_COMPILER}" DIRECTORY)
  find_library(LOCKSTEP_NCCL_LIBRARY NAMES nccl
    HINTS ${CUDAToolkit_LIBRARY_DIR} "${lockstep_cuda_root}/../lib64" "${lockstep_cuda_root}/../lib")
  find_path(LOCKSTEP_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} "${lockstep_cuda_root}/../include")
  if(CUDAToolkit_FOUND AND TARGET CUDA::cublasLt AND LOCKSTEP_NCCL_LIBRARY AND LOCKSTEP_NCCL_INCLUDE_DIR)
    add_library(Lockstep::nccl UNKNOWN IMPORTED)
    set_target_properties(Lockstep::nccl PROPERTIES
      IMPORTED_LOCATION "${LOCKSTEP_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${LOCKSTEP_NCCL_INCLUDE_DIR}")
    set(LOCKSTEP_HAVE_CUDA ON)
  else()
    message(STATUS "CUDA compiler found, but not cuBLASLt and NCCL: building the CPU backend only")
  endif()
endif()
add_feature_info(CUDA LOCKSTEP_HAVE_CUDA "the CUDA trainer backend (nvcc, cuBLASLt, NCCL)")
