#pragma once
// Webhook URLs (docs/alerts.md): a URL's path and query often hold its secret (Slack's, Teams'),
// so it is only ever shown redacted, in logs, job events, errors and reports.

#include <string>
#include <string_view>

#include "lockstep/common/result.h"

namespace lockstep::alerts {

// "https://hooks.slack.com/…": the scheme, host and port; user, path and query hidden.
std::string redactUrl(std::string_view url);
// http:// or https://, a host, at most 2048 bytes, no blanks or control characters.
Result<void> checkWebhookUrl(std::string_view url);

}  // namespace lockstep::alerts
