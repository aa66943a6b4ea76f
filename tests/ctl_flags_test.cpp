// Issue 15: lockstepctl's one flag parser. Commands used to read `--grace-ms abc` as 0 and
// `--rank x` as rank 0, and to drop what they did not know.

#include <gtest/gtest.h>

#include "ctl_flags.h"

namespace lockstep::ctl {
namespace {

TEST(CtlFlags, ValuesComeSpacedOrWithEqualsAndSwitchesAlone) {
  std::string out;
  std::uint32_t n = 0;
  std::optional<std::uint32_t> maybe;
  std::vector<std::uint32_t> list;
  std::optional<double> price;
  bool wait = false;
  std::vector<std::string> args;
  const auto parsed = Flags("usage: t")
                          .text("--out", &out)
                          .whole("--n", &n, 0, 10)
                          .whole("--maybe", &maybe, 1, 5)
                          .wholes("--list", &list, 0, 9)
                          .price("--price", &price)
                          .on("--wait", &wait)
                          .arguments(&args, 1, 1)
                          .parse({"JOB", "--out=a b", "--n", "7", "--maybe=5", "--list", "1,2,0", "--wait", "--price",
                                  "2.5", "EXTRA"});
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(out, "a b");
  EXPECT_EQ(n, 7u);
  EXPECT_EQ(maybe, 5u);
  EXPECT_EQ(list, (std::vector<std::uint32_t>{1, 2, 0}));
  EXPECT_EQ(price, 2.5);
  EXPECT_TRUE(wait);
  EXPECT_EQ(args, (std::vector<std::string>{"JOB", "EXTRA"}));
}

TEST(CtlFlags, EveryMistakeIsNamedWithTheUsage) {
  const auto parse = [](std::vector<std::string> argv) {
    std::uint32_t n = 0;
    bool on = false;
    std::optional<double> price;
    std::vector<std::string> args;
    auto r = Flags("usage: t JOB [--n N]").whole("--n", &n, 1, 10).on("--on", &on).price("--p", &price).arguments(&args, 1).parse(argv);
    return r.ok() ? std::string("ok") : r.error().message;
  };
  EXPECT_EQ(parse({"JOB", "--n", "3"}), "ok");
  EXPECT_EQ(parse({"JOB", "--n", "abc"}), "--n needs a whole number from 1 to 10 (not 'abc')");
  EXPECT_EQ(parse({"JOB", "--n", "11"}), "--n needs a whole number from 1 to 10 (not '11')");
  EXPECT_EQ(parse({"JOB", "--n", "-1"}), "--n needs a whole number from 1 to 10 (not '-1')");
  EXPECT_EQ(parse({"JOB", "--n"}), "--n needs a value; usage: t JOB [--n N]");
  EXPECT_EQ(parse({"JOB", "--on=yes"}), "--on takes no value; usage: t JOB [--n N]");
  EXPECT_EQ(parse({"JOB", "--p", "-2"}), "--p needs a price, like 2.50 (not '-2')");
  EXPECT_EQ(parse({"JOB", "--bogus"}), "unknown option --bogus; usage: t JOB [--n N]");
  EXPECT_EQ(parse({"JOB", "OTHER"}), "unexpected argument 'OTHER'; usage: t JOB [--n N]");
  EXPECT_EQ(parse({}), "an argument is missing; usage: t JOB [--n N]");
  EXPECT_EQ(parse({"-x1"}), "ok") << "a single dash starts an argument (a Z85 key may)";
  EXPECT_EQ(parse({"--", "--n"}), "ok") << "after --, everything is an argument";
}

TEST(CtlFlags, WhatAParserDoesNotKnowIsPassedOnWhenAskedInOrder) {
  bool wait = false;
  std::vector<std::string> rest;
  ASSERT_TRUE(Flags("u").on("--wait", &wait).passOn(&rest).parse({"--layers", "4,2", "--wait", "--lr=0.1"}).ok());
  EXPECT_TRUE(wait);
  EXPECT_EQ(rest, (std::vector<std::string>{"--layers", "4,2", "--lr=0.1"}));
}

}  // namespace
}  // namespace lockstep::ctl
