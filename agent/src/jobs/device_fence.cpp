#include "jobs/device_fence.h"

#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/bpf_common.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "lockstep/common/fd.h"

namespace lockstep::agent {
namespace {

constexpr unsigned kMaxMajor = (1u << 12) - 1;  // the kernel's dev_t: 12 bits of major, 20 of minor
constexpr unsigned kMaxMinor = (1u << 20) - 1;

// errnoError's "what: strerror" and, where the errno alone would leave the reader guessing, why.
Error refused(const std::string& what, int err, const std::string& hint) {
  Error error = errnoError(what, err);
  if (!hint.empty()) error.message += " (" + hint + ")";
  return error;
}

Result<void> checkFence(const DeviceFence& fence) {
  if (fence.major > kMaxMajor) return invalidArgument("device major " + std::to_string(fence.major) + " is over 4095");
  for (unsigned minor : fence.allowedMinors) {
    if (minor > kMaxMinor) return invalidArgument("device minor " + std::to_string(minor) + " is over 1048575");
  }
  return {};
}

bool allowed(const DeviceFence& fence, unsigned minor) {
  return std::find(fence.allowedMinors.begin(), fence.allowedMinors.end(), minor) != fence.allowedMinors.end();
}

// --- cgroup v2: the BPF device program -------------------------------------------------------

// The few instruction shapes the program needs, as the kernel's BPF_* macros (filter.h, not
// exported to user space) would write them.
constexpr bpf_insn loadCtxWord(std::uint8_t dst, std::size_t offset) {  // dst = *(u32*)(r1 + offset)
  return {.code = BPF_LDX | BPF_MEM | BPF_W, .dst_reg = dst, .src_reg = BPF_REG_1,
          .off = static_cast<std::int16_t>(offset), .imm = 0};
}
constexpr bpf_insn andImmediate(std::uint8_t dst, std::int32_t imm) {  // dst &= imm
  return {.code = BPF_ALU | BPF_AND | BPF_K, .dst_reg = dst, .src_reg = 0, .off = 0, .imm = imm};
}
constexpr bpf_insn jumpImmediate(std::uint8_t op, std::uint8_t dst, std::uint32_t imm) {  // if (dst op imm) goto; off patched later
  return {.code = static_cast<std::uint8_t>(BPF_JMP | op | BPF_K), .dst_reg = dst, .src_reg = 0, .off = 0,
          .imm = static_cast<std::int32_t>(imm)};
}
constexpr bpf_insn moveImmediate(std::uint8_t dst, std::int32_t imm) {  // dst = imm (64-bit)
  return {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = dst, .src_reg = 0, .off = 0, .imm = imm};
}
constexpr bpf_insn exitProgram() { return {.code = BPF_JMP | BPF_EXIT, .dst_reg = 0, .src_reg = 0, .off = 0, .imm = 0}; }

// r1 is the struct bpf_cgroup_dev_ctx; the program returns 1 to allow, 0 to deny:
//     r2 = ctx->access_type & 0xffff          (the low half is the type, the high half the access)
//     if r2 != BPF_DEVCG_DEV_CHAR goto allow
//     r3 = ctx->major; if r3 != MAJOR goto allow
//     r4 = ctx->minor; if r4 == ALLOWED_0 goto allow; if r4 == ALLOWED_1 goto allow ...
//     r0 = 0; exit
//   allow:
//     r0 = 1; exit
// Allowing what it does not fence leaves every other device to the other filters: with
// BPF_F_ALLOW_MULTI the kernel runs the cgroup's and its parents' programs, and an open passes
// only if every one of them allows it.
std::vector<bpf_insn> fenceProgram(const DeviceFence& fence) {
  std::vector<bpf_insn> program = {
      loadCtxWord(BPF_REG_2, offsetof(bpf_cgroup_dev_ctx, access_type)),
      andImmediate(BPF_REG_2, 0xffff),
      jumpImmediate(BPF_JNE, BPF_REG_2, BPF_DEVCG_DEV_CHAR),
      loadCtxWord(BPF_REG_3, offsetof(bpf_cgroup_dev_ctx, major)),
      jumpImmediate(BPF_JNE, BPF_REG_3, fence.major),
      loadCtxWord(BPF_REG_4, offsetof(bpf_cgroup_dev_ctx, minor)),
  };
  std::vector<std::size_t> jumpsToAllow = {2, 4};
  std::vector<unsigned> minors = fence.allowedMinors;
  std::sort(minors.begin(), minors.end());
  minors.erase(std::unique(minors.begin(), minors.end()), minors.end());
  for (unsigned minor : minors) {
    jumpsToAllow.push_back(program.size());
    program.push_back(jumpImmediate(BPF_JEQ, BPF_REG_4, minor));
  }
  program.push_back(moveImmediate(BPF_REG_0, 0));
  program.push_back(exitProgram());
  const std::size_t allow = program.size();
  program.push_back(moveImmediate(BPF_REG_0, 1));
  program.push_back(exitProgram());
  // A jump's offset counts from the instruction after it; fenceDevicesV2 keeps the program within
  // BPF_MAXINSNS (4096), so every offset fits its 16 bits.
  for (std::size_t at : jumpsToAllow) program[at].off = static_cast<std::int16_t>(allow - at - 1);
  return program;
}

long bpf(int command, bpf_attr& attr) { return ::syscall(__NR_bpf, command, &attr, sizeof attr); }

int loadProgram(const std::vector<bpf_insn>& program, char* log, std::uint32_t logSize) {
  static const char kLicense[] = "GPL";
  bpf_attr attr;
  std::memset(&attr, 0, sizeof attr);
  attr.prog_type = BPF_PROG_TYPE_CGROUP_DEVICE;
  attr.insns = reinterpret_cast<std::uintptr_t>(program.data());
  attr.insn_cnt = static_cast<std::uint32_t>(program.size());
  attr.license = reinterpret_cast<std::uintptr_t>(kLicense);
  if (log != nullptr) {
    attr.log_buf = reinterpret_cast<std::uintptr_t>(log);
    attr.log_size = logSize;
    attr.log_level = 1;
  }
  std::strncpy(attr.prog_name, "lockstep_fence", sizeof attr.prog_name - 1);
  return static_cast<int>(bpf(BPF_PROG_LOAD, attr));
}

// The loaded program's descriptor, or why the kernel refused it: its errno and, where the
// verifier refused it, the verifier's log. The log is asked for only on a second load after a
// refusal: a passing program's log is wasted work, and a log that outgrows its buffer would
// itself fail the load (ENOSPC).
Result<UniqueFd> load(const std::vector<bpf_insn>& program, const std::string& cgroupDir) {
  UniqueFd fd(loadProgram(program, nullptr, 0));
  if (fd.valid()) return fd;
  const int err = errno;
  const std::string what = "the kernel refused a device filter for " + cgroupDir;
  if (err == EPERM || err == EACCES) return refused(what, err, "the agent needs CAP_SYS_ADMIN and CAP_BPF");
  if (err == ENOSYS) return refused(what, err, "this kernel has no bpf(2): it was built without CONFIG_BPF_SYSCALL");
  std::string log(64 * 1024, '\0');
  UniqueFd again(loadProgram(program, log.data(), static_cast<std::uint32_t>(log.size())));
  if (again.valid()) return again;  // refused once, passed the second time: take it
  log.resize(std::strlen(log.c_str()));
  while (!log.empty() && log.back() == '\n') log.pop_back();
  return refused(what, err,
                 log.empty() ? "a bug in the agent's program: report it"
                             : "a bug in the agent's program: report it; the verifier said: " + log);
}

std::string attachHint(int err) {
  switch (err) {
    case EPERM:
    case EACCES: return "the agent needs CAP_SYS_ADMIN and CAP_BPF";
    case EBADF: return "it is not a directory of the cgroup2 hierarchy; on a hybrid host that is under /sys/fs/cgroup/unified";
    case EINVAL: return "this kernel may have been built without CONFIG_CGROUP_BPF";
    default: return "";
  }
}

// --- cgroup v1 ---------------------------------------------------------------------------------

Result<void> writeRule(int fd, const std::string& file, const std::string& rule) {
  // One rule a write(2): the kernel parses each write as a single rule.
  if (::write(fd, rule.data(), rule.size()) == static_cast<ssize_t>(rule.size())) return {};
  const int err = errno;
  return refused("cannot write \"" + rule + "\" to " + file, err, err == EPERM ? "the agent needs CAP_SYS_ADMIN" : "");
}

}  // namespace

Result<void> fenceDevicesV2(const std::string& cgroupDir, const DeviceFence& fence) {
  LOCKSTEP_TRY(checkFence(fence));
  // Opened first: a cgroup that is not there is the likelier mistake, and says so plainly.
  UniqueFd cgroup(::open(cgroupDir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!cgroup.valid()) {
    const int err = errno;
    return refused("cannot open the cgroup " + cgroupDir + " to fence its devices", err,
                   err == ENOENT ? "make the cgroup first" : "");
  }
  const std::vector<bpf_insn> program = fenceProgram(fence);
  if (program.size() > BPF_MAXINSNS) {
    return invalidArgument("a device fence of " + std::to_string(fence.allowedMinors.size()) +
                           " allowed minors is a program over the kernel's limit of " + std::to_string(BPF_MAXINSNS) +
                           " instructions; allow at most " + std::to_string(BPF_MAXINSNS - 10) + " minors");
  }
  LOCKSTEP_ASSIGN_OR_RETURN(UniqueFd filter, load(program, cgroupDir));
  bpf_attr attr;
  std::memset(&attr, 0, sizeof attr);
  attr.target_fd = static_cast<std::uint32_t>(cgroup.get());
  attr.attach_bpf_fd = static_cast<std::uint32_t>(filter.get());
  attr.attach_type = BPF_CGROUP_DEVICE;
  // ALLOW_MULTI: filters of other owners (systemd's on the cgroup's parents) stay, and run too;
  // without it, attaching would replace a program already on this cgroup, or fail where a parent
  // has one that does not allow overriding.
  attr.attach_flags = BPF_F_ALLOW_MULTI;
  if (bpf(BPF_PROG_ATTACH, attr) != 0) {
    const int err = errno;
    return refused("the kernel refused to attach a device filter to " + cgroupDir, err, attachHint(err));
  }
  return {};  // the cgroup holds the program now; closing `filter` does not detach it
}

// Why a deny for each minor, not "c MAJOR:* rwm" and an allow for each allowed minor: in a cgroup
// whose list allows all (default-allow, as every new v1 cgroup under an unrestricted parent is),
// devices.deny adds an exception and devices.allow only removes an exception that matches exactly
// (dev_exception_rm in security/device_cgroup.c). An allow of "c 195:0" finds no such exception
// beside "c 195:*" and removes nothing, so minor 0 would stay denied (checked on Linux 6.18: after
// "c 195:* rwm" to devices.deny and "c 195:0 rwm" to devices.allow, both accepted, opening 195:0
// gives EPERM; devices.list does not show it, as a default-allow cgroup lists only "a *:* rwm",
// never its exceptions). Switching the cgroup to default-deny ("a" to devices.deny) and allowing
// back every other device would mean listing every other major. So 256 exact denies (NVIDIA's
// minors are 0..255); allowed minors above 255 need no rule.
Result<void> fenceDevicesV1(const std::string& devicesCgroupDir, const DeviceFence& fence) {
  LOCKSTEP_TRY(checkFence(fence));
  const std::string file = devicesCgroupDir + "/devices.deny";
  UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    return refused("cannot open " + file + " to fence the cgroup's devices", err,
                   err == ENOENT ? "is " + devicesCgroupDir + " a cgroup of the v1 devices hierarchy?" : "");
  }
  const std::string prefix = "c " + std::to_string(fence.major) + ":";
  for (unsigned minor = 0; minor <= 255; ++minor) {
    if (!allowed(fence, minor)) LOCKSTEP_TRY(writeRule(fd.get(), file, prefix + std::to_string(minor) + " rwm"));
  }
  return {};
}

}  // namespace lockstep::agent
