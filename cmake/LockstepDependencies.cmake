# Every dependency is an imported target; Debian 12 packages provide all of them
# (./lockstep.sh installs the list).

find_package(Threads REQUIRED)

find_package(Protobuf REQUIRED)
set_package_properties(Protobuf PROPERTIES TYPE REQUIRED
  PURPOSE "wire schema (libprotobuf-dev, protobuf-compiler)")

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

find_package(SQLite3 REQUIRED)
set_package_properties(SQLite3 PROPERTIES TYPE REQUIRED
  PURPOSE "the job history (libsqlite3-dev)")

# CUDA is optional: the build and the CPU test suite never need it.
include(CheckLanguage)
if(LOCKSTEP_WITH_CUDA)
  check_language(CUDA)
endif()
if(LOCKSTEP_WITH_CUDA AND CMAKE_CUDA_COMPILER)
  set(LOCKSTEP_HAVE_CUDA ON)
else()
  set(LOCKSTEP_HAVE_CUDA OFF)
endif()
add_feature_info(CUDA LOCKSTEP_HAVE_CUDA "GPU toolchain found (the CUDA trainer backend lands with issue 6)")
