#include "metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <fstream>
#include <limits>
#include <type_traits>
#include <utility>
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
  j["lr"] = real(r.lr);
  return j.dump() + "\n";
}

namespace {

using Json = nlohmann::json;

// A field of a step report line, checked for its type and range; an error names the key.
class Fields {
 public:
  explicit Fields(const Json& j) : j_(j) {}

  template <class T>
  T integer(const char* key) {
    const Json* v = find(key);
    if (v && v->is_number_unsigned()) {
      const auto u = v->get<std::uint64_t>();
      if (std::cmp_less_equal(u, std::numeric_limits<T>::max())) return static_cast<T>(u);
    } else if (v && v->is_number_integer()) {
      const auto i = v->get<std::int64_t>();
      if (std::in_range<T>(i)) return static_cast<T>(i);
    }
    fail(key, std::is_signed_v<T> ? "an integer" : "a whole number from 0");
    return T{};
  }
  template <class T>
  std::optional<T> maybeInteger(const char* key) {
    const Json* v = find(key);
    if (v && v->is_null()) return std::nullopt;
    return integer<T>(key);
  }
  // A number or null (null: not finite, as stepReportJson writes NaN).
  double real(const char* key) {
    const Json* v = find(key);
    if (v && v->is_null()) return NAN;
    if (v && v->is_number()) return v->get<double>();
    fail(key, "a number or null");
    return NAN;
  }
  std::string text(const char* key) {
    const Json* v = find(key);
    if (v && v->is_string()) return v->get<std::string>();
    fail(key, "a string");
    return {};
  }
  const std::string& error() const { return error_; }

 private:
  const Json* find(const char* key) {
    const auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  void fail(const char* key, const char* what) {
    if (error_.empty()) error_ = std::string("\"") + key + "\" must be " + what + (j_.contains(key) ? "" : " (it is missing)");
  }
  const Json& j_;
  std::string error_;
};

}  // namespace

Result<StepReport> stepReportFromJson(const std::string& line) {
  const auto j = Json::parse(line, nullptr, false);
  if (!j.is_object()) return Error{ErrorCode::kInvalidArgument, "not a JSON object: " + line.substr(0, 80)};
  Fields f(j);
  StepReport r;
  r.jobId = f.text("job_id");
  r.rank = f.integer<std::uint32_t>("rank");
  r.worldSize = f.integer<std::uint32_t>("world_size");
  r.attempt = f.integer<std::uint32_t>("attempt");
  r.step = f.integer<std::uint64_t>("step");
  r.epoch = f.integer<std::uint32_t>("epoch");
  r.samples = f.integer<std::uint32_t>("samples");
  r.loss = static_cast<float>(f.real("loss"));
  if (const double g = f.real("global_loss"); std::isfinite(g)) r.globalLoss = static_cast<float>(g);
  r.dataTimeUs = f.maybeInteger<std::int64_t>("data_time_us");
  r.computeTimeUs = f.maybeInteger<std::int64_t>("compute_time_us");
  r.exposedCommTimeUs = f.maybeInteger<std::int64_t>("exposed_comm_time_us");
  r.allreduceTimeUs = f.maybeInteger<std::int64_t>("allreduce_time_us");
  r.bytesReduced = f.maybeInteger<std::uint64_t>("bytes_reduced");
  r.stepTimeUs = f.integer<std::int64_t>("step_time_us");
  r.timeUnixUs = f.integer<std::int64_t>("time_unix_us");
  r.lr = f.real("lr");
  if (!f.error().empty()) return Error{ErrorCode::kInvalidArgument, "not a step report line: " + f.error()};
  return r;
}

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

std::uint64_t MetricsSink::close() { return impl_->sender ? impl_->sender->close() : 0; }

}  // namespace lockstep::trainer
