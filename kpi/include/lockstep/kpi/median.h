#pragma once
// The median of a few values: the ranks' times of a step (kpi/), a measurement's repeats (the
// trainer's bucket planning).

#include <algorithm>
#include <vector>

namespace lockstep::kpi {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace lockstep::kpi
