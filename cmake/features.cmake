# Helpers that detect optional features and print one line per feature at
# configure time, found or not.

function(zo_feature_line name found detail)
  if(${found})
    message(STATUS "feature: ${name}: found ${detail}")
  else()
    message(STATUS "feature: ${name}: not found")
  endif()
endfunction()

# ZO_DEPS_PREFIX: a folder into which Debian packages were unpacked with
# `dpkg -x` (scripts/gpu-check.sh does it with those scripts/gpu-carry.sh
# downloads), for a machine without them and without a registry. Their
# pkg-config files name /usr; copies that name the prefix go to
# <build>/deps-pkgconfig, which comes first on PKG_CONFIG_PATH, and the prefix
# comes first for find_program/find_library (its pkg-config is used when the
# machine has none). Programs run outside the build tree (installed ones) need
# <prefix>/usr/lib/x86_64-linux-gnu on LD_LIBRARY_PATH; gpu-check.sh sets it.
macro(zo_use_deps_prefix)
  if(ZO_DEPS_PREFIX)
    get_filename_component(_zo_dp "${ZO_DEPS_PREFIX}" ABSOLUTE)
    if(NOT IS_DIRECTORY "${_zo_dp}/usr")
      message(FATAL_ERROR "ZO_DEPS_PREFIX=${ZO_DEPS_PREFIX}: no usr/ folder there "
                          "(unpack the packages with dpkg -x first: scripts/gpu-check.sh deps)")
    endif()
    set(_zo_pcdir "${PROJECT_BINARY_DIR}/deps-pkgconfig")
    file(REMOVE_RECURSE "${_zo_pcdir}")
    file(GLOB _zo_pcs "${_zo_dp}/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc"
                      "${_zo_dp}/usr/lib/pkgconfig/*.pc" "${_zo_dp}/usr/share/pkgconfig/*.pc")
    foreach(_zo_pc IN LISTS _zo_pcs)
      file(READ "${_zo_pc}" _zo_text)
      string(REGEX REPLACE "(=|-I|-L)/usr([/ \n])" "\\1${_zo_dp}/usr\\2" _zo_text "${_zo_text}")
      get_filename_component(_zo_name "${_zo_pc}" NAME)
      file(WRITE "${_zo_pcdir}/${_zo_name}" "${_zo_text}")
    endforeach()
    set(ENV{PKG_CONFIG_PATH} "${_zo_pcdir}:$ENV{PKG_CONFIG_PATH}")
    # the carried pkgconf finds its library (configure-time children only)
    set(ENV{LD_LIBRARY_PATH} "${_zo_dp}/usr/lib/x86_64-linux-gnu:$ENV{LD_LIBRARY_PATH}")
    list(PREPEND CMAKE_PREFIX_PATH "${_zo_dp}/usr")
    list(LENGTH _zo_pcs _zo_n)
    message(STATUS "feature: dependency prefix: ${_zo_dp} (${_zo_n} pkg-config files)")
  endif()
endmacro()

function(_zo_require opt found what)
  if("${${opt}}" STREQUAL "ON" AND NOT ${found})
    message(FATAL_ERROR "${opt}=ON but ${what} was not found")
  endif()
endfunction()

macro(zo_detect_cuda)
  set(ZO_HAVE_CUDA OFF)
  if(NOT ZO_CUDA STREQUAL "OFF")
    include(CheckLanguage)
    if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        # The common data-centre GPUs: V100, A100, H100/H200.
        set(CMAKE_CUDA_ARCHITECTURES "80;90")
      endif()
      enable_language(CUDA)
      find_package(CUDAToolkit)
      if(CUDAToolkit_FOUND)
        set(ZO_HAVE_CUDA ON)
      endif()
    endif()
  endif()
  _zo_require(ZO_CUDA ZO_HAVE_CUDA "a CUDA toolkit (nvcc)")
  if(ZO_CUDA STREQUAL "OFF")
    message(STATUS "feature: CUDA backend: disabled (ZO_CUDA=OFF)")
  else()
    zo_feature_line("CUDA backend" ZO_HAVE_CUDA "${CUDAToolkit_VERSION} archs ${CMAKE_CUDA_ARCHITECTURES}")
  endif()
endmacro()

# NCCL: the device collectives of the comm NCCL backend (gpu/cuda/comm_nccl.c).
# Needs CUDA; with MPI (detect it first) ranks broadcast the NCCL unique id
# over it, without MPI it runs one rank (the GPU machine has no MPI).
macro(zo_detect_nccl)
  set(ZO_HAVE_NCCL OFF)
  set(_zo_nccl_why "not found")
  if(ZO_NCCL STREQUAL "OFF")
    set(_zo_nccl_why "disabled (ZO_NCCL=OFF)")
  elseif(NOT ZO_HAVE_CUDA)
    set(_zo_nccl_why "not built: needs the CUDA backend")
  else()
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(ZO_HAVE_NCCL ON)
      file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _zo_nccl_ver REGEX "#define NCCL_(MAJOR|MINOR|PATCH) ")
      string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*"
             "\\1.\\2.\\3" NCCL_VERSION "${_zo_nccl_ver}")
      if(NOT TARGET NCCL::NCCL)
        add_library(NCCL::NCCL UNKNOWN IMPORTED)
        set_target_properties(NCCL::NCCL PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
                              INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
      endif()
    endif()
  endif()
  _zo_require(ZO_NCCL ZO_HAVE_NCCL "NCCL (with CUDA)")
  if(ZO_HAVE_NCCL AND NOT ZO_HAVE_MPI)
    message(STATUS "feature: NCCL comm backend: found ${NCCL_VERSION} (${NCCL_LIBRARY}); one rank (no MPI)")
  elseif(ZO_HAVE_NCCL)
    message(STATUS "feature: NCCL comm backend: found ${NCCL_VERSION} (${NCCL_LIBRARY})")
  else()
    message(STATUS "feature: NCCL comm backend: ${_zo_nccl_why}")
  endif()
endmacro()

# MPI: the comm MPI backend (gpu/comm_mpi.c), imported target MPI::MPI_C, and
# mpiexec for the multi-rank tests (MPIEXEC_EXECUTABLE).
macro(zo_detect_mpi)
  set(ZO_HAVE_MPI OFF)
  if(NOT ZO_MPI STREQUAL "OFF")
    find_package(MPI COMPONENTS C QUIET)
    if(MPI_C_FOUND)
      set(ZO_HAVE_MPI ON)
    endif()
  endif()
  _zo_require(ZO_MPI ZO_HAVE_MPI "MPI")
  if(ZO_MPI STREQUAL "OFF")
    message(STATUS "feature: MPI comm backend: disabled (ZO_MPI=OFF)")
  elseif(ZO_HAVE_MPI)
    message(STATUS "feature: MPI comm backend: found MPI ${MPI_C_VERSION} (${MPI_C_LIB_NAMES}; "
                   "tests run by ${MPIEXEC_EXECUTABLE})")
  else()
    message(STATUS "feature: MPI comm backend: not found")
  endif()
endmacro()

# OpenBLAS: the CPU backend's GEMM where it beats the backend's own kernel
# (gpu/ops_cpu.c, docs/gpu.md). The backend calls it from its own OpenMP teams,
# one single-threaded call per tile, so the OpenMP build is wanted: Debian
# ships it in a folder of its own (libopenblas-openmp-dev), next to the
# pthreads and serial builds; the plain `openblas` pkg-config module (any build,
# Debian's alternatives or a self-built one) is the second choice, and the
# backend checks at run time which build it got (the serial one is not safe to
# call from several threads at once and is left unused). Imported target
# OpenBLAS::OpenBLAS; ZO_PC_BLAS for zoffload.pc.
macro(zo_detect_openblas)
  set(ZO_OPENBLAS AUTO CACHE STRING "Use OpenBLAS for the CPU backend's GEMM (AUTO, ON, OFF)")
  set_property(CACHE ZO_OPENBLAS PROPERTY STRINGS AUTO ON OFF)
  set(ZO_HAVE_OPENBLAS OFF)
  set(ZO_PC_BLAS "")
  if(NOT ZO_OPENBLAS STREQUAL "OFF")
    set(_zo_ob_lib_dirs "")
    set(_zo_ob_inc_dirs "")
    foreach(_zo_p IN LISTS CMAKE_PREFIX_PATH ITEMS /usr)
      list(APPEND _zo_ob_lib_dirs ${_zo_p}/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp)
      list(APPEND _zo_ob_inc_dirs ${_zo_p}/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp)
    endforeach()
    find_library(OPENBLAS_LIBRARY openblas PATHS ${_zo_ob_lib_dirs} NO_DEFAULT_PATH)
    find_path(OPENBLAS_INCLUDE_DIR cblas.h PATHS ${_zo_ob_inc_dirs} NO_DEFAULT_PATH)
    if(NOT OPENBLAS_LIBRARY OR NOT OPENBLAS_INCLUDE_DIR)
      unset(OPENBLAS_LIBRARY CACHE)
      unset(OPENBLAS_INCLUDE_DIR CACHE)
      pkg_check_modules(OPENBLAS_PC QUIET openblas)
      if(OPENBLAS_PC_FOUND)
        find_library(OPENBLAS_LIBRARY openblas HINTS ${OPENBLAS_PC_LIBRARY_DIRS})
        find_path(OPENBLAS_INCLUDE_DIR cblas.h HINTS ${OPENBLAS_PC_INCLUDE_DIRS})
      endif()
    endif()
    if(OPENBLAS_LIBRARY AND OPENBLAS_INCLUDE_DIR)
      set(ZO_HAVE_OPENBLAS ON)
      set(_zo_ob_version "")
      if(EXISTS ${OPENBLAS_INCLUDE_DIR}/openblas_config.h)
        file(STRINGS ${OPENBLAS_INCLUDE_DIR}/openblas_config.h _zo_ob_v REGEX "define OPENBLAS_VERSION")
        string(REGEX REPLACE ".*OpenBLAS ([0-9.]+).*" "\\1" _zo_ob_version "${_zo_ob_v}")
      endif()
      if(NOT TARGET OpenBLAS::OpenBLAS)
        # GLOBAL: bench/ links it too, to time the library beside the backend
        add_library(OpenBLAS::OpenBLAS UNKNOWN IMPORTED GLOBAL)
        set_target_properties(OpenBLAS::OpenBLAS PROPERTIES IMPORTED_LOCATION ${OPENBLAS_LIBRARY}
                              INTERFACE_INCLUDE_DIRECTORIES ${OPENBLAS_INCLUDE_DIR})
      endif()
      # programs linked through zoffload.pc load this build, not whichever
      # libopenblas.so.0 the system's alternatives point at
      get_filename_component(_zo_ob_dir ${OPENBLAS_LIBRARY} DIRECTORY)
      set(ZO_PC_BLAS "-L${_zo_ob_dir} -Wl,-rpath,${_zo_ob_dir} -lopenblas")
    endif()
  endif()
  _zo_require(ZO_OPENBLAS ZO_HAVE_OPENBLAS "OpenBLAS (Debian: libopenblas-openmp-dev)")
  if(ZO_OPENBLAS STREQUAL "OFF")
    message(STATUS "feature: OpenBLAS (CPU backend GEMM): disabled (ZO_OPENBLAS=OFF)")
  elseif(ZO_HAVE_OPENBLAS)
    message(STATUS "feature: OpenBLAS (CPU backend GEMM): found ${_zo_ob_version} (${OPENBLAS_LIBRARY})")
  else()
    message(STATUS "feature: OpenBLAS (CPU backend GEMM): not found (the backend's own kernel "
                   "runs every GEMM; Debian: libopenblas-openmp-dev)")
  endif()
endmacro()

# zo_add_test(NAME SOURCES src... LIBS lib... [TIMEOUT s] [ENV VAR=value...]):
# one cmocka binary, run by ctest (nothing at all with ZO_BUILD_TESTS=OFF, so
# properties go through ENV here, or under if(TARGET NAME)).
# A test that needs what the machine lacks exits 77, reported as skipped.
function(zo_add_test name)
  if(NOT ZO_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;ENV" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} PkgConfig::CMOCKA)
  target_compile_definitions(${name} PRIVATE ZO_FIXTURES_DIR="${ZO_FIXTURES_DIR}"
                             ZO_BUILD_DIR="${PROJECT_BINARY_DIR}")
  add_test(NAME ${name} COMMAND ${name})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(ZO_SANITIZE)
    # ASan and UBSan slow the runtime tests several times over
    math(EXPR T_TIMEOUT "${T_TIMEOUT} * 4")
  endif()
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT ${T_TIMEOUT})
  if(T_ENV)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${T_ENV}")
  endif()
endfunction()
