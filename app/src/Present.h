#pragma once
// The presentation module (lockstep/present) for the widgets: the same text the reports and
// lockstepctl show, as QString.

#include <QString>
#include <optional>
#include <string>
#include <string_view>

#include "lockstep/present/present.h"

namespace lockstep::app {

inline QString qtext(const std::string& text) { return QString::fromStdString(text); }
inline QString dash() { return qtext(std::string(present::kUnknown)); }
inline QString figure(const std::optional<double>& value, int decimals, std::string_view unit = "") {
  return qtext(present::figure(value, decimals, unit));
}
inline QString percent(const std::optional<double>& fraction, int decimals = 1) {
  return qtext(present::percent(fraction, decimals));
}
inline QString duration(double seconds) { return qtext(present::duration(seconds)); }
inline QString money(double amount, const QString& currency) { return qtext(present::money(amount, currency.toStdString())); }

}  // namespace lockstep::app
