// Issue 3: the agent's parts on their own.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "config.h"
#include "lockstep/net/keys.h"
#include "nvml.h"
#include "stream_buffer.h"
#include "support/test_support.h"

namespace lockstep::agent {
namespace {

using test::TempDir;

GpuSample sample(std::uint32_t gpu) {
  GpuSample s;
  s.node = "n";
  s.gpuIndex = gpu;
  return s;
}

TEST(StreamBuffer, NumbersFetchesAndForgetsTheOldest) {
  std::vector<std::uint64_t> reserved;
  StreamBuffer buffer("node-a", 1, 5, [&](std::uint64_t upTo) {
    reserved.push_back(upTo);
    return Result<void>{};
  });
  for (std::uint32_t i = 0; i < 8; ++i) ASSERT_EQ(*buffer.append(sample(i)), i + 1);
  EXPECT_EQ(reserved, std::vector<std::uint64_t>{StreamBuffer::kReserveBlock});  // reserved before the first
  EXPECT_EQ(buffer.lastSeq(), 8u);
  EXPECT_EQ(buffer.firstSeq(), 4u);  // capacity 5: 4..8 kept
  auto f = buffer.fetch(5, 2, 99);
  EXPECT_EQ(f.instanceId, 99u);
  EXPECT_EQ(f.firstSeq, 4u);
  ASSERT_EQ(f.messages.size(), 2u);
  EXPECT_EQ(f.messages[0].seq, 6u);
  EXPECT_EQ(std::get<GpuSample>(f.messages[1].payload).gpuIndex, 6u);
  EXPECT_EQ(f.messages[0].node, "node-a");
  // A client behind the buffer gets what is left and can see the jump from firstSeq.
  f = buffer.fetch(1, 100, 99);
  ASSERT_EQ(f.messages.size(), 5u);
  EXPECT_EQ(f.messages.front().seq, 4u);
  EXPECT_TRUE(buffer.fetch(8, 100, 99).messages.empty());
  EXPECT_FALSE(buffer.hasAfter(8));
}

TEST(StreamBuffer, ARestartContinuesAfterTheReservedBlock) {
  std::uint64_t persisted = 0;
  auto reserve = [&](std::uint64_t upTo) {
    persisted = upTo;
    return Result<void>{};
  };
  {
    StreamBuffer first("n", 1, 100, reserve);
    for (int i = 0; i < 3; ++i) (void)first.append(sample(0));
  }
  StreamBuffer second("n", persisted + 1, 100, reserve);
  EXPECT_EQ(*second.append(sample(0)), StreamBuffer::kReserveBlock + 1);
  EXPECT_EQ(persisted, 2 * StreamBuffer::kReserveBlock);
}

TEST(Nvml, NoLibraryMeansACpuOnlyNodeSaidPlainly) {
  std::string why;
  auto nvml = Nvml::load("libnvidia-ml-that-does-not-exist.so.1", &why);
  EXPECT_EQ(nvml, nullptr);
  EXPECT_NE(why.find("CPU-only node"), std::string::npos) << why;
}

TEST(Nvml, LoadsTheNewestSymbolsAndKeepsUnsupportedMetricsUnknown) {
  std::string why;
  auto nvml = Nvml::load(LOCKSTEP_FAKE_NVML_PATH, &why);
  ASSERT_NE(nvml, nullptr) << why;
  EXPECT_TRUE(why.empty());
  ASSERT_EQ(nvml->gpus().size(), 2u);
  EXPECT_EQ(nvml->gpus()[1].name, "Fake GPU 1");
  EXPECT_EQ(nvml->gpus()[1].uuid, "GPU-fake-1");
  EXPECT_EQ(nvml->gpus()[0].memoryTotalBytes, 80ull << 30);
  const auto withPower = nvml->read(0, true);
  EXPECT_EQ(withPower.powerMilliwatts, 300000u);
  EXPECT_EQ(withPower.energyMillijoules, 123456u);
  EXPECT_EQ(withPower.utilizationPct, 50.0f);
  EXPECT_EQ(nvml->read(0, false).energyMillijoules, std::nullopt);  // the slow counter only when asked
  const auto withoutPower = nvml->read(1, true);
  EXPECT_EQ(withoutPower.powerMilliwatts, std::nullopt) << "unsupported must stay unknown, not 0";
  EXPECT_EQ(withoutPower.energyMillijoules, std::nullopt);
  EXPECT_EQ(withoutPower.memoryUsedBytes, 2ull << 30);
  EXPECT_EQ(withoutPower.temperatureC, 60);
}

TEST(AgentConfig, FlagsOverTheConfigFile) {
  TempDir dir;
  std::ofstream(dir.file("agent.conf")) << "# comment\nlisten = tcp://0.0.0.0:7800\nsample_hz = 10\nname = from-file\n";
  auto c = parseAgentArgs({"--state-dir", dir.path().string(), "--name", "from-flag"});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->listen, "tcp://0.0.0.0:7800");
  EXPECT_EQ(c->listenHost(), "0.0.0.0");
  EXPECT_EQ(c->sampleHz, 10u);
  EXPECT_EQ(c->name, "from-flag");
  for (auto [args, text] : std::initializer_list<std::pair<std::vector<std::string>, const char*>>{
           {{"--state-dir", dir.path().string(), "--sample-hz", "50"}, "from 1 to 20"},
           {{"--state-dir", dir.path().string(), "--listen", "udp://x"}, "expected tcp://HOST:PORT"},
           {{"--state-dir", dir.path().string(), "--colour", "red"}, "unknown setting 'colour'"},
           {{"--config", dir.file("missing.conf")}, "no such file"}}) {
    auto bad = parseAgentArgs(args);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_NE(bad.error().message.find(text), std::string::npos) << bad.error().message;
  }
}

// Issue 8: the Debian package keeps authorized keys in /etc/lockstep (a conffile), apart from the
// agent's state in /var/lib.
TEST(AgentConfig, AuthorizedKeysFileFromTheConfigFile) {
  TempDir dir;
  auto defaults = parseAgentArgs({"--state-dir", dir.path().string()});
  ASSERT_TRUE(defaults.ok()) << defaults.error().message;
  EXPECT_EQ(defaults->authorizedKeysPath(), dir.file("authorized_keys"));
  std::ofstream(dir.file("agent.conf")) << "state-dir = " << dir.file("state") << "\nauthorized-keys = /etc/lockstep/authorized_keys\n";
  auto c = parseAgentArgs({"--config", dir.file("agent.conf")});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->stateDir, dir.file("state"));
  EXPECT_EQ(c->authorizedKeysPath(), "/etc/lockstep/authorized_keys");
  EXPECT_EQ(c->logPath(), dir.file("state/agent.log"));
}

TEST(Keys, PairsFingerprintsAndAuthorizedKeys) {
  TempDir dir;
  bool created = false;
  auto pair = loadOrCreateKeyPair(dir.file("k"), "agent", &created);
  ASSERT_TRUE(pair.ok()) << pair.error().message;
  EXPECT_TRUE(created);
  EXPECT_EQ(std::filesystem::status(dir.file("k/agent.key")).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto again = loadOrCreateKeyPair(dir.file("k"), "agent", &created);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(again->publicKey, pair->publicKey);
  EXPECT_EQ(fingerprint(pair->publicKey).rfind("SHA256:", 0), 0u);
  EXPECT_EQ(fingerprint(pair->publicKey).size(), 7u + 43u);

  std::filesystem::permissions(dir.file("k/agent.key"), std::filesystem::perms::others_read, std::filesystem::perm_options::add);
  auto exposed = loadKeyPair(dir.file("k"), "agent");
  ASSERT_FALSE(exposed.ok());
  EXPECT_NE(exposed.error().message.find("chmod 600"), std::string::npos);

  std::ofstream(dir.file("authorized")) << "# who may connect\n" << pair->publicKey << " alice@laptop\n\n";
  auto keys = readAuthorizedKeys(dir.file("authorized"));
  ASSERT_TRUE(keys.ok());
  EXPECT_TRUE(keys->allows(pair->publicKey));
  EXPECT_EQ(keys->commentByKey.at(pair->publicKey), "alice@laptop");
  EXPECT_FALSE(keys->allows(generateKeyPair()->publicKey));
  std::ofstream(dir.file("broken")) << "not-a-key comment\n";
  auto broken = readAuthorizedKeys(dir.file("broken"));
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.error().message.find("line 1"), std::string::npos);
  EXPECT_TRUE(readAuthorizedKeys(dir.file("none"))->commentByKey.empty());
}

}  // namespace
}  // namespace lockstep::agent
