// The GPU device fence on the real kernel: a cgroup made for each test, stand-in device nodes
// (mknod 195:0, 195:1, 195:255; with no NVIDIA driver loaded, opening one that the fence allows
// fails with ENXIO, and one that it fences fails with EPERM, before the driver is looked for),
// and a forked child that joins the cgroup and opens each. Needs root and the hierarchy (CI is
// root on a hybrid host: v1 devices at /sys/fs/cgroup/devices, cgroup2 at /sys/fs/cgroup/unified);
// elsewhere the tests skip, saying why.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "jobs/device_fence.h"
#include "support/test_support.h"

namespace lockstep::test {
namespace {

using agent::DeviceFence;
using agent::fenceDevicesV1;
using agent::fenceDevicesV2;

bool isCgroup2(const std::string& dir) {
  struct statfs fs {};
  return ::statfs(dir.c_str(), &fs) == 0 && fs.f_type == CGROUP2_SUPER_MAGIC;
}

// Where this host's cgroup2 hierarchy is: /sys/fs/cgroup/unified on a hybrid host, /sys/fs/cgroup on
// a cgroup2-only one; "" where there is none.
std::string cgroup2Root() {
  for (const char* dir : {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}) {
    if (isCgroup2(dir)) return dir;
  }
  return "";
}

const char* kV1DevicesRoot = "/sys/fs/cgroup/devices";

std::string uniqueName() {
  static int made = 0;
  return "lockstep-devtest-" + std::to_string(::getpid()) + "-" + std::to_string(made++);
}

// A cgroup of the test's, removed when it goes (the child that joined it has been waited for by then).
class Cgroup {
 public:
  explicit Cgroup(const std::string& root) : path_(root + "/" + uniqueName()) {
    if (::mkdir(path_.c_str(), 0755) != 0) throw std::runtime_error("cannot make " + path_ + ": " + std::strerror(errno));
  }
  ~Cgroup() {
    // A child that was reaped may linger in the cgroup a moment: retry a second.
    for (int i = 0; i < 100 && ::rmdir(path_.c_str()) != 0 && errno == EBUSY; ++i) ::usleep(10000);
  }
  Cgroup(const Cgroup&) = delete;
  Cgroup& operator=(const Cgroup&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// What a process in the cgroup got opening each node O_RDWR: 0 where it opened, else errno.
struct Opens {
  int joined = 0;  // errno of joining the cgroup; 0 when it joined
  int gpu0 = 0, gpu1 = 0, gpu255 = 0, devNull = 0;
};

std::string errnoName(int err) { return err == 0 ? "opened" : std::string(strerrorname_np(err)); }

// The open of a GPU the fence allows: it reaches the (absent) driver.
testing::AssertionResult reachesDriver(int err) {
  if (err == ENXIO || err == ENODEV) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "expected ENXIO or ENODEV (the open reached the missing driver), got "
                                     << errnoName(err);
}

testing::AssertionResult fenced(int err) {
  if (err == EPERM) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "expected EPERM (the cgroup's device filter refused it), got " << errnoName(err);
}

class DeviceFenceTest : public ::testing::Test {
 protected:
  // Skips unless root, and unless stand-in nodes can be made and reach the driver from here.
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "making cgroups and device nodes needs root (CI runs as root)";
    nodes_ = std::make_unique<TempDir>();
    for (unsigned minor : {0u, 1u, 255u}) {
      const std::string node = nodePath(minor);
      if (::mknod(node.c_str(), S_IFCHR | 0666, makedev(195, minor)) != 0) {
        GTEST_SKIP() << "cannot mknod " << node << ": " << std::strerror(errno) << " (a container without CAP_MKNOD?)";
      }
    }
    const int err = openErrno(nodePath(1));
    if (err != ENXIO && err != ENODEV) {
      GTEST_SKIP() << "opening the stand-in " << nodePath(1) << " outside any fence gives " << errnoName(err)
                   << ", not ENXIO: an NVIDIA driver is loaded, $TMPDIR is mounted nodev, or this process is fenced already";
    }
  }

  std::string nodePath(unsigned minor) const { return nodes_->file("nvidia" + std::to_string(minor)); }

  static int openErrno(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return errno;
    ::close(fd);
    return 0;
  }

  // A child joins the cgroup (writing itself to `procsFile`), opens each node, and says what it got.
  Opens openFrom(const std::string& procsFile) {
    int pipeFds[2];
    if (::pipe2(pipeFds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    const std::array<std::string, 4> paths = {nodePath(0), nodePath(1), nodePath(255), "/dev/null"};
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Only system calls here: the child of a test process.
      Opens opens;
      const int procs = ::open(procsFile.c_str(), O_WRONLY | O_CLOEXEC);
      if (procs < 0 || ::write(procs, "0", 1) != 1) opens.joined = errno != 0 ? errno : EIO;
      if (opens.joined == 0) {
        opens.gpu0 = openErrno(paths[0]);
        opens.gpu1 = openErrno(paths[1]);
        opens.gpu255 = openErrno(paths[2]);
        opens.devNull = openErrno(paths[3]);
      }
      const bool sent = ::write(pipeFds[1], &opens, sizeof opens) == static_cast<ssize_t>(sizeof opens);
      ::_exit(sent ? 0 : 1);
    }
    ::close(pipeFds[1]);
    Opens opens;
    const bool got = pid > 0 && ::read(pipeFds[0], &opens, sizeof opens) == static_cast<ssize_t>(sizeof opens);
    ::close(pipeFds[0]);
    if (pid > 0) ::waitpid(pid, nullptr, 0);  // before the cgroup's rmdir
    if (!got) throw std::runtime_error("the child that opens the nodes did not report");
    return opens;
  }

  std::unique_ptr<TempDir> nodes_;
};

class DeviceFenceV2 : public DeviceFenceTest {
 protected:
  void SetUp() override {
    DeviceFenceTest::SetUp();
    if (IsSkipped()) return;
    root_ = cgroup2Root();
    if (root_.empty()) GTEST_SKIP() << "no cgroup2 hierarchy at /sys/fs/cgroup/unified or /sys/fs/cgroup";
    cgroup_ = std::make_unique<Cgroup>(root_);
  }
  // Declared after nodes_ (in the base), so the cgroup goes first; either order would do.
  std::string root_;
  std::unique_ptr<Cgroup> cgroup_;
};

class DeviceFenceV1 : public DeviceFenceTest {
 protected:
  void SetUp() override {
    DeviceFenceTest::SetUp();
    if (IsSkipped()) return;
    if (::access((std::string(kV1DevicesRoot) + "/devices.deny").c_str(), W_OK) != 0) {
      GTEST_SKIP() << "no cgroup v1 devices hierarchy at " << kV1DevicesRoot << " (a cgroup2-only host)";
    }
    cgroup_ = std::make_unique<Cgroup>(kV1DevicesRoot);
  }
  std::unique_ptr<Cgroup> cgroup_;
};

// What a child in `cgroup`, fenced to minors 0 and 255 of major 195, could open: those (and
// /dev/null, another major), and not 195:1.
void expectOnlyGpus0And255(const Opens& opens, const std::string& cgroup) {
  ASSERT_EQ(opens.joined, 0) << "the child could not join " << cgroup << ": " << errnoName(opens.joined);
  EXPECT_TRUE(reachesDriver(opens.gpu0)) << "195:0, allowed";
  EXPECT_TRUE(fenced(opens.gpu1)) << "195:1, not allowed";
  EXPECT_TRUE(reachesDriver(opens.gpu255)) << "195:255 (nvidiactl), allowed";
  EXPECT_EQ(opens.devNull, 0) << "/dev/null, another major the fence leaves alone: " << errnoName(opens.devNull);
}

TEST_F(DeviceFenceV2, RanksOpenOnlyTheirGpus) {
  const auto fenced_ = fenceDevicesV2(cgroup_->path(), DeviceFence{.major = 195, .allowedMinors = {0, 255}});
  ASSERT_TRUE(fenced_.ok()) << fenced_.error().message;
  expectOnlyGpus0And255(openFrom(cgroup_->path() + "/cgroup.procs"), cgroup_->path());
}

TEST_F(DeviceFenceV2, WithoutAFenceEveryGpuReachesTheDriver) {
  const Opens opens = openFrom(cgroup_->path() + "/cgroup.procs");
  ASSERT_EQ(opens.joined, 0) << errnoName(opens.joined);
  EXPECT_TRUE(reachesDriver(opens.gpu1)) << "195:1 in an unfenced cgroup";
  EXPECT_TRUE(reachesDriver(opens.gpu0));
}

TEST_F(DeviceFenceV2, AFenceOnAnotherMajorLeavesTheGpusAlone) {
  const auto fenced_ = fenceDevicesV2(cgroup_->path(), DeviceFence{.major = 196, .allowedMinors = {}});
  ASSERT_TRUE(fenced_.ok()) << fenced_.error().message;
  const Opens opens = openFrom(cgroup_->path() + "/cgroup.procs");
  ASSERT_EQ(opens.joined, 0) << errnoName(opens.joined);
  EXPECT_TRUE(reachesDriver(opens.gpu1));
  EXPECT_EQ(opens.devNull, 0) << errnoName(opens.devNull);
}

TEST_F(DeviceFenceV2, AV1CgroupIsRefusedSayingWhy) {
  if (!isCgroup2(root_) || ::access(kV1DevicesRoot, F_OK) != 0) GTEST_SKIP() << "not a hybrid host";
  const Cgroup v1(kV1DevicesRoot);
  const auto result = fenceDevicesV2(v1.path(), DeviceFence{.major = 195, .allowedMinors = {0}});
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error().message.find(v1.path()), std::string::npos) << result.error().message;
  EXPECT_NE(result.error().message.find("cgroup2"), std::string::npos) << result.error().message;
}

TEST_F(DeviceFenceV1, RanksOpenOnlyTheirGpus) {
  const auto fenced_ = fenceDevicesV1(cgroup_->path(), DeviceFence{.major = 195, .allowedMinors = {0, 255}});
  ASSERT_TRUE(fenced_.ok()) << fenced_.error().message;
  expectOnlyGpus0And255(openFrom(cgroup_->path() + "/cgroup.procs"), cgroup_->path());
}

TEST_F(DeviceFenceV1, WithoutAFenceEveryGpuReachesTheDriver) {
  const Opens opens = openFrom(cgroup_->path() + "/cgroup.procs");
  ASSERT_EQ(opens.joined, 0) << errnoName(opens.joined);
  EXPECT_TRUE(reachesDriver(opens.gpu1)) << "195:1 in an unfenced cgroup";
}

// Needs no root: the directory is not there for anyone.
TEST(DeviceFence, AMissingCgroupIsAClearError) {
  const std::string missing = "/sys/fs/cgroup/unified/" + uniqueName() + "-missing";
  const auto v2 = fenceDevicesV2(missing, DeviceFence{.major = 195, .allowedMinors = {0}});
  ASSERT_FALSE(v2.ok());
  EXPECT_NE(v2.error().message.find(missing), std::string::npos) << v2.error().message;
  EXPECT_NE(v2.error().message.find(std::strerror(ENOENT)), std::string::npos) << v2.error().message;

  const std::string missingV1 = std::string(kV1DevicesRoot) + "/" + uniqueName() + "-missing";
  const auto v1 = fenceDevicesV1(missingV1, DeviceFence{.major = 195, .allowedMinors = {0}});
  ASSERT_FALSE(v1.ok());
  EXPECT_NE(v1.error().message.find(missingV1), std::string::npos) << v1.error().message;
  EXPECT_NE(v1.error().message.find(std::strerror(ENOENT)), std::string::npos) << v1.error().message;
}

TEST(DeviceFence, AnImpossibleDeviceNumberIsRefused) {
  const auto result = fenceDevicesV2("/nonexistent", DeviceFence{.major = 195, .allowedMinors = {1u << 20}});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code, ErrorCode::kInvalidArgument) << result.error().message;
}

}  // namespace
}  // namespace lockstep::test
