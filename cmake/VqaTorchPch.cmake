# LibTorch's <torch/torch.h> precompiled once (a GCC .gch, about 0.6 GB) and
# reused by every target whose sources include LibTorch: each unity batch
# then reads the parsed headers instead of parsing them again (a test
# program's batch 27 -> 17 s; making the header takes 38 s, once per build).
# Clang's .pch works the same way. A target whose sources never include
# LibTorch is left alone: the header forced into it would cost it the
# headers' inline code (about 10 s a batch). -Winvalid-pch makes a rejected
# header a warning in the build log rather than a silent slow build.
#
#   vqa_precompile_torch()   after every target is defined (top-level CMakeLists)
option(VQA_PRECOMPILE_TORCH
       "Precompile <torch/torch.h> once and reuse it in every target that includes LibTorch"
       ON)

# The project's own include roots, where "train/train_config.h" or "process.h" is looked up.
set(_vqa_include_roots "${PROJECT_SOURCE_DIR}/src" "${PROJECT_SOURCE_DIR}/tests/support"
    "${PROJECT_SOURCE_DIR}/data_prep")

# Sets OUT to TRUE when FILE includes LibTorch (torch/, ATen/, c10/), itself
# or through the project's headers; memoised, and a cycle counts as FALSE.
function(_vqa_includes_torch file out)
  get_property(known GLOBAL PROPERTY "_vqa_torch:${file}" SET)
  if(known)
    get_property(value GLOBAL PROPERTY "_vqa_torch:${file}")
    set(${out} ${value} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY "_vqa_torch:${file}" FALSE)
  set(result FALSE)
  get_filename_component(dir "${file}" DIRECTORY)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"].*" "\\1" name "${line}")
    if(name MATCHES "^(torch|ATen|c10)/")
      set(result TRUE)
    else()
      # The first root that has the file, as the compiler looks them up.
      foreach(root IN ITEMS "${dir}" ${_vqa_include_roots})
        if(EXISTS "${root}/${name}" AND NOT IS_DIRECTORY "${root}/${name}")
          _vqa_includes_torch("${root}/${name}" result)
          break()
        endif()
      endforeach()
    endif()
    if(result)
      break()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY "_vqa_torch:${file}" ${result})
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# The targets defined in DIR and below.
function(_vqa_targets_below dir out)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(subdir IN LISTS subdirs)
    _vqa_targets_below("${subdir}" nested)
    list(APPEND targets ${nested})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

function(vqa_precompile_torch)
  if(NOT VQA_PRECOMPILE_TORCH OR VQA_FUZZ)
    message(STATUS "vqa-hpc: <torch/torch.h> not precompiled (VQA_PRECOMPILE_TORCH=${VQA_PRECOMPILE_TORCH}, VQA_FUZZ=${VQA_FUZZ})")
    return()
  endif()
  # The header is made by a target of its own with torch's flags, which
  # every user of LibTorch shares (definitions such as -DUSE_C10D_GLOO).
  set(source "${PROJECT_BINARY_DIR}/vqa_torch_pch.cpp")
  file(CONFIGURE OUTPUT "${source}"
       CONTENT "// Compiles <torch/torch.h> once (cmake/VqaTorchPch.cmake).\n")
  add_library(vqa_torch_pch OBJECT "${source}")
  target_link_libraries(vqa_torch_pch PRIVATE torch)
  target_precompile_headers(vqa_torch_pch PRIVATE <torch/torch.h>)
  _vqa_targets_below("${PROJECT_SOURCE_DIR}" targets)
  set(users "")
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|OBJECT_LIBRARY)$"
       OR target STREQUAL "vqa_torch_pch")
      continue()
    endif()
    get_target_property(source_dir ${target} SOURCE_DIR)
    get_target_property(sources ${target} SOURCES)
    foreach(file IN LISTS sources)
      if(NOT IS_ABSOLUTE "${file}")
        set(file "${source_dir}/${file}")
      endif()
      if(file MATCHES "\\.(cpp|cc|cxx)$" AND EXISTS "${file}")
        _vqa_includes_torch("${file}" includes)
        if(includes)
          target_precompile_headers(${target} REUSE_FROM vqa_torch_pch)
          target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Winvalid-pch>)
          list(APPEND users ${target})
          break()
        endif()
      endif()
    endforeach()
  endforeach()
  list(LENGTH users count)
  message(STATUS "vqa-hpc: <torch/torch.h> precompiled once for ${count} targets")
endfunction()
