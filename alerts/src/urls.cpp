// Webhook URLs: their one check, and how they are shown (alerts/urls.h).

#include "lockstep/alerts/urls.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>

namespace lockstep::alerts {
namespace {

constexpr std::size_t kMaxUrlBytes = 2048;
constexpr std::string_view kUnreadable = "(a URL that could not be read)";

bool isBlankOrControl(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u <= 0x20 || u == 0x7f;
}

bool equalsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// The parts of a URL that may be shown; `rest` (path, query, fragment) never is.
struct UrlParts {
  std::string_view scheme;
  std::string_view host;  // with the port, without any user:password@
  std::string_view rest;
};

// Only as much parsing as redaction and the checks need; curl parses the URL for real.
std::optional<UrlParts> splitUrl(std::string_view url) {
  const auto sep = url.find("://");
  if (sep == std::string_view::npos || sep == 0) return std::nullopt;
  UrlParts parts;
  parts.scheme = url.substr(0, sep);
  const bool schemeOk = std::isalpha(static_cast<unsigned char>(parts.scheme[0])) &&
                        std::all_of(parts.scheme.begin(), parts.scheme.end(), [](char c) {
                          return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
                        });
  if (!schemeOk) return std::nullopt;
  std::string_view after = url.substr(sep + 3);
  const auto end = std::min(after.find_first_of("/?#"), after.size());
  std::string_view authority = after.substr(0, end);
  parts.rest = after.substr(end);
  // The user and password come before the last '@' of the authority: never shown.
  if (const auto at = authority.rfind('@'); at != std::string_view::npos) authority.remove_prefix(at + 1);
  if (std::any_of(authority.begin(), authority.end(), isBlankOrControl)) return std::nullopt;
  parts.host = authority;
  return parts;
}

// "host:port" → the port is digits and at most 65535 (IPv6 hosts come in brackets).
bool portIsValid(std::string_view host) {
  const auto bracket = host.rfind(']');
  const auto colon = host.rfind(':');
  if (colon == std::string_view::npos || (bracket != std::string_view::npos && colon < bracket)) return true;
  const std::string_view port = host.substr(colon + 1);
  if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  return std::stol(std::string(port)) <= 65535;
}

}  // namespace

std::string redactUrl(std::string_view url) {
  const auto parts = splitUrl(url);
  if (!parts || parts->host.empty()) return std::string(kUnreadable);
  std::string out = std::string(parts->scheme) + "://" + std::string(parts->host);
  if (parts->rest == "/") return out + "/";
  if (!parts->rest.empty()) out += "/…";
  return out;
}

Result<void> checkWebhookUrl(std::string_view url) {
  if (url.size() > kMaxUrlBytes) {
    return invalidArgument("the webhook URL " + redactUrl(url) + " is " + std::to_string(url.size()) +
                           " bytes long; at most " + std::to_string(kMaxUrlBytes) + " are accepted: use a shorter URL");
  }
  if (std::any_of(url.begin(), url.end(), isBlankOrControl)) {
    return invalidArgument("the webhook URL " + redactUrl(url) +
                           " holds a blank or a control character: percent-encode it (a blank is %20) or remove it");
  }
  const auto parts = splitUrl(url);
  if (!parts || !(equalsIgnoringCase(parts->scheme, "http") || equalsIgnoringCase(parts->scheme, "https"))) {
    return invalidArgument("the webhook URL " + redactUrl(url) +
                           " is not http:// or https://: write it as https://host/path");
  }
  if (parts->host.empty() || parts->host.front() == ':') {
    return invalidArgument("the webhook URL " + redactUrl(url) + " names no host: write it as https://host/path");
  }
  if (!portIsValid(parts->host)) {
    return invalidArgument("the webhook URL " + redactUrl(url) + " has a port that is not a number from 1 to 65535");
  }
  return {};
}

}  // namespace lockstep::alerts
