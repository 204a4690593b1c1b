# gear_add_libfabric_target([GLOBAL])
#
# Where libfabric's header <rdma/fabric.h> and library are found (on the usual paths or under
# CMAKE_PREFIX_PATH), defines the imported target gear::libfabric: gear::gear plus libfabric, for
# code that uses the libfabric transport. Elsewhere defines nothing. Requires gear::gear.
#
# Used by the top-level CMakeLists.txt (GLOBAL, so that a project above gear sees it) and by the
# installed gearConfig.cmake, which looks for libfabric on the consumer's machine.
function(gear_add_libfabric_target)
  find_path(GEAR_LIBFABRIC_INCLUDE_DIR rdma/fabric.h)
  find_library(GEAR_LIBFABRIC_LIBRARY fabric)
  mark_as_advanced(GEAR_LIBFABRIC_INCLUDE_DIR GEAR_LIBFABRIC_LIBRARY)
  if(NOT GEAR_LIBFABRIC_INCLUDE_DIR OR NOT GEAR_LIBFABRIC_LIBRARY)
    return()
  endif()
  add_library(gear::libfabric INTERFACE IMPORTED ${ARGN})
  target_include_directories(gear::libfabric INTERFACE ${GEAR_LIBFABRIC_INCLUDE_DIR})
  target_link_libraries(gear::libfabric INTERFACE gear::gear ${GEAR_LIBFABRIC_LIBRARY})
endfunction()
