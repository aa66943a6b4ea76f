// The streamed records through protobuf's reflection, walking their descriptions (records.h): no
// field is spelled out here, so a field added to the schema, the struct and its description is
// carried without touching this file. The field descriptors are looked up once per record type.

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <utility>
#include <variant>

#include "lockstep/protocol/records.h"
#include "lockstep/protocol/validate.h"
#include "reflection.h"
#include "stream_pb.h"

namespace lockstep::detail {
namespace {

namespace pb = ::lockstep::v1;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using reflection::get;
using reflection::set;

// StreamMessage's payload field that holds an R.
template <class R>
const FieldDescriptor* payloadField() {
  static const FieldDescriptor* const fd = [] {
    const auto* found = pb::StreamMessage::descriptor()->FindFieldByName(std::string(records::Description<R>::kStreamField));
    if (found == nullptr || found->message_type() == nullptr) {
      std::fprintf(stderr, "lockstep: StreamMessage has no message field %s\n", std::string(records::Description<R>::kStreamField).c_str());
      std::abort();
    }
    return found;
  }();
  return fd;
}

// R's schema message: a streamed record's, or one a record holds a list of.
template <class R>
const google::protobuf::Descriptor* messageOf() {
  static const auto* const found = pb::StreamMessage::descriptor()->file()->pool()->FindMessageTypeByName(
      pb::StreamMessage::descriptor()->file()->package() + "." + std::string(records::Description<R>::kName));
  if (found == nullptr) {
    std::fprintf(stderr, "lockstep: the schema has no message %s\n", std::string(records::Description<R>::kName).c_str());
    std::abort();
  }
  return found;
}

// R's fields' descriptors, in the order of its description. A name the schema lacks is a
// programming error that the Records tests catch; here it stops the process at first use.
template <class R>
const std::array<const FieldDescriptor*, records::fieldCount<R>()>& descriptors() {
  static const auto table = [] {
    std::array<const FieldDescriptor*, records::fieldCount<R>()> out{};
    const auto* message = messageOf<R>();
    std::size_t i = 0;
    records::forEachField<R>([&](const auto& f) {
      out[i] = message->FindFieldByName(std::string(f.name));
      if (out[i] == nullptr) {
        std::fprintf(stderr, "lockstep: %s has no field %.*s\n", message->full_name().c_str(),
                     static_cast<int>(f.name.size()), f.name.data());
        std::abort();
      }
      ++i;
    });
    return out;
  }();
  return table;
}

template <class R>
void recordToPb(const R& record, Message* m) {
  const Reflection& r = *m->GetReflection();
  const auto& fds = descriptors<R>();
  std::size_t i = 0;
  records::forEachField<R>([&](const auto& f) {
    using T = typename std::decay_t<decltype(f)>::Type;
    const FieldDescriptor* fd = fds[i++];
    if constexpr (records::IsList<T>::value) {
      for (const auto& item : f.of(record)) recordToPb(item, r.AddMessage(m, fd));
    } else if constexpr (records::IsOptional<T>::value) {
      if (f.of(record)) set(r, m, fd, *f.of(record));
    } else {
      set(r, m, fd, f.of(record));
    }
  });
}

template <class R>
R recordFromPb(const Message& m) {
  const Reflection& r = *m.GetReflection();
  const auto& fds = descriptors<R>();
  R record;
  std::size_t i = 0;
  records::forEachField<R>([&](const auto& f) {
    using T = typename std::decay_t<decltype(f)>::Type;
    const FieldDescriptor* fd = fds[i++];
    if constexpr (records::IsList<T>::value) {
      // At most what the validation accepts, plus one so that it says too many: a hostile
      // message's list costs no more than that.
      const int n = std::min(r.FieldSize(m, fd), static_cast<int>(kMaxRecordListItems) + 1);
      f.of(record).reserve(static_cast<std::size_t>(n));
      for (int k = 0; k < n; ++k) {
        f.of(record).push_back(recordFromPb<typename records::IsList<T>::Value>(r.GetRepeatedMessage(m, fd, k)));
      }
    } else if constexpr (records::IsOptional<T>::value) {
      if (r.HasField(m, fd)) f.of(record) = get<typename records::IsOptional<T>::Value>(r, m, fd);
    } else {
      f.of(record) = get<T>(r, m, fd);
    }
  });
  return record;
}

// Each kind's checks (validate.h); a kind without one does not compile.
Result<void> validate(const JobEvent& r) { return validateJobEvent(r); }
Result<void> validate(const GpuSample& r) { return validateGpuSample(r); }
Result<void> validate(const ProcessSample& r) { return validateProcessSample(r); }
Result<void> validate(const NetSample& r) { return validateNetSample(r); }
Result<void> validate(const StepReport& r) { return validateStepReport(r); }
Result<void> validate(const PhaseReport& r) { return validatePhaseReport(r); }

template <class R>
Result<StreamPayload> payloadFromPb(const Message& m) {
  R record = recordFromPb<R>(m);
  LOCKSTEP_TRY(validate(record));
  return StreamPayload{std::move(record)};
}

// The payload held in `field` (one of StreamMessage's), decoded and validated.
template <std::size_t... I>
Result<StreamPayload> payloadFromPb(const Message& m, const FieldDescriptor* field, std::index_sequence<I...>) {
  std::optional<Result<StreamPayload>> out;
  const Reflection& r = *m.GetReflection();
  ((field == payloadField<std::variant_alternative_t<I, StreamPayload>>()
        ? void(out.emplace(payloadFromPb<std::variant_alternative_t<I, StreamPayload>>(r.GetMessage(m, field))))
        : void()),
   ...);
  if (!out) return invalidArgument("stream message has no payload");
  return std::move(*out);
}

}  // namespace

void toPb(const StreamMessage& message, pb::StreamMessage* m) {
  m->set_seq(message.seq);
  m->set_node(message.node);
  std::visit(
      [&](const auto& payload) {
        using R = std::decay_t<decltype(payload)>;
        recordToPb(payload, m->GetReflection()->MutableMessage(m, payloadField<R>()));
      },
      message.payload);
}

Result<StreamMessage> fromPb(const pb::StreamMessage& m) {
  if (m.seq() == 0) return invalidArgument("stream message: the sequence number is required (it counts from 1)");
  if (m.node().size() > 255) return invalidArgument("stream message: node name is longer than 255 bytes");
  static const auto* const oneof = pb::StreamMessage::descriptor()->FindOneofByName("payload");  // looked up once
  const FieldDescriptor* field = m.GetReflection()->GetOneofFieldDescriptor(m, oneof);
  LOCKSTEP_ASSIGN_OR_RETURN(auto payload, payloadFromPb(m, field, std::make_index_sequence<std::variant_size_v<StreamPayload>>{}));
  return StreamMessage{m.seq(), m.node(), std::move(payload)};
}

}  // namespace lockstep::detail
