// The unit-test binary: doctest's main; the tests live in test_<module>.cpp beside this file.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
