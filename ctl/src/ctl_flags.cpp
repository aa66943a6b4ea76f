#include "ctl_flags.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>

namespace lockstep::ctl {

Result<std::uint32_t> parseWhole(const std::string& what, const std::string& text, std::uint32_t min, std::uint32_t max) {
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < min || value > max) {
    return invalidArgument(what + " needs a whole number from " + std::to_string(min) + " to " + std::to_string(max) +
                           " (not '" + text + "')");
  }
  return static_cast<std::uint32_t>(value);
}

Flags& Flags::add(const std::string& name, Apply apply) {
  specs_.push_back({name, true, std::move(apply)});
  return *this;
}

Flags& Flags::texts(const std::string& name, std::vector<std::string>* out) {
  return add(name, [out](const std::string&, const std::string& v) -> Result<void> {
    out->push_back(v);
    return {};
  });
}

Flags& Flags::wholes(const std::string& name, std::vector<std::uint32_t>* out, std::uint32_t min, std::uint32_t max) {
  return add(name, [=](const std::string& flag, const std::string& v) -> Result<void> {
    out->clear();
    std::size_t start = 0;
    while (true) {
      const auto comma = v.find(',', start);
      LOCKSTEP_ASSIGN_OR_RETURN(auto n, parseWhole(flag, v.substr(start, comma - start), min, max));
      out->push_back(n);
      if (comma == std::string::npos) return {};
      start = comma + 1;
    }
  });
}

Flags& Flags::price(const std::string& name, std::optional<double>* out) {
  return add(name, [out](const std::string& flag, const std::string& v) -> Result<void> {
    char* end = nullptr;
    const double price = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(price >= 0)) {
      return invalidArgument(flag + " needs a price, like 2.50 (not '" + v + "')");
    }
    *out = price;
    return {};
  });
}

Flags& Flags::on(const std::string& name, bool* out) {
  specs_.push_back({name, false, [out](const std::string&, const std::string&) -> Result<void> {
                      *out = true;
                      return {};
                    }});
  return *this;
}

Flags& Flags::arguments(std::vector<std::string>* out, std::size_t required, std::size_t optional) {
  arguments_ = out;
  required_ = required;
  optional_ = optional;
  return *this;
}

Flags& Flags::passOn(std::vector<std::string>* out) {
  passOn_ = out;
  return *this;
}

Error Flags::usageError(const std::string& problem) const { return invalidArgument(problem + "; " + usage_); }

Result<void> Flags::argument(const std::string& text, std::size_t& count) const {
  if (arguments_ == nullptr || (optional_ != kAny && count >= required_ + optional_)) {
    return usageError("unexpected argument '" + text + "'");
  }
  arguments_->push_back(text);
  ++count;
  return {};
}

Result<void> Flags::parse(const std::vector<std::string>& args) const {
  std::size_t positionals = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::optional<std::string> inlineValue;
    if (const auto eq = flag.find('='); flag.starts_with("--") && eq != std::string::npos) {
      inlineValue = flag.substr(eq + 1);
      flag.resize(eq);
    }
    const auto spec = std::find_if(specs_.begin(), specs_.end(), [&](const Spec& s) { return s.name == flag; });
    if (spec != specs_.end()) {
      if (!spec->takesValue && inlineValue) return usageError(flag + " takes no value");
      if (spec->takesValue && !inlineValue && i + 1 >= args.size()) return usageError(flag + " needs a value");
      const std::string value = !spec->takesValue ? "" : inlineValue ? *inlineValue : args[++i];
      LOCKSTEP_TRY(spec->apply(flag, value));
      continue;
    }
    if (passOn_ != nullptr) {
      passOn_->push_back(args[i]);
      continue;
    }
    if (args[i] == "--") {  // the end of options: what follows is arguments, even "-x"
      for (++i; i < args.size(); ++i) LOCKSTEP_TRY(argument(args[i], positionals));
      break;
    }
    // A single dash may start an argument: a negative number, a key's Z85 text.
    if (flag.starts_with("--") || flag == "-h") return usageError("unknown option " + flag);
    LOCKSTEP_TRY(argument(args[i], positionals));
  }
  if (positionals < required_) return usageError(required_ == 1 ? "an argument is missing" : "arguments are missing");
  return {};
}

}  // namespace lockstep::ctl
