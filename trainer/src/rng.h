#pragma once
// Small deterministic generators: the same numbers on every rank and machine for the same seed.

#include <cstdint>

namespace lockstep::trainer {

// SplitMix64 (Steele, Lea, Flood 2014): fast, and good enough for init, data and shuffles.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 24 random bits.
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  // Uniform in [-1, 1).
  float uniformSigned() { return 2.0f * uniform() - 1.0f; }
  // Uniform integer in [0, bound), bound > 0 (Lemire's multiply-shift; bias below 2^-32 for bound < 2^32).
  std::uint64_t below(std::uint64_t bound) {
    __extension__ using Wide = unsigned __int128;
    return static_cast<std::uint64_t>((static_cast<Wide>(next()) * bound) >> 64);
  }

 private:
  std::uint64_t state_;
};

// Derives an independent stream seed from a seed and a stream number.
inline std::uint64_t mixSeed(std::uint64_t seed, std::uint64_t stream) {
  SplitMix64 a(seed ^ 0x6a09e667f3bcc909ull);
  SplitMix64 b(a.next() ^ stream);
  b.next();
  return b.next();
}

}  // namespace lockstep::trainer
