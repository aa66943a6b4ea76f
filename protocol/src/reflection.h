#pragma once
// A scalar of a domain struct into and out of a protobuf message field, through protobuf's
// reflection: what the record codec (stream_codec.cpp) and the job spec's (codec.cpp) share.
// Private to protocol/src.

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <cstdint>
#include <string>
#include <type_traits>

namespace lockstep::detail::reflection {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

template <class T>
void set(const Reflection& r, Message* m, const FieldDescriptor* fd, const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    r.SetString(m, fd, v);
  } else if constexpr (std::is_enum_v<T>) {
    r.SetEnumValue(m, fd, static_cast<int>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    r.SetBool(m, fd, v);
  } else if constexpr (std::is_same_v<T, float>) {
    r.SetFloat(m, fd, v);
  } else if constexpr (std::is_same_v<T, double>) {
    r.SetDouble(m, fd, v);
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    r.SetInt32(m, fd, v);
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    r.SetInt64(m, fd, v);
  } else if constexpr (std::is_same_v<T, std::uint32_t>) {
    r.SetUInt32(m, fd, v);
  } else {
    static_assert(std::is_same_v<T, std::uint64_t>, "a record field of a type the codec does not carry");
    r.SetUInt64(m, fd, v);
  }
}

template <class T>
T get(const Reflection& r, const Message& m, const FieldDescriptor* fd) {
  if constexpr (std::is_same_v<T, std::string>) {
    return r.GetString(m, fd);
  } else if constexpr (std::is_enum_v<T>) {
    return static_cast<T>(r.GetEnumValue(m, fd));  // its range is validate*'s to check
  } else if constexpr (std::is_same_v<T, bool>) {
    return r.GetBool(m, fd);
  } else if constexpr (std::is_same_v<T, float>) {
    return r.GetFloat(m, fd);
  } else if constexpr (std::is_same_v<T, double>) {
    return r.GetDouble(m, fd);
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return r.GetInt32(m, fd);
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    return r.GetInt64(m, fd);
  } else if constexpr (std::is_same_v<T, std::uint32_t>) {
    return r.GetUInt32(m, fd);
  } else {
    return r.GetUInt64(m, fd);
  }
}

}  // namespace lockstep::detail::reflection
