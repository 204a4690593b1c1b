#pragma once
// Shared by the multi-process transport tests: length-prefixed frames on a socket (the
// out-of-band channel), children with deadlines, and the cleanup checks (no process, no /dev/shm
// file of theirs left).

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <gear/error.hpp>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "spin_lock_probe.hpp"

namespace process_test {

using clock_type = std::chrono::steady_clock;

inline bool send_frame(int fd, std::span<const std::byte> bytes) {
  const auto n = static_cast<std::uint32_t>(bytes.size());
  return write(fd, &n, 4) == 4 &&
         write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
}
inline std::vector<std::byte> receive_frame(int fd) {
  std::uint32_t n = 0;
  if (read(fd, &n, 4) != 4 || n > (1u << 20)) return {};
  std::vector<std::byte> bytes(n);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = read(fd, bytes.data() + got, n - got);
    if (r <= 0) return {};
    got += static_cast<std::size_t>(r);
  }
  return bytes;
}

/// Runs `role(fd)` in a child process (which closes `other_fd`); its exit code is what role
/// returns, 77 when the provider is not there, 2 for any other gear::error. Returns its pid.
template <class Role>
pid_t spawn(Role role, int fd, int other_fd, bool disable_cma) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // Killed with the test, even stopped (a case's SIGSTOP) or past its alarm: a test killed at its
  // timeout leaves no process of its behind.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(1);
  if (other_fd >= 0) close(other_fd);
  // Any process of this user may look at it (gdb's stacks of a hung child, started by the test
  // and so not its ancestor, where Yama's ptrace_scope is 1).
  (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  alarm(90);  // a last resort: the parent kills at its own deadline first
  if (disable_cma) setenv("FI_SHM_DISABLE_CMA", "1", 1);
  setenv("FI_LOG_LEVEL", "warn", 0);
  int rc = 1;
  try {
    rc = role(fd);
  } catch (const gear::error& e) {
    std::fprintf(stderr, "child %d: %s\n", getpid(), e.what());
    // 77 (not tested) only when the provider is not there: fi_getinfo answered "no data".
    const bool absent = std::strstr(e.what(), "fi_getinfo") != nullptr &&
                        std::strstr(e.what(), "No data available") != nullptr;
    rc = absent ? 77 : 2;
  }
  _exit(rc);
}

/// Waits for `pid` until `until`, killing it past that. Its exit code, or -signal. A process that
/// has to be killed first has its threads' stacks printed to stderr where gdb is installed (a
/// hang a test can only report must say where it hung).
inline int reap(pid_t pid, clock_type::time_point until) {
  int status = 0;
  if (const auto it = collected_exits().find(pid); it != collected_exits().end()) {
    status = it->second;  // its exit was collected while it was looked at (spin_lock_probe.hpp)
    collected_exits().erase(it);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (clock_type::now() > until) {
      std::fprintf(stderr, "process %d still running at its deadline: its stacks, then SIGKILL\n",
                   static_cast<int>(pid));
      const std::string dump = "command -v gdb >/dev/null && timeout 30 gdb -p " +
                               std::to_string(pid) +
                               " -batch -ex 'thread apply all bt' 1>&2 2>/dev/null";
      (void)std::system(dump.c_str());
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -SIGKILL;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

/// Files a shm endpoint of `pid` left in /dev/shm (removed, and counted).
inline int shm_leftovers(pid_t pid) {
  int n = 0;
  const std::string prefix = std::to_string(pid) + ":";
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator("/dev/shm", ec))
    if (f.path().filename().string().rfind(prefix, 0) == 0) {
      std::filesystem::remove(f.path(), ec);
      ++n;
    }
  return n;
}

/// Runs `role()` alone in a child process, waits for it until `until`, and checks it left no
/// /dev/shm file. Its exit code (reap).
template <class Role>
int run_alone(Role role, bool disable_cma, clock_type::time_point until) {
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  const pid_t pid = spawn([&](int) { return role(); }, fds[0], fds[1], disable_cma);
  close(fds[0]);
  close(fds[1]);
  const int rc = reap(pid, until);
  CHECK(shm_leftovers(pid) == 0);
  return rc;
}

}  // namespace process_test
