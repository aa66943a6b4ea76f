// Issue 15: the PDF report's tables on an A4 page. A long node name or message used to squeeze
// every column alike, cutting the narrow ones' headers to "Ra…" and "No…"; now narrow columns keep
// their width and wide ones wrap. Read back with pdftotext (poppler-utils).

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lockstep/report/report_pdf.h"
#include "support/test_support.h"

namespace lockstep::report {
namespace {

using test::TempDir;

std::string pdfText(const TempDir& dir, const std::string& path) {
  const auto r = test::runProcess({"/usr/bin/pdftotext", "-layout", path, "-"}, {}, dir, std::chrono::seconds(30));
  EXPECT_TRUE(r.status.success()) << r.err;
  return r.out;
}

TEST(PdfReport, ALongCellWrapsInsteadOfCuttingTheOtherColumnsHeaders) {
  TempDir dir;
  const std::string node = "gpu-node-0123.rack-17.hall-b.training-cluster.example.org";
  Table ranks{"Per rank",
              {"Rank", "Node", "Steps", "Rows/step", "Samples/s", "Comm", "Data ms", "Compute ms", "Exposed ms",
               "Step ms", "Loss", "CPU %", "RSS"},
              {}};
  for (int r = 0; r < 8; ++r) {
    ranks.rows.push_back({std::to_string(r), node, "120,000", "64", "281,473", "74.7%", "0.0", "12.5", "0.1", "13.2",
                          "1.6776", "99", "1.2 GiB"});
  }
  Table events{"Events", {"Time", "Event", "Rank", "Message"}, {}};
  events.rows.push_back({"2026-12-01 19:17:34 UTC", "failed", "3",
                         "rank 3 on " + node + " exited with exit code 1: Traceback (most recent call last): File "
                         "\"train.py\", line 88, in <module> loss.backward() RuntimeError: CUDA error: an illegal "
                         "memory access was encountered"});
  Document doc{"Job wide", "", {Section{"Ranks", {}, {ranks, events}, {}, {}, {}}}};
  const std::string path = dir.file("wide.pdf");
  ASSERT_TRUE(writePdf(doc, path).ok());
  const std::string text = pdfText(dir, path);
  EXPECT_EQ(text.find("…"), std::string::npos) << "a cell was cut:\n" << text;
  for (const char* header : {"Rank", "Node", "Steps", "Samples/s", "Comm", "RSS", "Time", "Event", "Message"}) {
    EXPECT_NE(text.find(header), std::string::npos) << header << " is missing:\n" << text;
  }
  EXPECT_NE(text.find("illegal"), std::string::npos) << "the message's end is missing:\n" << text;
}

}  // namespace
}  // namespace lockstep::report
