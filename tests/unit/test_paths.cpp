// common/paths: make_dirs (`mkdir -p` without std::filesystem, for gpuq-worker) and remove_tree.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "common/paths.hpp"

using namespace gpuq::common;

TEST_SUITE_BEGIN("paths");

TEST_CASE("make_dirs creates missing parents, accepts what exists, and names what is in its way") {
  const std::string root = "/tmp/gpuq-unit-paths-" + std::to_string(::getpid());
  const std::string deep = root + "/a//b/c/";
  REQUIRE(make_dirs(deep).ok());
  CHECK(is_directory(root + "/a/b/c"));
  CHECK(make_dirs(root + "/a/b").ok());  // already there

  std::ofstream(root + "/file") << "x";
  auto blocked = make_dirs(root + "/file/sub");
  REQUIRE_FALSE(blocked.ok());
  CHECK(blocked.error().message.find(root + "/file/sub") != std::string::npos);
  auto over_file = make_dirs(root + "/file");
  REQUIRE_FALSE(over_file.ok());
  CHECK(over_file.error().message.find("something else is there") != std::string::npos);
  CHECK_FALSE(make_dirs("").ok());

  std::string error;
  remove_tree(root, error);
  CHECK(error.empty());
  CHECK_FALSE(path_exists(root));
}

TEST_CASE("make_dirs leaves the mode to the umask, as mkdir -p does") {
  const std::string root = "/tmp/gpuq-unit-paths-mode-" + std::to_string(::getpid());
  const mode_t old = ::umask(027);
  auto made = make_dirs(root + "/x");
  ::umask(old);
  REQUIRE(made.ok());
  struct stat st {};
  REQUIRE(::stat((root + "/x").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0750);
  std::string error;
  remove_tree(root, error);
}

TEST_SUITE_END();
