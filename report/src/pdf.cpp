// The PDF report: a small page layout over QPainter (headings, wrapped paragraphs, bullets, tables
// that break across pages with their header repeated, charts drawn from the report's SVG), on A4
// at 72 units per inch so that coordinates are points.

#include <unistd.h>
#include <QCoreApplication>
#include <QFile>
#include <QFontMetricsF>
#include <QGuiApplication>
#include <QPageSize>
#include <QPainter>
#include <QPdfWriter>
#include <QSvgRenderer>
#include <QTextOption>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>

#include "lockstep/report/report_pdf.h"

namespace lockstep::report {
namespace {

constexpr double kMargin = 48;  // points
constexpr double kChartHeight = 250;
constexpr double kChartWidth = kChartHeight * 760.0 / 320.0;  // the HTML's aspect ratio
const QColor kInk(0x22, 0x22, 0x22);
const QColor kMuted(0x55, 0x55, 0x55);
const QColor kRule(0xcc, 0xcc, 0xcc);
const QColor kHeaderFill(0xee, 0xf1, 0xf5);
const QColor kZebra(0xf7, 0xf8, 0xfa);

QString q(const std::string& text) { return QString::fromStdString(text); }

// 4 points each side of a cell's text, and 1 for the text layout to round up: a cell as wide as
// its text must not wrap it.
constexpr double kCellPadding = 9;
// A cell shows at most this much of its text (an event's message may be 64 KiB): a row must fit
// on a page.
constexpr qsizetype kMaxCellCharacters = 600;

QString cellText(const std::string& text) {
  QString q = QString::fromStdString(text);
  if (q.size() > kMaxCellCharacters) q = q.left(kMaxCellCharacters - 1) + QChar(0x2026);
  return q;
}

QFont font(double points, bool bold = false) {
  QFont f(QStringLiteral("DejaVu Sans"));
  f.setStyleHint(QFont::SansSerif);
  f.setPointSizeF(points);
  f.setBold(bold);
  return f;
}

class Layout {
 public:
  Layout(QPdfWriter& writer, QPainter& painter, QString footer)
      : writer_(writer), p_(painter), footer_(std::move(footer)) {
    const QRectF page = QRectF(QPointF(0, 0), writer.pageLayout().fullRectPoints().size());
    body_ = page.adjusted(kMargin, kMargin, -kMargin, -kMargin - 14);
    footerY_ = page.bottom() - kMargin + 4;
    y_ = body_.top();
  }

  void title(const QString& text, const QString& subtitle) {
    block(text, font(18, true), kInk, 4);
    if (!subtitle.isEmpty()) block(subtitle, font(9.5), kMuted, 10);
  }

  void heading(const QString& text) {
    // Keep a heading with at least a few lines of what follows it.
    ensure(60);
    y_ += 10;
    block(text, font(13, true), kInk, 2);
    p_.setPen(QPen(kRule, 0.8));
    p_.drawLine(QPointF(body_.left(), y_), QPointF(body_.right(), y_));
    y_ += 8;
  }

  void paragraph(const QString& text, const QString& bullet = {}) {
    const double indent = bullet.isEmpty() ? 0 : 12;
    p_.setFont(font(9.5));
    const QRectF box(body_.left() + indent, 0, body_.width() - indent, 1e6);
    const QRectF needed = p_.boundingRect(box, Qt::TextWordWrap, text);
    ensure(needed.height());
    p_.setPen(kInk);
    if (!bullet.isEmpty()) p_.drawText(QPointF(body_.left() + 2, y_ + QFontMetricsF(p_.font(), p_.device()).ascent()), bullet);
    p_.drawText(QRectF(box.left(), y_, box.width(), needed.height()), Qt::TextWordWrap, text);
    y_ += needed.height() + 4;
  }

  // A monospaced block, line for line; a line too long for the page wraps anywhere.
  void code(const QString& text) {
    QFont mono(QStringLiteral("monospace"));
    mono.setStyleHint(QFont::Monospace);
    mono.setPointSizeF(6.5);
    p_.setFont(mono);
    p_.setPen(kInk);
    for (const auto& line : text.split(QLatin1Char('\n'))) {
      const QRectF box(body_.left(), 0, body_.width(), 1e6);
      const QRectF needed = p_.boundingRect(box, Qt::TextWrapAnywhere, line.isEmpty() ? QStringLiteral(" ") : line);
      ensure(needed.height());
      p_.drawText(QRectF(box.left(), y_, box.width(), needed.height()), Qt::TextWrapAnywhere, line);
      y_ += needed.height();
    }
    y_ += 6;
  }

  void table(const Table& t) {
    if (!t.title.empty()) {
      ensure(50);
      block(q(t.title), font(10, true), kInk, 3);
    }
    const std::size_t columns = std::max(t.header.size(), t.rows.empty() ? 0 : t.rows.front().size());
    if (columns == 0) return;
    // The largest font (8 pt down to 6 pt) at which the widest cell of each column fits; below
    // that, the widest columns share what the others leave and their text wraps.
    double points = 8;
    std::vector<double> widths;
    for (;; points -= 0.5) {
      widths = columnWidths(t, columns, points);
      if (std::accumulate(widths.begin(), widths.end(), 0.0) <= body_.width() || points <= 6) break;
    }
    widths = fitWidths(std::move(widths), body_.width());
    const QFont cellFont = font(points), headerFont = font(points, true);
    // Figures right-aligned in columns of figures; a two-column table of settings reads left to right.
    const bool alignFigures = columns > 2;
    const double headerHeight = rowHeight(t.header, widths, headerFont);
    ensure(headerHeight + (t.rows.empty() ? 0 : rowHeight(t.rows.front(), widths, cellFont)));
    drawRow(t.header, widths, headerFont, kHeaderFill, headerHeight, false);
    for (std::size_t r = 0; r < t.rows.size(); ++r) {
      const double height = rowHeight(t.rows[r], widths, cellFont);
      if (y_ + height > body_.bottom()) {
        newPage();
        drawRow(t.header, widths, headerFont, kHeaderFill, headerHeight, false);
      }
      drawRow(t.rows[r], widths, cellFont, r % 2 ? kZebra : QColor(Qt::white), height, alignFigures);
    }
    y_ += 8;
  }

  void chart(const Chart& c) {
    const double width = std::min(kChartWidth, body_.width());
    const double height = width * 320.0 / 760.0;
    ensure(height + 20);
    // The title as text of the page (searchable, selectable); the SVG draws the rest.
    block(q(c.title), font(10, true), kInk, 2);
    Chart untitled = c;
    untitled.title.clear();
    QSvgRenderer renderer(QByteArray::fromStdString(svg(untitled, 760, 320)));
    renderer.render(&p_, QRectF(body_.left() + (body_.width() - width) / 2, y_, width, height));
    y_ += height + 10;
  }

  void finish() { drawFooter(); }
  int pages() const { return page_; }

 private:
  std::vector<double> columnWidths(const Table& t, std::size_t columns, double points) const {
    // Measured on the PDF writer (72 dpi: points are its units), not on a screen.
    const QFontMetricsF cell(font(points), p_.device()), header(font(points, true), p_.device());
    std::vector<double> widths(columns, 0);
    for (std::size_t c = 0; c < columns && c < t.header.size(); ++c) {
      widths[c] = header.horizontalAdvance(q(t.header[c])) + kCellPadding;
    }
    for (const auto& row : t.rows) {
      for (std::size_t c = 0; c < columns && c < row.size(); ++c) {
        widths[c] = std::max(widths[c], cell.horizontalAdvance(q(row[c])) + kCellPadding);
      }
    }
    return widths;
  }

  // Natural widths when they fit; else the narrow columns keep theirs and the wide ones get an equal
  // share of the rest (water-filling), so that a long name never cuts "Rank" to "Ra…".
  static std::vector<double> fitWidths(std::vector<double> widths, double available) {
    std::vector<double> sorted = widths;
    std::sort(sorted.begin(), sorted.end());
    double used = 0, cap = available;
    for (std::size_t i = 0; i < sorted.size(); ++i) {
      cap = (available - used) / static_cast<double>(sorted.size() - i);
      if (sorted[i] > cap) break;
      used += sorted[i];
    }
    for (double& w : widths) w = std::min(w, cap);
    return widths;
  }

  // Cell text wraps at words, and inside a word longer than its column.
  static QTextOption cellOption(Qt::Alignment alignment) {
    QTextOption option(alignment | Qt::AlignVCenter);
    option.setWrapMode(QTextOption::WrapAtWordBoundaryOrAnywhere);
    return option;
  }

  double rowHeight(const std::vector<std::string>& cells, const std::vector<double>& widths, const QFont& f) {
    p_.setFont(f);
    double height = QFontMetricsF(f, p_.device()).height();
    for (std::size_t c = 0; c < widths.size() && c < cells.size(); ++c) {
      const QRectF room(0, 0, std::max(1.0, widths[c] - 8), 1e6);
      height = std::max(height, p_.boundingRect(room, cellText(cells[c]), cellOption(Qt::AlignLeft)).height());
    }
    return height + 5;
  }

  void drawRow(const std::vector<std::string>& cells, const std::vector<double>& widths, const QFont& f,
               const QColor& fill, double height, bool alignFigures) {
    p_.setFont(f);
    double x = body_.left();
    for (std::size_t c = 0; c < widths.size(); ++c) {
      const QRectF cell(x, y_, widths[c], height);
      p_.fillRect(cell, fill);
      p_.setPen(QPen(kRule, 0.5));
      p_.drawRect(cell);
      if (c < cells.size()) {
        p_.setPen(kInk);
        const Qt::Alignment side = alignFigures && numeric(cells[c]) ? Qt::AlignRight : Qt::AlignLeft;
        p_.drawText(cell.adjusted(4, 0, -4, 0), cellText(cells[c]), cellOption(side));
      }
      x += widths[c];
    }
    y_ += height;
  }

  // Right-aligned like the HTML report: a cell that starts with a digit, a sign or the dash.
  static bool numeric(const std::string& cell) {
    return !cell.empty() && (std::isdigit(static_cast<unsigned char>(cell[0])) || cell == "–" ||
                             ((cell[0] == '-' || cell[0] == '+') && cell.size() > 1 &&
                              std::isdigit(static_cast<unsigned char>(cell[1]))));
  }

  void block(const QString& text, const QFont& f, const QColor& color, double after) {
    p_.setFont(f);
    const QRectF box(body_.left(), 0, body_.width(), 1e6);
    const QRectF needed = p_.boundingRect(box, Qt::TextWordWrap, text);
    ensure(needed.height());
    p_.setPen(color);
    p_.drawText(QRectF(box.left(), y_, box.width(), needed.height()), Qt::TextWordWrap, text);
    y_ += needed.height() + after;
  }

  void ensure(double height) {
    if (y_ + height > body_.bottom() && y_ > body_.top()) newPage();
  }

  void newPage() {
    drawFooter();
    writer_.newPage();
    ++page_;
    y_ = body_.top();
  }

  void drawFooter() {
    p_.setFont(font(7.5));
    p_.setPen(kMuted);
    const QRectF line(body_.left(), footerY_, body_.width(), 14);
    p_.drawText(line, Qt::AlignLeft | Qt::AlignVCenter, footer_);
    p_.drawText(line, Qt::AlignRight | Qt::AlignVCenter, QStringLiteral("page %1").arg(page_));
  }

  QPdfWriter& writer_;
  QPainter& p_;
  QString footer_;
  QRectF body_;
  double footerY_ = 0;
  double y_ = 0;
  int page_ = 1;
};

// A QGuiApplication for this call when the process has none (lockstepctl); offscreen, so that no
// display is needed.
class GuiForCall {
 public:
  GuiForCall() {
    if (QCoreApplication::instance()) return;
    if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
    // Qt's remarks about the session (no XDG_RUNTIME_DIR, ...) mean nothing to a command-line user.
    previous_ = qInstallMessageHandler([](QtMsgType type, const QMessageLogContext&, const QString& message) {
      if (type == QtCriticalMsg || type == QtFatalMsg) std::fprintf(stderr, "%s\n", qPrintable(message));
    });
    app_ = std::make_unique<QGuiApplication>(argc_, argv_);
  }
  ~GuiForCall() {
    if (!app_) return;
    app_.reset();
    qInstallMessageHandler(previous_);
  }
  bool ok() const { return qobject_cast<QGuiApplication*>(QCoreApplication::instance()) != nullptr; }

 private:
  int argc_ = 1;
  char name_[12] = "lockstepctl";
  char* argv_[2] = {name_, nullptr};
  std::unique_ptr<QGuiApplication> app_;
  QtMessageHandler previous_ = nullptr;
};

}  // namespace

Result<void> writePdf(const Document& document, const std::string& path) {
  GuiForCall gui;
  if (!gui.ok())
    return Error{ErrorCode::kInternal, "writing a PDF needs a QGuiApplication, and this process has a non-GUI one"};
  const std::filesystem::path target(path);
  const auto dir = target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return Error{ErrorCode::kNotFound, "cannot write " + path + ": the directory " + dir.string() + " does not exist"};
  }
  // Into a temporary file beside the target, renamed over it when complete.
  const std::string temporary =
      (dir / ("." + target.filename().string() + ".tmp-" + std::to_string(::getpid()))).string();
  int pages = 0;
  {
    QPdfWriter writer(QString::fromStdString(temporary));
    writer.setPageSize(QPageSize(QPageSize::A4));
    writer.setPageMargins(QMarginsF(0, 0, 0, 0));
    writer.setResolution(72);
    writer.setTitle(q(document.title));
    writer.setCreator(QStringLiteral("Lockstep"));
    QPainter painter;
    if (!painter.begin(&writer)) {
      QFile::remove(QString::fromStdString(temporary));
      return Error{ErrorCode::kIo, "cannot write " + path + ": the PDF writer could not open " + temporary};
    }
    painter.setRenderHint(QPainter::Antialiasing);
    Layout layout(writer, painter, q(document.title));
    layout.title(q(document.title), q(document.subtitle));
    for (const auto& section : document.sections) {
      layout.heading(q(section.heading));
      for (const auto& text : section.paragraphs) layout.paragraph(q(text));
      for (const auto& text : section.bullets) layout.paragraph(q(text), QStringLiteral("•"));
      for (const auto& t : section.tables) layout.table(t);
      for (const auto& c : section.code) layout.code(q(c));
      for (const auto& c : section.charts) layout.chart(c);
    }
    layout.finish();
    pages = layout.pages();
    if (!painter.end()) {
      QFile::remove(QString::fromStdString(temporary));
      return Error{ErrorCode::kIo, "cannot write " + path + ": the PDF writer failed"};
    }
  }
  if (std::filesystem::file_size(temporary, ec) == 0 || ec || pages == 0) {
    std::filesystem::remove(temporary, ec);
    return Error{ErrorCode::kIo, "cannot write " + path + ": the PDF came out empty (is the disk full?)"};
  }
  std::filesystem::rename(temporary, target, ec);
  if (ec) {
    std::filesystem::remove(temporary, ec);
    return Error{ErrorCode::kIo, "cannot write " + path + ": " + ec.message()};
  }
  return {};
}

Result<void> writePdf(const history::History& history, const std::string& jobId, const std::string& path,
                      std::int64_t nowUnixUs) {
  LOCKSTEP_ASSIGN_OR_RETURN(const ReportData data, load(history, jobId, nowUnixUs));
  return writePdf(document(data), path);
}

}  // namespace lockstep::report
