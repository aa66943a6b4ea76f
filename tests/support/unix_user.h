#pragma once
// A Unix user made for one test (useradd) and removed with whatever it still runs (userdel),
// even when the test fails. Root only: the tests that need one skip elsewhere.

#include <chrono>
#include <random>
#include <stdexcept>
#include <string>

#include "lockstep/common/identity.h"
#include "lockstep/common/process.h"

namespace lockstep::test {

class UnixUser {
 public:
  explicit UnixUser(const std::string& role) {
    using namespace std::chrono_literals;
    std::random_device random;
    name = "ls" + role + std::to_string(random() % 1000000);
    const auto made = runCommand({"useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name}, 30s);
    if (!made || !made->status.success()) throw std::runtime_error("useradd " + name + " failed");
    auto who = lookUpUser(name);
    if (!who) throw std::runtime_error(who.error().message);
    identity = *who;
  }
  ~UnixUser() {
    using namespace std::chrono_literals;
    (void)runCommand({"pkill", "-KILL", "-u", name}, 10s);
    (void)runCommand({"userdel", name}, 30s);
  }
  UnixUser(const UnixUser&) = delete;
  UnixUser& operator=(const UnixUser&) = delete;

  std::string name;
  Identity identity;
};

}  // namespace lockstep::test
