#include "sensors/netdev.h"

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>

#include "base/host.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/files.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;

// A sysfs file holding one unsigned number; nothing when it is absent, unreadable (sysfs says
// EINVAL for a link that is down) or not a number (-1: the driver does not know).
std::optional<std::uint64_t> number(const std::string& path) {
  auto text = readKernelFile(path, 256);
  if (!text) return std::nullopt;
  const std::string t = trim(*text);
  if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::strtoull(t.c_str(), nullptr, 10);
}

// An InfiniBand port's rate file: "200 Gb/sec (4X HDR)".
std::optional<std::uint64_t> ibRate(const std::string& path) {
  auto text = readKernelFile(path, 256);
  if (!text) return std::nullopt;
  std::stringstream in(*text);
  double value = 0;
  std::string unit;
  if (!(in >> value >> unit) || value <= 0 || unit.rfind("Gb/s", 0) != 0) return std::nullopt;
  return static_cast<std::uint64_t>(value * 1e9);
}

// The ports of the InfiniBand devices: bytes from the port counters, which count 4-byte words.
std::vector<NetSample> infinibandPorts(const std::string& root) {
  std::vector<NetSample> out;
  std::error_code ec;
  for (const auto& device : fs::directory_iterator(root, ec)) {
    std::error_code portsEc;
    for (const auto& port : fs::directory_iterator(device.path() / "ports", portsEc)) {
      const std::string counters = (port.path() / "counters").string() + "/";
      const auto rxWords = number(counters + "port_rcv_data");
      const auto txWords = number(counters + "port_xmit_data");
      if (!rxWords || !txWords) continue;
      NetSample s;
      s.interface = "ib:" + device.path().filename().string() + "/" + port.path().filename().string();
      s.rxBytes = *rxWords * 4;
      s.txBytes = *txWords * 4;
      s.rxPackets = number(counters + "port_rcv_packets").value_or(0);
      s.txPackets = number(counters + "port_xmit_packets").value_or(0);
      s.rxErrors = number(counters + "port_rcv_errors");
      s.txDrops = number(counters + "port_xmit_discards");
      s.linkBitsPerSecond = ibRate((port.path() / "rate").string());
      out.push_back(std::move(s));
    }
  }
  return out;
}

}  // namespace

std::vector<NetSample> parseProcNetDev(const std::string& text) {
  std::vector<NetSample> out;
  std::stringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;  // the two header lines
    const std::string name = trim(line.substr(0, colon));
    if (name.empty() || name == "lo") continue;
    // Receive: bytes packets errs drop fifo frame compressed multicast; transmit: bytes packets
    // errs drop fifo colls carrier compressed.
    std::stringstream fields(line.substr(colon + 1));
    std::uint64_t v[16] = {};
    int n = 0;
    while (n < 16 && fields >> v[n]) ++n;
    if (n < 12) continue;
    NetSample s;
    s.interface = name;
    s.rxBytes = v[0];
    s.rxPackets = v[1];
    s.rxErrors = v[2];
    s.rxDrops = v[3];
    s.txBytes = v[8];
    s.txPackets = v[9];
    s.txErrors = v[10];
    s.txDrops = v[11];
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<NetSample> readInterfaces(const std::string& node, const NetRoots& roots) {
  auto text = readKernelFile(roots.procNetDev);
  std::vector<NetSample> out = text ? parseProcNetDev(*text) : std::vector<NetSample>{};
  for (auto& s : out) {
    // Mb/s, as the kernel gives it.
    if (auto speed = number(roots.sysClassNet + "/" + s.interface + "/speed"); speed && *speed > 0) {
      s.linkBitsPerSecond = *speed * 1'000'000;
    }
  }
  for (auto& port : infinibandPorts(roots.sysClassInfiniband)) out.push_back(std::move(port));
  const std::int64_t now = unixMicrosNow();
  for (auto& s : out) {
    s.node = node;
    s.timeUnixUs = now;
  }
  return out;
}

}  // namespace lockstep::agent
