#pragma once
// A job's GPUs as Slurm's ConstrainDevices fences them: the ranks of a job given GPUs 0 and 3 may
// open /dev/nvidia0 and /dev/nvidia3 (and nvidiactl, nvidia-modeset, which every CUDA process
// needs), and another job's GPUs fail to open with EPERM, whatever CUDA_VISIBLE_DEVICES says.
// The fence is the kernel's: the cgroup's device filter, checked at open(2), so a rank that
// ignores its environment (or a debugger the user ran in the job) cannot reach another GPU.

#include <string>
#include <vector>

#include "lockstep/common/result.h"

namespace lockstep::agent {

// A job's ranks may open, of the character devices of major `major` (195: NVIDIA's GPUs
// /dev/nvidiaN, nvidia-modeset 254, nvidiactl 255), only the minors in `allowedMinors`; every
// other device is left as it was (what the cgroup's parents allow).
struct DeviceFence {
  unsigned major = 195;
  std::vector<unsigned> allowedMinors;
};

// cgroup v2: attaches a BPF_PROG_TYPE_CGROUP_DEVICE program (the raw bpf(2) syscall, no libbpf)
// to the cgroup2 directory `cgroupDir` with BPF_F_ALLOW_MULTI: it stays attached after the
// agent's descriptors are closed (until the cgroup is removed), and filters of the cgroup's
// parents (systemd's, a container's) still apply beside it. Works on a hybrid host too: device
// programs need no cgroup2 controller. Call it before the job's first process joins the cgroup.
Result<void> fenceDevicesV2(const std::string& cgroupDir, const DeviceFence& fence);

// cgroup v1 devices controller: writes "c MAJOR:MINOR rwm" to `devicesCgroupDir`/devices.deny
// for every minor 0..255 that is not allowed. A fence only narrows: call it once, on a cgroup
// made anew for the job (an allowed minor that an earlier fence denied stays denied).
Result<void> fenceDevicesV1(const std::string& devicesCgroupDir, const DeviceFence& fence);

}  // namespace lockstep::agent
