#pragma once
// gear: everything that compiles with a plain C++20 compiler (host storage, host selection).
#include <gear/version.hpp>
