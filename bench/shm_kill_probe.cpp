// How often a process using libfabric's shm provider is left spinning for good when a peer is
// killed (README, "A limit of shm in libfabric 1.17"):
//
//   gear_shm_kill_probe [kills] [message bytes]      (FI_SHM_DISABLE_CMA=1 to test without CMA)
//
// Each round forks a survivor and a victim with one shm endpoint each; both send `bytes`-byte
// messages to the other and poll, back to back. The victim is killed (SIGKILL) 1-31 ms after the
// survivor is ready; the survivor goes on for 300 ms, closes its endpoint and exits. One still
// running 5 s after the kill is counted as hung, and where it was found (inside
// pthread_spin_lock, or elsewhere) is printed. Leaves no process or /dev/shm file behind.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <gear/transport/libfabric.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "spin_lock_probe.hpp"  // tests/

namespace {

using clock_type = std::chrono::steady_clock;
namespace fabric = gear::transport::fabric;

void send_name(int fd, const std::vector<std::uint8_t>& name) {
  const auto n = static_cast<std::uint32_t>(name.size());
  if (write(fd, &n, 4) != 4 || write(fd, name.data(), n) != static_cast<ssize_t>(n)) _exit(3);
}
std::vector<std::uint8_t> receive_name(int fd) {
  std::uint32_t n = 0;
  if (read(fd, &n, 4) != 4 || n > 4096) _exit(3);
  std::vector<std::uint8_t> name(n);
  if (read(fd, name.data(), n) != static_cast<ssize_t>(n)) _exit(3);
  return name;
}

/// Sends to `peer` and polls, back to back, until `until`; failures are expected once it died.
void talk(fabric::endpoint& ep, fi_addr_t peer, const fabric::region& out, std::size_t bytes,
          clock_type::time_point until) {
  while (clock_type::now() < until) {
    try {
      (void)ep.try_send(out, 0, bytes, peer, nullptr);
      (void)ep.poll([](const fabric::completion&) {});
    } catch (const gear::error&) {
    }
  }
}

/// One endpoint that receives into 1 MiB and sends from 64 KiB.
struct side {
  fabric::endpoint ep;
  std::vector<std::byte> in = std::vector<std::byte>(1 << 20),
                         out = std::vector<std::byte>(1 << 16);
  fabric::region in_region, out_region;
  side() : ep(gear::transport::libfabric_config{.provider = "shm"}) {
    in_region = ep.register_memory(in.data(), in.size(), FI_RECV);
    out_region = ep.register_memory(out.data(), out.size(), FI_SEND);
    ep.receive_into(in_region, 1 << 16);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int kills = argc > 1 ? std::atoi(argv[1]) : 100;
  const auto bytes = static_cast<std::size_t>(argc > 2 ? std::atoi(argv[2]) : 60000);
  if (kills <= 0 || bytes == 0 || bytes > (1 << 16)) {
    std::fprintf(stderr, "usage: gear_shm_kill_probe [kills > 0] [message bytes, 1 to 65536]\n");
    return 2;
  }
  const char* cma = std::getenv("FI_SHM_DISABLE_CMA");
  std::printf("gear_shm_kill_probe: %d kills, %zu-byte messages both ways, %s\n", kills, bytes,
              cma != nullptr && std::string(cma) == "1" ? "without CMA" : "with CMA");
  std::signal(SIGPIPE, SIG_IGN);  // a survivor gone early: its pipe's write fails, and is told
  std::mt19937 gen(42);
  int hung = 0, spinning = 0;
  for (int round = 0; round < kills; ++round) {
    int names_a[2], names_b[2], ready[2], killed[2];
    if (pipe(names_a) != 0 || pipe(names_b) != 0 || pipe(ready) != 0 || pipe(killed) != 0) return 3;
    const pid_t survivor = fork();
    if (survivor == 0) {
      for (const int fd : {names_a[0], names_b[1], ready[0], killed[1]}) close(fd);
      {
        side s;
        send_name(names_a[1], s.ep.name());
        const fi_addr_t peer = s.ep.insert_peer(receive_name(names_b[0]));
        if (write(ready[1], "r", 1) != 1) _exit(3);
        (void)fcntl(killed[0], F_SETFL, O_NONBLOCK);
        char byte = 0;
        while (read(killed[0], &byte, 1) != 1)
          talk(s.ep, peer, s.out_region, bytes, clock_type::now() + std::chrono::milliseconds(1));
        talk(s.ep, peer, s.out_region, bytes, clock_type::now() + std::chrono::milliseconds(300));
      }  // the endpoint closes
      _exit(0);
    }
    const pid_t victim = fork();
    if (victim == 0) {
      for (const int fd : {names_a[1], names_b[0], ready[0], ready[1], killed[0], killed[1]})
        close(fd);
      side s;
      const fi_addr_t peer = s.ep.insert_peer(receive_name(names_a[0]));
      send_name(names_b[1], s.ep.name());
      talk(s.ep, peer, s.out_region, bytes, clock_type::now() + std::chrono::seconds(60));
      _exit(0);
    }
    // Only the children hold the other ends: a child that dies early ends the reads below.
    for (const int fd : {names_a[0], names_a[1], names_b[0], names_b[1], ready[1], killed[0]})
      close(fd);
    const auto remove_files = [&] {  // killed processes leave their /dev/shm files
      std::error_code ec;
      for (const pid_t pid : {victim, survivor})
        for (const auto& f : std::filesystem::directory_iterator("/dev/shm", ec))
          if (f.path().filename().string().rfind(std::to_string(pid) + ":", 0) == 0)
            std::filesystem::remove(f.path(), ec);
    };
    const auto give_up = [&](const char* why) {
      std::fprintf(stderr, "gear_shm_kill_probe: %s (is the shm provider there?)\n", why);
      for (const pid_t pid : {victim, survivor}) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
      close(ready[0]), close(killed[1]);
      remove_files();
      return 3;
    };
    char byte = 0;
    if (read(ready[0], &byte, 1) != 1) return give_up("the survivor did not get ready");
    std::this_thread::sleep_for(std::chrono::microseconds(1000 + gen() % 30000));
    kill(victim, SIGKILL);
    int status = 0;
    waitpid(victim, &status, 0);
    if (write(killed[1], "k", 1) != 1) return give_up("the survivor is gone");
    const auto at = clock_type::now();
    bool exited = false;
    while (!exited && clock_type::now() - at < std::chrono::seconds(5)) {
      exited = waitpid(survivor, &status, WNOHANG) == survivor;
      if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!exited) {
      ++hung;
      const bool spin = process_test::stuck_on_spin_lock(survivor);
      spinning += spin;
      std::printf("kill %d: the survivor is still running 5 s later, %s\n", round + 1,
                  spin ? "inside pthread_spin_lock" : "not inside pthread_spin_lock");
      kill(survivor, SIGKILL);
      waitpid(survivor, &status, 0);
    }
    close(ready[0]), close(killed[1]);
    remove_files();
    if ((round + 1) % 20 == 0)
      std::printf("... %d kills, %d hung\n", round + 1, hung), std::fflush(stdout);
  }
  std::printf("%d of %d kills left the survivor running 5 s later (%d inside pthread_spin_lock)\n",
              hung, kills, spinning);
  return 0;
}
