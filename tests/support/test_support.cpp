#include "test_support.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace lockstep::test {

TempDir::TempDir() : TempDir(std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp") {}

TempDir::TempDir(const std::string& base) {
  std::string pattern = base + "/lockstep-test-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string builtBinary(const char* name, const char* builtPath) {
  // Binaries carried to another machine (the GPU machine) live beside each other there.
  if (const char* dir = std::getenv("LOCKSTEP_TEST_BIN_DIR"); dir && *dir) return std::string(dir) + "/" + name;
  return builtPath;
}

std::vector<std::string> join(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string trainerPath() { return builtBinary("lockstep-trainer", LOCKSTEP_TRAINER_PATH); }

pid_t startProcess(const std::vector<std::string>& argv, const Env& env, const std::string& stdoutPath,
                   const std::string& stderrPath) {
  SpawnOptions options;
  options.argv = argv;
  options.env = env;
  options.stdoutPath = stdoutPath;
  options.stderrPath = stderrPath;
  auto pid = spawnProcess(options);
  if (!pid) throw std::runtime_error(pid.error().message);
  return *pid;
}

ProcessResult runProcess(const std::vector<std::string>& argv, const Env& env, const TempDir& dir,
                         std::chrono::milliseconds timeout) {
  static int counter = 0;
  const std::string tag = std::to_string(++counter);
  const std::string outPath = dir.file("stdout-" + tag + ".txt");
  const std::string errPath = dir.file("stderr-" + tag + ".txt");
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = startProcess(argv, env, outPath, errPath);
  ProcessResult result;
  auto waited = waitProcess(pid, timeout);
  if (!waited || !waited->has_value()) {
    result.timedOut = true;
    ::kill(pid, SIGKILL);
    auto killed = waitProcess(pid, std::chrono::seconds(10));
    if (killed && killed->has_value()) result.status = **killed;
  } else {
    result.status = **waited;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.out = readText(outPath);
  result.err = readText(errPath);
  return result;
}

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<nlohmann::json> readJsonLines(const std::string& path) {
  // The file may be growing: a line counts once its newline is there.
  const std::string text = readText(path);
  std::vector<nlohmann::json> out;
  std::size_t start = 0, end;
  while ((end = text.find('\n', start)) != std::string::npos) {
    if (end > start) out.push_back(nlohmann::json::parse(text.substr(start, end - start)));
    start = end + 1;
  }
  return out;
}

void writeNpy(const std::string& path, const std::string& descr, const std::vector<std::uint64_t>& shape,
              const void* data, std::size_t bytes) {
  std::string shapeText = "(";
  for (auto d : shape) shapeText += std::to_string(d) + ", ";
  if (shape.size() > 1) shapeText.resize(shapeText.size() - 2);
  if (shape.size() == 1) shapeText.resize(shapeText.size() - 1);
  shapeText += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shapeText + ", }";
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const auto len = static_cast<std::uint16_t>(header.size());
  const char lenBytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(lenBytes, 2);
  out << header;
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

std::uint16_t freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

bool waitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

std::vector<pid_t> childrenOf(pid_t pid) {
  std::vector<pid_t> out;
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  pid_t child;
  while (in >> child) out.push_back(child);
  return out;
}

std::optional<std::string> environOf(pid_t pid, const std::string& name) {
  const std::string all = readText("/proc/" + std::to_string(pid) + "/environ");
  std::size_t start = 0;
  while (start < all.size()) {
    const std::size_t end = all.find('\0', start);
    const std::string entry = all.substr(start, end - start);
    if (entry.rfind(name + "=", 0) == 0) return entry.substr(name.size() + 1);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return std::nullopt;
}

std::vector<pid_t> livingProcessesInGroup(pid_t pgid) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = readText("/proc/" + name + "/stat");
    // pid (comm) state ppid pgrp ...: comm may hold spaces, so parse after the last ')'.
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    char state = 0;
    pid_t ppid = 0, group = 0;
    rest >> state >> ppid >> group;
    if (group == pgid && state != 'Z') out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

std::int64_t residentKib(pid_t pid) {
  std::ifstream status("/proc/" + (pid == 0 ? std::string("self") : std::to_string(pid)) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

}  // namespace lockstep::test
