#include "metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <fstream>
#include <limits>
#include <type_traits>
#include <utility>

#include "lockstep/protocol/record_json.h"
#include "lockstep/reporter/sender.h"

namespace lockstep::trainer {

// The schema's JSON line of a step report (protocol/record_json.h): the same fields, names and
// order as the stream, so the file and the stream cannot disagree.
std::string stepReportJson(const StepReport& r) { return toJsonLine(r); }

Result<StepReport> stepReportFromJson(const std::string& line) { return fromJsonLine<StepReport>(line, "step report line"); }

Result<std::vector<StepReport>> readStepReports(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error{ErrorCode::kInvalidArgument, "cannot read " + path};
  std::vector<StepReport> out;
  std::size_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.empty()) continue;
    auto r = stepReportFromJson(line);
    if (!r) return Error{ErrorCode::kInvalidArgument, path + " line " + std::to_string(number) + ": " + r.error().message};
    out.push_back(std::move(*r));
  }
  return out;
}

class MetricsSink::Impl {
 public:
  int fd = STDOUT_FILENO;
  bool ownsFd = false;
  std::unique_ptr<ReportSender> sender;

  ~Impl() {
    if (ownsFd) ::close(fd);
  }
};

MetricsSink::MetricsSink(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsSink::~MetricsSink() { close(); }

Result<std::unique_ptr<MetricsSink>> MetricsSink::open(const std::string& path, const std::string& reportEndpoint) {
  auto impl = std::make_unique<Impl>();
  if (!path.empty()) {
    impl->fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (impl->fd < 0) return errnoError("--metrics-out: cannot open " + path, errno);
    impl->ownsFd = true;
  }
  if (!reportEndpoint.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(impl->sender, ReportSender::connect(reportEndpoint));
  }
  return std::unique_ptr<MetricsSink>(new MetricsSink(std::move(impl)));
}

Result<void> MetricsSink::write(const StepReport& report) {
  // One write() per line: with O_APPEND, lines from several ranks never interleave.
  const std::string line = stepReportJson(report);
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(impl_->fd, line.data() + done, line.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoError("cannot write metrics", errno);
    }
    done += static_cast<size_t>(n);
  }
  if (impl_->sender) impl_->sender->send(report);
  return {};
}

void MetricsSink::note(const JobEvent& event) {
  if (impl_->sender) impl_->sender->send(event);
}

void MetricsSink::phase(const PhaseReport& phase) {
  if (impl_->sender) impl_->sender->send(phase);
}

std::uint64_t MetricsSink::close() { return impl_->sender ? impl_->sender->close() : 0; }

}  // namespace lockstep::trainer
