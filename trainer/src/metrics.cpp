#include "metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <nlohmann/json.hpp>

#include "lockstep/reporter/sender.h"

namespace lockstep::trainer {

std::string stepReportJson(const StepReport& r) {
  nlohmann::ordered_json j;
  auto real = [](double v) { return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr); };
  j["job_id"] = r.jobId;
  j["rank"] = r.rank;
  j["world_size"] = r.worldSize;
  j["attempt"] = r.attempt;
  j["step"] = r.step;
  j["epoch"] = r.epoch;
  j["samples"] = r.samples;
  j["loss"] = real(r.loss);
  j["global_loss"] = r.globalLoss ? real(*r.globalLoss) : nlohmann::ordered_json(nullptr);
  auto maybe = [](const auto& v) { return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr); };
  j["data_time_us"] = maybe(r.dataTimeUs);
  j["compute_time_us"] = maybe(r.computeTimeUs);
  j["exposed_comm_time_us"] = maybe(r.exposedCommTimeUs);
  j["allreduce_time_us"] = maybe(r.allreduceTimeUs);
  j["bytes_reduced"] = maybe(r.bytesReduced);
  j["step_time_us"] = r.stepTimeUs;
  j["time_unix_us"] = r.timeUnixUs;
  j["lr"] = r.lr;
  return j.dump() + "\n";
}

Result<StepReport> stepReportFromJson(const std::string& line) {
  const auto j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object()) return Error{ErrorCode::kInvalidArgument, "not a JSON object: " + line.substr(0, 80)};
  try {
    StepReport r;
    r.jobId = j.at("job_id").get<std::string>();
    r.rank = j.at("rank").get<std::uint32_t>();
    r.worldSize = j.at("world_size").get<std::uint32_t>();
    r.attempt = j.at("attempt").get<std::uint32_t>();
    r.step = j.at("step").get<std::uint64_t>();
    r.epoch = j.at("epoch").get<std::uint32_t>();
    r.samples = j.at("samples").get<std::uint32_t>();
    r.loss = j.at("loss").is_null() ? NAN : j.at("loss").get<float>();
    if (!j.at("global_loss").is_null()) r.globalLoss = j.at("global_loss").get<float>();
    const auto maybe = [&](const char* key, auto& field) {
      if (!j.at(key).is_null()) field = j.at(key).get<typename std::decay_t<decltype(field)>::value_type>();
    };
    maybe("data_time_us", r.dataTimeUs);
    maybe("compute_time_us", r.computeTimeUs);
    maybe("exposed_comm_time_us", r.exposedCommTimeUs);
    maybe("allreduce_time_us", r.allreduceTimeUs);
    maybe("bytes_reduced", r.bytesReduced);
    r.stepTimeUs = j.at("step_time_us").get<std::int64_t>();
    r.timeUnixUs = j.at("time_unix_us").get<std::int64_t>();
    r.lr = j.at("lr").get<double>();
    return r;
  } catch (const nlohmann::json::exception& e) {
    return Error{ErrorCode::kInvalidArgument, std::string("not a step report line: ") + e.what()};
  }
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

std::uint64_t MetricsSink::close() { return impl_->sender ? impl_->sender->close() : 0; }

}  // namespace lockstep::trainer
