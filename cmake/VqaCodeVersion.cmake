# vqa_add_code_version(<target>)
# Compiles the source tree's `git describe --always --dirty --tags` into
# <target> as vqa::runtime::kBuiltCodeVersion ("unknown" outside git). The
# file is rewritten at every build but only when the text changes, so a new
# commit recompiles one small file and relinks; nothing else rebuilds.
find_package(Git QUIET)
set(VQA_CODE_VERSION_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/VqaWriteCodeVersion.cmake)

function(vqa_add_code_version target)
  set(output ${CMAKE_CURRENT_BINARY_DIR}/vqa_code_version.cpp)
  add_custom_target(${target}_code_version
    COMMAND ${CMAKE_COMMAND} -DGIT=${GIT_EXECUTABLE} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
            -DOUTPUT=${output} -P ${VQA_CODE_VERSION_SCRIPT}
    BYPRODUCTS ${output}
    COMMENT "Code version for ${target}"
    VERBATIM)
  target_sources(${target} PRIVATE ${output})
  add_dependencies(${target} ${target}_code_version)
endfunction()
