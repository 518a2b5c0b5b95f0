// CLI formatting: durations, numbers and tables read the way a person expects.
#include <doctest/doctest.h>

#include <sstream>

#include "cli/format.hpp"

using namespace gpuq::cli;

TEST_SUITE_BEGIN("format");

TEST_CASE("job ids print as ranges, and past a dozen ranges as a count") {
  CHECK(id_ranges({}) == "");
  CHECK(id_ranges({7}) == "7");
  CHECK(id_ranges({1, 2, 3, 7, 9, 10, 11, 12}) == "1-3 7 9-12");
  CHECK(id_ranges({5, 4}) == "5 4");  // in the order given
  std::vector<std::int64_t> sweep(100000);
  for (std::size_t i = 0; i < sweep.size(); ++i) sweep[i] = static_cast<std::int64_t>(i) + 1;
  CHECK(id_ranges(sweep) == "1-100000");
  std::vector<std::int64_t> odd;
  for (std::int64_t i = 1; i < 100000; i += 2) odd.push_back(i);
  const std::string s = id_ranges(odd, 3);
  CHECK(s == "1 3 5 ... (50000 in all)");
}

TEST_CASE("durations are compact and carry the two largest units") {
  CHECK(format_duration(4.7) == "4s");
  CHECK(format_duration(125) == "2m05s");
  CHECK(format_duration(3 * 3600 + 2 * 60 + 9) == "3h02m");
  CHECK(format_duration(2 * 86400 + 4 * 3600) == "2d04h");
  CHECK(format_duration(-1) == "0s");
}

TEST_CASE("a count is a whole string of digits within its bounds") {
  CHECK(parse_int("3", 1, 10) == 3);
  CHECK(parse_int("10", 1, 10) == 10);
  CHECK(parse_int("0", 0, 5) == 0);
  for (const char* bad : {"", "0", "11", "-1", "3x", " 3", "+3", "1.5", "99999999999"})
    CHECK_MESSAGE(!parse_int(bad, 1, 10), bad);
}

TEST_CASE("a duration is read as a number and one unit, and sizes print in binary units") {
  CHECK(parse_duration("90") == 90.0);
  CHECK(parse_duration("90s") == 90.0);
  CHECK(parse_duration("30m") == 1800.0);
  CHECK(parse_duration("1.5h") == 5400.0);
  CHECK(parse_duration("7d") == 7 * 86400.0);
  CHECK(parse_duration("2w") == 2 * 604800.0);
  CHECK(parse_duration("0") == 0.0);
  for (const char* bad : {"", "d", "7 d", "7dd", "7y", "-1h", "nan", "inf", "1e999d", "h7"})
    CHECK_MESSAGE(!parse_duration(bad), bad);
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(format_bytes(12LL << 20) == "12.0 MiB");
  CHECK(format_bytes(3LL << 40) == "3.0 TiB");
}

TEST_CASE("numbers keep four significant digits, without exponents for ordinary magnitudes") {
  CHECK(format_value(0.86661) == "0.8666");
  CHECK(format_value(16070.3) == "16070");
  CHECK(format_value(0.00013) == "1.300e-04");
  CHECK(format_value(3) == "3");
  CHECK(format_value(nullptr) == "-");
  CHECK(format_value("text") == "text");
  CHECK(format_value(nlohmann::json::parse("[4711.2343, 3318.9]")) == "[4711, 3319]");
}

TEST_CASE("fields print as key=value, metrics first, skipping bookkeeping and nested values") {
  nlohmann::json p = {{"epoch", 2}, {"loss", 0.41}, {"rank", 0}, {"at", 12.0}, {"hist", {1, 2}}};
  CHECK(format_fields(p, 5) == "loss=0.41 epoch=2");
  CHECK(format_fields(p, 1) == "loss=0.41 ...");
  nlohmann::json r = {{"backend", "gloo"}, {"checkpoint", "/x"}, {"epochs", 2}, {"test_accuracy", 0.87},
                      {"test_loss", 0.35}, {"type", "result"}};
  CHECK(format_fields(r, 3) == "test_accuracy=0.87 test_loss=0.35 epochs=2 ...");
}

TEST_CASE("tables align columns and trim trailing spaces") {
  Table t({"ID", "NAME"});
  t.add({"10", "a"});
  t.add({"7", "longer"});
  std::ostringstream out;
  t.print(out);
  CHECK(out.str() == "ID  NAME\n10  a\n7   longer\n");
  CHECK(t.width() == 10);  // "7   longer"
}

TEST_CASE("table lines cut wide columns but the last") {
  Table t({"ID", "NAME", "DETAIL"});
  t.add({"1", "a-very-long-job-name", "a detail longer than the cap"});
  auto lines = t.lines(8);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == "ID  NAME      DETAIL");
  CHECK(lines[1] == "1   a-very-~  a detail longer than the cap");
}

TEST_CASE("printable escapes what a terminal would act on and keeps every other character") {
  CHECK(printable("loss=0.41 épocas 学习 ✓") == "loss=0.41 épocas 学习 ✓");
  CHECK(printable("\x1b]0;owned\x07") == "\\x1b]0;owned\\x07");  // set the window title
  CHECK(printable("\x1b[2J\x1b[H") == "\\x1b[2J\\x1b[H");        // clear the screen
  CHECK(printable("a\nb\rc\td\x7f") == "a\\nb\\rc\\td\\x7f");
  CHECK(printable("\xc2\x9b" "31m") == "\\u009b31m");                  // C1 CSI, in UTF-8
  CHECK(printable("\xc2\x85\xc2\x80\xc2\xa0") == "\\u0085\\u0080\xc2\xa0");  // NEL, PAD; NBSP stays
  CHECK(printable("\xe2\x80\xae" "txt.exe") == "\\u202etxt.exe");     // right-to-left override
  CHECK(printable("\x9b" "31m \xff \xc3") == "\\x9b31m \\xff \\xc3");  // not UTF-8: bytes
  CHECK(printable("\xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80") == "\\xc0\\xaf \\xed\\xa0\\x80 \\xf4\\x90\\x80\\x80");
  CHECK(printable(std::string("nul\0here", 8)) == "nul\\x00here");
  CHECK(printable(printable("\x1b")) == printable("\x1b"));  // applying it twice changes nothing
  CHECK(printable_lines("one\x1b\ntwo") == "one\\x1b\ntwo");
}

TEST_CASE("a table escapes its cells, header included, and values of results and progress") {
  Table t({"ID", "k\x1b"});
  t.add({"1", "v\x1b[31m"});
  std::ostringstream out;
  t.print(out);
  CHECK(out.str() == "ID  k\\x1b\n1   v\\x1b[31m\n");
  CHECK(format_fields(nlohmann::json{{"a\x07", "b\x9b"}}, 4) == "a\\x07=b\\x9b");
}

TEST_SUITE_END();
