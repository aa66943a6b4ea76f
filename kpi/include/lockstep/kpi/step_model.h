#pragma once
// A data-parallel step's communication, simulated from measured figures (docs/trainer.md, "How
// buckets are chosen"): the model the trainer chooses its gradient buckets with (trainer/src/
// bucket_plan.h), and the report's advice on a DDP program's bucket_cap_mb (report/diagnosis.cpp).
//
// A step's backward makes the gradient buffer final from its start to its end; each bucket is
// all-reduced, in order, one at a time, as soon as backward has passed its end; after backward the
// main thread waits for each bucket in turn and applies the optimizer to it. Compute runs at full
// speed, or at 1 - contention while an all-reduce runs beside it.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::kpi {

// A contiguous range [begin, end) of a flat gradient buffer (in floats), all-reduced as one.
struct BufferRange {
  std::size_t begin = 0;
  std::size_t end = 0;
};

// All-reduce time against message size on one communicator: measured points, linear between them
// and beyond the last, never below the smallest message's time for smaller ones.
struct CommCurve {
  std::vector<double> bytes;   // ascending
  std::vector<double> micros;  // all-reduce time at each size
  // Linear between the measured points, never below the smallest one's time; beyond the last,
  // the fit's slope.
  double at(double messageBytes) const;
  // The least-squares line through the points, its slope never negative.
  struct Fit {
    double fixedMicros = 0;
    double microsPerByte = 0;
  };
  Fit fit() const;
  // The fit as "a ms + b ms/MB", for people.
  std::string describe() const;
};

struct StepFigures {
  CommCurve allReduce;
  // When backward had made grads[0, readyEnds[i]) final, in microseconds from its start, compute
  // alone. Ascending; the last entry is the whole buffer and the backward's duration.
  std::vector<std::size_t> readyEnds;
  std::vector<double> readyMicros;
  double optimizerMicrosPerFloat = 0;
  // Compute time lost per microsecond an all-reduce runs (0: communication does not slow compute,
  // as on a GPU; 1: it stops compute, as when it shares the rank's only core).
  double contention = 0;
  std::uint32_t worldSize = 1;
  // Ranges become final only at the measured points (the GPU loop launches a layer's buckets when
  // the layer is done), not gradually between them.
  bool readyOnlyAtPoints = false;

  double backwardMicros() const { return readyMicros.empty() ? 0 : readyMicros.back(); }
  // When grads[0, end) is final, interpolated between the measured points.
  double readyAt(std::size_t end) const;
};

// What a plan is expected to cost per step, from the backward's start.
struct StepForecast {
  double stepMicros = 0;         // to the end of the last bucket's optimizer
  double exposedMicros = 0;      // the main thread waiting for all-reduce after backward
  double backwardEndMicros = 0;  // when backward ends, slowed by the all-reduces beside it
};

StepForecast simulateStep(const std::vector<BufferRange>& buckets, const StepFigures& figures);

// "9 buckets of ~0.8 MB" (MB: 2^20 bytes, as --bucket-mb and bucket_cap_mb count).
std::string describeBuckets(const std::vector<BufferRange>& buckets);
std::string megabytes(double bytes);

}  // namespace lockstep::kpi
