// The Prometheus exposition writer and the metrics endpoint's address (daemon/metrics*.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "daemon/metrics.hpp"
#include "daemon/metrics_http.hpp"

using namespace gpuq::daemon;

TEST_CASE("a family is its HELP and TYPE once, then samples with quoted, escaped labels") {
  Exposition e;
  e.family("gpuq_jobs", "gauge", "Jobs by state");
  e.sample("gpuq_jobs", {{"state", "queued"}, {"user", "a\"b\\c\nd"}}, 3);
  e.sample("gpuq_store_bytes", {}, 1.5);
  CHECK(e.text() ==
        "# HELP gpuq_jobs Jobs by state\n# TYPE gpuq_jobs gauge\n"
        "gpuq_jobs{state=\"queued\",user=\"a\\\"b\\\\c\\nd\"} 3\n"
        "gpuq_store_bytes 1.5\n");
}

TEST_CASE("values: integers plainly, large ones whole, fractions to 15 digits, infinities and NaN by name") {
  CHECK(format_sample_value(0) == "0");
  CHECK(format_sample_value(85899345920.0) == "85899345920");
  CHECK(format_sample_value(1795651430.125) == "1795651430.125");
  CHECK(format_sample_value(1e-5) == "1e-05");
  CHECK(format_sample_value(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(format_sample_value(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(format_sample_value(std::nan("")) == "NaN");
}

TEST_CASE("a histogram's buckets are cumulative, +Inf counts every observation, with sum and count") {
  Histogram h({1, 10});
  for (double v : {0.5, 1.0, 5.0, 50.0}) h.observe(v);
  Exposition e;
  e.histogram("gpuq_wait_seconds", {{"q", "x"}}, h);
  CHECK(e.text() ==
        "gpuq_wait_seconds_bucket{q=\"x\",le=\"1\"} 2\n"
        "gpuq_wait_seconds_bucket{q=\"x\",le=\"10\"} 3\n"
        "gpuq_wait_seconds_bucket{q=\"x\",le=\"+Inf\"} 4\n"
        "gpuq_wait_seconds_sum{q=\"x\"} 56.5\n"
        "gpuq_wait_seconds_count{q=\"x\"} 4\n");
}

TEST_CASE("the metrics address is HOST:PORT with an IP literal or localhost, and a bad one says why") {
  auto a = parse_http_endpoint("127.0.0.1:9464");
  REQUIRE(a.ok());
  CHECK((a->host == "127.0.0.1" && a->port == 9464));
  a = parse_http_endpoint("[::1]:0");
  REQUIRE(a.ok());
  CHECK((a->host == "::1" && a->port == 0));
  CHECK(parse_http_endpoint("localhost:80")->host == "127.0.0.1");
  CHECK(parse_http_endpoint("9464").error().message == "metrics_listen 9464: expected HOST:PORT, as 127.0.0.1:9464");
  CHECK(parse_http_endpoint("127.0.0.1:99999").error().message.find("from 0 to 65535") != std::string::npos);
  CHECK(parse_http_endpoint("127.0.0.1:").error().message.find("from 0 to 65535") != std::string::npos);
  CHECK(parse_http_endpoint("example.com:80").error().message.find("an IP address") != std::string::npos);
  CHECK(parse_http_endpoint(":80").error().message.find("an IP address") != std::string::npos);
}
