#include "AlertLog.h"

#include <QLoggingCategory>
#include <algorithm>

#include "lockstep/alerts/rules.h"
#include "lockstep/common/clock.h"

Q_LOGGING_CATEGORY(lcAlerts, "lockstep.alerts")

namespace lockstep::app {

std::string undeliveredRule(const std::string& message) {
  static constexpr std::string_view kOpen = "alert '";
  if (message.rfind(kOpen, 0) != 0) return {};
  const auto end = message.find("' (", kOpen.size());
  return end == std::string::npos ? std::string() : message.substr(kOpen.size(), end - kOpen.size());
}

AlertLog::AlertLog(QObject* parent) : QObject(parent) {
  silenceTimer_.setSingleShot(true);
  connect(&silenceTimer_, &QTimer::timeout, this, [this] {
    expireSilences();
    Q_EMIT changed();
  });
}

void AlertLog::add(EventBatch events) {
  for (const auto& e : *events) addEvent(e);
}

AlertEntry* AlertLog::findFiring(const std::string& jobId, const std::string& rule) {
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->jobId == jobId && it->rule == rule && it->status == AlertEntry::Status::kFiring) return &*it;
  }
  return nullptr;
}

void AlertLog::addEvent(const JobEvent& event) {
  if (event.kind == JobEventKind::kAlertUndelivered) {
    for (const auto& e : entries_) {
      if (e.status == AlertEntry::Status::kUndelivered && e.jobId == event.jobId && e.firedUs == event.timeUnixUs &&
          e.message == event.message) {
        return;  // seen (a replay)
      }
    }
    AlertEntry e;
    e.serial = nextSerial_++;
    e.jobId = event.jobId;
    e.rule = undeliveredRule(event.message);
    e.status = AlertEntry::Status::kUndelivered;
    e.firedUs = event.timeUnixUs;
    e.message = event.message;
    entries_.push_back(std::move(e));
    trim();
    Q_EMIT changed();
    return;
  }
  auto alert = alerts::alertOf(event);
  if (!alert) {
    qCWarning(lcAlerts) << "job" << QString::fromStdString(event.jobId) << ": an alert event that does not decode:"
                        << QString::fromStdString(event.message);
    return;
  }
  if (alert->state == alerts::State::kPending) return;  // agents do not send these; nothing to show
  const std::int64_t timeUs = alert->timeUs ? alert->timeUs : event.timeUnixUs;
  if (alert->state == alerts::State::kResolved) {
    if (AlertEntry* firing = findFiring(alert->jobId, alert->rule)) {
      firing->status = AlertEntry::Status::kResolved;
      firing->resolvedUs = timeUs;
      firing->alert = std::move(*alert);
      firing->message = firing->alert.text;
      Q_EMIT changed();
      return;
    }
    for (const auto& e : entries_) {
      if (e.jobId == alert->jobId && e.rule == alert->rule && e.resolvedUs == timeUs) return;  // seen
    }
  } else {
    for (const auto& e : entries_) {
      if (e.jobId == alert->jobId && e.rule == alert->rule && e.firedUs == timeUs) return;  // seen
    }
  }
  // A firing alert, or one the app saw only resolve (it fired before what the agent replayed).
  AlertEntry e;
  e.serial = nextSerial_++;
  e.jobId = alert->jobId;
  e.rule = alert->rule;
  e.status = alert->state == alerts::State::kResolved ? AlertEntry::Status::kResolved
             : alerts::isInstant(alert->kpi)          ? AlertEntry::Status::kFired
                                                      : AlertEntry::Status::kFiring;
  e.firedUs = alert->state == alerts::State::kResolved ? (alert->startedAtUs ? alert->startedAtUs : timeUs) : timeUs;
  e.resolvedUs = alert->state == alerts::State::kResolved ? timeUs : 0;
  e.message = alert->text;
  e.alert = std::move(*alert);
  const std::uint64_t serial = e.serial;
  const bool notify = e.active() && !silencedUntil(e.jobId, e.rule) && unixMicrosNow() - e.firedUs <= kNotifyWithinUs;
  entries_.push_back(std::move(e));
  trim();
  Q_EMIT changed();
  if (notify) Q_EMIT fired(serial);
}

void AlertLog::trim() {
  while (entries_.size() > kMaxEntries) {
    auto victim = std::find_if(entries_.begin(), entries_.end(), [](const AlertEntry& e) { return !e.active(); });
    if (victim == entries_.end()) victim = entries_.begin();
    entries_.erase(victim);
  }
}

std::vector<const AlertEntry*> AlertLog::entries(const std::string& jobId) const {
  std::vector<const AlertEntry*> out;
  for (const auto& e : entries_) {
    if (jobId.empty() || e.jobId == jobId) out.push_back(&e);
  }
  std::stable_sort(out.begin(), out.end(), [](const AlertEntry* a, const AlertEntry* b) {
    const bool fa = a->status == AlertEntry::Status::kFiring, fb = b->status == AlertEntry::Status::kFiring;
    if (fa != fb) return fa;
    const std::int64_t ta = std::max(a->firedUs, a->resolvedUs), tb = std::max(b->firedUs, b->resolvedUs);
    return ta != tb ? ta > tb : a->serial > b->serial;
  });
  return out;
}

const AlertEntry* AlertLog::entry(std::uint64_t serial) const {
  for (const auto& e : entries_) {
    if (e.serial == serial) return &e;
  }
  return nullptr;
}

std::vector<const AlertEntry*> AlertLog::bannerEntries() const {
  std::vector<const AlertEntry*> out;
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->active() && !it->closed && !silencedUntil(it->jobId, it->rule)) out.push_back(&*it);
  }
  std::stable_sort(out.begin(), out.end(), [](const AlertEntry* a, const AlertEntry* b) { return a->firedUs > b->firedUs; });
  return out;
}

// Firing now: an instant alert (failed, finished, restarted) happened, and keeps its banner until
// closed, but does not fire on.
int AlertLog::firingCount() const {
  return static_cast<int>(std::count_if(entries_.begin(), entries_.end(),
                                        [](const AlertEntry& e) { return e.status == AlertEntry::Status::kFiring; }));
}

void AlertLog::silence(const std::string& jobId, const std::string& rule, std::int64_t seconds) {
  silences_[{jobId, rule}] = unixMicrosNow() + seconds * 1'000'000;
  qCInfo(lcAlerts) << "job" << QString::fromStdString(jobId) << ": rule" << QString::fromStdString(rule) << "silenced in this app for"
                   << seconds << "s (the agent still notifies its webhooks)";
  expireSilences();
  Q_EMIT changed();
}

void AlertLog::unsilence(const std::string& jobId, const std::string& rule) {
  if (silences_.erase({jobId, rule}) == 0) return;
  expireSilences();
  Q_EMIT changed();
}

std::optional<std::int64_t> AlertLog::silencedUntil(const std::string& jobId, const std::string& rule) const {
  auto it = silences_.find({jobId, rule});
  if (it == silences_.end() || it->second <= unixMicrosNow()) return std::nullopt;
  return it->second;
}

void AlertLog::close(std::uint64_t serial) {
  for (auto& e : entries_) {
    if (e.serial == serial && !e.closed) {
      e.closed = true;
      Q_EMIT changed();
    }
  }
}

// Drops the silences that ended and sets the timer for the next end.
void AlertLog::expireSilences() {
  const std::int64_t now = unixMicrosNow();
  std::int64_t next = 0;
  for (auto it = silences_.begin(); it != silences_.end();) {
    if (it->second <= now) {
      it = silences_.erase(it);
    } else {
      next = next ? std::min(next, it->second) : it->second;
      ++it;
    }
  }
  if (next) {
    silenceTimer_.start(static_cast<int>(std::min<std::int64_t>((next - now) / 1000 + 1, 24LL * 3600 * 1000)));
  } else {
    silenceTimer_.stop();
  }
}

}  // namespace lockstep::app
