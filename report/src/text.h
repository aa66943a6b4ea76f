#pragma once
// Text helpers shared by the report's renderers; private to report/.
//
// Everything here is locale-independent (std::to_chars, gmtime_r): Qt applications set the C
// library's locale from the environment, and a decimal comma would break SVG coordinates, CSV and
// JSON.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace lockstep::report::detail {

// Shown for an unknown value.
inline constexpr std::string_view kDash = "–";

// Fixed decimals with thousands separators: number(12400.25, 1) == "12,400.3". NaN/inf: "–".
std::string number(double value, int decimals);
// Fixed decimals without separators, for coordinates: plainNumber(3.14159, 1) == "3.1".
std::string plainNumber(double value, int decimals);
// A setting as written: 25 -> "25", 12.5 -> "12.5", 0.001 -> "0.001".
std::string compact(double value);
// The shortest text that reads back as the same double (CSV): "0.1", "1e-08", "nan".
std::string shortest(double value);
std::string shortest(float value);

// & < > " ' as entities; valid in XML text, attributes and HTML alike.
std::string xmlEscape(std::string_view text);

std::string isoTime(std::int64_t unixUs);                               // 2024-05-01T12:00:00Z
std::string displayTime(std::int64_t unixUs);                           // 2024-05-01 12:00:00 UTC
std::string duration(double seconds);                                   // 42 s, 3.5 min, 2.1 h
std::string percent(std::optional<double> fraction, int decimals = 1);  // 0.412 -> 41.2%, else "–"
std::string bytes(double count);                                        // 1.5 GiB

}  // namespace lockstep::report::detail
