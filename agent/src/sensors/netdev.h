#pragma once
// A node's network interfaces as the kernel counts them, for the node sensors (docs/agent.md):
// /proc/net/dev for every interface but loopback, its link speed from /sys/class/net/IF/speed
// where the driver says it, and InfiniBand ports from /sys/class/infiniband where it exists.
// Unknown stays unknown: an interface whose driver gives no speed has none, never 0.

#include <string>
#include <vector>

#include "lockstep/protocol/types.h"

namespace lockstep::agent {

// Where the kernel's files are: a test points these at a fixture.
struct NetRoots {
  std::string procNetDev = "/proc/net/dev";
  std::string sysClassNet = "/sys/class/net";
  std::string sysClassInfiniband = "/sys/class/infiniband";
};

// The interfaces' counters now, stamped with `node` and the time.
std::vector<NetSample> readInterfaces(const std::string& node, const NetRoots& roots = {});

// The lines of a /proc/net/dev text, loopback left out.
std::vector<NetSample> parseProcNetDev(const std::string& text);

}  // namespace lockstep::agent
