#include "DesktopNotifier.h"

#include <QLoggingCategory>

#ifdef LOCKSTEP_HAVE_QTDBUS
#include <QDBusConnection>
#include <QDBusConnectionInterface>
#include <QDBusMessage>
#include <QDBusPendingCallWatcher>
#include <QDBusPendingReply>
#endif

Q_DECLARE_LOGGING_CATEGORY(lcAlerts)

namespace lockstep::app {

namespace {
[[maybe_unused]] constexpr const char* kService = "org.freedesktop.Notifications";
[[maybe_unused]] constexpr const char* kPath = "/org/freedesktop/Notifications";
[[maybe_unused]] constexpr const char* kInterface = "org.freedesktop.Notifications";
}  // namespace

DesktopNotifier::DesktopNotifier(QObject* parent) : QObject(parent) {}

bool DesktopNotifier::connectBus() {
#ifdef LOCKSTEP_HAVE_QTDBUS
  if (busTried_) return busAvailable_;
  busTried_ = true;
  // No address, no bus: do not let libdbus try to autolaunch one.
  if (qEnvironmentVariableIsEmpty("DBUS_SESSION_BUS_ADDRESS")) {
    qCInfo(lcAlerts) << "desktop notifications off: no session D-Bus (DBUS_SESSION_BUS_ADDRESS is unset)";
    return false;
  }
  QDBusConnection bus = QDBusConnection::sessionBus();
  if (!bus.isConnected()) {
    qCInfo(lcAlerts) << "desktop notifications off: the session D-Bus does not answer:" << bus.lastError().message();
    return false;
  }
  bus.connect(QString::fromLatin1(kService), QString::fromLatin1(kPath), QString::fromLatin1(kInterface),
              QStringLiteral("ActionInvoked"), this, SLOT(onActionInvoked(uint,QString)));
  busAvailable_ = true;
  return true;
#else
  if (!busTried_) qCInfo(lcAlerts) << "desktop notifications off: this build has no Qt DBus";
  busTried_ = true;
  return false;
#endif
}

void DesktopNotifier::notify(const QString& key, const QString& summary, const QString& body) {
  ++requested_;
  lastSummary_ = summary;
  if (!connectBus()) return;
#ifdef LOCKSTEP_HAVE_QTDBUS
  QDBusMessage call = QDBusMessage::createMethodCall(QString::fromLatin1(kService), QString::fromLatin1(kPath),
                                                     QString::fromLatin1(kInterface), QStringLiteral("Notify"));
  const auto previous = ids_.find(key);
  QVariantMap hints;
  hints.insert(QStringLiteral("urgency"), QVariant::fromValue(static_cast<uchar>(1)));  // normal
  hints.insert(QStringLiteral("category"), QStringLiteral("im.received"));
  call << QStringLiteral("Lockstep") << static_cast<uint>(previous == ids_.end() ? 0 : previous->second)
       << QStringLiteral("dialog-warning") << summary << body.toHtmlEscaped()
       << QStringList{QStringLiteral("default"), tr("Show")} << hints << -1;
  ++sent_;
  auto* watcher = new QDBusPendingCallWatcher(QDBusConnection::sessionBus().asyncCall(call), this);
  connect(watcher, &QDBusPendingCallWatcher::finished, this, [this, watcher, key] {
    watcher->deleteLater();
    QDBusPendingReply<uint> reply = *watcher;
    if (reply.isError()) {
      // No notification server (org.freedesktop.DBus.Error.ServiceUnknown), say, once.
      if (!loggedFailure_) qCInfo(lcAlerts) << "desktop notification not shown:" << reply.error().message();
      loggedFailure_ = true;
      return;
    }
    ids_[key] = reply.value();
    keys_[reply.value()] = key;
  });
#else
  Q_UNUSED(key);
  Q_UNUSED(summary);
  Q_UNUSED(body);
#endif
}

void DesktopNotifier::onActionInvoked(uint id, const QString& action) {
  auto it = keys_.find(id);
  if (it != keys_.end() && action == QLatin1String("default")) Q_EMIT activated(it->second);
}

}  // namespace lockstep::app
