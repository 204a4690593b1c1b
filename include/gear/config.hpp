#pragma once
// Portability macros shared by every gear header.
//
// GEAR_HD marks functions that run on both the host and the device. Under a plain C++ compiler it
// expands to nothing, so the same index and layout maths is compiled and tested with g++.

#if defined(__CUDACC__)
#define GEAR_HD __host__ __device__
#define GEAR_DEVICE_COMPILER 1
#else
#define GEAR_HD
#define GEAR_DEVICE_COMPILER 0
#endif
