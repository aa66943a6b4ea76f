#include "jobs/job_cgroup.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "base/host.h"
#include "lockstep/common/fd.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;

// The leaf an agent moves into when its cgroup must be empty to enable controllers for its jobs.
constexpr const char* kAgentLeaf = "lockstep-agent";

Result<void> writeTo(const std::string& path, const std::string& text) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (fd.valid() && ::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size())) return {};
  const int error = errno;
  Error why = errnoError("cannot write '" + text + "' to " + path, error);
  errno = error;  // for a caller that tells EBUSY from the rest
  return why;
}

std::string readTrimmed(const std::string& path) {
  std::string text = readKernelFile(path).value_or("");
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  return text;
}

std::set<std::string> words(const std::string& text, char separator) {
  std::set<std::string> out;
  std::istringstream in(text);
  for (std::string word; std::getline(in, word, separator);) {
    if (!word.empty()) out.insert(word);
  }
  return out;
}

bool writable(const std::string& dir) {
  return ::access(dir.c_str(), W_OK) == 0 && ::access((fs::path(dir) / "cgroup.procs").c_str(), W_OK) == 0;
}

struct Mount {
  std::string root, point, type;
  std::set<std::string> options;  // the super options: a v1 hierarchy's controllers
};

std::vector<Mount> cgroupMounts() {
  std::vector<Mount> mounts;
  std::istringstream lines(readKernelFile("/proc/self/mountinfo").value_or(""));
  for (std::string line; std::getline(lines, line);) {
    const auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream head(line.substr(0, dash)), tail(line.substr(dash + 3));
    Mount m;
    std::string id, parent, device, options, source, superOptions;
    head >> id >> parent >> device >> m.root >> m.point;
    tail >> m.type >> source >> superOptions;
    if (m.type != "cgroup" && m.type != "cgroup2") continue;
    m.options = words(superOptions, ',');
    mounts.push_back(std::move(m));
  }
  return mounts;
}

// A process's cgroup in each hierarchy, from /proc/PID/cgroup (`file`), by its key ("" for
// cgroup2, else a v1 hierarchy's controllers, "cpu,cpuacct").
std::map<std::string, std::string> cgroupsIn(const std::string& file) {
  std::map<std::string, std::string> out;
  std::istringstream lines(readKernelFile(file).value_or(""));
  for (std::string line; std::getline(lines, line);) {
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    out[line.substr(first + 1, second - first - 1)] = line.substr(second + 1);
  }
  return out;
}

std::map<std::string, std::string> ownCgroups() { return cgroupsIn("/proc/self/cgroup"); }

// Whether /proc/PID/cgroup's `key` names the hierarchy mounted as `m`.
bool names(const Mount& m, const std::string& key) {
  if (m.type == "cgroup2") return key.empty();
  const auto controllers = words(key, ',');
  return !controllers.empty() &&
         std::all_of(controllers.begin(), controllers.end(), [&](const std::string& c) { return m.options.count(c) > 0; });
}

// Whether `inside` is `dir` or below it (both absolute, normalized, without trailing slashes).
bool within(const std::string& inside, const std::string& dir) {
  return inside == dir || dir == "/" ||
         (inside.size() > dir.size() && inside.compare(0, dir.size(), dir) == 0 && inside[dir.size()] == '/');
}

// `path` (as /proc/self/cgroup says it) under a mount of its hierarchy.
std::string underMount(const Mount& m, const std::string& path) {
  fs::path relative = fs::path(path).lexically_relative(m.root);
  if (relative.empty() || relative.native().rfind("..", 0) == 0) return "";
  std::string dir = (fs::path(m.point) / relative).lexically_normal().string();
  if (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

// A v1 hierarchy's directory of the agent's cgroup holding `controller`, or "" and why not.
std::string v1Base(const std::string& controller, std::string* why) {
  const auto own = ownCgroups();
  for (const Mount& m : cgroupMounts()) {
    if (m.type != "cgroup" || !m.options.count(controller)) continue;
    for (const auto& [key, path] : own) {
      if (!words(key, ',').count(controller)) continue;
      const std::string base = underMount(m, path);
      if (!base.empty() && writable(base)) return base;
      *why = "the agent's " + controller + " cgroup " + (base.empty() ? path : base) + " is not its to write";
      return "";
    }
  }
  *why = "no cgroup hierarchy holds the " + controller + " controller";
  return "";
}

// Enables `wanted` for the agent's subtree of the cgroup2 hierarchy: those its cgroup has. When
// its cgroup must be empty first (it holds the agent), the agent moves into a leaf of its own.
std::set<std::string> enableV2(const std::string& base, const std::set<std::string>& wanted, std::string* why) {
  std::set<std::string> present;
  for (const auto& c : words(readTrimmed(base + "/cgroup.controllers"), ' ')) {
    if (wanted.count(c)) present.insert(c);
  }
  bool busy = false;  // the cgroup holds processes, which it may not once its subtree has controllers
  const auto enableAll = [&] {
    std::set<std::string> on = words(readTrimmed(base + "/cgroup.subtree_control"), ' ');
    for (const auto& c : present) {
      if (on.count(c)) continue;
      const int error = writeTo(base + "/cgroup.subtree_control", "+" + c) ? 0 : errno;
      if (error == 0) on.insert(c);
      busy = busy || error == EBUSY;
    }
    return on;
  };
  std::set<std::string> on = enableAll();
  if (on.size() < present.size() && busy) {
    if (base.size() > 8 && base.ends_with(".service")) {
      // systemd before 254 puts a restarted unit's main process in the unit's cgroup, which it may
      // no longer hold once its subtree has controllers (jobs outlive the agent): the next start
      // would fail. DelegateSubgroup=lockstep-agent (systemd 254) starts it in the leaf instead.
      *why = "the agent runs in the systemd unit's own cgroup " + base +
             " (systemd 254 or later: DelegateSubgroup=lockstep-agent in the unit)";
      return on;
    }
    const std::string procs = readTrimmed(base + "/cgroup.procs");
    if (procs != std::to_string(::getpid())) {
      *why = "the agent's cgroup " + base + " holds other processes (run the agent alone in a unit with Delegate=yes)";
      return on;
    }
    const std::string leaf = base + "/" + kAgentLeaf;
    if ((::mkdir(leaf.c_str(), 0755) == 0 || errno == EEXIST) && writeTo(leaf + "/cgroup.procs", "0")) on = enableAll();
  }
  if (on.size() < present.size()) *why = "cannot enable controllers in " + base + "/cgroup.subtree_control";
  return on;
}

// Whether the kernel takes a device filter on the agent's cgroups (root, or CAP_SYS_ADMIN).
bool bpfDevicesWork(const std::string& base, std::string* why) {
  const std::string probe = base + "/lockstep-probe-" + std::to_string(::getpid());
  if (::mkdir(probe.c_str(), 0755) != 0 && errno != EEXIST) {
    *why = "cannot make a cgroup in " + base;
    return false;
  }
  auto fenced = fenceDevicesV2(probe, DeviceFence{});
  ::rmdir(probe.c_str());
  if (!fenced) *why = fenced.error().message;
  return fenced.ok();
}

void addCpus(NodeCgroups& node) {
  const std::string effective = node.cpuset.v2 ? "/cpuset.cpus.effective" : "/cpuset.effective_cpus";
  if (node.cpuset.available()) {
    node.cpus = parseCpuList(readTrimmed(node.cpuset.base + effective));
    node.mems = readTrimmed(node.cpuset.base + (node.cpuset.v2 ? "/cpuset.mems.effective" : "/cpuset.effective_mems"));
  }
  if (node.cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) == 0) {
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set)) node.cpus.push_back(cpu);
      }
    }
  }
}

// One controller: from the cgroup2 hierarchy where it is on there, else its v1 hierarchy.
CgroupHierarchy controller(NodeCgroups& node, const std::set<std::string>& onV2, const std::string& name,
                           const std::string& fence, const std::string& v2Why) {
  if (onV2.count(name)) return {node.unified.base, true};
  std::string why;
  std::string base = v1Base(name, &why);
  if (base.empty()) node.off.push_back(fence + ": " + (v2Why.empty() ? why : v2Why));
  return {base, false};
}

}  // namespace

std::optional<std::string> jobCgroupBase(std::string* why) {
  const auto own = ownCgroups();
  const auto v2 = own.find("");
  for (const Mount& m : cgroupMounts()) {
    if (m.type != "cgroup2" || v2 == own.end()) continue;
    fs::path base = underMount(m, v2->second);
    if (base.filename() == kAgentLeaf) base = base.parent_path();
    if (base.empty() || !writable(base.string())) {
      *why = "the agent's cgroup " + base.string() + " is not delegated to it (a unit needs Delegate=yes)";
      return std::nullopt;
    }
    return base.string();
  }
  *why = v2 == own.end() ? "the agent is in no cgroup2 cgroup" : "no cgroup2 hierarchy is mounted";
  return std::nullopt;
}

NodeCgroups probeCgroups(bool enable) {
  NodeCgroups node;
  std::string why;
  node.unified.base = jobCgroupBase(&why).value_or("");
  node.unified.v2 = true;
  if (!node.unified.available()) node.off.push_back("kill: " + why);
  std::string v2Why;
  std::set<std::string> onV2;
  if (node.unified.available()) {
    onV2 = enable ? enableV2(node.unified.base, {"memory", "pids", "cpuset"}, &v2Why)
                  : words(readTrimmed(node.unified.base + "/cgroup.subtree_control"), ' ');
  }
  node.memory = controller(node, onV2, "memory", "memory", v2Why);
  node.pids = controller(node, onV2, "pids", "processes", v2Why);
  node.cpuset = controller(node, onV2, "cpuset", "cores", v2Why);
  std::string devicesWhy;
  node.devices = {v1Base("devices", &devicesWhy), false};
  if (!node.devices.available() && node.unified.available() && bpfDevicesWork(node.unified.base, &devicesWhy)) {
    node.devices = {node.unified.base, true};
  }
  if (!node.devices.available()) node.off.push_back("GPUs: " + devicesWhy);
  if (::geteuid() != 0 && (node.memory.available() || node.pids.available() || node.cpuset.available())) {
    node.off.push_back("enforcement: jobs run as the agent's own user, who owns their cgroups and may raise their limits");
  }
  addCpus(node);
  return node;
}

bool inCgroups(pid_t pid, const std::vector<std::string>& dirs) {
  if (dirs.empty()) return true;
  const auto of = cgroupsIn("/proc/" + std::to_string(pid) + "/cgroup");
  const auto mounts = cgroupMounts();
  const auto in = [&](const std::string& dir) {
    std::string wanted = fs::path(dir).lexically_normal().string();
    while (wanted.size() > 1 && wanted.back() == '/') wanted.pop_back();
    for (const Mount& m : mounts) {
      if (!within(wanted, m.point)) continue;
      for (const auto& [key, path] : of) {
        if (names(m, key)) return within(underMount(m, path), wanted);
      }
      return false;
    }
    return false;
  };
  return std::all_of(dirs.begin(), dirs.end(), in);
}

std::vector<std::string> PartCgroups::distinct() const {
  std::vector<std::string> out;
  for (const std::string* dir : {&unified, &memory, &pids, &cpuset, &devices}) {
    if (!dir->empty() && std::find(out.begin(), out.end(), *dir) == out.end()) out.push_back(*dir);
  }
  return out;
}

namespace {

std::string sanitized(std::string name) {
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  }
  return name;
}

}  // namespace

std::string partCgroupPrefix(const std::string& node, const std::string& stateDir) {
  char digest[9];
  std::snprintf(digest, sizeof digest, "%08x", static_cast<unsigned>(std::hash<std::string>{}(stateDir) & 0xffffffffu));
  return sanitized("lockstep-" + node + "-" + digest + "-");
}

std::string partCgroupName(const std::string& node, const std::string& stateDir, const std::string& jobId,
                           std::uint32_t attempt) {
  return partCgroupPrefix(node, stateDir) + sanitized(jobId + "-" + std::to_string(attempt));
}

int removeCgroupsNamed(const std::string& prefix) {
  std::vector<std::string> bases;
  std::string why;
  if (auto unified = jobCgroupBase(&why)) bases.push_back(*unified);
  for (const char* controller : {"memory", "pids", "cpuset", "devices"}) {
    if (std::string base = v1Base(controller, &why); !base.empty()) bases.push_back(base);
  }
  std::vector<std::string> left;
  for (const auto& base : bases) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(base, ec)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_directory(ec) && name.rfind(prefix, 0) == 0) left.push_back(entry.path().string());
    }
  }
  for (const auto& dir : left) killPart(PartCgroups{dir});
  for (int i = 0; i < 200 && !left.empty(); ++i) {
    std::erase_if(left, [](const std::string& dir) { return ::rmdir(dir.c_str()) == 0 || errno == ENOENT; });
    if (!left.empty()) ::usleep(10000);
  }
  return static_cast<int>(left.size());
}

PartCgroups partCgroups(const NodeCgroups& node, const std::string& name) {
  const auto in = [&](const CgroupHierarchy& h) { return h.available() ? (fs::path(h.base) / name).string() : ""; };
  return {in(node.unified), in(node.memory), in(node.pids), in(node.cpuset), in(node.devices)};
}

namespace {

Result<void> makeFresh(const std::string& path) {
  if (::rmdir(path.c_str()) != 0 && errno == EBUSY) {
    killPart(PartCgroups{path});  // what an earlier run of this attempt left (the agent was away when it ended)
    for (int i = 0; i < 100 && ::rmdir(path.c_str()) != 0 && errno == EBUSY; ++i) ::usleep(10000);
  }
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) return errnoError("cannot replace the job's cgroup " + path, errno);
  if (::mkdir(path.c_str(), 0755) != 0) return errnoError("cannot make the job's cgroup " + path, errno);
  return {};
}

bool has(const std::string& dir, const char* file) { return ::access((fs::path(dir) / file).c_str(), F_OK) == 0; }

Result<void> limitMemory(const std::string& dir, std::uint64_t bytes) {
  const std::string limit = std::to_string(bytes);
  if (has(dir, "memory.max")) {
    LOCKSTEP_TRY(writeTo(dir + "/memory.max", limit));
    if (has(dir, "memory.swap.max")) LOCKSTEP_TRY(writeTo(dir + "/memory.swap.max", "0"));
    return {};
  }
  LOCKSTEP_TRY(writeTo(dir + "/memory.limit_in_bytes", limit));
  // With swap accounting, memory and swap together: a rank over its limit is killed, not swapped.
  if (has(dir, "memory.memsw.limit_in_bytes")) LOCKSTEP_TRY(writeTo(dir + "/memory.memsw.limit_in_bytes", limit));
  return {};
}

Result<void> limitCpus(const NodeCgroups& node, const std::string& dir, const std::vector<int>& cpus) {
  // A v1 cpuset starts with no cores and no memory nodes, and takes no process until it has both.
  if (!node.cpuset.v2) LOCKSTEP_TRY(writeTo(dir + "/cpuset.mems", node.mems));
  return writeTo(dir + "/cpuset.cpus", cpuListText(cpus.empty() ? node.cpus : cpus));
}

}  // namespace

Result<void> makePartCgroups(const NodeCgroups& node, const PartCgroups& part, const PartLimits& limits) {
  for (const auto& dir : part.distinct()) LOCKSTEP_TRY(makeFresh(dir));
  if (!part.memory.empty() && limits.memoryBytes > 0) LOCKSTEP_TRY(limitMemory(part.memory, limits.memoryBytes));
  if (!part.pids.empty() && limits.processes > 0) LOCKSTEP_TRY(writeTo(part.pids + "/pids.max", std::to_string(limits.processes)));
  if (!part.cpuset.empty()) LOCKSTEP_TRY(limitCpus(node, part.cpuset, limits.cpus));
  if (!part.devices.empty()) {
    LOCKSTEP_TRY(node.devices.v2 ? fenceDevicesV2(part.devices, limits.devices) : fenceDevicesV1(part.devices, limits.devices));
  }
  return {};
}

namespace {

// "KEY N" from a flat-keyed cgroup file.
std::uint64_t counted(const std::string& path, const std::string& key) {
  std::istringstream lines(readKernelFile(path).value_or(""));
  for (std::string name; lines >> name;) {
    std::uint64_t value = 0;
    if (!(lines >> value)) break;
    if (name == key) return value;
  }
  return 0;
}

}  // namespace

PartEvents partEvents(const PartCgroups& part) {
  PartEvents events;
  if (!part.memory.empty()) {
    events.oomKills = counted(part.memory + (has(part.memory, "memory.events") ? "/memory.events" : "/memory.oom_control"), "oom_kill");
  }
  if (!part.pids.empty()) events.forksRefused = counted(part.pids + "/pids.events", "max");
  return events;
}

void killPart(const PartCgroups& part) {
  if (!part.unified.empty() && writeTo(part.unified + "/cgroup.kill", "1")) return;
  // Without cgroup.kill, what forks while being killed is killed on a later round.
  for (int round = 0; round < 20; ++round) {
    bool any = false;
    for (const auto& dir : part.distinct()) {
      std::istringstream pids(readKernelFile(dir + "/cgroup.procs").value_or(""));
      for (pid_t pid; pids >> pid; any = true) ::kill(pid, SIGKILL);
    }
    if (!any) return;
    ::usleep(5000);
  }
}

bool removePart(const PartCgroups& part) {
  bool gone = true;
  for (const auto& dir : part.distinct()) gone = (::rmdir(dir.c_str()) == 0 || errno == ENOENT) && gone;
  return gone;
}

std::string cpuListText(const std::vector<int>& cpus) {
  std::string text;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    text += (text.empty() ? "" : ",") + std::to_string(cpus[i]) + (j > i ? "-" + std::to_string(cpus[j]) : "");
    i = j + 1;
  }
  return text;
}

std::vector<int> parseCpuList(const std::string& text) {
  std::vector<int> cpus;
  for (const auto& range : words(text, ',')) {
    int first = -1, last = -1;
    const int n = std::sscanf(range.c_str(), "%d-%d", &first, &last);
    if (n < 1 || first < 0) continue;
    for (int cpu = first; cpu <= (n == 2 ? std::min(last, first + 65535) : first); ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

}  // namespace lockstep::agent
