#pragma once
// Text helpers shared by the report's renderers; private to report/. Figures are shown as the
// presentation module (lockstep/present) shows them everywhere.
//
// Everything here is locale-independent (std::to_chars, gmtime_r): Qt applications set the C
// library's locale from the environment, and a decimal comma would break SVG coordinates, CSV and
// JSON.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "lockstep/present/present.h"

namespace lockstep::report::detail {

inline constexpr std::string_view kDash = present::kUnknown;
inline std::string dash() { return std::string(kDash); }
using present::bytes;
using present::duration;
using present::figure;
using present::number;
using present::percent;
using present::plainNumber;

// A setting as written: 25 -> "25", 12.5 -> "12.5", 0.001 -> "0.001".
std::string compact(double value);
// The shortest text that reads back as the same double (CSV): "0.1", "1e-08", "nan".
std::string shortest(double value);
std::string shortest(float value);

// & < > " ' as entities; valid in XML text, attributes and HTML alike.
std::string xmlEscape(std::string_view text);

// One kind of collective over the window (docs/kpis.md), as the report's key figures show it, a
// row each: "12.0% exposed of 30.1%" and "4 per step · 8.0 MiB · 9.5 GB/s bus".
std::string collectiveShares(const kpi::CollectiveKpis& c);
std::string collectiveSizes(const kpi::CollectiveKpis& c);

std::string isoTime(std::int64_t unixUs);                               // 2024-05-01T12:00:00Z
std::string displayTime(std::int64_t unixUs);                           // 2024-05-01 12:00:00 UTC

}  // namespace lockstep::report::detail
