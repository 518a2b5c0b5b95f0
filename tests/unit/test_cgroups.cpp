// The cgroup layout as hosts show it (/proc/self/mountinfo, /proc/self/cgroup), and an attempt's
// cgroup over a fake cgroupfs (a directory with the files the kernel would show).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <linux/capability.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>

#include "daemon/cgroups.hpp"
#include "daemon/executor.hpp"
#include "daemon/launcher.hpp"
#include "tests/unit/temp_dir.hpp"

using gpuq::daemon::CgroupHierarchy;
using gpuq::daemon::Cgroups;
using gpuq::daemon::parse_cgroup_layout;

namespace {

// This machine kind: v1 controllers, v2 at /sys/fs/cgroup/unified with nothing in it, the process
// in a memory cgroup of the sandbox's.
const char* k_hybrid_mounts =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n";
const char* k_hybrid_groups = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/bc3e\n1:cpu:/\n0::/\n";

// Ubuntu 24.04: v2 only, gpuqd in its service's cgroup.
const char* k_v2_mounts =
    "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";
const char* k_v2_groups = "0::/system.slice/gpuqd.service\n";

// A container: the hierarchy's part of it bind-mounted, with a space in the mount point.
const char* k_container_mounts = "700 690 0:30 /docker/abc /sys/fs/cgroup\\040x rw,relatime - cgroup2 cgroup2 rw\n";

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// The directory a refusal names, from `prefix` to the next space.
std::string named(const std::string& why, const std::string& prefix) {
  const auto at = why.find(prefix);
  REQUIRE(at != std::string::npos);
  return why.substr(at, why.find(' ', at) - at);
}

// This host's hierarchies, as gpuqd reads them at start.
std::vector<CgroupHierarchy> host_layout() {
  std::ifstream mounts("/proc/self/mountinfo"), groups("/proc/self/cgroup");
  std::stringstream m, g;
  m << mounts.rdbuf();
  g << groups.rdbuf();
  return parse_cgroup_layout(m.str(), g.str());
}

// This host's v1 hierarchies of one controller each, for those named.
std::vector<CgroupHierarchy> host_v1(const std::vector<std::string>& controllers) {
  std::vector<CgroupHierarchy> out;
  for (auto& h : host_layout())
    if (!h.v2 && h.controllers.size() == 1 &&
        std::find(controllers.begin(), controllers.end(), h.controllers.front()) != controllers.end())
      out.push_back(h);
  return out;
}

// A file's first word (a cgroup file's value).
std::string first_of(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  in >> word;
  return word;
}

// An attempt's tracking cgroup: the first of those make() gives.
// gpuqd's cgroups on this host's v1 pids and freezer hierarchies, where there are both and they
// may be written (root); an error elsewhere.
gpuq::Result<Cgroups> v1_pids_and_freezer(const gpuq::testing::TempDir& state) {
  const std::vector<CgroupHierarchy> v1 = host_v1({"pids", "freezer"});
  return v1.size() < 2 ? gpuq::Result<Cgroups>(gpuq::Error{}) : Cgroups::open(state.path, v1);
}

std::optional<std::string> made(gpuq::Result<std::vector<gpuq::daemon::AttemptCgroup>> dirs) {
  if (!dirs || dirs->empty()) return std::nullopt;
  return dirs->front().dir;
}

}  // namespace

TEST_SUITE_BEGIN("cgroups");

TEST_CASE("the layout: each hierarchy this process is in, with its own cgroup as a directory") {
  const auto hybrid = parse_cgroup_layout(k_hybrid_mounts, k_hybrid_groups);
  REQUIRE(hybrid.size() == 5);
  const auto find = [&](const std::string& controller) -> const CgroupHierarchy* {
    for (const auto& h : hybrid)
      if ((controller.empty() && h.v2) || (!h.controllers.empty() && h.controllers.front() == controller)) return &h;
    return nullptr;
  };
  REQUIRE(find(""));
  CHECK(find("")->own_dir() == "/sys/fs/cgroup/unified");
  REQUIRE(find("memory"));
  CHECK(find("memory")->own_dir() == "/sys/fs/cgroup/memory/process_api/bc3e");
  CHECK(find("name=systemd")->own_dir() == "/sys/fs/cgroup/systemd");

  const auto v2 = parse_cgroup_layout(k_v2_mounts, k_v2_groups);
  REQUIRE(v2.size() == 1);
  CHECK(v2[0].v2);
  CHECK(v2[0].own_dir() == "/sys/fs/cgroup/system.slice/gpuqd.service");

  // Inside the bind-mounted part, and outside it (a cgroup this mount does not show).
  const auto inside = parse_cgroup_layout(k_container_mounts, "0::/docker/abc/init\n");
  REQUIRE(inside.size() == 1);
  CHECK(inside[0].own_dir() == "/sys/fs/cgroup x/init");
  CHECK(parse_cgroup_layout(k_container_mounts, "0::/docker/other\n").empty());
  CHECK(parse_cgroup_layout(k_container_mounts, "0::/docker/abcd\n").empty());  // a prefix, not a parent

  // Nothing mounted, or text that is not what the kernel writes.
  CHECK(parse_cgroup_layout("", k_hybrid_groups).empty());
  CHECK(parse_cgroup_layout("garbage - cgroup2\n- - -\n", "0::/\n").empty());
  CHECK(parse_cgroup_layout(k_v2_mounts, "nonsense\n").empty());

  // Mounted twice at one point: the later mount is the one seen.
  const std::string over = std::string(k_v2_mounts) + "90 24 0:99 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  const auto seen = parse_cgroup_layout(over, "0::/a\n");
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].own_dir() == "/sys/fs/cgroup/a");
}

TEST_CASE("gpuqd's cgroup is made under its own, named for its state dir, and refused where it is no cgroup") {
  gpuq::testing::TempDir fs("gpuq-unit-cgroupfs");
  const CgroupHierarchy v2{true, {}, fs.path, "/", "/svc"};
  REQUIRE(std::filesystem::create_directory(fs.path + "/svc"));

  // mkdir in a real cgroupfs makes its files; here it does not: not a cgroup, named.
  auto refused = Cgroups::open("/var/lib/gpuq", {v2});
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.find("is not a cgroup") != std::string::npos);
  const std::string base = named(refused.error().message, fs.path + "/svc/gpuq-");
  write(base + "/cgroup.procs", "");
  write(base + "/cgroup.kill", "");

  auto cgroups = Cgroups::open("/var/lib/gpuq", {v2});
  REQUIRE(cgroups);
  CHECK(cgroups->base() == base);
  CHECK(cgroups->describe() == "cgroup v2 at " + base + " (cgroup.kill)");
  // Another state dir: another cgroup; the same one again: the same.
  CHECK(Cgroups::open("/var/lib/gpuq2", {v2}).error().message.find(base) == std::string::npos);

  // An attempt's: made (or found again), empty until a process is listed, killed through
  // cgroup.kill, removed once empty.
  auto dir = made(cgroups->make("12-attempt-1"));
  REQUIRE(dir);
  CHECK(*dir == base + "/12-attempt-1");
  CHECK(cgroups->make("12-attempt-1"));  // after a restart: found again
  write(*dir + "/cgroup.events", "populated 1\nfrozen 0\n");
  CHECK_FALSE(cgroups->empty(*dir));
  cgroups->kill(*dir);
  std::ifstream kill(*dir + "/cgroup.kill");
  std::string said;
  kill >> said;
  CHECK(said == "1");
  write(*dir + "/cgroup.events", "populated 0\nfrozen 0\n");
  CHECK(cgroups->empty(*dir));
  CHECK(cgroups->empty(base + "/no-such-attempt"));
}

TEST_CASE("v1 where v2 cannot be made: a hierarchy that tracks processes, named for its controller") {
  gpuq::testing::TempDir fs("gpuq-unit-cgroupfs");
  const CgroupHierarchy v2{true, {}, fs.path + "/missing", "/", "/"};
  const CgroupHierarchy cpuset{false, {"cpuset"}, fs.path + "/cpuset", "/", "/"};
  const CgroupHierarchy pids{false, {"pids"}, fs.path + "/pids", "/", "/"};
  REQUIRE(std::filesystem::create_directory(fs.path + "/pids"));
  REQUIRE(std::filesystem::create_directory(fs.path + "/cpuset"));
  auto refused = Cgroups::open("/s", {cpuset, v2, pids});
  REQUIRE_FALSE(refused);
  const std::string& why = refused.error().message;
  // v2 first, then pids; never cpuset (its children need CPUs given first).
  CHECK(why.find("v2: cannot make " + fs.path + "/missing/gpuq-") == 0);
  CHECK(why.find("v1 (pids)") != std::string::npos);
  CHECK(why.find("cpuset") == std::string::npos);
  const std::string base = named(why, fs.path + "/pids/gpuq-");
  write(base + "/cgroup.procs", "");
  auto cgroups = Cgroups::open("/s", {cpuset, v2, pids});
  REQUIRE(cgroups);
  CHECK(cgroups->describe() == "cgroup v1 at " + base);
  auto dir = made(cgroups->make("3-attempt-2"));
  REQUIRE(dir);
  write(*dir + "/cgroup.procs", "");
  CHECK(cgroups->empty(*dir));  // v1: nothing listed
  write(*dir + "/cgroup.procs", "999999999\n");
  CHECK_FALSE(cgroups->empty(*dir));
}

TEST_CASE("gpuqd's cgroup is made again when it was removed meanwhile") {
  gpuq::testing::TempDir fs("gpuq-unit-cgroupfs");
  const CgroupHierarchy v2{true, {}, fs.path, "/", "/"};
  const std::string base = named(Cgroups::open("/s", {v2}).error().message, fs.path + "/gpuq-");
  write(base + "/cgroup.procs", "");
  auto cgroups = Cgroups::open("/s", {v2});
  REQUIRE(cgroups);
  std::filesystem::remove_all(base);
  CHECK(cgroups->make("1-attempt-1"));
  CHECK(std::filesystem::is_directory(base + "/1-attempt-1"));
}

// A cgroup v2 filesystem in a temporary directory, with gpuqd's cgroup (for state dir /s) made in
// it as the kernel would have it: cgroup.procs and cgroup.kill there.
struct FakeV2 {
  gpuq::testing::TempDir fs{"gpuq-unit-cgroupfs"};
  std::string base;
  gpuq::Result<Cgroups> cgroups = gpuq::Error{};
  FakeV2() {
    const CgroupHierarchy v2{true, {}, fs.path, "/", "/"};
    base = named(Cgroups::open("/s", {v2}).error().message, fs.path + "/gpuq-");
    write(base + "/cgroup.procs", "");
    write(base + "/cgroup.kill", "");
    cgroups = Cgroups::open("/s", {v2});
    REQUIRE(cgroups);
  }
};

TEST_CASE("an attempt has ended only once its supervisor is gone and its cgroup is empty") {
  FakeV2 fake;
  const gpuq::testing::TempDir& fs = fake.fs;
  const std::string& base = fake.base;
  auto& cgroups = fake.cgroups;
  const std::string cgroup = base + "/7-attempt-1";
  REQUIRE(std::filesystem::create_directory(cgroup));
  write(cgroup + "/cgroup.events", "populated 1\n");  // a process of it lives on

  boost::asio::io_context io;
  std::vector<std::int64_t> ended;
  // The supervisor: a program that exits at once (its arguments are ignored).
  auto local = gpuq::daemon::make_local_executor(
      io, "/bin/true", [&](std::int64_t id) { ended.push_back(id); }, std::move(*cgroups));
  const std::string dir = fs.path + "/jobs/7/attempt-1";
  std::filesystem::create_directories(dir);
  REQUIRE(local->start({7, dir, nullptr, {}, ::getuid(), {}}));
  const auto killed = [&] {
    std::ifstream in(cgroup + "/cgroup.kill");
    std::string said;
    in >> said;
    return said == "1";
  };
  for (int i = 0; i < 1000 && !killed(); ++i)
    io.run_one_for(std::chrono::milliseconds(10));
  REQUIRE(killed());  // the supervisor is gone: the cgroup was killed
  for (int i = 0; i < 5; ++i)
    io.run_one_for(std::chrono::milliseconds(100));  // and looked at again since
  CHECK(ended.empty());                              // not ended while a process of it lives
  write(cgroup + "/cgroup.events", "populated 0\n");
  for (int i = 0; i < 1000 && ended.empty(); ++i)
    io.run_one_for(std::chrono::milliseconds(10));
  CHECK(ended == std::vector<std::int64_t>{7});
}

TEST_CASE("the cpuset unpinned attempts share stays while an attempt runs, and goes with gpuqd's cgroup after") {
  // This host's v1 pids (tracking) and cpuset hierarchies, where they may be written (root).
  const std::vector<CgroupHierarchy> v1 = host_v1({"pids", "cpuset"});
  gpuq::testing::TempDir state("gpuq-unit-cgroup-state");
  auto cgroups = v1.size() < 2 ? gpuq::Result<Cgroups>(gpuq::Error{}) : Cgroups::open(state.path, v1);
  if (!cgroups || cgroups->where(gpuq::daemon::Limit::cpuset).empty()) {
    MESSAGE("no writable v1 pids and cpuset hierarchies here: skipped");
    return;
  }
  gpuq::daemon::AttemptLimits loose;
  const std::vector<int> cores = gpuq::daemon::usable_cores();  // ascending
  REQUIRE_FALSE(cores.empty());
  loose.free_cores = {cores.front()};
  auto dirs = cgroups->make("1-attempt-1", loose);
  REQUIRE(dirs);
  REQUIRE(dirs->size() == 2);
  const std::string shared = (*dirs)[1].dir;
  CHECK(shared.substr(shared.rfind('/')) == "/unpinned");
  CHECK(first_of(shared + "/cpuset.cpus") == std::to_string(loose.free_cores.front()));
  cgroups->remove((*dirs)[0].dir);
  cgroups->remove_base(false);  // an attempt of gpuqd's runs: a rank may be about to join it
  CHECK(std::filesystem::exists(shared + "/cgroup.procs"));
  auto again = cgroups->make("2-attempt-1", loose);  // found as it was left
  REQUIRE(again);
  CHECK((*again)[1].dir == shared);
  cgroups->remove((*again)[0].dir);
  cgroups->remove_base(true);
  CHECK_FALSE(std::filesystem::exists(shared));
  CHECK_FALSE(std::filesystem::exists(cgroups->base()));
}

TEST_CASE("without cgroup.kill (v1), each process still in the cgroup is killed through its pidfd") {
  // This host's v1 pids hierarchy, where there is one and it may be written (root).
  const std::vector<CgroupHierarchy> v1 = host_v1({"pids"});
  gpuq::testing::TempDir state("gpuq-unit-cgroup-state");
  auto cgroups = v1.empty() ? gpuq::Result<Cgroups>(gpuq::Error{}) : Cgroups::open(state.path, v1);
  if (!cgroups) {
    MESSAGE("no writable v1 pids hierarchy here: skipped");
    return;
  }
  auto dir = made(cgroups->make("1-attempt-1"));
  REQUIRE(dir);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    for (;;)
      ::pause();
  }
  std::ofstream(*dir + "/cgroup.procs") << child << "\n";
  CHECK_FALSE(cgroups->empty(*dir));
  for (int i = 0; i < 1000 && !cgroups->empty(*dir); ++i) {
    cgroups->kill(*dir);
    ::usleep(10000);
  }
  const bool emptied = cgroups->empty(*dir);
  if (!emptied) ::kill(child, SIGKILL);  // not to leave it behind
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(emptied);
  cgroups->remove(*dir);
  cgroups->remove_base();
  CHECK_FALSE(std::filesystem::exists(cgroups->base()));
}

TEST_CASE("cgroup v2's device program refuses the nodes it lists to the cgroup's processes, and only those") {
  std::string own;
  for (auto& h : host_layout())
    if (h.v2) own = h.own_dir();
  char tmpl[] = "/tmp/gpuq-unit-bpf-XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  const std::string nodes = tmpl;
  const std::string cgroup = own + "/gpuq-unit-bpf-" + std::to_string(::getpid());
  const bool can = !own.empty() && ::mknod((nodes + "/nvidia0").c_str(), S_IFCHR | 0666, makedev(195, 0)) == 0 &&
                   ::mknod((nodes + "/nvidia1").c_str(), S_IFCHR | 0666, makedev(195, 1)) == 0 &&
                   ::mkdir(cgroup.c_str(), 0755) == 0;
  std::vector<std::pair<unsigned, unsigned>> denied{{195, 1}};
  for (unsigned minor_no = 0; minor_no < 256; ++minor_no)
    denied.emplace_back(10, minor_no);  // a long list loads too (a box's every GPU, and more)
  auto attached = can ? gpuq::daemon::deny_devices_bpf(cgroup, denied)
                      : gpuq::Result<bool>(gpuq::Error{gpuq::ErrorCode::unavailable, "no v2 cgroup or mknod here"});
  if (!attached) {
    MESSAGE("skipped: " << attached.error().message);
  } else {
    // A child in the cgroup opens both nodes: 195:0 is allowed (ENXIO without a driver; it opens
    // on a GPU machine), 195:1 refused.
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      std::ofstream(cgroup + "/cgroup.procs") << ::getpid() << "\n";
      const auto err_of = [&](const char* name) {
        const int fd = ::open((nodes + "/" + name).c_str(), O_RDWR);
        if (fd >= 0) ::close(fd);
        return fd >= 0 ? 0 : errno;
      };
      const int allowed = err_of("nvidia0"), refused = err_of("nvidia1");
      ::_exit((allowed == 0 || allowed == ENXIO || allowed == ENODEV) && refused == EPERM ? 0
                                                                                          : 10 + (refused == EPERM));
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    // Outside the cgroup nothing is refused.
    const int fd = ::open((nodes + "/nvidia1").c_str(), O_RDWR);
    CHECK((fd < 0 && errno != EPERM));
  }
  ::rmdir(cgroup.c_str());
  std::filesystem::remove_all(nodes);
}

TEST_CASE("the devices limit is in force only where the kernel takes a deny from gpuqd (CAP_SYS_ADMIN)") {
  const std::vector<CgroupHierarchy> v1 = host_v1({"pids", "devices"});
  gpuq::testing::TempDir state("gpuq-unit-cgroup-state");
  auto with = v1.size() < 2 ? gpuq::Result<Cgroups>(gpuq::Error{}) : Cgroups::open(state.path, v1);
  if (!with || with->where(gpuq::daemon::Limit::devices).empty()) {
    MESSAGE("no writable v1 pids and devices hierarchies here: skipped");
    return;
  }
  // The same, in a child without CAP_SYS_ADMIN in its effective set (a service's bounding set
  // without it): the file's mode still says writable, the kernel refuses the deny.
  int out[2];
  REQUIRE(::pipe(out) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2]{};
    if (::syscall(SYS_capget, &header, caps) != 0) ::_exit(2);
    caps[CAP_SYS_ADMIN / 32].effective &= ~(1u << (CAP_SYS_ADMIN % 32));
    if (::syscall(SYS_capset, &header, caps) != 0) ::_exit(3);
    auto without = Cgroups::open(state.path, v1);
    const std::string said = without ? without->describe_limits() : without.error().message;
    [[maybe_unused]] auto n = ::write(out[1], said.data(), said.size());
    ::_exit(without && without->where(gpuq::daemon::Limit::devices).empty() ? 0 : 1);
  }
  ::close(out[1]);
  std::string said;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof(buf))) > 0;)
    said.append(buf, static_cast<std::size_t>(n));
  ::close(out[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CAPTURE(said);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(said.find("the GPUs given: v1: cannot write \"c 195:255 m\" to ") != std::string::npos);
  CHECK(said.find("(the kernel wants CAP_SYS_ADMIN for it)") != std::string::npos);
  with->remove_base();
}

TEST_CASE("an attempt is frozen in place and thawed (a suspension), on a v1 freezer hierarchy") {
  gpuq::testing::TempDir state("gpuq-unit-cgroup-state");
  auto cgroups = v1_pids_and_freezer(state);
  if (!cgroups) {
    MESSAGE("no writable v1 pids and freezer hierarchies here: skipped");
    return;
  }
  REQUIRE(cgroups->can_freeze());
  auto dirs = cgroups->make("1-attempt-1");
  REQUIRE(dirs);
  const std::string& dir = dirs->front().dir;
  const std::string freezer = dirs->back().dir + "/freezer.state";
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    for (;;)
      ::pause();
  }
  for (const auto& group : *dirs)
    std::ofstream(group.dir + "/cgroup.procs") << child << "\n";
  CHECK_FALSE(cgroups->frozen(dir));
  CHECK(cgroups->freeze(dir, true));
  CHECK(cgroups->frozen(dir));
  for (int i = 0; i < 2000 && first_of(freezer) != "FROZEN"; ++i)
    ::usleep(1000);
  CHECK(first_of(freezer) == "FROZEN");
  CHECK(cgroups->freeze(dir, false));
  CHECK_FALSE(cgroups->frozen(dir));
  CHECK(first_of(freezer) == "THAWED");
  CHECK_FALSE(cgroups->freeze(state.path + "/not-an-attempt", true));  // outside gpuqd's cgroup: nothing written
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  for (int i = 0; i < 200 && !cgroups->empty(dir); ++i)
    ::usleep(5000);
  cgroups->remove(dir);
  cgroups->remove_base();
}

TEST_CASE("without cgroup.kill, a fork loop is frozen in one round and killed in the next, which ends it") {
  // (Without the freezer a round lists the chains, and each has forked on before its SIGKILL.)
  gpuq::testing::TempDir state("gpuq-unit-cgroup-state");
  auto cgroups = v1_pids_and_freezer(state);
  if (!cgroups) {
    MESSAGE("no writable v1 pids and freezer hierarchies here: skipped");
    return;
  }
  CHECK(cgroups->describe() == "cgroup v1 at " + cgroups->base() + " (frozen, then killed)");
  auto dirs = cgroups->make("1-attempt-1");
  REQUIRE(dirs);
  REQUIRE(dirs->size() == 2);  // pids tracks, freezer freezes
  int go[2];
  REQUIRE(::pipe(go) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // once in the cgroups: forks a child and exits, again and again (a pid that runs away)
    char c;
    ::close(go[1]);
    if (::read(go[0], &c, 1) != 1) ::_exit(1);
    for (int chains = 0; chains < 7 && ::fork() > 0; ++chains) {
    }  // eight chains at once
    for (;;) {
      const pid_t next = ::fork();
      if (next != 0) ::_exit(0);
    }
  }
  ::close(go[0]);
  for (const auto& group : *dirs)  // no limit per rank: the ranks join the attempt's cgroup itself
    std::ofstream(group.dir + "/cgroup.procs") << child << "\n";
  REQUIRE(::write(go[1], "x", 1) == 1);
  ::close(go[1]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);  // it forked on: its successors live in the cgroup
  const std::string& dir = dirs->front().dir;
  REQUIRE_FALSE(cgroups->empty(dir));
  cgroups->kill(dir);  // a round that asks for the freeze, and returns
  const std::string freezer = dirs->back().dir + "/freezer.state";
  for (int i = 0; i < 2000 && first_of(freezer) != "FROZEN"; ++i)
    ::usleep(1000);
  CHECK(first_of(freezer) == "FROZEN");
  cgroups->kill(dir);  // the round that kills, and thaws
  bool emptied = false;
  for (int i = 0; i < 200 && !(emptied = cgroups->empty(dir)); ++i)
    ::usleep(5000);  // the SIGKILLed take a moment to go, but none of them forks again
  // Not to leave a runaway behind, whatever happened: thawed (were it left frozen, it would never
  // die of its SIGKILL), and killed again until none is left.
  for (int i = 0; i < 1000 && !cgroups->empty(dir); ++i) {
    for (const auto& d : *dirs)
      for (const std::string& group : {d.dir, d.dir + "/rank-0"}) {
        if (std::filesystem::exists(group + "/freezer.state")) std::ofstream(group + "/freezer.state") << "THAWED\n";
        std::ifstream procs(group + "/cgroup.procs");
        for (int pid = 0; procs >> pid;)
          ::kill(pid, SIGKILL);
      }
    ::usleep(1000);
  }
  CHECK(emptied);
  CHECK(cgroups->empty(dir));
  cgroups->remove(dir);
  cgroups->remove_base();
}

TEST_CASE(
    "an attempt whose processes will not die ends after the bound, lingering, and is released once they are gone") {
  FakeV2 fake;
  const gpuq::testing::TempDir& fs = fake.fs;
  const std::string& base = fake.base;
  auto& cgroups = fake.cgroups;
  const std::string cgroup = base + "/7-attempt-1";
  REQUIRE(std::filesystem::create_directory(cgroup));
  write(cgroup + "/cgroup.events", "populated 1\n");  // a process of it that SIGKILL does not end

  boost::asio::io_context io;
  const std::string dir = fs.path + "/jobs/7/attempt-1", next = fs.path + "/jobs/7/attempt-2";
  std::filesystem::create_directories(dir);
  const gpuq::daemon::Executor::Attempt first{7, dir, nullptr, {}, ::getuid(), {}},
      second{7, next, nullptr, {}, ::getuid(), {}};
  std::unique_ptr<gpuq::daemon::Executor> local;
  std::vector<std::string> ended;  // what lingering() said of the attempt when it ended
  std::vector<std::int64_t> released;
  local = gpuq::daemon::make_local_executor(io, "/bin/true",
                                            [&](std::int64_t) { ended.push_back(local->lingering(first)); },
                                            std::move(*cgroups), {0.1, 0.5});
  local->on_released([&](std::int64_t id) { released.push_back(id); });
  REQUIRE(local->start(first));
  CHECK(local->lingering(first).empty());
  for (int i = 0; i < 1000 && ended.empty(); ++i)
    io.run_one_for(std::chrono::milliseconds(10));
  REQUIRE(ended.size() == 1);  // recorded as ended past the bound, lingering as it was
  CHECK(ended[0].find("did not die within 0.5 s of SIGKILL") != std::string::npos);
  CHECK(local->lingering(second).empty());  // the job's next attempt is not what lingers
  for (int i = 0; i < 5; ++i)
    io.run_one_for(std::chrono::milliseconds(100));
  CHECK(released.empty());  // still there
  write(cgroup + "/cgroup.events", "populated 0\n");
  for (int i = 0; i < 1000 && released.empty(); ++i)
    io.run_one_for(std::chrono::milliseconds(10));
  CHECK(released == std::vector<std::int64_t>{7});
  CHECK(local->lingering(first).empty());
}

TEST_CASE("processes an ended attempt left behind are watched again at start until they are gone") {
  FakeV2 fake;
  const gpuq::testing::TempDir& fs = fake.fs;
  const std::string& base = fake.base;
  auto& cgroups = fake.cgroups;
  for (const char* name : {"9-attempt-2", "8-attempt-1", "x-attempt-1", "probe"})
    REQUIRE(std::filesystem::create_directory(base + "/" + name));
  write(base + "/9-attempt-2/cgroup.events", "populated 1\n");  // left behind, still there
  write(base + "/8-attempt-1/cgroup.events", "populated 0\n");  // left behind, gone since
  write(base + "/x-attempt-1/cgroup.events", "populated 1\n");  // not an attempt's name
  write(base + "/probe/cgroup.events", "populated 1\n");

  boost::asio::io_context io;
  std::vector<std::int64_t> released;
  auto local = gpuq::daemon::make_local_executor(io, "/bin/true", [](std::int64_t) {}, std::move(*cgroups), {0.1, 0.5});
  local->on_released([&](std::int64_t id) { released.push_back(id); });
  CHECK(local->adopt_lingering() == std::vector<std::int64_t>{9});
  CHECK(local->lingering({9, fs.path + "/jobs/9/attempt-2", nullptr, {}, ::getuid(), {}}).find("did not die") !=
        std::string::npos);
  for (int i = 0; i < 5; ++i)
    io.run_one_for(std::chrono::milliseconds(50));
  CHECK(released.empty());
  write(base + "/9-attempt-2/cgroup.events", "populated 0\n");
  for (int i = 0; i < 1000 && released.empty(); ++i)
    io.run_one_for(std::chrono::milliseconds(10));
  CHECK(released == std::vector<std::int64_t>{9});
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST_CASE("limits on cgroup v2: the controllers given to gpuqd's cgroup, handed down and written per rank") {
  gpuq::testing::TempDir fs("gpuq-unit-cgroupfs");
  const std::string own = fs.path + "/svc";
  REQUIRE(std::filesystem::create_directory(own));
  write(own + "/cgroup.controllers", "cpuset cpu io memory pids\n");
  const CgroupHierarchy v2{true, {}, fs.path, "/", "/svc"};
  const std::string base = named(Cgroups::open("/s", {v2}).error().message, own + "/gpuq-");
  write(base + "/cgroup.procs", "");
  write(base + "/cgroup.kill", "");
  auto cgroups = Cgroups::open("/s", {v2});
  REQUIRE(cgroups);
  for (auto limit : {gpuq::daemon::Limit::memory, gpuq::daemon::Limit::pids, gpuq::daemon::Limit::cpuset})
    CHECK(cgroups->where(limit) == "v2");
  CHECK(cgroups->where(gpuq::daemon::Limit::devices).empty());  // a BPF program: not loaded
  CHECK(read(base + "/cgroup.subtree_control") == "+cpuset");   // the last handed down
  const std::string said = cgroups->describe_limits();
  CHECK(said.find("limits in force: memory per rank (v2), processes per attempt (v2), each rank's cores (v2)") == 0);
  CHECK(said.find("not in force: the GPUs given: cgroup v2: ") !=
        std::string::npos);  // a directory: no program attaches

  gpuq::daemon::AttemptLimits limits;
  limits.ranks = 2;
  limits.memory_mb = 64;
  limits.pids = 100;
  limits.rank_cores = {{0, 1}, {3}};
  auto dirs = cgroups->make("5-attempt-1", limits);
  REQUIRE(dirs);
  REQUIRE(dirs->size() == 1);  // v2 gives them all: one hierarchy
  const std::string dir = dirs->front().dir;
  CHECK(dirs->front().per_rank);  // memory and pinned cores per rank
  CHECK(dir == base + "/5-attempt-1");
  CHECK(read(dir + "/cgroup.subtree_control") == "+memory +cpuset");  // for the ranks' cgroups
  CHECK(read(dir + "/pids.max") == "100");
  for (int r = 0; r < 2; ++r)
    CHECK(read(dir + "/rank-" + std::to_string(r) + "/memory.max") == std::to_string(64 << 20));
  CHECK(read(dir + "/rank-0/cpuset.cpus") == "0-1");
  CHECK(read(dir + "/rank-1/cpuset.cpus") == "3");
  CHECK_FALSE(std::filesystem::exists(dir + "/rank-2"));

  // Unpinned: held to the cores gpuqd may use by the attempt's cgroup, whose ranks (in cgroups of
  // their own for their memory, or not) have no cores of their own to widen it by.
  for (const std::int64_t memory_mb : {32, 0}) {
    gpuq::daemon::AttemptLimits loose;
    loose.ranks = 2;
    loose.memory_mb = memory_mb;
    loose.free_cores = {0, 2};
    const std::string name = "6-attempt-" + std::to_string(memory_mb);
    auto held = cgroups->make(name, loose);
    REQUIRE(held);
    CHECK(held->front().per_rank == (memory_mb > 0));
    CHECK(read(base + "/" + name + "/cpuset.cpus") == "0,2");
    CHECK_FALSE(std::filesystem::exists(base + "/" + name + "/rank-0/cpuset.cpus"));
  }

  // The OOM kills of its subtree (v2's memory.events is hierarchical).
  CHECK_FALSE(cgroups->oom_kills(dir + "-none").has_value());
  write(dir + "/memory.events", "low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n");
  CHECK(cgroups->oom_kills(dir) == 2);

  // A controller not given to gpuqd's cgroup is not in force, and why is said.
  gpuq::testing::TempDir bare("gpuq-unit-cgroupfs");
  REQUIRE(std::filesystem::create_directory(bare.path + "/svc"));
  write(bare.path + "/svc/cgroup.controllers", "cpu io\n");
  const CgroupHierarchy plain{true, {}, bare.path, "/", "/svc"};
  const std::string bare_base = named(Cgroups::open("/s", {plain}).error().message, bare.path + "/svc/gpuq-");
  write(bare_base + "/cgroup.procs", "");
  auto without = Cgroups::open("/s", {plain});
  REQUIRE(without);
  CHECK(without->where(gpuq::daemon::Limit::memory).empty());
  CHECK(without->describe_limits().find("limits in force: none; not in force: memory per rank: cgroup v2: the memory "
                                        "controller is not given to the cgroup " +
                                        bare.path + "/svc; no v1 hierarchy has it") == 0);
  CHECK_FALSE(without->oom_kills(bare_base + "/1-attempt-1").has_value());
}

TEST_CASE("cgroup_parent: attempts' cgroups under the admin's v2 cgroup, which hands its controllers down") {
  gpuq::testing::TempDir fs("gpuq-unit-cgroupfs");
  REQUIRE(std::filesystem::create_directory(fs.path + "/svc"));  // gpuqd's own: given nothing
  const std::string parent = fs.path + "/gpuq-jobs";
  REQUIRE(std::filesystem::create_directory(parent));
  write(parent + "/cgroup.controllers", "cpuset memory pids\n");
  const CgroupHierarchy v2{true, {}, fs.path, "/", "/svc"};
  const std::string base = named(Cgroups::open("/s", {v2}, parent).error().message, parent + "/gpuq-");
  write(base + "/cgroup.procs", "");
  auto cgroups = Cgroups::open("/s", {v2}, parent);
  REQUIRE(cgroups);
  CHECK(cgroups->base() == base);
  CHECK_FALSE(std::filesystem::exists(fs.path + "/svc/gpuq-" + base.substr(base.rfind("gpuq-") + 5)));
  for (auto limit : {gpuq::daemon::Limit::memory, gpuq::daemon::Limit::pids, gpuq::daemon::Limit::cpuset})
    CHECK(cgroups->where(limit) == "v2");
  CHECK(read(parent + "/cgroup.subtree_control") == "+cpuset");  // each written in turn: the last
  // The hierarchy's root itself may be the parent (it hands down whatever it has).
  const std::string tag = base.substr(base.rfind("gpuq-") + 5);
  auto at_root = Cgroups::open("/s", {v2}, fs.path);
  REQUIRE_FALSE(at_root);  // not a cgroup here (a fake one): its base is where it would be made
  CHECK(named(at_root.error().message, fs.path + "/gpuq-") == fs.path + "/gpuq-" + tag);
  // A base that moved while attempts still ran in the old one (below gpuqd's own cgroup here):
  // no cgroups, so no start, as adoption would find none of them; an empty old one goes.
  const std::string old = fs.path + "/svc/gpuq-" + tag;
  REQUIRE(std::filesystem::create_directories(old + "/3-attempt-1"));
  write(old + "/cgroup.events", "populated 1\nfrozen 0\n");
  auto moved = Cgroups::open("/s", {v2}, parent);
  REQUIRE_FALSE(moved);
  CHECK(moved.error().code == gpuq::ErrorCode::wrong_state);
  CHECK(moved.error().message.find("attempts of this state dir still run in " + old) == 0);
  write(old + "/cgroup.events", "populated 0\nfrozen 0\n");
  CHECK(Cgroups::open("/s", {v2}, parent));
  // A directory outside the hierarchy gpuqd is in is refused, and none is made in its place.
  gpuq::testing::TempDir elsewhere("gpuq-unit-cgroupfs");
  auto refused = Cgroups::open("/s", {v2}, elsewhere.path);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message ==
        "cgroup_parent " + elsewhere.path + " is not in the cgroup v2 hierarchy gpuqd is in");
  // Not a cgroup v2 directory: gpuqd's start refuses it (the check on the real filesystem).
  CHECK_FALSE(gpuq::daemon::check_cgroup_parent(elsewhere.path));
  CHECK(gpuq::daemon::check_cgroup_parent("relative").error().message.find("not an absolute path") !=
        std::string::npos);
}

TEST_CASE("limits on a hybrid host: v2 tracks, v1 hierarchies hold the limits v2 does not give") {
  gpuq::testing::TempDir fs("gpuq-unit-cgroupfs");
  for (const char* h : {"unified", "memory", "memory/sandbox", "cpuset", "devices"})
    REQUIRE(std::filesystem::create_directory(fs.path + "/" + h));
  const CgroupHierarchy v2{true, {}, fs.path + "/unified", "/", "/"};
  const CgroupHierarchy memory{false, {"memory"}, fs.path + "/memory", "/", "/sandbox"};
  const CgroupHierarchy cpuset{false, {"cpuset"}, fs.path + "/cpuset", "/", "/"};
  const CgroupHierarchy devices{false, {"devices"}, fs.path + "/devices", "/", "/"};
  const std::vector<CgroupHierarchy> all{v2, memory, cpuset, devices};
  const std::string base = named(Cgroups::open("/s", all).error().message, fs.path + "/unified/gpuq-");
  write(base + "/cgroup.procs", "");
  write(base + "/cgroup.kill", "");
  const std::string tag = base.substr(base.rfind('/') + 1);  // "gpuq-<hash of the state dir>"
  // What the kernel shows in gpuqd's cgroup of each v1 hierarchy once made (here before): its files.
  write(fs.path + "/cpuset/cpuset.cpus", "0-3\n");
  write(fs.path + "/cpuset/cpuset.mems", "0\n");
  for (const char* h : {"memory/sandbox", "cpuset", "devices"})
    std::filesystem::create_directories(fs.path + "/" + std::string(h) + "/" + tag);  // made by a first try, or not
  write(fs.path + "/memory/sandbox/" + tag + "/cgroup.procs", "");
  write(fs.path + "/memory/sandbox/" + tag + "/memory.limit_in_bytes", "");
  write(fs.path + "/cpuset/" + tag + "/cgroup.procs", "");
  write(fs.path + "/devices/" + tag + "/cgroup.procs", "");
  write(fs.path + "/devices/" + tag + "/devices.deny", "");
  write(fs.path + "/devices/" + tag + "/devices.list", "c 195:* rwm\n");  // an allow-list: not narrowed
  CHECK(Cgroups::open("/s", all)->describe_limits().find("the GPUs given: no v1 hierarchy has it") ==
        std::string::npos);
  CHECK(Cgroups::open("/s", all)->describe_limits().find(" allows devices by a list (a container's?)") !=
        std::string::npos);
  CHECK(Cgroups::open("/s", all)->where(gpuq::daemon::Limit::devices).empty());
  write(fs.path + "/devices/" + tag + "/devices.list", "a *:* rwm\n");  // allows all: what a deny narrows
  auto cgroups = Cgroups::open("/s", all);
  REQUIRE(cgroups);
  CHECK(cgroups->where(gpuq::daemon::Limit::memory) == "v1 memory");
  CHECK(cgroups->where(gpuq::daemon::Limit::cpuset) == "v1 cpuset");
  CHECK(cgroups->where(gpuq::daemon::Limit::devices) == "v1 devices");
  CHECK(cgroups->where(gpuq::daemon::Limit::pids).empty());           // no pids hierarchy here
  CHECK(read(fs.path + "/cpuset/" + tag + "/cpuset.cpus") == "0-3");  // given its parent's: joinable
  CHECK(read(fs.path + "/cpuset/" + tag + "/cpuset.mems") == "0");
  CHECK(cgroups->describe_limits().find("memory per rank (v1 at " + fs.path + "/memory/sandbox/" + tag + ")") !=
        std::string::npos);

  gpuq::daemon::AttemptLimits limits;
  limits.ranks = 2;
  limits.memory_mb = 100;
  limits.pids = 50;  // not in force: nowhere written
  limits.rank_cores = {{2}, {3}};
  limits.denied_devices = {{195, 1}};
  auto dirs = cgroups->make("6-attempt-3", limits);
  REQUIRE(dirs);
  const std::vector<std::string> expected{base + "/6-attempt-3", fs.path + "/memory/sandbox/" + tag + "/6-attempt-3",
                                          fs.path + "/cpuset/" + tag + "/6-attempt-3",
                                          fs.path + "/devices/" + tag + "/6-attempt-3"};
  REQUIRE(dirs->size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CHECK((*dirs)[i].dir == expected[i]);  // the tracking one first: the one the shim is told first
    // A cgroup per rank where a limit is held per rank: memory, and the pinned ranks' cores.
    CHECK((*dirs)[i].per_rank == (i == 1 || i == 2));
    for (int r = 0; r < 2; ++r)
      CHECK(std::filesystem::is_directory(expected[i] + "/rank-" + std::to_string(r)) == (i == 1 || i == 2));
  }
  CHECK(read(expected[1] + "/rank-1/memory.limit_in_bytes") == std::to_string(100 << 20));
  CHECK(read(expected[2] + "/cpuset.cpus") == "2-3");  // the attempt's: its ranks' together
  CHECK(read(expected[2] + "/rank-0/cpuset.cpus") == "2");
  CHECK(read(expected[2] + "/rank-1/cpuset.cpus") == "3");
  CHECK(read(expected[2] + "/rank-1/cpuset.mems") == "0");
  CHECK(read(expected[3] + "/devices.deny") == "c 195:1 rwm");
  CHECK_FALSE(std::filesystem::exists(expected[0] + "/pids.max"));

  // v1's OOM kills: each of its cgroups' (memory.oom_control is not hierarchical), summed.
  write(expected[1] + "/rank-0/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n");
  write(expected[1] + "/rank-1/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n");
  CHECK(cgroups->oom_kills(expected[0]) == 3);

  // Unpinned, no memory limit: no cgroup per rank anywhere; the cpuset hierarchy, which holds
  // nothing else of theirs, has one cgroup that unpinned attempts share, holding gpuqd's cores.
  gpuq::daemon::AttemptLimits loose;
  loose.ranks = 2;
  loose.free_cores = {0, 1, 2};
  for (const char* name : {"8-attempt-1", "9-attempt-1"}) {
    auto shared = cgroups->make(name, loose);
    REQUIRE(shared);
    REQUIRE(shared->size() == 4);
    CHECK((*shared)[2].dir == fs.path + "/cpuset/" + tag + "/unpinned");
    for (const auto& group : *shared) {
      CHECK_FALSE(group.per_rank);
      CHECK_FALSE(std::filesystem::exists(group.dir + "/rank-0"));
    }
    CHECK((*shared)[1].dir == fs.path + "/memory/sandbox/" + tag + "/" + name);  // its own: its OOM kills
  }
  CHECK(read(fs.path + "/cpuset/" + tag + "/unpinned/cpuset.cpus") == "0-2");
  CHECK(read(fs.path + "/cpuset/" + tag + "/unpinned/cpuset.mems") == "0");
  CHECK_FALSE(std::filesystem::exists(fs.path + "/cpuset/" + tag + "/8-attempt-1"));

  // A limit the kernel refuses fails the start, naming the file.
  REQUIRE(std::filesystem::create_directories(fs.path + "/memory/sandbox/" + tag +
                                              "/7-attempt-1/rank-0/memory.limit_in_bytes"));
  auto refused = cgroups->make("7-attempt-1", limits);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.find("cannot hold the attempt to its limits: cannot open " + fs.path +
                                     "/memory/sandbox/" + tag + "/7-attempt-1/rank-0/memory.limit_in_bytes") == 0);
}

TEST_SUITE_END();
