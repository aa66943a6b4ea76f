#include "jobs/job_rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "jobs/job.h"
#include "jobs/rank_launch.h"

namespace lockstep::agent {
namespace {

bool isWildcard(const std::string& host) { return host.empty() || host == "*" || host == "0.0.0.0"; }

// A TCP port free on `host` a moment ago, for a command job's own rendezvous (torch's c10d store
// binds it on rank 0), as torchrun picks one.
Result<std::uint32_t> freePortOn(const std::string& host) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errnoError("cannot make a socket to find a free port", errno);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = 0;
  if (::inet_pton(AF_INET, isWildcard(host) ? "0.0.0.0" : host.c_str(), &address.sin_addr) != 1) {
    address.sin_addr.s_addr = htonl(INADDR_ANY);  // a host name: any interface has it
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    return errnoError("cannot find a free port on " + host, errno);
  }
  socklen_t length = sizeof address;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return errnoError("cannot read the free port", errno);
  }
  return std::uint32_t{ntohs(address.sin_port)};
}

}  // namespace

JobRendezvous::JobRendezvous(std::string listenHost) : listenHost_(std::move(listenHost)) {}

Result<void> JobRendezvous::prepare(Job& job, const std::vector<RankPlacement>& local, NodeLaunch& launch) const {
  const JobSpec& spec = job.spec;
  const bool runsRankZero = std::any_of(local.begin(), local.end(), [](const RankPlacement& p) { return p.rank == 0; });
  const bool wildcard = isWildcard(listenHost_);
  if (runsRankZero) {
    if (spec.command) {
      LOCKSTEP_ASSIGN_OR_RETURN(job.masterPort, freePortOn(listenHost_));
      launch.masterPort = job.masterPort;
    } else if (spec.worldSize > 1) {
      job.storeSecret = newStoreSecret();
      LOCKSTEP_ASSIGN_OR_RETURN(job.store, startStore(job, 0));
      job.storePort = job.store->port();
      launch.masterPort = job.storePort;
    }
    launch.storeSecret = job.storeSecret;
    if (launch.masterAddr.empty()) launch.masterAddr = wildcard ? "127.0.0.1" : listenHost_;
    return {};
  }
  if (launch.masterAddr.empty() || launch.masterPort == 0) {
    return invalidArgument("job " + spec.jobId + ": rank 0 runs on another node, so the job spec needs that node's "
                           "rendezvous host and port (start the job there first; lockstepctl does)");
  }
  if (!spec.command && job.storeSecret.empty()) {
    return invalidArgument("job " + spec.jobId + ": rank 0 runs on another node, so its store's secret is needed, "
                           "which that node's agent returned when the job started there (lockstepctl and the app "
                           "pass it on)");
  }
  launch.storeSecret = job.storeSecret;
  return {};
}

// The job's store, on the address the agent listens on (the wildcard only when the agent's is).
Result<std::unique_ptr<StoreServer>> JobRendezvous::startStore(const Job& job, std::uint16_t port) const {
  StoreServerOptions store;
  store.secret = job.storeSecret;
  store.worldSize = job.spec.worldSize;
  return StoreServer::start(isWildcard(listenHost_) ? "0.0.0.0" : listenHost_, port, store);
}

}  // namespace lockstep::agent
