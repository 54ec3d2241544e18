// doctest main for the single-process executor tests (torch headers first: test_common.hpp).
#include "test_common.hpp"
// clang-format off
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
// clang-format on
