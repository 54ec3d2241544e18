// core/unit_parse: the one place unit suffixes are read. Each kind accepts its own units only, and a size or rate
// without a unit is refused (a bare "80" could be GB or GiB); a count may be bare.
#include <doctest/doctest.h>

#include "core/unit_parse.hpp"

using namespace fsdp;

TEST_CASE("unit parse: sizes, bandwidths, durations and FLOP rates need their units") {
  CHECK(parse_bytes("80 GiB")->value == 80.0 * kGiB);
  CHECK(parse_bytes("80GB")->value == 80e9);
  CHECK_FALSE(parse_bytes("80").has_value());
  CHECK_FALSE(parse_bytes("80 Gb/s").has_value());
  CHECK(parse_bandwidth("400 Gb/s")->value == 50e9);
  CHECK(parse_bandwidth("900 GB/s")->value == 900e9);
  CHECK_FALSE(parse_bandwidth("400 GB").has_value());
  CHECK(parse_duration("30 us")->value == doctest::Approx(30e-6));
  CHECK_FALSE(parse_duration("30").has_value());
  CHECK(parse_flops_rate("989 TFLOP/s")->value == doctest::Approx(989e12));
  CHECK_FALSE(parse_flops_rate("989 TB/s").has_value());
}

TEST_CASE("unit parse: counts are bare numbers or K, M, B, T, decimal as token counts are quoted") {
  CHECK(*parse_count("1000") == 1000.0);
  CHECK(*parse_count("5e11") == 5e11);
  CHECK(*parse_count("2T") == 2e12);
  CHECK(*parse_count("15 T") == 15e12);
  CHECK(*parse_count("300B") == 3e11);
  CHECK(*parse_count("4M") == 4e6);
  CHECK(*parse_count("1.5K") == 1500.0);
  CHECK_FALSE(parse_count("2X").has_value());
  CHECK_FALSE(parse_count("2 GiB").has_value());
  CHECK_FALSE(parse_count("T").has_value());
  CHECK_FALSE(parse_count("").has_value());
  CHECK_FALSE(parse_count("inf").has_value());
}
