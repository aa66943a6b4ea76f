// Writes the protocol fuzzer's seed corpus (valid messages of every kind) into a directory, from
// the current schema, so that the seeds never go stale.

#include <cstdio>
#include <fstream>
#include <string>

#include "lockstep/protocol/codec.h"

using namespace lockstep;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  int n = 0;
  auto write = [&](char kind, const std::string& bytes) {
    std::ofstream(std::string(argv[1]) + "/seed-" + std::to_string(n++), std::ios::binary) << kind << bytes;
  };
  JobSpec spec;
  spec.jobId = "seed";
  spec.layers = {784, 1024, 10};
  spec.steps = 100;
  spec.worldSize = 2;
  spec.ranks = {{0, "a", 0, std::nullopt}, {1, "b", 0, std::nullopt}};
  spec.targetLoss = 0.5;
  JobSpec npy = spec;
  npy.dataset = NpyDataset{"/x.npy", "/y.npy"};
  npy.layers = {16, 4};
  write(0, encode(Request{1, HelloRequest{1, "seed"}}));
  write(0, encode(Request{2, StartJobRequest{spec, ""}}));
  write(0, encode(Request{3, StartJobRequest{npy, ""}}));
  write(0, encode(Request{4, StopJobRequest{"seed", 100}}));
  write(0, encode(Request{5, FetchRequest{10, 100, 200, {"job-left-out"}}}));
  write(0, encode(Request{6, LogsRequest{"seed", 1, 100}}));
  StepReport report;
  report.jobId = "seed";
  report.worldSize = 2;
  report.step = 3;
  report.globalLoss = 1.5f;
  GpuSample gpu;
  gpu.node = "a";
  gpu.utilizationPct = 90.0f;
  gpu.powerMilliwatts = 300000;
  write(2, encode(StreamMessage{1, "a", report}));
  write(2, encode(StreamMessage{2, "a", gpu}));
  write(2, encode(StreamMessage{3, "a", ProcessSample{"seed", 1, 42, 5, 99.0f, 1000}}));
  write(2, encode(StreamMessage{4, "a", JobEvent{"seed", JobEventKind::kFailed, 6, 1u, 3, {}, "m", "tail", 7u}}));
  write(2, encode(StreamMessage{5, "", PhaseReport{"seed", 1, 2, 0, "checkpoint", 8, 2, 3}}));
  NodeHello hello;
  hello.host = "a";
  hello.gpus = {{0, "H200", "GPU-1", 1}};
  write(1, encode(Reply{1, hello}));
  write(1, encode(Reply{2, FetchReply{1, 1, 2, {StreamMessage{1, "a", report}}}}));
  write(1, encode(Reply{3, JobsReply{{JobStatus{spec, JobState::kRunning, {}, 1, 0, "", 29500, {}}}}}));
  write(1, encode(Reply{4, ErrorReply{ErrorCode::kNotFound, "no"}}));
  write(3, jobSpecToJson(spec));
  write(3, jobSpecToJson(npy));
  std::printf("%d seeds\n", n);
  return 0;
}
