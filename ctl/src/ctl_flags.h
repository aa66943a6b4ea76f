#pragma once
// lockstepctl's one flag parser: every command declares its flags and arguments, and gets a clear
// error for a flag it does not know, a value that is missing or malformed, or an argument too many.
// `--flag VALUE` and `--flag=VALUE` both work.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/common/result.h"

namespace lockstep::ctl {

// The whole number `text` within [min, max], or an error naming `what`.
Result<std::uint32_t> parseWhole(const std::string& what, const std::string& text, std::uint32_t min, std::uint32_t max);

class Flags {
 public:
  using Apply = std::function<Result<void>(const std::string& flag, const std::string& value)>;

  explicit Flags(std::string usage) : usage_(std::move(usage)) {}

  // `out` is a std::string or a std::optional<std::string>.
  template <class Out>
  Flags& text(const std::string& name, Out* out) {
    return add(name, [out](const std::string&, const std::string& v) -> Result<void> {
      *out = v;
      return {};
    });
  }
  Flags& texts(const std::string& name, std::vector<std::string>* out);  // may be given again
  // `out` is a std::uint32_t or a std::optional<std::uint32_t>.
  template <class Out>
  Flags& whole(const std::string& name, Out* out, std::uint32_t min, std::uint32_t max) {
    return add(name, [=](const std::string& flag, const std::string& v) -> Result<void> {
      LOCKSTEP_ASSIGN_OR_RETURN(*out, parseWhole(flag, v, min, max));
      return {};
    });
  }
  Flags& wholes(const std::string& name, std::vector<std::uint32_t>* out, std::uint32_t min, std::uint32_t max);  // A,B,...
  Flags& price(const std::string& name, std::optional<double>* out);  // a number >= 0
  Flags& on(const std::string& name, bool* out);                      // a switch
  // Arguments that are not flags, in order: `required` of them, then at most `optional` more (or
  // any number: kAny).
  static constexpr std::size_t kAny = ~std::size_t{0};
  Flags& arguments(std::vector<std::string>* out, std::size_t required, std::size_t optional = 0);
  // Whatever this parser does not know goes here as it came (start's job flags, which their own
  // parser reads), instead of being an error.
  Flags& passOn(std::vector<std::string>* out);

  Result<void> parse(const std::vector<std::string>& args) const;

 private:
  struct Spec {
    std::string name;
    bool takesValue = true;
    Apply apply;
  };
  Flags& add(const std::string& name, Apply apply);  // a flag that takes a value
  Error usageError(const std::string& problem) const;
  Result<void> argument(const std::string& text, std::size_t& count) const;

  std::string usage_;
  std::vector<Spec> specs_;
  std::vector<std::string>* arguments_ = nullptr;
  std::size_t required_ = 0, optional_ = 0;
  std::vector<std::string>* passOn_ = nullptr;
};


}  // namespace lockstep::ctl
