#include "lockstep/protocol/record_json.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>

#include "lockstep/protocol/names.h"
#include "lockstep/protocol/records.h"
#include "lockstep/protocol/validate.h"

namespace lockstep {
namespace {

using Json = nlohmann::ordered_json;

template <class R>
Json recordToJson(const R& record);
template <class R>
std::string readRecord(const Json& j, R& record);

template <class E>
concept Named = requires(E e) { namesOf(e); };

template <class T>
Json toJson(const T& v) {
  if constexpr (records::IsList<T>::value) {
    Json out = Json::array();
    for (const auto& item : v) out.push_back(recordToJson(item));
    return out;
  } else if constexpr (records::IsOptional<T>::value) {
    return v ? toJson(*v) : Json(nullptr);
  } else if constexpr (std::is_floating_point_v<T>) {
    return std::isfinite(v) ? Json(v) : Json(nullptr);
  } else if constexpr (Named<T>) {
    return Json(std::string(nameOf(v)));  // "all_reduce": a kind a reader of the line can read
  } else if constexpr (std::is_enum_v<T>) {
    return Json(static_cast<int>(v));
  } else {
    return Json(v);
  }
}

// Reads the fields of one line; the first wrong one is kept, named, for the error.
class Reader {
 public:
  explicit Reader(const Json& j) : j_(j) {}

  template <class T>
  void read(std::string_view key, T& out) {
    const auto it = j_.find(key);
    const Json* v = it == j_.end() ? nullptr : &*it;
    if constexpr (records::IsList<T>::value) {
      out.clear();
      if (v == nullptr || v->is_null()) return;  // none (a line from before the list was)
      if (!v->is_array() || v->size() > kMaxRecordListItems) return fail(key, v, "a list of at most 64 objects");
      for (const auto& item : *v) {
        typename records::IsList<T>::Value value{};
        const std::string error = item.is_object() ? readRecord(item, value) : std::string("not an object");
        if (!error.empty()) return fail(key, v, ("a list of objects whose fields are right: " + error).c_str());
        out.push_back(std::move(value));
      }
    } else if constexpr (records::IsOptional<T>::value) {
      if (v == nullptr || v->is_null()) {
        out.reset();
        return;
      }
      typename records::IsOptional<T>::Value value{};
      read(key, v, value);
      out = value;
    } else {
      read(key, v, out);
    }
  }
  const std::string& error() const { return error_; }

 private:
  template <class T>
  void read(std::string_view key, const Json* v, T& out) {
    if constexpr (std::is_same_v<T, std::string>) {
      if (v && v->is_string()) out = v->get<std::string>();
      else fail(key, v, "a string");
    } else if constexpr (std::is_same_v<T, bool>) {
      if (v && v->is_boolean()) out = v->get<bool>();
      else fail(key, v, "true or false");
    } else if constexpr (std::is_floating_point_v<T>) {
      if (v && v->is_null()) out = std::numeric_limits<T>::quiet_NaN();  // as written for NaN
      else if (v && v->is_number()) out = static_cast<T>(v->get<double>());
      else fail(key, v, "a number or null");
    } else if constexpr (Named<T>) {
      const auto value = v && v->is_string() ? named<T>(v->get<std::string>()) : std::nullopt;
      if (value) out = *value;
      else fail(key, v, ("one of " + namesText<T>()).c_str());
    } else if constexpr (std::is_enum_v<T>) {
      int i = 0;
      read(key, v, i);
      out = static_cast<T>(i);
    } else {
      if (!integer(v, out)) fail(key, v, std::is_signed_v<T> ? "an integer" : "a whole number from 0");
    }
  }
  template <class T>
  static bool integer(const Json* v, T& out) {
    if (v && v->is_number_unsigned()) {
      const auto u = v->get<std::uint64_t>();
      if (!std::cmp_less_equal(u, std::numeric_limits<T>::max())) return false;
      out = static_cast<T>(u);
      return true;
    }
    if (v && v->is_number_integer()) {
      const auto i = v->get<std::int64_t>();
      if (!std::in_range<T>(i)) return false;
      out = static_cast<T>(i);
      return true;
    }
    return false;
  }
  void fail(std::string_view key, const Json* v, const char* what) {
    if (!error_.empty()) return;
    error_ = "\"" + std::string(key) + "\" must be " + what + (v ? "" : " (it is missing)");
  }

  const Json& j_;
  std::string error_;
};

template <class R>
Json recordToJson(const R& record) {
  Json j = Json::object();
  records::forEachField<R>([&](const auto& f) { j[std::string(f.name)] = toJson(f.of(record)); });
  return j;
}

// R's fields from the object `j`; the first wrong one, or "".
template <class R>
std::string readRecord(const Json& j, R& record) {
  Reader reader(j);
  records::forEachField<R>([&](const auto& f) { reader.read(f.name, f.of(record)); });
  return reader.error();
}

}  // namespace

template <class R>
std::string toJsonLine(const R& record) {
  return recordToJson(record).dump() + "\n";
}

template <class R>
Result<R> fromJsonLine(std::string_view line, std::string_view what) {
  const auto j = Json::parse(line, nullptr, false);
  if (!j.is_object()) return invalidArgument("not a JSON object: " + std::string(line.substr(0, 80)));
  R record;
  const std::string error = readRecord(j, record);
  if (!error.empty()) return invalidArgument("not a " + std::string(what) + ": " + error);
  return record;
}

template <class R>
std::string listToJson(const std::vector<R>& items) {
  return toJson(items).dump();
}

template <class R>
Result<std::vector<R>> listFromJson(std::string_view text) {
  const auto j = Json::parse(text, nullptr, false);
  Json holder = Json::object();
  holder["list"] = j;
  Reader reader(holder);
  std::vector<R> items;
  reader.read("list", items);
  if (!reader.error().empty()) return invalidArgument("not a list of " + std::string(records::Description<R>::kName) + ": " + reader.error());
  return items;
}

template std::string toJsonLine(const JobEvent&);
template std::string toJsonLine(const GpuSample&);
template std::string toJsonLine(const ProcessSample&);
template std::string toJsonLine(const NetSample&);
template std::string toJsonLine(const StepReport&);
template std::string toJsonLine(const PhaseReport&);
template Result<JobEvent> fromJsonLine(std::string_view, std::string_view);
template Result<GpuSample> fromJsonLine(std::string_view, std::string_view);
template Result<ProcessSample> fromJsonLine(std::string_view, std::string_view);
template Result<NetSample> fromJsonLine(std::string_view, std::string_view);
template Result<StepReport> fromJsonLine(std::string_view, std::string_view);
template Result<PhaseReport> fromJsonLine(std::string_view, std::string_view);
template std::string listToJson(const std::vector<CollectiveTimes>&);
template std::string listToJson(const std::vector<CollectiveSpan>&);
template Result<std::vector<CollectiveTimes>> listFromJson(std::string_view);
template Result<std::vector<CollectiveSpan>> listFromJson(std::string_view);

}  // namespace lockstep
