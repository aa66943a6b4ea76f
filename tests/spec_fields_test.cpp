// Issue 41: a job spec's fields are described once (lockstep/protocol/spec_fields.h), and every
// form follows from that description: the schema, protobuf, JSON, the trainer's and a command job's
// flags, their usage text and each field's range. Each test fails on a form that drops or alters a
// field, and on a field of the schema that the description does not know.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "lockstep/jobflags/options.h"
#include "lockstep/protocol/codec.h"
#include "lockstep/protocol/records.h"
#include "lockstep/protocol/spec_fields.h"
#include "lockstep/protocol/validate.h"
#include "lockstep/v1/lockstep.pb.h"

namespace lockstep {
namespace {

using spec::Jobs;

// A trainer job in which every field the trainer has holds a value other than JobSpec{}'s, except
// where one excludes another (steps and epochs, a GPU and rebalancing): trainerB has those.
JobSpec trainerA() {
  JobSpec s;
  s.jobId = "every-field";
  s.name = "all of them";
  s.backend = Backend::kCuda;
  s.layers = {12, 40, 7};
  s.activation = Activation::kGelu;
  s.precision = Precision::kBf16;
  s.dataset = NpyDataset{"/data/x.npy", "/data/y.npy"};
  s.batchPerRank = 48;
  s.accumSteps = 3;
  s.optimizer = {OptimizerKind::kAdamW, 0.1 / 3, 0.5, true, 0.013, 0.85, 0.995, 1e-7, LrScaling::kLinear, 96};
  s.epochs = 4;
  s.targetLoss = 0.125;
  s.shuffle = false;
  s.seed = 1234567890123ull;
  s.bucketMb = 2.5;
  s.checkpointEvery = 50;
  s.checkpointDir = "/ckpt";
  s.keepCheckpoints = 7;
  s.initWeightsPath = "/w.safetensors";
  s.timeoutS = 90;
  s.worldSize = 2;
  s.ranks = {{0, "node-a", 0, 0u}, {1, "node-b", 0, 1u}};
  s.rendezvousHost = "node-a";
  s.rendezvousPort = 29500;
  s.prices = {2.5, 0.05, 0.3, "EUR"};
  s.maxRestarts = 2;
  s.minWorldSize = 1;
  s.attempt = 1;
  s.restartReason = "node-b was lost";
  s.agents = {{"node-a", "10.0.0.1:7700", std::string(40, 'a')}, {"node-b", "10.0.0.2:7700", std::string(40, 'b')}};
  s.slurmJobId = "42_7";
  s.allocatedGpus = 8;
  s.onStall = OnStall::kRestart;
  s.stallAfterS = 30;
  s.alertRules = {"exposed_comm > 40% for 2m -> notify", "loss is nan -> notify,stop"};
  s.notify = {"https://hooks.example.org/T0/B1?x=1", "http://127.0.0.1:8080/hook"};
  s.budget = 40.5;
  s.memPerRank = std::uint64_t{3} << 30;
  s.maxProcessesPerRank = 512;
  s.cpusPerRank = 2;
  return s;
}

JobSpec trainerB() {
  JobSpec s = trainerA();
  s.backend = Backend::kCpu;
  s.precision = Precision::kFp32;
  for (auto& r : s.ranks) r.gpuIndex.reset();
  s.epochs = 0;
  s.steps = 77;
  s.rebalanceEvery = 5;
  s.shard = Shard::kOptimizer;
  s.dataset = SyntheticDataset{1000, 12, 7, 9};
  return s;
}

// The parameter server's fields, which the others' re-splitting and sharding do not go with.
JobSpec trainerC() {
  JobSpec s = trainerB();
  s.rebalanceEvery = 0;
  s.shard = Shard::kNone;
  s.sync = Sync::kParameterServer;
  s.staleness = 2;
  return s;
}

// The parameter server split over ranks, which is synchronous only.
JobSpec trainerD() {
  JobSpec s = trainerC();
  s.staleness = 0;
  s.psRanks = 2;
  return s;
}

JobSpec commandJob() {
  JobSpec s;
  s.jobId = "own-every-field";
  s.name = "my program";
  s.backend = Backend::kCuda;
  s.command = CommandSpec{{"python3", "train.py", "--lr", "0.1"}, "/home/me", {{"DATA", "a=b c"}, {"SEED", "3"}}};
  s.targetLoss = 0.25;
  s.maxRestarts = 3;
  s.minWorldSize = 2;
  s.onStall = OnStall::kStop;
  s.stallAfterS = 45;
  s.alertRules = {"gpu_util < 5% for 30m -> stop"};
  s.notify = {"https://hooks.example.org/own"};
  s.budget = 12;
  s.memPerRank = 1000;  // bytes no larger unit writes whole: the flag says 1000B
  s.maxProcessesPerRank = 64;
  s.cpusPerRank = 3;
  s.worldSize = 2;
  s.ranks = {{0, "node-a", 0, 0u}, {1, "node-a", 1, 1u}};
  s.prices = {1, 0, 0, "USD"};
  return s;
}

// `s` with the fields that no flag of `job` carries as JobSpec{} has them: what a parser of
// those flags can give back.
JobSpec onlyFlagged(const JobSpec& s, Jobs job) {
  JobSpec out = s;
  const JobSpec defaults;
  spec::forEachField([&](const auto& f) {
    if (f.flag.name.empty() || !spec::takes(f.flag.jobs, job)) f.of(out) = f.of(defaults);
  });
  out.ranks.clear();
  out.agents.clear();
  return out;
}

TEST(SpecFields, TheDescriptionNamesEveryFieldOfTheSchemasJobSpec) {
  std::set<std::pair<std::string, std::string>> rows;
  spec::forEachField([&](const auto& f) {
    EXPECT_TRUE(rows.emplace(f.message, f.name).second) << f.name << " is described twice";
  });
  const auto* message = v1::JobSpec::descriptor();
  std::size_t named = 0;
  for (int i = 0; i < message->field_count(); ++i) {
    const auto* field = message->field(i);
    const auto is = [&](const auto& list) {
      return std::find(std::begin(list), std::end(list), field->name()) != std::end(list);
    };
    if (is(spec::kStructured)) continue;
    if (is(spec::kMessages)) {
      for (int k = 0; k < field->message_type()->field_count(); ++k) {
        const std::string sub = field->message_type()->field(k)->name();
        EXPECT_TRUE(rows.count({field->name(), sub})) << field->name() << "." << sub << " is not in spec_fields.h";
        named += rows.count({field->name(), sub});
      }
      continue;
    }
    EXPECT_TRUE(rows.count({"", field->name()})) << "JobSpec." << field->name() << " is not in spec_fields.h";
    named += rows.count({"", field->name()});
  }
  EXPECT_EQ(named, rows.size()) << "a row names a field the schema does not have";
}

TEST(SpecFields, TheTestSpecsGiveEveryFieldAValueOtherThanItsDefault) {
  // Otherwise a form that dropped that field would pass the round trips below unseen.
  const JobSpec defaults;
  spec::forEachField([&](const auto& f) {
    const bool set = f.of(trainerA()) != f.of(defaults) || f.of(trainerB()) != f.of(defaults) ||
                     f.of(trainerC()) != f.of(defaults) || f.of(trainerD()) != f.of(defaults);
    EXPECT_TRUE(set) << f.name << ": give it a value in trainerA(), trainerB(), trainerC() or trainerD()";
    if (spec::takes(f.flag.jobs, Jobs::kCommand)) {
      EXPECT_NE(f.of(commandJob()), f.of(defaults)) << f.name << ": give it a value in commandJob()";
    }
  });
}

TEST(SpecFields, EveryFieldSurvivesProtobufAndJson) {
  for (const JobSpec& s : {trainerA(), trainerB(), trainerC(), trainerD(), commandJob()}) {
    ASSERT_TRUE(validateJobSpec(s).ok()) << s.jobId << ": " << validateJobSpec(s).error().message;
    const Request request{1, StartJobRequest{s, ""}};
    auto back = decodeRequest(encode(request));
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(std::get<StartJobRequest>(back->body).spec, s) << s.jobId;
    auto json = jobSpecFromJson(jobSpecToJson(s));
    ASSERT_TRUE(json) << json.error().message;
    EXPECT_EQ(*json, s) << jobSpecToJson(s);
  }
}

TEST(SpecFields, EveryFlaggedFieldSurvivesTheTrainersFlags) {
  for (const JobSpec& s : {trainerA(), trainerB(), trainerC(), trainerD()}) {
    const auto args = jobflags::jobSpecToTrainerArgs(s, "/m.jsonl");
    auto parsed = jobflags::parseTrainerArgs(args);
    ASSERT_TRUE(parsed) << parsed.error().message;
    JobSpec expected = onlyFlagged(s, Jobs::kTrainer);
    expected.worldSize = 1;  // a rank by hand trains alone; through agents its environment says
    EXPECT_EQ(parsed->spec, expected) << s.jobId;
    EXPECT_EQ(parsed->resume, s.attempt > 0) << "a restart resumes";
  }
}

TEST(SpecFields, ARankGetsItsSpecWholeFromTheAgent) {
  // The agent hands each rank the validated spec as JSON (rankArgs); nothing is lost on the way
  // but the placements, which a rank takes from its environment, and the alerts, which are the
  // supervising agent's and whose webhooks' URLs are secrets a command line would show everyone.
  for (const JobSpec& s : {trainerA(), trainerB(), trainerC(), trainerD()}) {
    const auto args = jobflags::rankArgs(s, "/m.jsonl");
    for (const auto& arg : args) EXPECT_EQ(arg.find("hooks.example.org"), std::string::npos) << arg;
    auto parsed = jobflags::parseTrainerArgs(args);
    ASSERT_TRUE(parsed) << parsed.error().message;
    JobSpec expected = s;
    expected.ranks.clear();
    expected.agents.clear();
    expected.alertRules.clear();
    expected.notify.clear();
    expected.budget.reset();
    expected.memPerRank = 0;  // the agent fences the rank; the rank has no use for them
    expected.maxProcessesPerRank = 0;
    expected.cpusPerRank = 0;
    EXPECT_EQ(parsed->spec, expected) << jobSpecToJson(parsed->spec);
    EXPECT_EQ(parsed->metricsOut, "/m.jsonl");
    EXPECT_EQ(parsed->resume, s.attempt > 0) << "a restart resumes";
    // A job's own flag beside --spec would say it twice.
    auto twice = args;
    twice.insert(twice.end(), {"--lr", "0.5"});
    auto refused = jobflags::parseTrainerArgs(twice);
    ASSERT_FALSE(refused);
    EXPECT_NE(refused.error().message.find("--lr is the job's own"), std::string::npos) << refused.error().message;
  }
  // --job-id may name it anew, as beside lockstepctl's --spec.
  auto args = jobflags::rankArgs(trainerB(), "/m.jsonl");
  args.insert(args.end(), {"--job-id", "renamed"});
  auto renamed = jobflags::parseTrainerArgs(args);
  ASSERT_TRUE(renamed) << renamed.error().message;
  EXPECT_EQ(renamed->spec.jobId, "renamed");
  // A spec that is not a valid job says what is wrong with it, and so does one that is not there.
  auto missing = jobflags::parseTrainerArgs({"--spec", "/nonexistent/job.json"});
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("--spec: "), std::string::npos) << missing.error().message;
  auto bad = jobflags::parseTrainerArgs({"--spec", R"({"jobId": "j", "bogusField": 1})"});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("--spec: "), std::string::npos) << bad.error().message;
}

TEST(SpecFields, EveryFlaggedFieldSurvivesACommandJobsFlags) {
  const JobSpec s = commandJob();
  auto parsed = jobflags::parseCommandJobArgs(jobflags::jobSpecToCommandJobArgs(s), s.command->argv);
  ASSERT_TRUE(parsed) << parsed.error().message;
  JobSpec expected = onlyFlagged(s, Jobs::kCommand);
  expected.worldSize = 1;
  EXPECT_EQ(*parsed, expected);
  // A flag without its value is named plainly: the trainer's usage is not this job's.
  auto valueless = jobflags::parseCommandJobArgs({"--name"}, s.command->argv);
  ASSERT_FALSE(valueless);
  EXPECT_EQ(valueless.error().message, "--name needs a value");
  // A trainer's flag is refused, and the refusal lists the flags a command job takes.
  auto refused = jobflags::parseCommandJobArgs({"--layers", "4,2"}, s.command->argv);
  ASSERT_FALSE(refused);
  spec::forEachField([&](const auto& f) {
    if (!spec::takes(f.flag.jobs, Jobs::kCommand)) return;
    EXPECT_NE(refused.error().message.find(std::string(f.flag.name)), std::string::npos) << refused.error().message;
  });
}

TEST(SpecFields, TheUsageTextHasALineForEveryFlag) {
  const std::string usage = jobflags::trainerUsage();
  spec::forEachField([&](const auto& f) {
    if (f.flag.name.empty() || !spec::takes(f.flag.jobs, Jobs::kTrainer)) return;
    EXPECT_NE(usage.find("\n  " + std::string(f.flag.name) + " "), std::string::npos) << f.flag.name;
  });
}

// One past a field's bound: the largest number plus one, or a text one byte too long.
template <class T>
T pastTheBound(const spec::Field<T>& f) {
  if constexpr (std::is_same_v<T, std::string>) {
    return std::string(static_cast<std::size_t>(f.hi) + 1, 'x');
  } else if constexpr (records::IsOptional<T>::value) {
    return f.hi + 1;
  } else {
    return static_cast<T>(f.hi + 1);
  }
}

TEST(SpecFields, EachBoundOfTheDescriptionIsCheckedAndNamesTheField) {
  spec::forEachField([&](const auto& f) {
    using T = typename std::decay_t<decltype(f)>::Type;
    if constexpr (!std::is_same_v<T, bool> && !std::is_enum_v<T> && !std::is_same_v<T, std::vector<std::uint32_t>>) {
      if (f.hi == 0) return;
      JobSpec s = trainerB();
      f.of(s) = pastTheBound(f);
      auto checked = validateJobSpec(s);
      if (f.style.boundOnFlag) {
        // A bound only its flag has held: a spec from the wire or a job table keeps its value.
        EXPECT_TRUE(checked.ok()) << f.name << ": " << checked.error().message;
        auto flagged = jobflags::parseTrainerArgs(jobflags::jobSpecToTrainerArgs(s, "/m.jsonl"));
        ASSERT_FALSE(flagged) << f.flag.name << " past " << f.hi << " was taken";
        EXPECT_NE(flagged.error().message.find(std::string(f.flag.name) + ": "), std::string::npos)
            << flagged.error().message;
        return;
      }
      ASSERT_FALSE(checked.ok()) << f.name << " past " << f.hi << " was taken";
      EXPECT_NE(checked.error().message.find(std::string(f.label)), std::string::npos)
          << f.name << ": " << checked.error().message;
    }
  });
}

}  // namespace
}  // namespace lockstep
