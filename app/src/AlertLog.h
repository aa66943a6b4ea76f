#pragma once
// The alerts of every job the app watches, past and present, in the GUI thread: what the jobs'
// supervising agents raised (docs/alerts.md), as the ingest thread read it from their streams, and
// the silences this app keeps. A silence is this app's only: it hides a rule's banner and desktop
// notification for a while; the agent still notifies the job's webhooks.
//
// An entry is one alert from its firing to its resolution (an instant one, failed/finished/
// restarted, fires and never resolves), or one webhook that did not take an alert.
//
//   event               entry                 banner
//   alert_firing        new, firing           shown unless silenced or closed
//   alert_resolved      its firing -> resolved  removed
//   alert_undelivered   new, undelivered      never
//
// Threading: GUI thread only; add() is connected to the ingest thread's signal (queued).

#include <QObject>
#include <QString>
#include <QTimer>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "Types.h"
#include "lockstep/alerts/alert.h"

namespace lockstep::app {

struct AlertEntry {
  enum class Status { kFiring, kFired, kResolved, kUndelivered };  // kFired: an instant alert
  std::uint64_t serial = 0;  // the order the app learned of it
  std::string jobId;
  std::string rule;
  Status status = Status::kFiring;
  alerts::Alert alert;             // the newest state of it (the resolved one once resolved); empty for kUndelivered
  std::int64_t firedUs = 0;        // when it fired (or when the webhook gave up)
  std::int64_t resolvedUs = 0;     // 0 while it fires
  std::string message;             // kUndelivered: which webhook (redacted) and why; else the alert's text
  bool closed = false;             // its banner was closed (×)

  bool active() const { return status == Status::kFiring || status == Status::kFired; }
};

class AlertLog : public QObject {
  Q_OBJECT
 public:
  // Alerts older than this are not notified on the desktop: an agent replays its stream to an app
  // that connects late, and an hour-old alert is news for the panel, not a notification.
  static constexpr std::int64_t kNotifyWithinUs = 5 * 60 * 1'000'000LL;
  static constexpr std::size_t kMaxEntries = 2000;  // the oldest resolved ones go first

  explicit AlertLog(QObject* parent = nullptr);

  // Newest first, the firing ones before the others.
  std::vector<const AlertEntry*> entries(const std::string& jobId = {}) const;
  const AlertEntry* entry(std::uint64_t serial) const;
  // What the banner shows: active, not closed, not silenced; newest first.
  std::vector<const AlertEntry*> bannerEntries() const;
  int firingCount() const;  // entries firing now, silenced or not (not instant ones)

  // Silences one rule of one job until nowUs + seconds (local to this app; see above).
  void silence(const std::string& jobId, const std::string& rule, std::int64_t seconds);
  void unsilence(const std::string& jobId, const std::string& rule);
  // When the silence ends (Unix µs), if the rule is silenced now.
  std::optional<std::int64_t> silencedUntil(const std::string& jobId, const std::string& rule) const;
  void close(std::uint64_t serial);  // the banner's ×: this alert's banner only

 public Q_SLOTS:
  void add(lockstep::app::EventBatch events);
  void addEvent(const JobEvent& event);

 Q_SIGNALS:
  void changed();
  // A new alert fired, not silenced: for the desktop notification.
  void fired(quint64 serial);

 private:
  AlertEntry* findFiring(const std::string& jobId, const std::string& rule);
  void expireSilences();
  void trim();

  std::vector<AlertEntry> entries_;  // in the order learned
  std::map<std::pair<std::string, std::string>, std::int64_t> silences_;  // (job, rule) -> until, Unix µs
  QTimer silenceTimer_;  // wakes at the next silence's end
  std::uint64_t nextSerial_ = 1;
};

// The rule an undelivered event's message names ("alert 'RULE' (STATE) was not delivered to ..."),
// or empty.
std::string undeliveredRule(const std::string& message);

}  // namespace lockstep::app
