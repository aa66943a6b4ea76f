#pragma once
// Desktop notifications of alerts (freedesktop Notifications over the session D-Bus: Notify on
// org.freedesktop.Notifications) while the main window is not the active one. The call is
// asynchronous: the GUI thread never waits for the bus or the notification server. Without a
// session bus (offscreen, a test, a bare X server) or a notification server, nothing shows and one
// line is logged (category lockstep.alerts); never a dialog. Built without Qt DBus, it only logs.
//
// Threading: GUI thread.

#include <QObject>
#include <QString>
#include <map>

namespace lockstep::app {

class DesktopNotifier : public QObject {
  Q_OBJECT
 public:
  explicit DesktopNotifier(QObject* parent = nullptr);

  // Sends one notification; `key` (a job and rule) replaces the previous one of the same key.
  void notify(const QString& key, const QString& summary, const QString& body);

  // What was asked, for tests: notifications asked for, Notify calls made (with a bus), the last.
  int requested() const { return requested_; }
  int sent() const { return sent_; }
  QString lastSummary() const { return lastSummary_; }
  // Whether the session bus was there when last tried (false until the first notify()).
  bool busAvailable() const { return busAvailable_; }

 Q_SIGNALS:
  void activated(QString key);  // the user clicked the notification (its default action)

 private Q_SLOTS:
  void onActionInvoked(uint id, const QString& action);

 private:
  bool connectBus();

  int requested_ = 0, sent_ = 0;
  QString lastSummary_;
  bool busTried_ = false, busAvailable_ = false, loggedFailure_ = false;
  std::map<uint, QString> keys_;     // notification id -> key
  std::map<QString, uint> ids_;      // key -> its newest notification id
};

}  // namespace lockstep::app
