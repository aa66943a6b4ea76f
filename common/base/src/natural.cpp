#include "lockstep/common/natural.h"

namespace lockstep {
namespace {

bool isDigit(char c) { return c >= '0' && c <= '9'; }

// The run of digits at `i`, without its leading zeros; `i` moves past the run.
std::string_view digits(std::string_view s, std::size_t& i) {
  while (i < s.size() && s[i] == '0' && i + 1 < s.size() && isDigit(s[i + 1])) ++i;
  const std::size_t start = i;
  while (i < s.size() && isDigit(s[i])) ++i;
  return s.substr(start, i - start);
}

}  // namespace

bool naturalLess(std::string_view a, std::string_view b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (isDigit(a[i]) && isDigit(b[j])) {
      const std::size_t runA = i, runB = j;
      const std::string_view x = digits(a, i), y = digits(b, j);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      // Equal numbers: fewer leading zeros first, so that the order stays strict ("1" < "01").
      if (i - runA != j - runB) return i - runA < j - runB;
      continue;
    }
    if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

}  // namespace lockstep
