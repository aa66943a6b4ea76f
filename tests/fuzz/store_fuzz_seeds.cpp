// Writes a seed corpus for store_fuzzer.cpp: well-formed conversations with the store, so the
// fuzzer starts from inputs that reach every request handler.
//   lockstep_store_fuzz_seeds DIR

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "store_wire.h"

using namespace lockstep::store_wire;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string hello = Writer().u8(kOpHello).frame();
  const std::string set = Writer().u8(kOpSet).str("lockstep/j/0/gloo/0").str("address").frame();
  const std::string get = Writer().u8(kOpGet).str("lockstep/j/0/gloo/0").u32(20).frame();
  const std::string beat = Writer().u8(kOpHeartbeat).i64(7).u8(1).i64(12).frame();
  const std::string status = Writer().u8(kOpStatus).frame();
  const std::string auth = Writer().u8(kOpAuth).u32(1).raw(std::string(kMacBytes, 'm')).frame();
  // Byte 0: the store and whether the fuzzer answers the challenge first; byte 1: the rank.
  const std::vector<std::string> seeds = {
      std::string("\x00\x00", 2) + hello + set + get,
      std::string("\x01\x01", 2) + hello + beat + status,
      std::string("\x00\x02", 2) + get + set + get,
      std::string("\x01\x03", 2) + set + set + status,
      std::string("\x02\x00", 2) + auth,
      std::string("\x03\x00", 2) + auth + hello,
  };
  for (std::size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream out(std::string(argv[1]) + "/seed-" + std::to_string(i), std::ios::binary);
    out << seeds[i];
  }
  return 0;
}
