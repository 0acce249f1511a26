# Every test's environment: one thread per process (the tests oversubscribe
# 2 cores with 3 ranks), and Open MPI's ob1 PML named: the one it selects on
# a machine without InfiniBand or Omni-Path anyway, named so that MPI_Init
# skips opening the cm PML and its PSM transports (about half of an empty
# MPI program's start-up). The same PML and BTLs carry the data.
set(VQA_TEST_ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;OMPI_MCA_pml=ob1")
# A CPU-only LibTorch on a host with NVIDIA GPUs: vqa_train refuses
# --device auto there (src/train/setup.cpp), so the tests run with every GPU
# hidden, which tells it the CPU is meant (train_device_guard unhides them).
if(NOT TORCH_CUDA_LIBRARIES)
  list(APPEND VQA_TEST_ENVIRONMENT "CUDA_VISIBLE_DEVICES=")
endif()

# A GoogleTest program (linked with vqa_gtest_main or vqa_test_main) exits 77
# when it skipped a case and failed none: CTest shows that test as skipped,
# never as passed (tests/support/test_outcome.h).
set(VQA_TEST_SKIP_CODE 77)

# With APART <suffix> <gtest filter>, a registration makes two tests: the
# cases that the filter names as <name>_<suffix>, and the rest as <name>.
# APART is for cases that skip where the rest runs (no GPU, another
# LibTorch), so that the rest still shows as passed and those as skipped.
# _vqa_gtest_variants(<out-names>): the test names, from the caller's T_NAME
# and T_APART; _vqa_gtest_variant_args(<out-args> <name>): that test's
# arguments, the caller's T_ARGS and its filter.
function(_vqa_gtest_variants out_names)
  set(names ${T_NAME})
  if(T_APART)
    list(GET T_APART 0 suffix)
    list(APPEND names ${T_NAME}_${suffix})
  endif()
  set(${out_names} ${names} PARENT_SCOPE)
endfunction()
function(_vqa_gtest_variant_args out_args name)
  set(args ${T_ARGS})
  if(T_APART)
    list(GET T_APART 1 filter)
    if(name STREQUAL T_NAME)
      list(APPEND args --gtest_filter=-${filter})
    else()
      list(APPEND args --gtest_filter=${filter})
    endif()
  endif()
  set(${out_args} ${args} PARENT_SCOPE)
endfunction()

# vqa_add_mpi_test(NAME <name> TARGET <target> RANKS <n>... [ARGS ...] [TIMEOUT s] [LABELS ...]
#                  [APART <suffix> <gtest filter>])
# Registers one CTest test per rank count, each started through mpirun.
function(vqa_add_mpi_test)
  cmake_parse_arguments(T "" "NAME;TARGET;TIMEOUT" "RANKS;ARGS;LABELS;APART" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  _vqa_gtest_variants(names)
  foreach(name IN LISTS names)
    _vqa_gtest_variant_args(args ${name})
    foreach(ranks IN LISTS T_RANKS)
      set(test_name ${name}_np${ranks})
      add_test(NAME ${test_name}
        COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${VQA_TEST_MPIEXEC_FLAGS}
                $<TARGET_FILE:${T_TARGET}> ${args})
      set_tests_properties(${test_name} PROPERTIES
        TIMEOUT ${T_TIMEOUT}
        PROCESSORS ${ranks}
        LABELS "mpi;${T_LABELS}"
        SKIP_RETURN_CODE ${VQA_TEST_SKIP_CODE}
        ENVIRONMENT "${VQA_TEST_ENVIRONMENT};OMPI_MCA_rmaps_base_oversubscribe=1")
    endforeach()
  endforeach()
endfunction()

# vqa_add_test(NAME <name> TARGET <target> [ARGS ...] [TIMEOUT s] [LABELS ...]
#              [APART <suffix> <gtest filter>])
# A test that runs as one plain process (it may start mpirun itself).
function(vqa_add_test)
  cmake_parse_arguments(T "" "NAME;TARGET;TIMEOUT" "ARGS;LABELS;APART" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  _vqa_gtest_variants(names)
  foreach(name IN LISTS names)
    _vqa_gtest_variant_args(args ${name})
    add_test(NAME ${name} COMMAND $<TARGET_FILE:${T_TARGET}> ${args})
    set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}"
      SKIP_RETURN_CODE ${VQA_TEST_SKIP_CODE} ENVIRONMENT "${VQA_TEST_ENVIRONMENT}")
  endforeach()
endfunction()

# vqa_add_job_test_executable(<target> <source> [LIBRARIES ...] [DEFINITIONS ...] [DEPENDS ...])
# A GoogleTest program that runs the job's binaries as processes (usually
# through mpirun): it links the process helpers (tests/support/process.h)
# and knows VQA_PREP, VQA_TRAIN and VQA_SOURCE_DIR as string macros, plus any
# DEFINITIONS; it is built after vqa_prep, vqa_train and any DEPENDS.
# Register it with vqa_add_test.
function(vqa_add_job_test_executable target source)
  cmake_parse_arguments(T "" "" "LIBRARIES;DEFINITIONS;DEPENDS" ${ARGN})
  add_executable(${target} ${source})
  target_link_libraries(${target} PRIVATE vqa_test_process vqa_gtest_main ${T_LIBRARIES}
                        vqa_warnings)
  target_compile_definitions(${target} PRIVATE
    VQA_PREP="$<TARGET_FILE:vqa_prep>"
    VQA_TRAIN="$<TARGET_FILE:vqa_train>"
    VQA_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    ${T_DEFINITIONS})
  add_dependencies(${target} vqa_prep vqa_train ${T_DEPENDS})
endfunction()

# vqa_add_script_test(NAME <name> SCRIPT <file.sh> [ARGS ...] [TIMEOUT s] [LABELS ...]
#                     [PROCESSORS n] [RESOURCE_LOCK lock] [SKIP_RETURN_CODE code])
# A bash test script from the calling folder, given the source and build
# folders first (then ARGS), one thread per process like every other test.
function(vqa_add_script_test)
  cmake_parse_arguments(T "" "NAME;SCRIPT;TIMEOUT;PROCESSORS;RESOURCE_LOCK;SKIP_RETURN_CODE"
                        "ARGS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(NOT T_PROCESSORS)
    set(T_PROCESSORS 1)
  endif()
  add_test(NAME ${T_NAME}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/${T_SCRIPT} ${PROJECT_SOURCE_DIR}
                   ${PROJECT_BINARY_DIR} ${T_ARGS})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}"
    PROCESSORS ${T_PROCESSORS} ENVIRONMENT "${VQA_TEST_ENVIRONMENT}")
  if(T_RESOURCE_LOCK)
    set_tests_properties(${T_NAME} PROPERTIES RESOURCE_LOCK ${T_RESOURCE_LOCK})
  endif()
  if(T_SKIP_RETURN_CODE)
    set_tests_properties(${T_NAME} PROPERTIES SKIP_RETURN_CODE ${T_SKIP_RETURN_CODE})
  endif()
endfunction()
