// lockstepctl's main: signals, then the command line (lockstep_ctl, ctl/src/ctl_run.cpp).

#include <csignal>

#include "ctl.h"
#include "lockstep/common/files.h"

namespace {
void onSignal(int signal) { lockstep::ctl::g_interrupted.store(signal); }
}  // namespace

int main(int argc, char** argv) {
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  lockstep::raiseOpenFilesLimit();  // watch holds a connection per agent
  return lockstep::ctl::run(argc, argv);
}
