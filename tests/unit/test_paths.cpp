// common/paths: make_dirs (`mkdir -p` without std::filesystem, for gpuq-worker) and remove_tree.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

#include "common/paths.hpp"
#include "common/process.hpp"

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

TEST_CASE("ensure_private_dir makes what is missing of a path, up from its end, and the directory itself private") {
  const std::string root = "/tmp/gpuq-unit-private-" + std::to_string(::getpid());
  const std::string deep = root + "/jobs//7/attempt-1";
  REQUIRE(ensure_private_dir(deep));
  struct stat st {};
  REQUIRE(::stat(deep.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  CHECK(is_directory(root + "/jobs/7"));
  REQUIRE(ensure_private_dir(root + "/jobs/7/attempt-2"));  // a second attempt: its parent is there
  CHECK(is_directory(root + "/jobs/7/attempt-2"));
  REQUIRE(::chmod(deep.c_str(), 0755) == 0);
  CHECK(ensure_private_dir(deep));  // there already: made private again
  REQUIRE(::stat(deep.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  std::ofstream(root + "/file") << "x";
  auto blocked = ensure_private_dir(root + "/file/sub/dir");
  REQUIRE_FALSE(blocked);
  CHECK(blocked.error().message ==
        "cannot create directory " + root + "/file/sub/dir: " + root + "/file is not a directory");
  std::string error;
  remove_tree(root, error);
  CHECK(error.empty());
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


TEST_CASE("write_file_atomic replaces a symlink at its name or its temporary name, never writes through") {
  const std::string root = "/tmp/gpuq-unit-atomic-" + std::to_string(::getpid());
  REQUIRE(make_dirs(root).ok());
  const auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  std::ofstream(root + "/victim1") << "root's own\n";
  std::ofstream(root + "/victim2") << "root's own\n";
  // A job owns the directory a root gpuqd writes launch.json into: it plants links at both names.
  REQUIRE(::symlink((root + "/victim1").c_str(), (root + "/launch.json").c_str()) == 0);
  REQUIRE(::symlink((root + "/victim2").c_str(), (root + "/launch.json.tmp").c_str()) == 0);
  auto w = write_file_atomic(root + "/launch.json", "{\"ok\": 1}\n", 0600);
  REQUIRE(w);
  CHECK(slurp(root + "/victim1") == "root's own\n");
  CHECK(slurp(root + "/victim2") == "root's own\n");
  struct stat st {};
  REQUIRE(::lstat((root + "/launch.json").c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(slurp(root + "/launch.json") == "{\"ok\": 1}\n");
  CHECK(::access((root + "/launch.json.tmp").c_str(), F_OK) != 0);
  // The mode asked for, whatever the umask (the lab unit's is 027; a hook's input is for its owner).
  const mode_t was = ::umask(027);
  REQUIRE(write_file_atomic(root + "/input.json", "{}", 0644));
  ::umask(was);
  REQUIRE(::stat((root + "/input.json").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0644);
  std::string error;
  CHECK(remove_tree(root, error) >= 0);
}

TEST_CASE("remove_tree deletes a symlink in the tree, never what it points to") {
  const std::string root = "/tmp/gpuq-unit-rmtree-" + std::to_string(::getpid());
  REQUIRE(make_dirs(root + "/precious").ok());
  REQUIRE(make_dirs(root + "/job/checkpoints").ok());
  std::ofstream(root + "/precious/keep") << "not the job's\n";
  std::ofstream(root + "/job/checkpoints/ckpt") << "the job's\n";
  // A job's own links in its directory: to a directory and to a file outside it.
  REQUIRE(::symlink((root + "/precious").c_str(), (root + "/job/checkpoints/dir-link").c_str()) == 0);
  REQUIRE(::symlink((root + "/precious/keep").c_str(), (root + "/job/file-link").c_str()) == 0);
  std::string error;
  CHECK(remove_tree(root + "/job", error) == 10);  // the job's one file; links count nothing
  CHECK(error.empty());
  CHECK(::access((root + "/job").c_str(), F_OK) != 0);
  std::ifstream kept(root + "/precious/keep");
  CHECK(std::string(std::istreambuf_iterator<char>(kept), {}) == "not the job's\n");
  CHECK(remove_tree(root, error) >= 0);
}

TEST_CASE("the fallback for old kernels marks every open descriptor close-on-exec, high ones too") {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const int high = ::fcntl(p[0], F_DUPFD, 70000);  // past the old loop's 65,536, where the limit allows
  mark_listed_fds_cloexec();
  CHECK((::fcntl(p[0], F_GETFD) & FD_CLOEXEC) != 0);
  CHECK((::fcntl(p[1], F_GETFD) & FD_CLOEXEC) != 0);
  if (high >= 0) {
    CHECK((::fcntl(high, F_GETFD) & FD_CLOEXEC) != 0);
    ::close(high);
  }
  CHECK((::fcntl(0, F_GETFD) & FD_CLOEXEC) == 0);  // stdin stays the child's
  ::close(p[0]);
  ::close(p[1]);
}

TEST_SUITE_END();
