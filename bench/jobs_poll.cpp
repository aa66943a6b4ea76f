// What a client's once-a-second job list costs at scale (issue 46 §1): each agent of a job answers
// with the job's status, whose spec places every rank of the job, so the app polling N agents
// fetched N copies of an N×8-rank spec every second. With ListJobsRequest.known_specs the agent
// leaves out the specs the client holds. For jobs of 1,024 to 16,384 ranks on nodes of 8, through
// the real codec: the bytes of one agent's reply and what all of them send the desktop each second,
// with the spec and without, and the client's decode time per reply, side by side in one run.
//
//   build/bin/lockstep-bench-jobs-poll [--rounds R]

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "lockstep/protocol/codec.h"
#include "lockstep/protocol/job_list.h"

using namespace lockstep;
using Clock = std::chrono::steady_clock;

namespace {

// Node `node`'s status of a trainer job on `nodes` nodes of 8 ranks: the whole spec, its own ranks.
JobStatus statusOn(std::uint32_t nodes, std::uint32_t node) {
  JobStatus st;
  st.spec.jobId = "llama-pretrain-0042";
  st.spec.name = "pretrain";
  st.spec.layers = {1024, 4096, 4096, 1000};
  st.spec.dataset = SyntheticDataset{.samples = 1'000'000, .dim = 1024, .classes = 1000};
  st.spec.steps = 100'000;
  st.spec.backend = Backend::kCuda;
  st.spec.worldSize = nodes * 8;
  for (std::uint32_t n = 0; n < nodes; ++n) {
    char name[32];
    std::snprintf(name, sizeof name, "gpu-node-%05u", n);
    for (std::uint32_t g = 0; g < 8; ++g) st.spec.ranks.push_back({n * 8 + g, name, g, g});
  }
  st.state = JobState::kRunning;
  st.startedUnixUs = 1'800'000'000'000'000;
  st.owner = "alice";
  for (std::uint32_t g = 0; g < 8; ++g) {
    st.ranks.push_back({node * 8 + g, g, g, 4000 + g, JobState::kRunning, std::nullopt, std::nullopt, false});
    RankProgress p;
    p.rank = node * 8 + g;
    p.recorded = p.reportsSteps = true;
    p.step = 12345;
    p.phase = "backward";
    st.progress.push_back(p);
  }
  return st;
}

JobStatus omitted(JobStatus st) {
  omitSpec(st);
  return st;
}

double decodeMicros(const std::string& bytes, int rounds) {
  const auto start = Clock::now();
  std::size_t jobs = 0;
  for (int i = 0; i < rounds; ++i) {
    auto r = decodeReply(bytes);
    if (!r) {
      std::fprintf(stderr, "decode failed: %s\n", r.error().message.c_str());
      std::exit(1);
    }
    jobs += std::get<JobsReply>(r->body).jobs.size();
  }
  if (jobs != static_cast<std::size_t>(rounds)) std::exit(1);
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / rounds;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
  }
  std::printf("%8s %7s %14s %14s %16s %16s %12s %12s %8s\n", "GPUs", "agents", "reply B", "reply B known",
              "desktop MB/s", "MB/s known", "decode us", "us known", "ratio");
  for (std::uint32_t nodes : {128u, 512u, 2048u}) {
    const JobStatus full = statusOn(nodes, 1);
    const std::string withSpec = encode(Reply{1, JobsReply{{full}}});
    const std::string known = encode(Reply{1, JobsReply{{omitted(full)}}});
    const double us = decodeMicros(withSpec, rounds), usKnown = decodeMicros(known, rounds * 10);
    std::printf("%8u %7u %14zu %14zu %16.1f %16.3f %12.1f %12.2f %8.0fx\n", nodes * 8, nodes, withSpec.size(),
                known.size(), static_cast<double>(withSpec.size()) * nodes / 1e6,
                static_cast<double>(known.size()) * nodes / 1e6, us, usKnown,
                static_cast<double>(withSpec.size()) / static_cast<double>(known.size()));
  }
  std::printf("(desktop MB/s: every agent's reply once a second, as the app polls; decode: the client's, per reply)\n");
  return 0;
}
