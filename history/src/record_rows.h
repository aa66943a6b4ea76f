#pragma once
// A streamed record as a row of its history table, by its description (protocol/records.h): the
// columns are the fields' (sqlColumn), in their order, after the table's own leading columns (the
// node of a step report, the span of a sample). A NaN is stored as NULL and read back as NaN; an
// empty optional is NULL. Private to history/.

#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "lockstep/protocol/record_json.h"
#include "lockstep/protocol/records.h"
#include "sqlite.h"

namespace lockstep::history::detail {

// "job_id, rank, ...": R's columns, for a SELECT or an INSERT.
template <class R>
std::string columnsOf() {
  std::string out;
  records::forEachField<R>([&](const auto& f) {
    if (!out.empty()) out += ", ";
    out += f.sqlColumn();
  });
  return out;
}

// "INSERT OR IGNORE INTO table (lead, R's columns) VALUES (?1, ...)": the lead columns are bound
// by the caller, from ?1; R's follow them (bindRecord).
template <class R>
std::string insertSql(std::string_view table, std::string_view lead, int leadCount) {
  std::string values;
  for (int i = 1; i <= leadCount + static_cast<int>(records::fieldCount<R>()); ++i) {
    values += (i > 1 ? ", ?" : "?") + std::to_string(i);
  }
  return "INSERT OR IGNORE INTO " + std::string(table) + " (" + std::string(lead) + (lead.empty() ? "" : ", ") +
         columnsOf<R>() + ") VALUES (" + values + ")";
}

namespace rows {
template <class T>
void bindValue(Statement& s, int i, const T& v) {
  if constexpr (records::IsList<T>::value) {
    if (v.empty()) s.bindNull(i);
    else s.bind(i, listToJson(v));  // a JSON array (record_json.h)
  } else if constexpr (records::IsOptional<T>::value) {
    if (v) bindValue(s, i, *v);
    else s.bindNull(i);
  } else if constexpr (std::is_floating_point_v<T>) {
    s.bind(i, static_cast<double>(v));  // SQLite stores NaN as NULL
  } else if constexpr (std::is_enum_v<T>) {
    s.bind(i, static_cast<std::int64_t>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    s.bind(i, std::int64_t{v ? 1 : 0});
  } else {
    s.bind(i, v);
  }
}

template <class T>
T readValue(const Statement& s, int c) {
  if constexpr (records::IsList<T>::value) {
    if (s.null(c)) return {};
    auto items = listFromJson<typename records::IsList<T>::Value>(s.text(c));
    return items ? std::move(*items) : T{};  // a column this build wrote: it reads back
  } else if constexpr (records::IsOptional<T>::value) {
    if (s.null(c)) return std::nullopt;
    return readValue<typename records::IsOptional<T>::Value>(s, c);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return s.text(c);
  } else if constexpr (std::is_floating_point_v<T>) {
    return s.null(c) ? std::numeric_limits<T>::quiet_NaN() : static_cast<T>(s.real(c));
  } else {
    return static_cast<T>(s.i64(c));
  }
}
}  // namespace rows

// Binds R's fields from parameter `first` on.
template <class R>
void bindRecord(Statement& s, int first, const R& record) {
  int i = first;
  records::forEachField<R>([&](const auto& f) { rows::bindValue(s, i++, f.of(record)); });
}

// Reads R's fields from column `first` on (a SELECT of columnsOf<R>()).
template <class R>
R readRecord(const Statement& s, int first) {
  R record;
  int c = first;
  records::forEachField<R>([&](const auto& f) {
    using T = typename std::decay_t<decltype(f)>::Type;
    f.of(record) = rows::readValue<T>(s, c++);
  });
  return record;
}

}  // namespace lockstep::history::detail
