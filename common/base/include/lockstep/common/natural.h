#pragma once
// Natural order for names people give nodes and interfaces: "node2" before "node10", "eth9"
// before "eth10". Runs of digits compare as numbers, the rest byte by byte. Every list of nodes
// that a user reads (the app's tables and heatmap, lockstepctl, reports) is sorted with this.

#include <string_view>

namespace lockstep {

bool naturalLess(std::string_view a, std::string_view b);

// For ordered containers: std::map<std::string, T, NaturalLess>.
struct NaturalLess {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return naturalLess(a, b); }
};

}  // namespace lockstep
