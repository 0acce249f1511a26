# vqa_add_mpi_test(NAME <name> TARGET <target> RANKS <n>... [ARGS ...] [TIMEOUT s] [LABELS ...])
# Registers one CTest test per rank count, each started through mpirun.
# Each rank runs one thread: the tests oversubscribe 2 cores with 3 ranks.
function(vqa_add_mpi_test)
  cmake_parse_arguments(T "" "NAME;TARGET;TIMEOUT" "RANKS;ARGS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  foreach(ranks IN LISTS T_RANKS)
    set(test_name ${T_NAME}_np${ranks})
    add_test(NAME ${test_name}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${VQA_TEST_MPIEXEC_FLAGS}
              $<TARGET_FILE:${T_TARGET}> ${T_ARGS})
    set_tests_properties(${test_name} PROPERTIES
      TIMEOUT ${T_TIMEOUT}
      PROCESSORS ${ranks}
      LABELS "mpi;${T_LABELS}"
      ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  endforeach()
endfunction()

# vqa_add_test(NAME <name> TARGET <target> [ARGS ...] [TIMEOUT s] [LABELS ...])
# A test that runs as one plain process (it may start mpirun itself).
function(vqa_add_test)
  cmake_parse_arguments(T "" "NAME;TARGET;TIMEOUT" "ARGS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_test(NAME ${T_NAME} COMMAND $<TARGET_FILE:${T_TARGET}> ${T_ARGS})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}"
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endfunction()
