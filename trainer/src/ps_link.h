#pragma once
// Point-to-point messages between the workers and their parameter server (--sync
// parameter-server, ps_server.h), over a Gloo mesh of their own: the workers are its ranks 0..W-1
// and the server's parts its ranks W..W+N-1, part s hosted in rank s's process. Its pairs are in Gloo's asynchronous
// mode, which point-to-point buffers need (the collectives' mesh runs its pairs synchronously).
// Every wait is bounded by the job's timeout.

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace lockstep::trainer {

// What a message is, so that a push is never taken for a pull.
enum class PsTag : std::uint64_t { kPush = 0x5053'0001, kPull = 0x5053'0002, kState = 0x5053'0003 };

class PsLink {
 public:
  // Joins the mesh as options.rank of options.worldSize (the workers and the server), through
  // the store under options.storePrefix. Every member calls it at the same point.
  static Result<std::unique_ptr<PsLink>> connect(StoreClient& store, const GlooOptions& options);
  ~PsLink();
  PsLink(const PsLink&) = delete;
  PsLink& operator=(const PsLink&) = delete;

  int rank() const;
  int size() const;

  // A receive posted into `data`, from any of the ranks it was posted for; one at a time.
  class Receive {
   public:
    ~Receive();
    // The sender, once the message is in.
    Result<int> wait();
    // Ends a wait() in progress, from another thread: it returns Cancelled.
    void abort();

   private:
    friend class PsLink;
    Receive(std::unique_ptr<gloo::transport::UnboundBuffer> buffer, std::chrono::milliseconds timeout);
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
    std::chrono::milliseconds timeout_;
  };
  Result<std::unique_ptr<Receive>> receive(const std::vector<int>& from, float* data, std::size_t floats, PsTag tag);
  // Sends and waits until the message is out.
  Result<void> send(int to, float* data, std::size_t floats, PsTag tag);

 private:
  PsLink(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout);
  std::shared_ptr<gloo::Context> context_;
  std::chrono::milliseconds timeout_;
};

}  // namespace lockstep::trainer
