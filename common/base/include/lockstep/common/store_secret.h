#pragma once
// A job's rendezvous-store secret (store.h): the store checks it, and so does the protocol, which
// carries it from rank 0's agent to the others' (StartJobRequest.store_secret).

#include <string_view>

namespace lockstep {

// Whether `secret` is empty or 64 lower-case hex characters.
inline bool isValidStoreSecret(std::string_view secret) {
  return secret.empty() ||
         (secret.size() == 64 && secret.find_first_not_of("0123456789abcdef") == std::string_view::npos);
}

}  // namespace lockstep
