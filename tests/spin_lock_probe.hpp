#pragma once
// Whether a process is spinning in pthread_spin_lock: where libfabric 1.17's shm provider spins for
// good on a lock of a shared region that a killed peer held (README, "A limit of shm in libfabric
// 1.17"). Used by the fault tests and by bench/gear_shm_kill_probe. Linux on x86-64 (elsewhere it
// answers false).

#include <dlfcn.h>
#include <sys/ptrace.h>
#include <sys/types.h>
#include <sys/user.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace process_test {

/// True when a thread of `pid` (a child forked from this process, so its libc is at the same
/// addresses) was found inside pthread_spin_lock at each of 5 looks 20 ms apart (ptrace). That
/// is where libfabric 1.17's shm provider spins for good on a lock of a shared region that a
/// killed peer held: no deadline of gear's can end a wait there.
inline bool stuck_on_spin_lock(pid_t pid) {
#if defined(__x86_64__)
  const auto lock = reinterpret_cast<std::uintptr_t>(dlsym(RTLD_DEFAULT, "pthread_spin_lock"));
  if (lock == 0) return false;
  std::vector<pid_t> threads;
  std::error_code ec;
  for (const auto& t :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec))
    threads.push_back(static_cast<pid_t>(std::stol(t.path().filename().string())));
  for (const pid_t tid : threads) {
    int inside = 0;
    for (int look = 0; look < 5; ++look) {
      if (ptrace(PTRACE_ATTACH, tid, nullptr, nullptr) != 0) break;
      int status = 0;
      if (waitpid(tid, &status, __WALL) != tid) break;
      user_regs_struct regs{};
      const bool read = ptrace(PTRACE_GETREGS, tid, nullptr, &regs) == 0;
      (void)ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
      if (!read || regs.rip < lock || regs.rip >= lock + 64) break;
      ++inside;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (inside == 5) return true;
  }
#else
  (void)pid;
#endif
  return false;
}

}  // namespace process_test
