# Configures, builds and runs one of the outside projects in this folder, in a fresh WORK_DIR.
#
#   cmake -DCONSUMER=add_subdirectory|fetchcontent|find_package
#         -DGEAR_SOURCE_DIR=<gear checkout> -DGEAR_BINARY_DIR=<configured gear build> -DWORK_DIR=<dir>
#         [-DGENERATOR=<name>] [-DMAKE_PROGRAM=<path>] [-DCXX_COMPILER=<path>]
#         [-DCUDA_TOOLKIT_ROOT=<dir>] [-DCONFIG=<config>]
#         -P run_consumer.cmake
#
# For find_package, GEAR_BINARY_DIR is installed first (headers and package files only: gear is
# header-only, so no build is needed), and the prefix is moved before use, which shows that the
# installed package does not depend on where it was installed.
cmake_minimum_required(VERSION 3.25)

foreach(var IN ITEMS CONSUMER GEAR_SOURCE_DIR GEAR_BINARY_DIR WORK_DIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()
set(project_dir ${CMAKE_CURRENT_LIST_DIR}/${CONSUMER})
if(NOT EXISTS ${project_dir}/CMakeLists.txt)
  message(FATAL_ERROR "run_consumer.cmake: no consumer project named '${CONSUMER}'")
endif()

function(run)
  execute_process(COMMAND ${ARGN} COMMAND_ECHO STDOUT COMMAND_ERROR_IS_FATAL ANY)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

set(configure_args -S ${project_dir} -B ${WORK_DIR}/build --no-warn-unused-cli
  -DGEAR_SOURCE_DIR=${GEAR_SOURCE_DIR})
if(GENERATOR)
  list(APPEND configure_args -G ${GENERATOR})
endif()
if(MAKE_PROGRAM)
  list(APPEND configure_args -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM})
endif()
if(CXX_COMPILER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
if(CUDA_TOOLKIT_ROOT)
  list(APPEND configure_args -DCUDAToolkit_ROOT=${CUDA_TOOLKIT_ROOT})
endif()

if(CONSUMER STREQUAL "find_package")
  set(install_args --install ${GEAR_BINARY_DIR} --prefix ${WORK_DIR}/staging)
  if(CONFIG)
    list(APPEND install_args --config ${CONFIG})
  endif()
  run(${CMAKE_COMMAND} ${install_args})
  file(RENAME ${WORK_DIR}/staging ${WORK_DIR}/prefix)

  # The exported targets must not carry folders of the machine gear was built on: the CUDA
  # Toolkit's are found again by gearConfig.cmake.
  file(GLOB targets_files ${WORK_DIR}/prefix/*/cmake/gear/gearTargets*.cmake)
  if(NOT targets_files)
    message(FATAL_ERROR "no gearTargets.cmake under ${WORK_DIR}/prefix")
  endif()
  foreach(file IN LISTS targets_files)
    file(READ ${file} text)
    foreach(path IN ITEMS ${GEAR_SOURCE_DIR} ${GEAR_BINARY_DIR} /cccl)
      string(FIND "${text}" "${path}" at)
      if(NOT at EQUAL -1)
        message(FATAL_ERROR "${file} mentions '${path}'; the installed package must not")
      endif()
    endforeach()
  endforeach()

  list(APPEND configure_args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
endif()

run(${CMAKE_COMMAND} ${configure_args})

if(CONSUMER STREQUAL "find_package")
  # Make sure the package came from the prefix just installed, not from somewhere on the system.
  file(STRINGS ${WORK_DIR}/build/CMakeCache.txt gear_dir REGEX "^gear_DIR:")
  string(REGEX REPLACE "^[^=]*=" "" gear_dir "${gear_dir}")
  string(FIND "${gear_dir}" "${WORK_DIR}/prefix/" at)
  if(NOT at EQUAL 0)
    message(FATAL_ERROR "find_package(gear) found '${gear_dir}', not the package in ${WORK_DIR}/prefix")
  endif()
endif()

run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/gear_consumer)
