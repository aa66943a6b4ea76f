#include "base/log.h"

#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <ctime>

namespace lockstep::agent {
namespace {
constexpr std::uint64_t kLogRotateBytes = 16u << 20;
}  // namespace

Log::Log(std::string path) : path_(std::move(path)) {}

void Log::info(const std::string& line) { write("info", line); }
void Log::error(const std::string& line) { write("error", line); }

void Log::write(const char* level, const std::string& line) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &local);
  const std::string text = std::string(stamp) + " " + level + ": " + line + "\n";
  std::lock_guard lock(mutex_);
  std::fputs(text.c_str(), stderr);
  if (path_.empty()) return;
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && static_cast<std::uint64_t>(st.st_size) > kLogRotateBytes) {
    std::rename(path_.c_str(), (path_ + ".1").c_str());
  }
  if (FILE* f = std::fopen(path_.c_str(), "ae")) {  // close-on-exec: never inherited by a rank
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
}

}  // namespace lockstep::agent
