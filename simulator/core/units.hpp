// Physical quantities with their unit in the type name (ASTRA-sim style).
// Conversions from text ("80 GiB", "300 GB/s", "2 us") happen once, at parsing
// (see unit_parse.hpp); arithmetic inside the simulator uses these SI base
// units only: bytes, seconds, bytes per second, FLOPs, FLOPs per second.
#pragma once

#include <compare>
#include <cstdint>

namespace fsdp {

template <typename Tag>
struct Quantity {
  double value = 0.0;
  constexpr Quantity() = default;
  constexpr explicit Quantity(double v) : value(v) {}
  constexpr auto operator<=>(const Quantity&) const = default;
  constexpr Quantity& operator+=(Quantity o) {
    value += o.value;
    return *this;
  }
  constexpr Quantity& operator-=(Quantity o) {
    value -= o.value;
    return *this;
  }
  friend constexpr Quantity operator+(Quantity a, Quantity b) { return Quantity(a.value + b.value); }
  friend constexpr Quantity operator-(Quantity a, Quantity b) { return Quantity(a.value - b.value); }
  friend constexpr Quantity operator*(Quantity a, double k) { return Quantity(a.value * k); }
  friend constexpr Quantity operator*(double k, Quantity a) { return Quantity(a.value * k); }
  friend constexpr Quantity operator/(Quantity a, double k) { return Quantity(a.value / k); }
  friend constexpr double operator/(Quantity a, Quantity b) { return a.value / b.value; }
};

struct BytesTag {};
struct SecondsTag {};
struct BytesPerSecondTag {};
struct FlopsTag {};
struct FlopsPerSecondTag {};

using Bytes = Quantity<BytesTag>;
using Seconds = Quantity<SecondsTag>;
using BytesPerSecond = Quantity<BytesPerSecondTag>;
using Flops = Quantity<FlopsTag>;
using FlopsPerSecond = Quantity<FlopsPerSecondTag>;

constexpr Seconds operator/(Bytes b, BytesPerSecond bw) { return Seconds(b.value / bw.value); }
constexpr Seconds operator/(Flops f, FlopsPerSecond r) { return Seconds(f.value / r.value); }
constexpr Bytes operator*(BytesPerSecond bw, Seconds s) { return Bytes(bw.value * s.value); }

// Binary and decimal prefixes, named so no bare 1e9 appears in the code.
inline constexpr double kKiB = 1024.0;
inline constexpr double kMiB = 1024.0 * 1024.0;
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr double kKB = 1e3;
inline constexpr double kMB = 1e6;
inline constexpr double kGB = 1e9;
inline constexpr double kTera = 1e12;
inline constexpr double kMicro = 1e-6;
inline constexpr double kNano = 1e-9;

constexpr double to_gib(Bytes b) { return b.value / kGiB; }
constexpr Bytes gib(double g) { return Bytes(g * kGiB); }
constexpr Bytes mib(double m) { return Bytes(m * kMiB); }

}  // namespace fsdp
