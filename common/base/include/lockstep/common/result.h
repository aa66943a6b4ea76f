#pragma once
// Result<T>: a value or an Error with a code and a message. Libraries return these; only main()
// decides to exit. Error messages say what was wrong and, where it helps, what to do about it.

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace lockstep {

// Mirrored by lockstep.v1.ErrorCode on the wire; keep the numbers in step.
enum class ErrorCode {
  kInvalidArgument = 1,    // the input is wrong: fix it and try again
  kNotFound = 2,           // a file, job or key does not exist
  kAlreadyExists = 3,
  kPermissionDenied = 4,   // the caller is not allowed (unknown key, file mode)
  kResourceExhausted = 5,  // a size or count limit was hit
  kFailedPrecondition = 6, // the request is valid but the state forbids it now
  kTimeout = 7,            // a wait ran out of time
  kUnavailable = 8,        // a peer or service could not be reached
  kPeerLost = 9,           // a peer that was reachable went away
  kIo = 10,                // the operating system refused a read or write
  kInternal = 11,          // a bug: report it
  kCancelled = 12,         // stopped on request
};

std::string_view errorCodeName(ErrorCode code);

struct Error {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;

  // "context: message", keeping the code; used as errors travel up through layers.
  [[nodiscard]] Error withContext(std::string_view context) const;
};

Error invalidArgument(std::string message);
Error notFound(std::string message);
Error ioError(std::string message);
Error timeoutError(std::string message);
Error unavailable(std::string message);
Error peerLost(std::string message);
Error internalError(std::string message);
// An I/O error built from errno: "what: strerror(errno)".
Error errnoError(std::string_view what, int errnoValue);

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : state_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    assert(ok());
    return std::get<0>(state_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(state_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(state_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  const Error& error() const {
    assert(!ok());
    return std::get<1>(state_);
  }

 private:
  std::variant<T, Error> state_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)) {}  // NOLINT: implicit by design

  bool ok() const { return !error_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Error& error() const {
    assert(!ok());
    return *error_;
  }

 private:
  std::optional<Error> error_;
};

}  // namespace lockstep

// Propagate an error from an expression returning Result<...>.
#define LOCKSTEP_TRY(expr)                                 \
  do {                                                     \
    auto&& lockstep_try_result_ = (expr);                  \
    if (!lockstep_try_result_) {                           \
      return lockstep_try_result_.error();                 \
    }                                                      \
  } while (false)

#define LOCKSTEP_CONCAT_INNER_(a, b) a##b
#define LOCKSTEP_CONCAT_(a, b) LOCKSTEP_CONCAT_INNER_(a, b)
// `LOCKSTEP_ASSIGN_OR_RETURN(auto x, makeX());` declares x from the value or returns the error.
#define LOCKSTEP_ASSIGN_OR_RETURN(lhs, expr) \
  LOCKSTEP_ASSIGN_OR_RETURN_IMPL_(LOCKSTEP_CONCAT_(lockstep_result_, __LINE__), lhs, expr)
#define LOCKSTEP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp) {                                           \
    return tmp.error();                                 \
  }                                                     \
  lhs = std::move(tmp).value()
