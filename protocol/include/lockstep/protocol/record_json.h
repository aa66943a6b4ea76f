#pragma once
// A streamed record as one line of JSON, by its description (records.h): the schema's field
// names as keys in the schema's order, unknown values (an empty optional, a NaN) as null. The
// trainer's --metrics-out lines are step reports written so. Reading checks each field's type and
// range and names the field that is wrong; a field the line lacks is an error, unless it may be
// unknown (then it is).

#include <string>
#include <string_view>
#include <vector>

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep {

// One line, ending in "\n".
template <class R>
std::string toJsonLine(const R& record);

// `what` names the line in errors: "not a step report line: \"rank\" must be ...".
template <class R>
Result<R> fromJsonLine(std::string_view line, std::string_view what);

// A list a record holds (its collectives), as a JSON array of objects: the history's column.
template <class R>
std::string listToJson(const std::vector<R>& items);
template <class R>
Result<std::vector<R>> listFromJson(std::string_view text);

extern template std::string toJsonLine(const JobEvent&);
extern template std::string toJsonLine(const GpuSample&);
extern template std::string toJsonLine(const ProcessSample&);
extern template std::string toJsonLine(const NetSample&);
extern template std::string toJsonLine(const StepReport&);
extern template std::string toJsonLine(const PhaseReport&);
extern template Result<JobEvent> fromJsonLine(std::string_view, std::string_view);
extern template Result<GpuSample> fromJsonLine(std::string_view, std::string_view);
extern template Result<ProcessSample> fromJsonLine(std::string_view, std::string_view);
extern template Result<NetSample> fromJsonLine(std::string_view, std::string_view);
extern template Result<StepReport> fromJsonLine(std::string_view, std::string_view);
extern template Result<PhaseReport> fromJsonLine(std::string_view, std::string_view);
extern template std::string listToJson(const std::vector<CollectiveTimes>&);
extern template std::string listToJson(const std::vector<CollectiveSpan>&);
extern template Result<std::vector<CollectiveTimes>> listFromJson(std::string_view);
extern template Result<std::vector<CollectiveSpan>> listFromJson(std::string_view);

}  // namespace lockstep
