// Built by the three consumer projects in this folder (add_subdirectory, FetchContent,
// find_package) with a plain C++ compiler: a program that only includes gear and links gear::gear.
#include <cstdio>
#include <gear/gear.hpp>

int main() {
  std::printf("gear %s\n", gear::version_string);
  return 0;
}
