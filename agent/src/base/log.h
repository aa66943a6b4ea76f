#pragma once
// The agent's log: timestamped lines to stderr and its log file (rotated once past 16 MiB).
// Thread-safe. Every part of the agent logs through one, without knowing the agent's server.

#include <mutex>
#include <string>

namespace lockstep::agent {

class Log {
 public:
  explicit Log(std::string path);
  void info(const std::string& line);
  void error(const std::string& line);

 private:
  void write(const char* level, const std::string& line);
  std::string path_;
  std::mutex mutex_;
};

}  // namespace lockstep::agent
