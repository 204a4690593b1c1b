# gear_cccl_include_dirs(<out-var>)
#
# Sets <out-var> to the CUDA Toolkit include directories followed by their `cccl` subfolder where
# one exists. nvcc adds the `cccl` folder on its own; a plain C++ compiler needs it spelled out to
# find <cuda/std/mdspan>, <cuda/stream_ref> and <cub/...>. Requires find_package(CUDAToolkit) first.
#
# Used by the top-level CMakeLists.txt for the build tree and by the installed gearConfig.cmake,
# which recomputes the folders on the consumer's machine instead of carrying this machine's paths.
function(gear_cccl_include_dirs out_var)
  set(dirs "")
  foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    list(APPEND dirs "${dir}")
    if(IS_DIRECTORY "${dir}/cccl")
      list(APPEND dirs "${dir}/cccl")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES dirs)
  set(${out_var} "${dirs}" PARENT_SCOPE)
endfunction()
