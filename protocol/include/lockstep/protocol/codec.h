#pragma once
// Bytes <-> validated domain structs. Decoding refuses oversized input, unparsable bytes, missing
// required fields and out-of-range values with an InvalidArgument error that names the field.
// Stateless and thread-safe.

#include <cstddef>
#include <string>
#include <string_view>

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep {

// Larger messages are refused before parsing. A StartJob placing the most ranks a job may have
// (32,768, spec_fields.h) is about 2.5 MB.
inline constexpr std::size_t kMaxMessageBytes = 4u << 20;

std::string encode(const Request& request);
std::string encode(const Reply& reply);
std::string encode(const StreamMessage& message);

Result<Request> decodeRequest(std::string_view bytes, std::size_t maxBytes = kMaxMessageBytes);
Result<Reply> decodeReply(std::string_view bytes, std::size_t maxBytes = kMaxMessageBytes);
Result<StreamMessage> decodeStreamMessage(std::string_view bytes,
                                          std::size_t maxBytes = kMaxMessageBytes);

// A job spec in protobuf's JSON mapping of lockstep.v1.JobSpec (lowerCamelCase names, enums by
// name), for job files: `lockstepctl start --spec job.json`, and on one line for the agent to hand
// a rank (`lockstep-trainer --spec JSON`). Parsing validates like decoding.
std::string jobSpecToJson(const JobSpec& spec, bool oneLine = false);
Result<JobSpec> jobSpecFromJson(std::string_view json);

}  // namespace lockstep
