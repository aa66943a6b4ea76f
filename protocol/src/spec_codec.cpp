// A job spec through protobuf's reflection, walking its one description (spec_fields.h): no scalar
// field is spelled out here. The data set, placements, agents and a command job's program
// (spec::kStructured) are converted by hand below.

#include <array>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <variant>

#include "lockstep/protocol/names.h"
#include "lockstep/protocol/records.h"
#include "lockstep/protocol/spec_fields.h"
#include "lockstep/protocol/validate.h"
#include "reflection.h"
#include "spec_pb.h"

namespace lockstep::detail {
namespace {

namespace pb = ::lockstep::v1;
using reflection::FieldDescriptor;
using reflection::Message;
using reflection::Reflection;

constexpr std::size_t kFieldCount = std::tuple_size_v<std::remove_cv_t<decltype(spec::kFields)>>;

// Where a row lives: the JobSpec's sub-message field that holds it (null: JobSpec itself), and
// its own field there.
struct Place {
  const FieldDescriptor* message = nullptr;
  const FieldDescriptor* field = nullptr;
};

const FieldDescriptor* fieldNamed(const google::protobuf::Descriptor* in, std::string_view name) {
  const FieldDescriptor* fd = in->FindFieldByName(std::string(name));
  if (fd == nullptr) {  // a programming error that SpecFields.* tests catch; here it stops at first use
    std::fprintf(stderr, "lockstep: %s has no field %.*s\n", in->full_name().c_str(), static_cast<int>(name.size()), name.data());
    std::abort();
  }
  return fd;
}

const std::array<Place, kFieldCount>& places() {
  static const auto table = [] {
    std::array<Place, kFieldCount> out{};
    std::size_t i = 0;
    spec::forEachField([&](const auto& f) {
      const auto* in = pb::JobSpec::descriptor();
      if (!f.message.empty()) {
        out[i].message = fieldNamed(in, f.message);
        in = out[i].message->message_type();
      }
      out[i++].field = fieldNamed(in, f.name);
    });
    return out;
  }();
  return table;
}

template <class T>
void write(const Reflection& r, Message* m, const FieldDescriptor* fd, const T& v, const spec::Style& style) {
  if constexpr (records::IsOptional<T>::value) {
    if (v) write(r, m, fd, *v, style);
  } else if constexpr (spec::IsList<T>::value) {
    for (const auto& each : v) r.AddUInt32(m, fd, each);
  } else if constexpr (std::is_same_v<T, bool>) {
    r.SetBool(m, fd, v != style.invert);
  } else {
    reflection::set(r, m, fd, v);
  }
}

Error bad(std::string message) { return invalidArgument(std::move(message)); }

// An enum as the schema holds it. 0 is "unspecified" where it names no value: a command job need not
// say what only the built-in trainer uses, and such a field keeps its default.
template <class E>
Result<void> readEnum(int value, E& out, const spec::Field<E>& f, bool commandJob) {
  for (const auto& n : namesOf(E{})) {
    if (static_cast<int>(n.value) == value) {
      out = n.value;
      return {};
    }
  }
  if (value == 0 && commandJob && f.flag.jobs == spec::Jobs::kTrainer) return {};
  return bad("job spec " + std::string(f.label) + " is missing or unknown (" + std::to_string(value) + ")");
}

template <class T>
Result<void> read(const Reflection& r, const Message& m, const FieldDescriptor* fd, const spec::Field<T>& f,
                  JobSpec& s) {
  T& out = f.of(s);
  if constexpr (records::IsOptional<T>::value) {
    if (r.HasField(m, fd)) out = reflection::get<typename records::IsOptional<T>::Value>(r, m, fd);
  } else if constexpr (spec::IsList<T>::value) {
    out.clear();
    for (int k = 0; k < r.FieldSize(m, fd); ++k) out.push_back(r.GetRepeatedUInt32(m, fd, k));
  } else if constexpr (std::is_same_v<T, bool>) {
    out = r.GetBool(m, fd) != f.style.invert;
  } else if constexpr (std::is_enum_v<T>) {
    return readEnum(r.GetEnumValue(m, fd), out, f, s.isCommand());
  } else {
    out = reflection::get<T>(r, m, fd);
  }
  return {};
}

void toPb(const CommandSpec& c, pb::Command* m) {
  for (const auto& arg : c.argv) m->add_argv(arg);
  m->set_working_dir(c.workingDir);
  for (const auto& [name, value] : c.env) {
    auto* e = m->add_env();
    e->set_name(name);
    e->set_value(value);
  }
}

CommandSpec fromPb(const pb::Command& m) {
  CommandSpec c;
  c.argv.assign(m.argv().begin(), m.argv().end());
  c.workingDir = m.working_dir();
  for (const auto& e : m.env()) c.env.emplace_back(e.name(), e.value());
  return c;
}

void datasetToPb(const DatasetSource& dataset, pb::Dataset* m) {
  if (const auto* syn = std::get_if<SyntheticDataset>(&dataset)) {
    auto* d = m->mutable_synthetic();
    d->set_samples(syn->samples);
    d->set_dim(syn->dim);
    d->set_classes(syn->classes);
    d->set_seed(syn->seed);
  } else {
    const auto& npy = std::get<NpyDataset>(dataset);
    m->mutable_npy()->set_features_path(npy.featuresPath);
    m->mutable_npy()->set_labels_path(npy.labelsPath);
  }
}

Result<void> datasetFromPb(const pb::JobSpec& m, JobSpec& s) {
  switch (m.dataset().source_case()) {
    case pb::Dataset::kSynthetic: {
      const auto& d = m.dataset().synthetic();
      s.dataset = SyntheticDataset{d.samples(), d.dim(), d.classes(), d.seed()};
      return {};
    }
    case pb::Dataset::kNpy:
      s.dataset = NpyDataset{m.dataset().npy().features_path(), m.dataset().npy().labels_path()};
      return {};
    case pb::Dataset::SOURCE_NOT_SET:
      break;
  }
  if (!s.command) return bad("job spec dataset is required (synthetic or npy)");
  return {};
}

}  // namespace

void toPb(const JobSpec& s, pb::JobSpec* m) {
  const Reflection& r = *m->GetReflection();
  const auto& at = places();
  std::size_t i = 0;
  spec::forEachField([&](const auto& f) {
    const Place& place = at[i++];
    Message* in = place.message ? r.MutableMessage(m, place.message) : m;
    write(*in->GetReflection(), in, place.field, f.of(s), f.style);
  });
  if (s.command) toPb(*s.command, m->mutable_command());  // no data set: the program reads its own
  else datasetToPb(s.dataset, m->mutable_dataset());
  for (const auto& rank : s.ranks) {
    auto* p = m->add_ranks();
    p->set_rank(rank.rank);
    p->set_node(rank.node);
    p->set_local_rank(rank.localRank);
    if (rank.gpuIndex) p->set_gpu_index(*rank.gpuIndex);
  }
  for (const auto& rule : s.alertRules) m->add_alert_rules(rule);
  for (const auto& url : s.notify) m->add_notify(url);
  for (const auto& a : s.agents) {
    auto* p = m->add_agents();
    p->set_node(a.node);
    p->set_address(a.address);
    p->set_public_key(a.publicKey);
  }
}

Result<JobSpec> fromPb(const pb::JobSpec& m) {
  JobSpec s;
  // First: a command job may leave out what only the trainer reads, and needs no data set.
  if (m.has_command()) s.command = fromPb(m.command());
  LOCKSTEP_TRY(datasetFromPb(m, s));
  const Reflection& r = *m.GetReflection();
  const auto& at = places();
  std::size_t i = 0;
  std::optional<Error> error;
  spec::forEachField([&](const auto& f) {
    const Place& place = at[i++];
    if (error) return;
    const Message& in = place.message ? r.GetMessage(m, place.message) : m;
    if (auto done = read(*in.GetReflection(), in, place.field, f, s); !done.ok()) error = done.error();
  });
  if (error) return *error;
  for (const auto& p : m.ranks()) {
    RankPlacement rank{p.rank(), p.node(), p.local_rank(), std::nullopt};
    if (p.has_gpu_index()) rank.gpuIndex = p.gpu_index();
    s.ranks.push_back(std::move(rank));
  }
  for (const auto& a : m.agents()) s.agents.push_back(JobAgent{a.node(), a.address(), a.public_key()});
  s.alertRules.assign(m.alert_rules().begin(), m.alert_rules().end());
  s.notify.assign(m.notify().begin(), m.notify().end());
  LOCKSTEP_TRY(validateJobSpec(s));
  return s;
}

}  // namespace lockstep::detail
