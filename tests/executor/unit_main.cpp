// doctest main for the single-process executor tests (torch headers first: test_common.hpp).
#include "test_common.hpp"
// clang-format off
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
// clang-format on

int main(int argc, char** argv) { return doctest::Context(argc, argv).run(); }
