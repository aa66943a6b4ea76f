#pragma once
// Range, size and consistency checks shared by every part: the trainer validates its flags with
// validateJobSpec, the agent validates StartJob with it, the codec validates what it decodes.
// Errors are InvalidArgument and say which field is wrong and what would be right.

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep {

Result<void> validateJobId(const std::string& jobId);
// A job spec on its own: sizes, ranges, exactly one of steps/epochs, rank placements.
// Dataset files are not opened here (that needs the node's file system).
Result<void> validateJobSpec(const JobSpec& spec);
Result<void> validateNodeHello(const NodeHello& hello);
Result<void> validateJobEvent(const JobEvent& event);
Result<void> validateGpuSample(const GpuSample& sample);
Result<void> validateProcessSample(const ProcessSample& sample);
Result<void> validateStepReport(const StepReport& report);

}  // namespace lockstep
