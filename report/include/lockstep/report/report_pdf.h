#pragma once
// The PDF report: the same document as the HTML one, on A4 pages, drawn with Qt's PDF writer
// (charts as vectors, from the same SVG). Part of the desktop side (Qt 6 Gui + Svg).
//
// Works with or without a running Qt application: without one, it starts an offscreen
// QGuiApplication for the call (lockstepctl is headless). Written atomically like the others.

#include <string>

#include "lockstep/report/report.h"

namespace lockstep::report {

Result<void> writePdf(const Document& document, const std::string& path);
Result<void> writePdf(const history::History& history, const std::string& jobId, const std::string& path,
                      std::int64_t nowUnixUs);

}  // namespace lockstep::report
