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
#include <map>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace process_test {

/// Exit statuses of children that a waitpid here collected (a process leader that exited while
/// being looked at): reap() takes them from here.
inline std::map<pid_t, int>& collected_exits() {
  static std::map<pid_t, int> statuses;
  return statuses;
}

/// Stops thread `tid` of process `pid` with ptrace (PTRACE_SEIZE, then PTRACE_INTERRUPT: no
/// SIGSTOP of ours is left pending), reads its instruction pointer into `ip` and lets it go on;
/// a signal that reaches the thread meanwhile is handed on to it. False when it could not (the
/// thread or process is gone: a leader's exit status is kept for reap, or ptrace is not allowed).
inline bool instruction_pointer(pid_t pid, pid_t tid, std::uintptr_t& ip) {
#if defined(__x86_64__)
  if (ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) return false;
  if (ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0) {
    (void)ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
    return false;
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (std::chrono::steady_clock::now() < until) {
    int status = 0;
    const pid_t got = waitpid(tid, &status, __WALL | WNOHANG);
    if (got == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    if (got != tid) return false;  // gone
    if (WIFEXITED(status) || WIFSIGNALED(status)) {
      if (tid == pid) collected_exits()[pid] = status;
      return false;
    }
    if (!WIFSTOPPED(status)) continue;
    if ((status >> 16) == PTRACE_EVENT_STOP) {  // the interrupt's stop (or a group stop)
      user_regs_struct regs{};
      const bool read = ptrace(PTRACE_GETREGS, tid, nullptr, &regs) == 0;
      (void)ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
      ip = static_cast<std::uintptr_t>(regs.rip);
      return read;
    }
    // A signal on its way to the thread: deliver it, and wait on for the interrupt's stop.
    (void)ptrace(PTRACE_CONT, tid, nullptr,
                 reinterpret_cast<void*>(static_cast<std::uintptr_t>(WSTOPSIG(status))));
  }
  (void)ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
  return false;
#else
  (void)pid, (void)tid, (void)ip;
  return false;
#endif
}

/// True when a thread of `pid` (a child forked from this process, so its libc is at the same
/// addresses) was found inside pthread_spin_lock at each of 5 looks 20 ms apart. That is where
/// libfabric 1.17's shm provider spins for good on a lock of a shared region that a killed peer
/// held: no deadline of gear's can end a wait there. False where ptrace is not allowed.
inline bool stuck_on_spin_lock(pid_t pid) {
  const auto lock = reinterpret_cast<std::uintptr_t>(dlsym(RTLD_DEFAULT, "pthread_spin_lock"));
  if (lock == 0) return false;
  std::vector<pid_t> threads;
  std::error_code ec;
  for (const auto& t :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec))
    threads.push_back(static_cast<pid_t>(std::stol(t.path().filename().string())));
  for (const pid_t tid : threads) {
    int inside = 0;
    std::uintptr_t ip = 0;
    while (inside < 5 && instruction_pointer(pid, tid, ip) && ip >= lock && ip < lock + 64) {
      ++inside;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (inside == 5) return true;
  }
  return false;
}

}  // namespace process_test
