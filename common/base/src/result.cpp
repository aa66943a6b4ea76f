#include "lockstep/common/result.h"

#include <cstring>

namespace lockstep {

std::string_view errorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kAlreadyExists: return "already exists";
    case ErrorCode::kPermissionDenied: return "permission denied";
    case ErrorCode::kResourceExhausted: return "resource exhausted";
    case ErrorCode::kFailedPrecondition: return "failed precondition";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kPeerLost: return "peer lost";
    case ErrorCode::kIo: return "I/O error";
    case ErrorCode::kInternal: return "internal error";
    case ErrorCode::kCancelled: return "cancelled";
  }
  return "unknown error";
}

Error Error::withContext(std::string_view context) const {
  return Error{code, std::string(context) + ": " + message};
}

Error invalidArgument(std::string message) { return {ErrorCode::kInvalidArgument, std::move(message)}; }
Error notFound(std::string message) { return {ErrorCode::kNotFound, std::move(message)}; }
Error ioError(std::string message) { return {ErrorCode::kIo, std::move(message)}; }
Error timeoutError(std::string message) { return {ErrorCode::kTimeout, std::move(message)}; }
Error unavailable(std::string message) { return {ErrorCode::kUnavailable, std::move(message)}; }
Error peerLost(std::string message) { return {ErrorCode::kPeerLost, std::move(message)}; }
Error internalError(std::string message) { return {ErrorCode::kInternal, std::move(message)}; }

Error errnoError(std::string_view what, int errnoValue) {
  const ErrorCode code = errnoValue == ENOENT ? ErrorCode::kNotFound
                         : errnoValue == EACCES || errnoValue == EPERM ? ErrorCode::kPermissionDenied
                                                                       : ErrorCode::kIo;
  return Error{code, std::string(what) + ": " + std::strerror(errnoValue)};
}

}  // namespace lockstep
