# Finds every external library and fails early, with a message that says what
# to install, when one is missing or is the wrong build.

# LibTorch: Debian's libtorch-dev, or a CUDA LibTorch via Torch_DIR/CMAKE_PREFIX_PATH.
find_package(Torch REQUIRED)

find_package(MPI REQUIRED COMPONENTS C)
# The C API only: keep mpi.h from dragging in the removed C++ bindings.
add_compile_definitions(OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)

# Parallel HDF5 is required: every rank opens the one dataset file through MPI-IO.
set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 REQUIRED COMPONENTS C)
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR
    "HDF5 ${HDF5_VERSION} at ${HDF5_INCLUDE_DIRS} is the serial build; vqa-hpc needs the "
    "parallel (MPI-IO) build. On Debian/Ubuntu: apt-get install libhdf5-openmpi-dev "
    "(env/setup.sh does it); elsewhere point HDF5_ROOT at a parallel HDF5.")
endif()
add_library(vqa_hdf5 INTERFACE)
target_include_directories(vqa_hdf5 SYSTEM INTERFACE ${HDF5_INCLUDE_DIRS})
target_compile_definitions(vqa_hdf5 INTERFACE ${HDF5_DEFINITIONS})
target_link_libraries(vqa_hdf5 INTERFACE ${HDF5_C_LIBRARIES} MPI::MPI_C)

find_package(Boost 1.71 REQUIRED COMPONENTS program_options)
# TensorBoard's event files (src/util/tensorboard_writer.h): the event
# messages through Protocol Buffers (its runtime and protoc; Debian:
# libprotobuf-dev, protobuf-compiler), the records' CRC-32C through Boost.
set(VQA_TENSORBOARD_BUILT OFF)
set(VQA_TENSORBOARD_REASON "VQA_WITH_TENSORBOARD=OFF")
if(NOT VQA_WITH_TENSORBOARD STREQUAL "OFF")
  find_package(Protobuf QUIET)
  if(Protobuf_FOUND AND Protobuf_PROTOC_EXECUTABLE AND TARGET protobuf::libprotobuf)
    set(VQA_TENSORBOARD_BUILT ON)
  elseif(VQA_WITH_TENSORBOARD STREQUAL "ON")
    message(FATAL_ERROR "VQA_WITH_TENSORBOARD=ON but Protocol Buffers (library: ${Protobuf_FOUND}, "
                        "protoc: ${Protobuf_PROTOC_EXECUTABLE}) is missing: apt-get install "
                        "libprotobuf-dev protobuf-compiler (env/setup.sh does it)")
  else()
    set(VQA_TENSORBOARD_REASON "Protocol Buffers or protoc not found")
  endif()
endif()
# CRC-32 of checkpoint files (zlib's, the one of gzip and zip).
find_package(ZLIB REQUIRED)
# OpenCV: only core, imgcodecs and imgproc (decode, resize, crop). Debian
# ships OpenCVConfig.cmake only with the full libopencv-dev, so fall back to
# finding the three libraries directly.
find_package(OpenCV QUIET COMPONENTS core imgcodecs imgproc)
add_library(vqa_opencv INTERFACE)
if(OpenCV_FOUND)
  target_link_libraries(vqa_opencv INTERFACE ${OpenCV_LIBS})
  target_include_directories(vqa_opencv SYSTEM INTERFACE ${OpenCV_INCLUDE_DIRS})
else()
  find_path(VQA_OPENCV_INCLUDE_DIR opencv2/imgcodecs.hpp PATH_SUFFIXES opencv4)
  foreach(module core imgcodecs imgproc)
    find_library(VQA_OPENCV_${module}_LIBRARY opencv_${module})
    if(NOT VQA_OPENCV_${module}_LIBRARY)
      message(FATAL_ERROR "OpenCV ${module} not found: apt-get install libopencv-${module}-dev "
                          "(env/setup.sh does it) or set OpenCV_DIR")
    endif()
    target_link_libraries(vqa_opencv INTERFACE ${VQA_OPENCV_${module}_LIBRARY})
  endforeach()
  if(NOT VQA_OPENCV_INCLUDE_DIR)
    message(FATAL_ERROR "OpenCV headers (opencv2/imgcodecs.hpp) not found")
  endif()
  target_include_directories(vqa_opencv SYSTEM INTERFACE ${VQA_OPENCV_INCLUDE_DIR})
endif()
find_package(nlohmann_json 3.9 REQUIRED)
find_package(Threads REQUIRED)

# Optional GPU communicator: CUDA runtime + NCCL. Plain C++ against their
# headers: no nvcc is needed, so CI compiles it on machines without a GPU.
set(VQA_NCCL_ENABLED OFF)
set(VQA_NCCL_REASON "VQA_WITH_NCCL=OFF")
if(NOT VQA_WITH_NCCL STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  find_path(VQA_NCCL_INCLUDE_DIR nccl.h
            HINTS ${NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_ROOT
            PATH_SUFFIXES include)
  find_library(VQA_NCCL_LIBRARY nccl
               HINTS ${NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_ROOT
               PATH_SUFFIXES lib lib64)
  if(CUDAToolkit_FOUND AND VQA_NCCL_INCLUDE_DIR AND VQA_NCCL_LIBRARY)
    set(VQA_NCCL_ENABLED ON)
  elseif(VQA_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "VQA_WITH_NCCL=ON but the CUDA toolkit (found: ${CUDAToolkit_FOUND}) "
                        "or NCCL (nccl.h: ${VQA_NCCL_INCLUDE_DIR}, libnccl: ${VQA_NCCL_LIBRARY}) "
                        "is missing; set CUDAToolkit_ROOT / NCCL_ROOT")
  else()
    set(VQA_NCCL_REASON "CUDA toolkit or NCCL not found")
  endif()
endif()
