#include "lockstep/jobflags/options.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <optional>

#include "lockstep/alerts/rules.h"
#include "lockstep/alerts/urls.h"
#include "lockstep/common/files.h"
#include "lockstep/protocol/codec.h"
#include "lockstep/protocol/names.h"
#include "lockstep/protocol/records.h"
#include "lockstep/protocol/spec_fields.h"
#include "lockstep/protocol/validate.h"

namespace lockstep::jobflags {
namespace {

constexpr std::string_view kByteUnits = "BKMGT";

Error usage(std::string message) { return invalidArgument(message + " (see lockstep-trainer --help)"); }

template <class T>
Result<T> parseUnsigned(const std::string& flag, const std::string& text, T max) {
  std::uint64_t v = 0;
  const auto* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return usage(flag + ": '" + text + "' is not a whole number");
  }
  if (v > static_cast<std::uint64_t>(max)) {
    return usage(flag + ": " + text + " is larger than " + std::to_string(static_cast<std::uint64_t>(max)));
  }
  return static_cast<T>(v);
}

Result<double> parseReal(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v)) {
    return usage(flag + ": '" + text + "' is not a number");
  }
  return v;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t pos = text.find(sep, start);
    out.push_back(text.substr(start, pos - start));
    if (pos == std::string::npos) return out;
    start = pos + 1;
  }
}

// The largest value a whole-number field's flag takes: its row's bound, else its type's.
template <class T>
T maxOf(double hi) {
  return hi > 0 ? static_cast<T>(hi) : std::numeric_limits<T>::max();
}

// Bytes as the largest unit that writes them whole.
std::string bytesText(std::uint64_t bytes) {
  std::size_t unit = 0;
  while (bytes != 0 && unit + 1 < kByteUnits.size() && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + kByteUnits[unit];
}

// A row's flag's value into its field, or what is wrong with it.
template <class T>
Result<void> parseInto(const spec::Field<T>& f, const std::string& flag, const std::string& text, JobSpec& s) {
  T& out = f.of(s);
  if constexpr (std::is_same_v<T, std::string>) {
    out = text;
  } else if constexpr (records::IsOptional<T>::value) {
    LOCKSTEP_ASSIGN_OR_RETURN(out, parseReal(flag, text));
  } else if constexpr (std::is_same_v<T, double>) {
    if (!f.style.zeroWord.empty() && text == f.style.zeroWord) {
      out = 0;
      return {};
    }
    LOCKSTEP_ASSIGN_OR_RETURN(out, parseReal(flag, text));
  } else if constexpr (std::is_enum_v<T>) {
    const auto value = named<T>(text);
    if (!value) return usage(flag + ": '" + text + "' is not one of " + namesText<T>());
    out = *value;
  } else if constexpr (spec::IsList<T>::value) {
    out.clear();
    for (const auto& part : split(text, ',')) {
      LOCKSTEP_ASSIGN_OR_RETURN(auto v, parseUnsigned<std::uint32_t>(flag, part, maxOf<std::uint32_t>(f.hi)));
      out.push_back(v);
    }
  } else if constexpr (std::is_same_v<T, std::uint64_t>) {
    LOCKSTEP_ASSIGN_OR_RETURN(out, f.style.bytes ? parseSize(flag, text) : parseUnsigned<T>(flag, text, maxOf<T>(f.hi)));
    if (out > maxOf<T>(f.hi)) return usage(flag + ": " + text + " is larger than " + bytesText(maxOf<T>(f.hi)));
  } else {
    static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>, "a job flag of a type jobflags cannot parse");
    LOCKSTEP_ASSIGN_OR_RETURN(out, parseUnsigned<T>(flag, text, maxOf<T>(f.hi)));
  }
  return {};
}

std::string realText(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

// A row's value as its flag's text (a switch has none).
template <class T>
std::string textOf(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    return v;
  } else if constexpr (records::IsOptional<T>::value) {
    return realText(*v);
  } else if constexpr (std::is_same_v<T, double>) {
    return realText(v);
  } else if constexpr (std::is_enum_v<T>) {
    return std::string(nameOf(v));
  } else if constexpr (spec::IsList<T>::value) {
    std::string out;
    for (auto each : v) out += (out.empty() ? "" : ",") + std::to_string(each);
    return out;
  } else if constexpr (std::is_same_v<T, bool>) {
    return {};
  } else {
    return std::to_string(v);
  }
}

// A flag's parser: stores the value's meaning, or says what is wrong with it.
using Handler = std::function<Result<void>(const std::string& flag, const std::string& value)>;
using Switch = std::function<void()>;

// The flags of the rows a kind of job takes, into `s`.
void addRowFlags(spec::Jobs job, JobSpec& s, std::map<std::string, Handler>& valued, std::map<std::string, Switch>& switches) {
  spec::forEachField([&](const auto& f) {
    using T = typename std::decay_t<decltype(f)>::Type;
    if (f.flag.name.empty() || !spec::takes(f.flag.jobs, job)) return;
    if constexpr (std::is_same_v<T, bool>) {
      switches[std::string(f.flag.name)] = [&f, &s] { f.of(s) = !f.style.invert; };
    } else {
      valued[std::string(f.flag.name)] = [&f, &s](const std::string& flag, const std::string& v) { return parseInto(f, flag, v, s); };
    }
  });
}

// A flag the trainer takes that is not a field of the spec: its usage line, and why a job through
// agents refuses it (empty: a job takes it too).
struct ProcessFlag {
  std::string_view name, metavar, help, group, notAJobs;
};

constexpr ProcessFlag kProcessFlags[] = {
    {"--spec", "FILE|JSON",
     "the whole job as protobuf's JSON of lockstep.v1.JobSpec, in a file or as\nthe text itself (what an agent "
     "hands each rank); the job's other flags\nthen stay out",
     spec::kJob, ""},
    {"--nproc", "N", "launch N ranks on this machine", spec::kJob,
     "the agents start a job's ranks: give --ranks or --ranks-per-agent"},
    {"--dataset", "SPEC",
     "synthetic:n=65536,dim=784,classes=10,seed=1 (default synthetic, dim and\nclasses from --layers) or "
     "npy:FEATURES.npy,LABELS.npy (float32 [N,D],\ninteger labels [N])",
     spec::kJob, ""},
    {"--balance", "even|dynamic",
     "how the global batch is split among ranks (default even); dynamic\nre-splits it from the ranks' measured "
     "compute rates, so that slower\nranks get fewer samples and all finish together (CPU backend)",
     spec::kComm, ""},
    {"--resume", "", "continue from the newest checkpoint in --checkpoint-dir", spec::kCkpt,
     "a job resumes only in its own restarts (--max-restarts); a new job refuses a directory that holds another "
     "run's checkpoints: give it an empty --checkpoint-dir"},
    {"--save-weights", "F", "write the final weights there (safetensors)", spec::kCkpt,
     "a job's weights are its checkpoints: give --checkpoint-dir and --checkpoint-every"},
    {"--metrics-out", "F", "one JSON line per step and rank (default: stdout)", spec::kOut,
     "the agent writes a job's metrics to its job directory; `lockstepctl history` and `report` read them"},
    {"--threads", "N",
     "BLAS threads per rank (default: cores / local ranks); each local rank\nruns on its own share of the CPUs the "
     "process may use, where N fits",
     spec::kOut, "the agent gives each rank the node's cores divided by its local ranks"},
    {"--no-pin-cpus", "", "let local ranks' threads run on any of those CPUs", spec::kOut,
     "each of a job's local ranks computes on its own share of the node's CPUs"},
    {"--log-every", "N", "progress line every N steps (default: about 20 per run)", spec::kOut,
     "a job's rank logs keep the trainer's own interval (`lockstepctl logs JOB`)"},
    {"--quiet", "", "no progress lines", spec::kOut,
     "a job's rank logs keep the trainer's progress lines (`lockstepctl logs JOB`)"},
    {"--alert", "RULE",
     "through agents: 'KPI OP VALUE [for DURATION] [-> ACTIONS]', e.g.\n'gpu_util < 30% for 10m -> notify' (repeatable; docs/alerts.md)",
     spec::kComm, ""},
    {"--notify", "URL", "through agents: POST each alert there as JSON (repeatable; with no\n--alert: the default rules)",
     spec::kComm, ""},
    {"--gemm-peak", "",
     "print one core's sgemm rate, measured on every core at once, as JSON\n(the CPU peak a job's MFU is taken against; the agent runs it)",
     spec::kOut, "the agent measures the CPU's peak itself, once per node"},
    {"--help, --version", "", "", spec::kOut, ""},
};

// "  --lr X                      learning rate": the flag in 28 columns, then its help, continued
// lines under it.
std::string usageLine(std::string_view name, std::string_view metavar, std::string_view help) {
  std::string head = "  " + std::string(name) + (metavar.empty() ? "" : " " + std::string(metavar));
  std::string out = head;
  constexpr std::size_t kColumn = 30;
  if (help.empty()) return out + "\n";
  out += head.size() + 1 < kColumn ? std::string(kColumn - head.size(), ' ') : "\n" + std::string(kColumn, ' ');
  for (char c : help) out += c == '\n' ? "\n" + std::string(kColumn, ' ') : std::string(1, c);
  return out + "\n";
}

std::string usageGroup(std::string_view group) {
  std::string out = "\n" + std::string(group) + ":\n";
  spec::forEachField([&](const auto& f) {
    if (f.flag.group == group && spec::takes(f.flag.jobs, spec::Jobs::kTrainer)) {
      out += usageLine(f.flag.name, f.flag.metavar, f.flag.help);
    }
  });
  for (const auto& p : kProcessFlags) {
    if (p.group == group) out += usageLine(p.name, p.metavar, p.help);
  }
  return out;
}

}  // namespace

Result<DatasetSource> parseDatasetSpec(const std::string& text, const std::vector<std::uint32_t>& layers) {
  const auto colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  const std::string rest = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (kind == "npy") {
    const auto parts = split(rest, ',');
    if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
      return usage("--dataset npy:FEATURES.npy,LABELS.npy needs two file names, got '" + text + "'");
    }
    return DatasetSource{NpyDataset{parts[0], parts[1]}};
  }
  if (kind != "synthetic") {
    return usage("--dataset '" + text + "': the kind must be synthetic:... or npy:...");
  }
  SyntheticDataset d;
  std::optional<std::uint32_t> dim, classes;
  if (!rest.empty()) {
    for (const auto& item : split(rest, ',')) {
      const auto eq = item.find('=');
      if (eq == std::string::npos) return usage("--dataset: '" + item + "' is not key=value");
      const std::string key = item.substr(0, eq);
      const std::string value = item.substr(eq + 1);
      const std::string flag = "--dataset synthetic " + key;
      if (key == "n") {
        LOCKSTEP_ASSIGN_OR_RETURN(d.samples, parseUnsigned<std::uint64_t>(flag, value, 1ull << 31));
      } else if (key == "dim") {
        LOCKSTEP_ASSIGN_OR_RETURN(dim, parseUnsigned<std::uint32_t>(flag, value, 1u << 20));
      } else if (key == "classes") {
        LOCKSTEP_ASSIGN_OR_RETURN(classes, parseUnsigned<std::uint32_t>(flag, value, 1u << 20));
      } else if (key == "seed") {
        LOCKSTEP_ASSIGN_OR_RETURN(d.seed, parseUnsigned<std::uint64_t>(flag, value, ~0ull));
      } else {
        return usage("--dataset synthetic: unknown key '" + key + "' (known: n, dim, classes, seed)");
      }
    }
  }
  d.dim = dim.value_or(layers.empty() ? 0 : layers.front());
  d.classes = classes.value_or(layers.empty() ? 0 : layers.back());
  return DatasetSource{d};
}

std::vector<std::string> withoutNproc(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--nproc") {
      ++i;
      continue;
    }
    if (args[i].rfind("--nproc=", 0) == 0) continue;
    out.push_back(args[i]);
  }
  return out;
}

namespace {

// Walks args through the two maps: "--flag value", "--flag=value" or a switch. A mistake is
// `wording`'s to say, an unknown flag `unknown`'s.
using Wording = std::function<Error(const std::string&)>;
Result<void> walkFlags(const std::vector<std::string>& args, const std::map<std::string, Handler>& valued,
                       const std::map<std::string, Switch>& switches, std::vector<std::string>& given,
                       const Wording& wording, const Wording& unknown) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::optional<std::string> inlineValue;
    if (const auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      inlineValue = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    given.push_back(flag);
    if (auto sw = switches.find(flag); sw != switches.end()) {
      if (inlineValue) return wording(flag + " takes no value");
      sw->second();
      continue;
    }
    auto handler = valued.find(flag);
    if (handler == valued.end()) return unknown(flag);
    if (!inlineValue && i + 1 >= args.size()) return wording(flag + " needs a value");
    LOCKSTEP_TRY(handler->second(flag, inlineValue ? *inlineValue : args[++i]));
  }
  return {};
}

Handler appendInto(std::vector<std::string>& list) {
  return [&list](const std::string&, const std::string& v) -> Result<void> {
    list.push_back(v);
    return {};
  };
}

// --alert and --notify, which both kinds of job take: the rules are checked here, before any rank
// starts (the agent checks them again, and the URLs).
void addAlertFlags(JobSpec& s, std::map<std::string, Handler>& valued) {
  valued["--alert"] = appendInto(s.alertRules);
  valued["--notify"] = appendInto(s.notify);
}

Result<void> checkAlertRules(const JobSpec& s) {
  LOCKSTEP_TRY(alerts::parseRules(s.alertRules));
  for (const auto& url : s.notify) {
    if (auto ok = alerts::checkWebhookUrl(url); !ok) return ok.error().withContext("--notify");
  }
  return {};
}

void writeAlertFlags(const JobSpec& spec, std::vector<std::string>& a) {
  for (const auto& rule : spec.alertRules) a.insert(a.end(), {"--alert", rule});
  for (const auto& url : spec.notify) a.insert(a.end(), {"--notify", url});
}

Handler textInto(std::string& field) {
  return [&field](const std::string&, const std::string& v) -> Result<void> {
    field = v;
    return {};
  };
}

template <class T>
Handler wholeInto(T& field, T max) {
  return [&field, max](const std::string& flag, const std::string& v) -> Result<void> {
    LOCKSTEP_ASSIGN_OR_RETURN(field, parseUnsigned<T>(flag, v, max));
    return {};
  };
}

// What the flags leave to be worked out from each other: the precision from the backend, the
// data set from the layers, the balance from --balance.
Result<void> settle(TrainerOptions& o, const std::string& datasetText, const std::string& balanceText) {
  JobSpec& s = o.spec;
  if (balanceText != "even" && balanceText != "dynamic") return usage("--balance " + balanceText + ": use even or dynamic");
  if (s.rebalanceEvery > 0 && balanceText != "dynamic") return usage("--rebalance-every goes with --balance dynamic");
  s.rebalanceEvery = balanceText == "dynamic" ? (s.rebalanceEvery > 0 ? s.rebalanceEvery : 10) : 0;
  if (!o.gave("--precision")) s.precision = s.backend == Backend::kCuda ? Precision::kBf16 : Precision::kFp32;
  if (!o.gave("--layers")) return usage("--layers is required, e.g. --layers 784,1024,1024,10");
  LOCKSTEP_ASSIGN_OR_RETURN(s.dataset, parseDatasetSpec(datasetText, s.layers));
  if (s.steps == 0 && s.epochs == 0) return usage("give --steps N or --epochs N");
  if (o.resume && s.checkpointDir.empty()) return usage("--resume needs --checkpoint-dir");
  if (o.gave("--keep-checkpoints") && s.keepCheckpoints == 0) return usage("--keep-checkpoints must be at least 1");
  if (o.nproc > 0) s.worldSize = o.nproc;
  return {};
}

// The job whole from --spec: a JSON file, or the JSON text itself. The job's own flags would say it
// twice, so they are refused beside it; --job-id may name it anew, as beside lockstepctl's --spec.
Result<void> takeSpec(TrainerOptions& o, const std::string& specText) {
  for (const auto& flag : o.given) {
    bool jobs = flag == "--dataset" || flag == "--balance";
    spec::forEachField([&](const auto& f) { jobs = jobs || (f.flag.name == flag && flag != "--job-id"); });
    if (jobs) return usage(flag + " is the job's own, which --spec gives whole; leave it out or drop --spec");
  }
  std::string json = specText;
  if (const auto first = specText.find_first_not_of(" \t\r\n"); first == std::string::npos || specText[first] != '{') {
    auto read = readFile(specText, 4u << 20);
    if (!read) return usage("--spec: " + read.error().message);
    json = std::move(read).value();
  }
  auto spec = jobSpecFromJson(json);
  if (!spec) return usage("--spec: " + spec.error().message);
  const std::string jobId = o.spec.jobId;  // --job-id's, or $LOCKSTEP_JOB_ID's
  o.spec = std::move(spec).value();
  if (o.gave("--job-id")) o.spec.jobId = jobId;
  if (o.resume && o.spec.checkpointDir.empty()) return usage("--resume needs a checkpoint directory in the --spec job");
  if (o.nproc > 0) o.spec.worldSize = o.nproc;
  return {};
}

}  // namespace

Result<TrainerOptions> parseTrainerArgs(const std::vector<std::string>& args) {
  TrainerOptions o;
  JobSpec& s = o.spec;
  std::string datasetText = "synthetic";
  std::string balanceText = "even";
  std::optional<std::string> specText;
  if (const char* id = std::getenv("LOCKSTEP_JOB_ID"); id != nullptr && *id != '\0') s.jobId = id;
  else s.jobId = "local";

  std::map<std::string, Handler> valued = {
      {"--nproc", wholeInto(o.nproc, 1024u)},
      {"--spec", [&specText](const std::string&, const std::string& v) -> Result<void> {
         specText = v;
         return {};
       }},
      {"--dataset", textInto(datasetText)},
      {"--balance", textInto(balanceText)},
      {"--save-weights", textInto(o.saveWeightsPath)},
      {"--metrics-out", textInto(o.metricsOut)},
      {"--threads", wholeInto(o.threads, 1024u)},
      {"--log-every", wholeInto(o.logEvery, 1u << 30)},
  };
  std::map<std::string, Switch> switches = {
      {"--resume", [&] { o.resume = true; }},
      {"--quiet", [&] { o.quiet = true; }},
      {"--no-pin-cpus", [&] { o.pinCpus = false; }},
      {"--help", [&] { o.help = true; }},
      {"-h", [&] { o.help = true; }},
      {"--version", [&] { o.version = true; }},
      {"--gemm-peak", [&] { o.gemmPeak = true; }},
  };
  addRowFlags(spec::Jobs::kTrainer, s, valued, switches);
  addAlertFlags(s, valued);
  LOCKSTEP_TRY(walkFlags(args, valued, switches, o.given, usage, [](const std::string& flag) {
    return usage(flag.rfind("-", 0) == 0 ? "unknown option " + flag : "unexpected argument '" + flag + "'");
  }));
  if (o.help || o.version || o.gemmPeak) return o;
  if (specText) {
    LOCKSTEP_TRY(takeSpec(o, *specText));
  } else {
    LOCKSTEP_TRY(settle(o, datasetText, balanceText));
  }
  LOCKSTEP_TRY(validateJobSpec(s));
  LOCKSTEP_TRY(checkAlertRules(s));
  return o;
}

Result<TrainerOptions> parseJobArgs(const std::vector<std::string>& args) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto o, parseTrainerArgs(args));
  for (const auto& p : kProcessFlags) {
    if (!p.notAJobs.empty() && o.gave(std::string(p.name))) {
      return invalidArgument(std::string(p.name) + " is lockstep-trainer's own, not a job's: " + std::string(p.notAJobs));
    }
  }
  return o;
}

Result<std::pair<std::string, std::string>> parseEnvAssignment(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    return invalidArgument("environment variable '" + text + "' is not NAME=VALUE");
  }
  return std::pair{text.substr(0, eq), text.substr(eq + 1)};
}

std::string commandJobFlags() {
  std::string out;
  spec::forEachField([&](const auto& f) {
    if (!f.flag.name.empty() && spec::takes(f.flag.jobs, spec::Jobs::kCommand)) out += " " + std::string(f.flag.name);
  });
  return out.substr(out.empty() ? 0 : 1) + " --workdir --env --alert --notify";
}

Result<JobSpec> parseCommandJobArgs(const std::vector<std::string>& args, const std::vector<std::string>& command) {
  JobSpec s;
  s.command = CommandSpec{command, "", {}};
  std::vector<std::string> envText, given;
  std::map<std::string, Handler> valued = {
      {"--workdir", textInto(s.command->workingDir)},
      {"--env", [&](const std::string&, const std::string& v) -> Result<void> {
         envText.push_back(v);
         return {};
       }},
  };
  std::map<std::string, Switch> switches;
  addRowFlags(spec::Jobs::kCommand, s, valued, switches);
  addAlertFlags(s, valued);
  const Wording plain = [](const std::string& message) { return invalidArgument(message); };
  LOCKSTEP_TRY(walkFlags(args, valued, switches, given, plain, [](const std::string& flag) {
    return invalidArgument(flag + " is not a flag of a job that runs your own program; the program's own flags go "
                           "after -- (job flags: " + commandJobFlags() + ")");
  }));
  for (const auto& item : envText) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto assignment, parseEnvAssignment(item));
    s.command->env.push_back(std::move(assignment));
  }
  LOCKSTEP_TRY(validateJobSpec(s));
  LOCKSTEP_TRY(checkAlertRules(s));
  return s;
}

std::string trainerUsage() {
  std::string out = R"(Usage: lockstep-trainer [options]

Synchronous data-parallel training of an MLP classifier. One process is one rank; the rank and
world come from torchrun's environment (RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR
MASTER_PORT), or --nproc N starts N local ranks. Without either it trains alone.
)";
  for (std::string_view group : {spec::kJob, spec::kOptim, spec::kComm, spec::kRes, spec::kCkpt, spec::kOut}) {
    out += usageGroup(group);
  }
  return out + R"(
When LOCKSTEP_REPORT holds a ZeroMQ endpoint, each step is also pushed there as a protobuf
lockstep.v1.StreamMessage. Exit codes: 0 done, 1 failure, 2 bad input, 3 lost peer or timeout,
128+N stopped by signal N. See docs/trainer.md.
)";
}

namespace {

// A restart of this job (attempt 1, 2, ...) continues where the last attempt stopped. A new job
// is not told to resume: a directory already holding another run's checkpoints is refused rather
// than resumed from (and then pruned by this job's retention).
bool resumes(const JobSpec& spec) { return spec.attempt > 0 && !spec.checkpointDir.empty(); }

// The flags of the rows a kind of job takes whose value is not JobSpec{}'s (or that are always
// written): what makes a parser of that kind's flags read back `spec`'s values.
std::vector<std::string> rowFlags(const JobSpec& spec, spec::Jobs job) {
  static const JobSpec kDefaults{};
  std::vector<std::string> a;
  spec::forEachField([&](const auto& f) {
    if (f.flag.name.empty() || !spec::takes(f.flag.jobs, job)) return;
    if (f.of(spec) == f.of(kDefaults) && !f.style.alwaysWritten) return;
    a.emplace_back(f.flag.name);
    if (f.flag.metavar.empty()) return;
    if constexpr (std::is_same_v<typename std::decay_t<decltype(f)>::Type, std::uint64_t>) {
      if (f.style.bytes) return a.push_back(bytesText(f.of(spec)));
    }
    a.push_back(textOf(f.of(spec)));
  });
  return a;
}

}  // namespace

Result<std::uint64_t> parseSize(const std::string& flag, const std::string& text) {
  const std::size_t unit = text.empty() ? std::string::npos : kByteUnits.find(static_cast<char>(std::toupper(text.back())));
  const std::string digits = unit == std::string::npos ? text : text.substr(0, text.size() - 1);
  const int shift = unit == std::string::npos ? 20 : 10 * static_cast<int>(unit);
  auto number = parseUnsigned<std::uint64_t>(flag, digits, std::numeric_limits<std::uint64_t>::max() >> shift);
  if (!number) return usage(flag + ": '" + text + "' is not a size: write it as 512K, 256M, 4G or 1T");
  return *number << shift;
}

std::vector<std::string> jobSpecToTrainerArgs(const JobSpec& spec, const std::string& metricsPath) {
  std::vector<std::string> a = rowFlags(spec, spec::Jobs::kTrainer);
  if (const auto* s = std::get_if<SyntheticDataset>(&spec.dataset)) {
    a.insert(a.end(), {"--dataset", "synthetic:n=" + std::to_string(s->samples) + ",dim=" + std::to_string(s->dim) +
                                        ",classes=" + std::to_string(s->classes) + ",seed=" + std::to_string(s->seed)});
  } else {
    const auto& npy = std::get<NpyDataset>(spec.dataset);
    a.insert(a.end(), {"--dataset", "npy:" + npy.featuresPath + "," + npy.labelsPath});
  }
  if (spec.rebalanceEvery > 0) a.insert(a.end(), {"--balance", "dynamic"});
  writeAlertFlags(spec, a);
  if (resumes(spec)) a.emplace_back("--resume");
  a.insert(a.end(), {"--metrics-out", metricsPath});
  return a;
}

std::vector<std::string> rankArgs(const JobSpec& spec, const std::string& metricsPath) {
  JobSpec job = spec;
  job.ranks.clear();  // each rank takes its place from its environment; this keeps the text short
  job.agents.clear();
  // A rank has no use for the job's alerts, and its command line is every local user's to read
  // (/proc/PID/cmdline): a webhook's URL is a secret.
  job.alertRules.clear();
  job.notify.clear();
  job.budget.reset();
  job.memPerRank = 0;  // the agent fences them (docs/fences.md)
  job.maxProcessesPerRank = 0;
  job.cpusPerRank = 0;
  std::vector<std::string> a = {"--spec", jobSpecToJson(job, true), "--metrics-out", metricsPath};
  if (resumes(spec)) a.emplace_back("--resume");
  return a;
}

std::vector<std::string> jobSpecToCommandJobArgs(const JobSpec& spec) {
  std::vector<std::string> a = rowFlags(spec, spec::Jobs::kCommand);
  if (!spec.command) return a;
  if (!spec.command->workingDir.empty()) a.insert(a.end(), {"--workdir", spec.command->workingDir});
  for (const auto& [name, value] : spec.command->env) a.insert(a.end(), {"--env", name + "=" + value});
  writeAlertFlags(spec, a);
  return a;
}

}  // namespace lockstep::jobflags
