// Issue 19's network under the job: the agent's interface counters (from fixtures of the kernel's
// files, and from a real veth pair between two network namespaces with a known transfer) and the
// throughput worked out from two samples.

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include "lockstep/kpi/network.h"
#include "sensors/netdev.h"
#include "support/test_support.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

const NetSample* find(const std::vector<NetSample>& all, const std::string& name) {
  const auto it = std::find_if(all.begin(), all.end(), [&](const NetSample& s) { return s.interface == name; });
  return it == all.end() ? nullptr : &*it;
}

// A /proc/net/dev as Linux 6 writes it.
const char* kProcNetDev =
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
    "    lo: 12143520291 4801144    0    0    0     0          0         0 12143520291 4801144    0    0    0     0       0          0\n"
    "  eth0: 987654321  654321    3    4    0     0          0        12 123456789  54321    5    6    0     0       0          0\n"
    "   ib0:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n";

TEST(NetDev, CountersLinkSpeedsAndInfinibandPortsFromTheKernelsFiles) {
  test::TempDir dir;
  NetRoots roots{dir.file("proc_net_dev"), dir.file("net"), dir.file("infiniband")};
  write(roots.procNetDev, kProcNetDev);
  write(roots.sysClassNet + "/eth0/speed", "25000\n");  // Mb/s
  write(roots.sysClassNet + "/ib0/speed", "-1\n");      // the driver does not know
  const std::string port = roots.sysClassInfiniband + "/mlx5_0/ports/1/";
  write(port + "counters/port_rcv_data", "250\n");  // 4-byte words
  write(port + "counters/port_xmit_data", "1000\n");
  write(port + "counters/port_rcv_packets", "9\n");
  write(port + "counters/port_xmit_packets", "11\n");
  write(port + "counters/port_rcv_errors", "2\n");
  write(port + "rate", "200 Gb/sec (4X HDR)\n");

  const auto all = readInterfaces("node-a", roots);
  ASSERT_EQ(all.size(), 3u);  // no loopback
  const NetSample* eth = find(all, "eth0");
  ASSERT_NE(eth, nullptr);
  EXPECT_EQ(eth->node, "node-a");
  EXPECT_GT(eth->timeUnixUs, 0);
  EXPECT_EQ(eth->rxBytes, 987654321u);
  EXPECT_EQ(eth->rxPackets, 654321u);
  EXPECT_EQ(eth->rxErrors, 3u);
  EXPECT_EQ(eth->rxDrops, 4u);
  EXPECT_EQ(eth->txBytes, 123456789u);
  EXPECT_EQ(eth->txPackets, 54321u);
  EXPECT_EQ(eth->txErrors, 5u);
  EXPECT_EQ(eth->txDrops, 6u);
  EXPECT_EQ(eth->linkBitsPerSecond, 25'000'000'000ull);
  const NetSample* ipoib = find(all, "ib0");
  ASSERT_NE(ipoib, nullptr);
  EXPECT_FALSE(ipoib->linkBitsPerSecond.has_value()) << "-1 is unknown, not a speed";
  const NetSample* ib = find(all, "ib:mlx5_0/1");
  ASSERT_NE(ib, nullptr);
  EXPECT_EQ(ib->rxBytes, 1000u);
  EXPECT_EQ(ib->txBytes, 4000u);
  EXPECT_EQ(ib->rxPackets, 9u);
  EXPECT_EQ(ib->rxErrors, 2u);
  EXPECT_FALSE(ib->txErrors.has_value());
  EXPECT_FALSE(ib->txDrops.has_value()) << "no port_xmit_discards file: unknown";
  EXPECT_EQ(ib->linkBitsPerSecond, 200'000'000'000ull);

  // No /proc/net/dev, no sysfs: nothing, rather than made-up interfaces.
  EXPECT_TRUE(readInterfaces("n", {dir.file("absent"), dir.file("absent"), dir.file("absent")}).empty());
  // A garbled line is skipped, not misread.
  EXPECT_TRUE(parseProcNetDev("  eth9: 12 13 x\n").empty());
}

TEST(NetRate, ThroughputAgainstTheLinkFromTwoSamples) {
  NetSample a{"n", "eth0", 1'000'000, 1'000'000, 500'000, 10, 10, 0u, 0u, 0u, 0u, 10'000'000'000ull};
  NetSample b = a;
  b.timeUnixUs = 3'000'000;         // 2 s later
  b.rxBytes = 1'000'000 + 250'000'000;  // 125 MB/s: 1 Gb/s
  b.txBytes = 500'000 + 50'000'000;     // 25 MB/s
  b.rxDrops = 3u;
  b.txErrors = 1u;
  const auto r = kpi::netRate(a, b);
  ASSERT_TRUE(r);
  EXPECT_DOUBLE_EQ(r->rxBytesPerSecond, 125e6);
  EXPECT_DOUBLE_EQ(r->txBytesPerSecond, 25e6);
  ASSERT_TRUE(r->linkUse);
  EXPECT_DOUBLE_EQ(*r->linkUse, 0.1);  // the busier way: 1 Gb/s of 10
  EXPECT_EQ(r->newErrors, 4u);
  EXPECT_EQ(kpi::formatBitsPerSecond(8 * r->rxBytesPerSecond), "1.00 Gb/s");
  EXPECT_EQ(kpi::formatBitsPerSecond(8 * r->txBytesPerSecond), "200 Mb/s");

  b.linkBitsPerSecond.reset();
  EXPECT_FALSE(kpi::netRate(a, b)->linkUse.has_value()) << "no speed, no share of it";
  NetSample reset = b;
  reset.rxBytes = 10;  // the interface was recreated: its counters start again
  EXPECT_FALSE(kpi::netRate(a, reset));
  EXPECT_FALSE(kpi::netRate(b, a)) << "out of order";
  NetSample other = b;
  other.interface = "eth1";
  EXPECT_FALSE(kpi::netRate(a, other));
}

// A shell command, true when it exited 0.
bool sh(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()) == 0; }

// The kernel's own counters: a veth pair, one end here and one in a namespace of its own, and a
// known number of UDP datagrams sent across it. Needs root (CAP_NET_ADMIN); skipped without.
TEST(NetDev, AKnownTransferOverAVethPairShowsInTheCounters) {
  const std::string tag = std::to_string(::getpid() % 100000);
  const std::string ns = "lstest" + tag, here = "lsa" + tag, there = "lsb" + tag;
  if (!sh("ip netns add " + ns)) GTEST_SKIP() << "cannot make a network namespace here (needs root)";
  struct Cleanup {
    std::string ns, here;
    ~Cleanup() {
      sh("ip link del " + here);
      sh("ip netns del " + ns);
    }
  } cleanup{ns, here};
  ASSERT_TRUE(sh("ip link add " + here + " type veth peer name " + there + " netns " + ns)) << "no veth here";
  ASSERT_TRUE(sh("ip addr add 10.231.7.1/30 dev " + here + " && ip link set " + here + " up"));
  ASSERT_TRUE(sh("ip netns exec " + ns + " sh -c 'ip addr add 10.231.7.2/30 dev " + there + " && ip link set " + there +
                 " up'"));
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);  // discard: nobody listens, the datagrams still cross the link
  ::inet_pton(AF_INET, "10.231.7.2", &to.sin_addr);
  constexpr int kDatagrams = 200;
  constexpr std::size_t kPayload = 1000;
  const std::string payload(kPayload, 'x');
  // The peer's MAC, learnt before counting (datagrams sent before it is are queued, a few only):
  // the transfer is then the datagrams alone, and what the kernel itself sends, allowed for below.
  ::sendto(fd, "x", 1, 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  const auto before = readInterfaces("n");
  const NetSample* b = find(before, here);
  ASSERT_NE(b, nullptr) << "the veth end is not in /proc/net/dev";
  for (int i = 0; i < kDatagrams; ++i) {
    ASSERT_EQ(::sendto(fd, payload.data(), payload.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to),
              static_cast<ssize_t>(kPayload));
  }
  ::close(fd);
  const auto after = readInterfaces("n");
  const NetSample* a = find(after, here);
  ASSERT_NE(a, nullptr);
  // Each datagram on the wire: payload + UDP (8) + IPv4 (20) + Ethernet (14) bytes.
  const std::uint64_t expected = kDatagrams * (kPayload + 8 + 20 + 14);
  const std::uint64_t sent = a->txBytes - b->txBytes;
  EXPECT_GE(sent, expected);
  EXPECT_LE(sent, expected + 2048) << "more than the transfer and a little of the kernel's own";
  EXPECT_GE(a->txPackets - b->txPackets, static_cast<std::uint64_t>(kDatagrams));
  EXPECT_LE(a->txPackets - b->txPackets, static_cast<std::uint64_t>(kDatagrams) + 10);
}

}  // namespace
}  // namespace lockstep::agent
