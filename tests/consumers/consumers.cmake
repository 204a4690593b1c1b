# Registers the consumer tests: outside projects that take gear the three ways a user would
# (add_subdirectory, FetchContent, find_package after an install), build consumer_main.cpp with the
# plain C++ compiler, and run it. Include this file from tests/CMakeLists.txt; it needs nothing
# from there (the gear source folder is found from this file's place, the build folder from
# project(gear)).
#
#   ctest -L consumer

get_filename_component(gear_consumer_source_dir ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)

# Build the outside projects with Ninja when there is one, like gear's own build.
if(CMAKE_GENERATOR STREQUAL "Ninja")
  set(gear_consumer_generator Ninja)
  set(gear_consumer_make_program ${CMAKE_MAKE_PROGRAM})
else()
  find_program(GEAR_CONSUMER_NINJA NAMES ninja ninja-build)
  mark_as_advanced(GEAR_CONSUMER_NINJA)
  if(GEAR_CONSUMER_NINJA)
    set(gear_consumer_generator Ninja)
    set(gear_consumer_make_program ${GEAR_CONSUMER_NINJA})
  else()
    set(gear_consumer_generator "")
    set(gear_consumer_make_program "")
  endif()
endif()

get_filename_component(gear_consumer_cuda_root ${CUDAToolkit_BIN_DIR} DIRECTORY)

foreach(consumer IN ITEMS add_subdirectory fetchcontent find_package)
  set(work_dir ${CMAKE_CURRENT_BINARY_DIR}/consumers/${consumer})
  add_test(NAME consumer.${consumer}
    COMMAND ${CMAKE_COMMAND}
      -DCONSUMER=${consumer}
      -DGEAR_SOURCE_DIR=${gear_consumer_source_dir}
      -DGEAR_BINARY_DIR=${gear_BINARY_DIR}
      -DWORK_DIR=${work_dir}
      -DGENERATOR=${gear_consumer_generator}
      -DMAKE_PROGRAM=${gear_consumer_make_program}
      -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
      -DCUDA_TOOLKIT_ROOT=${gear_consumer_cuda_root}
      -DCONFIG=$<CONFIG>
      -P ${CMAKE_CURRENT_LIST_DIR}/run_consumer.cmake
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(consumer.${consumer} PROPERTIES LABELS consumer TIMEOUT 600)
endforeach()
